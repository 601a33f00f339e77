"""What Parley runs on, in words: its version, a package's version, the device MLX computes on (Help → About)."""

from __future__ import annotations

from importlib import metadata

from .messages import EngineInfo


def package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def parley_version() -> str:
    version = package_version("parley")
    return "0+unknown" if version == "not installed" else version


def mlx_device(engine_info: EngineInfo | None) -> str:
    """The device MLX computes on ("gpu: NVIDIA H100 …"), and on Linux's CPU why not the GPU.

    ``engine_info`` is what the worker reported (None before it did: then this process asks MLX itself).
    """
    from engine import device_description

    from .cuda_check import device_note

    if engine_info is not None:
        device = engine_info.device
    else:
        described = device_description()
        device = f"{described['type']}: {described['name']}"
    note = device_note(device.startswith("gpu"))
    return device + (f" — {note}" if note else "")
