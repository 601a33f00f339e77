"""Parley's MLX implementation of the VoiceChat duplex pipeline (no Qt): the one way in for the app.

``from engine import load_voicechat, Session, FrameProfiler, …`` is how app/ reaches the engine; besides this
facade, app/ imports only the MLX-free :mod:`engine.events`, :mod:`engine.timeline` and :mod:`engine.errors`
(tests/test_engine_layering.py checks). The names below load their module on first use (PEP 562), so that
importing ``engine.events`` from the UI, which runs this file first, pulls in no MLX.

The engine's layers, each importing only from its own or lower ones (docs/architecture.md):

* core: :mod:`engine.timeline`, :mod:`engine.events`, :mod:`engine.errors`, :mod:`engine.files`, :mod:`engine.jit`,
  :mod:`engine.hooks` (the one instrumentation object), :mod:`engine.streaming` (the networks' contract),
  :mod:`engine.weight_names`, :mod:`engine.kernel_cache`;
* :mod:`engine.loading` (a checkpoint's config, layout, files, tokenizers; random checkpoints' arrays) and
  :mod:`engine.ops` (attention caches, draws);
* :mod:`engine.kernels`: fast mode's custom kernels beside their fallbacks, and their admission;
* :mod:`engine.networks`: the networks, which hold weights and no conversation state;
* :mod:`engine.numerics`: exact or fast, and which fast parts this device admitted;
* :mod:`engine.model` (the networks assembled, and loading a checkpoint) and :mod:`engine.random_model`;
* :mod:`engine.session` (one conversation, frame by frame), :mod:`engine.tools` (tool calls, the tool prompt and
  response) and :mod:`engine.tool_turn` (the held frames while a call waits);
* instrumentation: :mod:`engine.profiler`, :mod:`engine.counters` (the census), :mod:`engine.pricing`,
  :mod:`engine.profile_log`;
* this facade.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

# On CUDA, MLX records kernels into CUDA graphs and replays them. Measured on an H200 at full size
# (docs/performance.md, "CUDA graphs"), replaying gave the same median frame but stalls of up to 2x the median
# whenever a frame took a kernel sequence it had not recorded yet; launching kernels directly gave
# steadier frames (p95 45-54 ms against 58 ms). A frame that arrives late is heard, so Parley launches
# directly unless told otherwise. Read by MLX at its first GPU evaluation; no effect on other backends.
os.environ.setdefault("MLX_USE_CUDA_GRAPHS", "0")

if TYPE_CHECKING:  # the names as mypy sees them; at run time __getattr__ imports each on first use
    from .counters import FrameCensus as FrameCensus
    from .counters import GraphCensus as GraphCensus
    from .counters import named_weights as named_weights
    from .counters import python_calls as python_calls
    from .files import write_atomic as write_atomic
    from .hooks import NO_HOOKS as NO_HOOKS
    from .hooks import FrameHooks as FrameHooks
    from .hooks import NoHooks as NoHooks
    from .jit import check_report as check_report
    from .jit import compile_checking as compile_checking
    from .jit import compile_enabled as compile_enabled
    from .kernel_cache import KERNEL_CACHE_SETTING as KERNEL_CACHE_SETTING
    from .kernel_cache import cached_kernels as cached_kernels
    from .kernel_cache import seed_kernel_cache as seed_kernel_cache
    from .kernel_cache import use_kernel_cache as use_kernel_cache
    from .kernels.admission import kernels_standing_in as kernels_standing_in
    from .kernels.admission import relative_l2 as relative_l2
    from .kernels.admission import stand_in_kernels as stand_in_kernels
    from .loading.checkpoint import load_into as load_into
    from .loading.checkpoint import open_checkpoint as open_checkpoint
    from .loading.checkpoint import read_config as read_config
    from .loading.checkpoint import read_runtime_weights as read_runtime_weights
    from .loading.checkpoint import verify_layout as verify_layout
    from .loading.layout import RANDOM_SIZES as RANDOM_SIZES
    from .loading.random_checkpoint import has_random_weights as has_random_weights
    from .loading.random_checkpoint import make_checkpoint as make_checkpoint
    from .loading.random_checkpoint import random_weights as random_weights
    from .loading.tokenizer import TextTokenizer as TextTokenizer
    from .model import VoiceChat as VoiceChat
    from .model import assemble_voicechat as assemble_voicechat
    from .model import load_voicechat as load_voicechat
    from .networks.tts import TTSInput as TTSInput
    from .numerics import NUMERICS as NUMERICS
    from .numerics import Numerics as Numerics
    from .numerics import check_numerics as check_numerics
    from .numerics import set_numerics as set_numerics
    from .pricing import full_size_prices as full_size_prices
    from .pricing import weight_bytes as weight_bytes
    from .pricing import weight_bytes_by_network as weight_bytes_by_network
    from .pricing import weight_bytes_by_weight as weight_bytes_by_weight
    from .profile_log import AUDIO_COUNTERS as AUDIO_COUNTERS
    from .profile_log import ConversationLog as ConversationLog
    from .profile_log import build_profile_log as build_profile_log
    from .profile_log import build_session_profile_log as build_session_profile_log
    from .profile_log import device_description as device_description
    from .profile_log import to_json as to_json
    from .profile_log import write_profile_log as write_profile_log
    from .profiler import FrameProfiler as FrameProfiler
    from .profiler import percentile as percentile
    from .profiler import summarize as summarize
    from .random_model import random_voicechat as random_voicechat
    from .session import Session as Session
    from .session import speaker_prompt as speaker_prompt
    from .tools import MAX_TOOLS as MAX_TOOLS
    from .tools import ScriptedChannels as ScriptedChannels
    from .tools import ToolResult as ToolResult
    from .tools import ToolSpec as ToolSpec
    from .tools import render_tool_prompt as render_tool_prompt
    from .tools import render_tool_response as render_tool_response
    from .warming import warm_up as warm_up

# Each exported name and the module that holds it (relative to this package).
_EXPORTS: dict[str, str] = {
    # a checkpoint: load it, or make a random (demo) one
    "load_voicechat": ".model",
    "assemble_voicechat": ".model",
    "VoiceChat": ".model",
    "read_config": ".loading.checkpoint",
    "read_runtime_weights": ".loading.checkpoint",
    "load_into": ".loading.checkpoint",
    "open_checkpoint": ".loading.checkpoint",
    "verify_layout": ".loading.checkpoint",
    "TextTokenizer": ".loading.tokenizer",
    "RANDOM_SIZES": ".loading.layout",
    "make_checkpoint": ".loading.random_checkpoint",
    "has_random_weights": ".loading.random_checkpoint",
    "random_weights": ".loading.random_checkpoint",
    "random_voicechat": ".random_model",
    # a conversation
    "Session": ".session",
    "TTSInput": ".networks.tts",
    "warm_up": ".warming",
    "speaker_prompt": ".session",
    # tools: what the model is offered, and what it hears back
    "MAX_TOOLS": ".tools",
    "ToolSpec": ".tools",
    "ToolResult": ".tools",
    "render_tool_prompt": ".tools",
    "render_tool_response": ".tools",
    "ScriptedChannels": ".tools",
    # numerics
    "NUMERICS": ".numerics",
    "Numerics": ".numerics",
    "check_numerics": ".numerics",
    "set_numerics": ".numerics",
    "relative_l2": ".kernels.admission",
    "stand_in_kernels": ".kernels.admission",
    "kernels_standing_in": ".kernels.admission",
    # watching frames: hooks, timing, the census and its prices, the profile log
    "FrameHooks": ".hooks",
    "NoHooks": ".hooks",
    "NO_HOOKS": ".hooks",
    "FrameProfiler": ".profiler",
    "percentile": ".profiler",
    "summarize": ".profiler",
    "GraphCensus": ".counters",
    "FrameCensus": ".counters",
    "named_weights": ".counters",
    "python_calls": ".counters",
    "full_size_prices": ".pricing",
    "weight_bytes": ".pricing",
    "weight_bytes_by_network": ".pricing",
    "weight_bytes_by_weight": ".pricing",
    "AUDIO_COUNTERS": ".profile_log",
    "ConversationLog": ".profile_log",
    "build_profile_log": ".profile_log",
    "build_session_profile_log": ".profile_log",
    "device_description": ".profile_log",
    "to_json": ".profile_log",
    "write_profile_log": ".profile_log",
    # the device: kernel cache, compilation switches, files
    "KERNEL_CACHE_SETTING": ".kernel_cache",
    "cached_kernels": ".kernel_cache",
    "seed_kernel_cache": ".kernel_cache",
    "use_kernel_cache": ".kernel_cache",
    "check_report": ".jit",
    "compile_checking": ".jit",
    "compile_enabled": ".jit",
    "write_atomic": ".files",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
