"""Parley's MLX implementation of the VoiceChat duplex pipeline (no Qt; see README, "The engine")."""

import os

# On CUDA, MLX records kernels into CUDA graphs and replays them. Measured on an H200 at full size
# (README, "CUDA graphs"), replaying gave the same median frame but stalls of up to 2x the median
# whenever a frame took a kernel sequence it had not recorded yet; launching kernels directly gave
# steadier frames (p95 45-54 ms against 58 ms). A frame that arrives late is heard, so Parley launches
# directly unless told otherwise. Read by MLX at its first GPU evaluation; no effect on other backends.
os.environ.setdefault("MLX_USE_CUDA_GRAPHS", "0")
