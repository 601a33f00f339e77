"""MLX CUDA for one transfer: the two wheels unpacked into one folder, libmlx.so's GPU code kept for sm_90 only.

    python3 tests/device/pack_mlx_cuda.py MLX_CUDA_13_WHEEL MLX_WHEEL .gpu/mlx-cuda-sm90.tar.xz

The wheels come from ``../shared/tools/mlx-cuda/get-wheels.sh`` (``mlx_cuda_13-0.32.4-…whl``, 90 MB, and
``mlx-0.32.4-…whl``). The CUDA wheel's libmlx.so carries its kernels for every architecture in its ``.nv_fatbin``
section; the payloads of the entries for any other than sm_90 (H100, H200) are zeroed in place, so that the
library keeps its layout and xz packs the zeros to nothing: about 22 MB instead of 90. The mlx wheel is unpacked over
the CUDA wheel (as pip installs the two into one folder), and the folder packed with ``tar -cJ`` at its top (``./``).
The harness's setup (``tests/device/harness.sh setup``) unpacks it into ``$HOME/mlx-site``.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ARCH = 90
FATBIN_MAGIC = 0xBA55ED50
CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of its entries
# kind, _, header size, payload size, _, _, minor, major, arch, _, _, flags
ENTRY = struct.Struct("<HHIQIIHHIIIQ")


def unpack_wheel(wheel: Path, into: Path) -> None:
    """Unzip ``wheel`` into ``into``, keeping each file's mode (zipfile drops it)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            path = Path(archive.extract(member, into))
            mode = (member.external_attr >> 16) & 0o777
            if mode and not member.is_dir():
                path.chmod(mode)


def fatbin_section(elf: bytes) -> tuple[int, int]:
    """Offset and size of a 64-bit little-endian ELF's ``.nv_fatbin`` section."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF")
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", elf, shoff + index * shentsize)
        return name, offset, size

    _, names, _ = section(shstrndx)
    for index in range(shnum):
        name, offset, size = section(index)
        if elf[names + name : elf.index(b"\0", names + name)] == b".nv_fatbin":
            return offset, size
    raise ValueError("no .nv_fatbin section")


def keep_one_arch(library: Path, arch: int = ARCH) -> tuple[int, int]:
    """Zero the payloads of ``library``'s fatbin entries for other architectures than ``arch``, in place.
    Returns (entries kept, entries zeroed)."""
    elf = bytearray(library.read_bytes())
    start, size = fatbin_section(elf)
    kept = zeroed = 0
    position = start
    while position + CONTAINER.size <= start + size:
        magic, _, header, entries = CONTAINER.unpack_from(elf, position)
        if magic != FATBIN_MAGIC:  # padding between containers
            position += 8
            continue
        entry, end = position + header, position + header + entries
        while entry < end:
            _, _, entry_header, payload, _, _, _, _, entry_arch, _, _, _ = ENTRY.unpack_from(elf, entry)
            if entry_arch == arch:
                kept += 1
            else:
                elf[entry + entry_header : entry + entry_header + payload] = bytes(payload)
                zeroed += 1
            entry += entry_header + payload
        position = end
    if not kept:
        raise ValueError(f"no sm_{arch} entries in {library}")
    library.write_bytes(elf)
    return kept, zeroed


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    cuda_wheel, mlx_wheel, out = (Path(arg) for arg in argv)
    with tempfile.TemporaryDirectory() as folder:
        site = Path(folder)
        site.chmod(0o755)  # the folder it is unpacked into takes this mode
        unpack_wheel(cuda_wheel, site)
        kept, zeroed = keep_one_arch(site / "mlx" / "lib" / "libmlx.so")
        print(f"libmlx.so: {kept} sm_{ARCH} fatbin entries kept, {zeroed} others zeroed")
        unpack_wheel(mlx_wheel, site)
        subprocess.run(["tar", "-cJf", str(out.resolve()), "-C", str(site), "."], check=True)
    print(f"{out}: {out.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
