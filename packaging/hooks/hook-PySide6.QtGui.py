"""PyInstaller hook for PySide6.QtGui: PyInstaller's own, minus the Qt plugins Parley never loads.

It replaces the stock hook (hooks in ``hookspath`` take precedence), so the plugins left out
here never reach dependency analysis: dropping the GTK platform theme alone keeps GTK, cairo,
pango and about 40 other system libraries out of the bundle.
"""

from __future__ import annotations

from pathlib import PurePath

from PyInstaller.utils.hooks.qt import add_qt6_dependencies

# Platforms Parley runs on: X11, Wayland, macOS; offscreen and minimal for headless runs and tests.
# Left out: EGLFS, linuxfb, VNC and Vulkan-display, which are for embedded devices.
KEPT_PLATFORMS = ("qxcb", "qwayland", "qoffscreen", "qminimal.", "qcocoa")
# Whole plugin types for embedded input (generic) and EGL device integration.
DROPPED_TYPES = ("egldeviceintegrations", "generic")
# The UI's images are SVG (icons) and PNG (built into QtGui); the other image formats are never read.
KEPT_IMAGE_FORMATS = ("qsvg",)


def is_unused(source: str, destination: str) -> bool:
    """Whether a collected plugin is one Parley has no use for."""
    plugin_type = PurePath(destination).name
    name = PurePath(source).name
    if plugin_type in DROPPED_TYPES:
        return True
    if plugin_type == "platforms":
        return not any(kept in name for kept in KEPT_PLATFORMS)
    if plugin_type == "imageformats":
        return not any(kept in name for kept in KEPT_IMAGE_FORMATS)
    # The GTK theme needs GTK 3 at run time and links cairo/pango; Parley styles itself (ui/theme.py).
    # The XDG desktop portal theme stays: it tells Qt whether the desktop is in dark mode.
    return plugin_type == "platformthemes" and "gtk" in name


hiddenimports, binaries, datas = add_qt6_dependencies(__file__)
binaries = [(source, destination) for source, destination in binaries if not is_unused(source, destination)]
