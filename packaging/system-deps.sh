#!/usr/bin/env bash
# Install the Debian/Ubuntu packages Parley needs: PortAudio and the Qt xcb libraries to run,
# and for the tests PulseAudio (virtual devices), Xvfb (with XTEST for key presses), a tray host (trayer), espeak-ng and sox.
# Does nothing when not root, not on apt, or when everything is already installed.
set -euo pipefail
mode=${1:-run}
# g++ also serves evdev (pynput's Linux dependency, built from source at pip install): it needs a C compiler,
# Python's headers and the kernel's input headers (linux-libc-dev).
runtime=(libportaudio2 libxcb-icccm4 libxcb-keysyms1 libxcb-cursor0 libxkbcommon-x11-0 libegl1 libgl1
         libfontconfig1 fonts-dejavu-core libdbus-1-3 g++ python3-dev linux-libc-dev)
testing=(pulseaudio pulseaudio-utils espeak-ng sox xvfb xauth x11-utils libxtst6 imagemagick libopenblas0-pthread trayer)
packages=("${runtime[@]}")
[ "$mode" = test ] && packages+=("${testing[@]}")

if [ "$(uname -s)" != Linux ] || ! command -v apt-get >/dev/null; then exit 0; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "Parley needs these system packages: ${missing[*]}" >&2
  echo "Install them with: sudo apt-get install ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
