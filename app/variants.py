"""The one table of model variants: the demo, and the published 4-bit, 8-bit and bf16 checkpoints.

Everything that names a variant — settings keys, the first-run downloads, the model switch,
the header chip, the speed verdict, profile exports — reads it from here. A variant's
``key`` is what settings files and profile logs store. Which variant a loaded checkpoint
is comes from the checkpoint itself (its quantization, or the demo marker), never from
where it was configured. No Qt, no MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class Variant:
    key: str  # stored in settings and profile logs: "demo", "4bit", "8bit", "bf16"
    label: str  # shown to users
    bits: int | None  # the checkpoint's quantization; None for bf16 weights
    repo: str | None  # the published Hugging Face repository; None for the generated demo
    download_gb: float | None  # the repository's size
    note: str  # one line for the download and switch choices

    @property
    def demo(self) -> bool:
        """A generated random-weight checkpoint: it makes noise, not speech."""
        return self.repo is None

    @property
    def folder_name(self) -> str:
        """The repository's folder name (where a download goes), e.g. ``NemotronLabs-VoiceChat-11B-4bit``."""
        return (self.repo or "demo-checkpoint").split("/")[-1]


DEMO: Final = Variant(
    "demo",
    "Demo",
    4,
    None,
    None,
    "A tiny random-weight model made on this computer: everything runs, but it makes noise, not speech.",
)
Q4: Final = Variant(
    "4bit",
    "4-bit",
    4,
    "mlx-community/NemotronLabs-VoiceChat-11B-4bit",
    9.2,
    "Recommended. Faster, and fits machines with 16 GB of memory or more.",
)
Q8: Final = Variant(
    "8bit",
    "8-bit",
    8,
    "mlx-community/NemotronLabs-VoiceChat-11B-8bit",
    13.9,
    "Closer to the original model. Needs more memory and a faster machine.",
)
BF16: Final = Variant(
    "bf16",
    "bf16",
    None,
    "mlx-community/NemotronLabs-VoiceChat-11B-bf16",
    22.2,
    "The unquantized weights. Needs 32 GB of memory or more and the fastest machines.",
)

VARIANTS: Final = (DEMO, Q4, Q8, BF16)
MODEL_VARIANTS: Final = (Q4, Q8, BF16)
"""The real checkpoints, which can be downloaded, configured and switched between."""

_BY_KEY: Final = {variant.key: variant for variant in VARIANTS}


def variant(key: str) -> Variant:
    """The variant stored as ``key``; raises ``ValueError`` for anything else."""
    try:
        return _BY_KEY[key]
    except KeyError:
        raise ValueError(f"unknown model variant {key!r}; expected one of {', '.join(_BY_KEY)}") from None


def variant_for_checkpoint(bits: int | None, *, demo: bool = False) -> Variant:
    """The variant a loaded checkpoint is, from its quantization (or the demo marker)."""
    if demo:
        return DEMO
    for candidate in MODEL_VARIANTS:
        if candidate.bits == bits:
            return candidate
    raise ValueError(f"no published variant is quantized to {bits} bits")


def variant_for_repo(repo: str) -> Variant | None:
    return next((candidate for candidate in MODEL_VARIANTS if candidate.repo == repo), None)
