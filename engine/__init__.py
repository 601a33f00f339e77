"""Parley's MLX implementation of the VoiceChat duplex pipeline (no Qt; see README, "The engine: how it works").

* :mod:`engine.networks`: the networks — perception (``mel``, ``encoder``), the RN-T (``rnnt``), the LLM (``llm``,
  ``ssm``), the TTS (``tts``, ``subword``, ``sampling``) and the codec (``codec``) — and the layers they share
  (``linear``, ``cache``, ``fused``). They hold no state.
* :mod:`engine.kernels`: fast mode's custom kernels, CUDA and Metal sources beside their operations fallbacks, and
  their admission (``admission``: a kernel runs only where it matched its fallback on this device).
* :mod:`engine.numerics`: exact or fast, and what fast mode changes (the written decision).
* :mod:`engine.loading`: a checkpoint's config, layout, files and tokenizers, what is cast at load and what fits.
* :mod:`engine.model`: the networks assembled into VoiceChat, and loading a checkpoint into it.
* :mod:`engine.session`: one conversation, frame by frame, owning every cache; :mod:`engine.events` (what it
  emits), :mod:`engine.timeline` (the frame's constants and stage names) and :mod:`engine.tools` (tool calls) are
  what the rest of Parley reads, the first two without MLX.
* :mod:`engine.profiler`, :mod:`engine.profile_log` and :mod:`engine.counters`: a frame's times, the profile log,
  and the census of what a frame evaluates.
* :mod:`engine.jit` (``mx.compile`` and its switches), :mod:`engine.errors`, :mod:`engine.files`.
"""

import os

# On CUDA, MLX records kernels into CUDA graphs and replays them. Measured on an H200 at full size
# (docs/performance.md, "CUDA graphs"), replaying gave the same median frame but stalls of up to 2x the median
# whenever a frame took a kernel sequence it had not recorded yet; launching kernels directly gave
# steadier frames (p95 45-54 ms against 58 ms). A frame that arrives late is heard, so Parley launches
# directly unless told otherwise. Read by MLX at its first GPU evaluation; no effect on other backends.
os.environ.setdefault("MLX_USE_CUDA_GRAPHS", "0")
