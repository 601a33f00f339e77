"""List the fused kernels MLX generated that add to a product: ``x * y + z`` in one kernel.

    python3 tests/device/fused_products.py FOLDER [FOLDER ...]     (bash tests/device/harness.sh setup fused)

A GPU compiler contracts such a pair into one fused multiply-add (one rounding instead of
two), so a compiled program that holds one computes differently from the reference's
separate kernels. MLX keeps the source of every kernel it generates: C++ for the CPU
(``$TMPDIR/mlx/<version>/cpu/*.cpp``) and CUDA for NVIDIA GPUs (``*.cu`` beside each
``.ptx`` in its PTX cache: the harness scans ``/tmp/ptx``).

On the CPU, the fast kernels (rms_norm, layer_norm, rope, attention) are built from
ordinary operations and fuse into such patterns too; on a GPU they are kernels of their
own, so the CUDA sources are the ones that matter.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

# A statement of a generated kernel: "<type> tmp_<name> = <Primitive>{}(tmp_a, tmp_b);" (CUDA) or "...()(...)" (C++).
_STATEMENT = re.compile(r"^\s*([\w:]+) tmp_(\w+) = (\w+)(?:\{\}|\(\))\((.*)\);$")
_PRODUCTS = {"Multiply", "Square"}
_SUMS = {"Add", "Subtract"}
# "<type> tmp_<name> = <literal>;" or a cast of another temporary.
_LITERAL = re.compile(r"^\s*[\w:]+ tmp_(\w+) = (?:static_cast<[\w:]+>\()?([-+0-9.eE]+)\)?;$")
_CAST = re.compile(r"^\s*[\w:]+ tmp_(\w+) = static_cast<[\w:]+>\(tmp_(\w+)\);$")
_FLOATS = ("float", "__half", "__nv_bfloat16", "float16_t", "bfloat16_t", "complex64_t", "cu::complex64_t")


def products_added(source: str) -> list[str]:
    """``"<Product>-><Sum> (<type>)"`` for each sum in ``source`` that consumes a product of the same kernel."""
    made: dict[str, str] = {}
    literal: dict[str, float] = {}
    for line in source.splitlines():
        if match := _LITERAL.match(line):
            literal[match.group(1)] = float(match.group(2))
        elif (match := _CAST.match(line)) and match.group(2) in literal:
            literal[match.group(1)] = literal[match.group(2)]
    found: list[str] = []
    for line in source.splitlines():
        match = _STATEMENT.match(line)
        if match is None:
            continue
        kind, name, primitive, arguments = match.groups()
        operands = re.findall(r"tmp_(\w+)", arguments)
        if primitive == "Multiply" and any(_power_of_two(literal.get(operand)) for operand in operands):
            primitive = "Scale"  # times a power of two: exact, so contracting it changes nothing
        made[name] = primitive
        if primitive in _SUMS and kind.endswith(_FLOATS):
            for operand in operands:
                if made.get(operand) in _PRODUCTS:
                    found.append(f"{made[operand]}->{primitive} ({kind})")
    return found


def _power_of_two(value: float | None) -> bool:
    if value is None or value == 0:
        return False
    mantissa, _ = math.frexp(abs(value))
    return mantissa == 0.5


def main(folders: list[str]) -> int:
    total = 0
    for folder in folders:
        for path in sorted(Path(folder).rglob("*")):
            if path.suffix not in (".cu", ".cpp"):
                continue
            found = products_added(path.read_text(errors="replace"))
            if found:
                total += 1
                print(f"{path.name[:160]}: {', '.join(found)}")
    print(f"{total} kernel(s) add to a product")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
