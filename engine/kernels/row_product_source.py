"""The CUDA and Metal text of :class:`engine.kernels.row_product.RowProduct`: the body, each prologue's row sums and
norms, and how each weight dtype is loaded. :func:`engine.kernels.row_product._source` fills a shape into them. Kept
apart from the kernel's shapes, fallback and launch so that each file holds one thing; MLX's kernel cache is keyed by
a hash of this text, so it moves only byte for byte.
"""

from __future__ import annotations

import mlx.core as mx

# --------------------------------------------------------------------------- CUDA

# A sum over the row of TERM (of v = SOURCE(r, i)) per row into TARGET[r] = FINISH(total), every thread of
# the block taking part.
_CUDA_ROW_SUM = """
    {
        float sums[ROWS];
        for (int r = 0; r < ROWS; ++r) sums[r] = 0.0f;
        for (int i = threadIdx.x; i < K; i += WARPS * 32) {
            for (int r = 0; r < ROWS; ++r) {
                const float v = @SOURCE@;
                sums[r] += @TERM@;
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            for (int offset = 16; offset > 0; offset /= 2) sums[r] += __shfl_xor_sync(0xffffffff, sums[r], offset);
            if (lane == 0) partial[warp][r] = sums[r];
        }
        __syncthreads();
        if (threadIdx.x < ROWS) {
            float total = 0.0f;
            for (int w = 0; w < WARPS; ++w) total += partial[w][threadIdx.x];
            @TARGET@[threadIdx.x] = @FINISH@;
        }
        __syncthreads();
    }
"""


def _row_sum(template: str, source: str, term: str, target: str, finish: str) -> str:
    replaced = template.replace("@SOURCE@", source).replace("@TERM@", term)
    return replaced.replace("@TARGET@", target).replace("@FINISH@", finish)


def _prologues(row_sum: str, loop: str, barrier: str, rsqrt: str, exp: str, first_block: str) -> dict[str, str]:
    """Each prologue's source for one backend: ``loop`` strides a thread over a row's K inputs (as ``i``),
    ``barrier`` syncs the block, ``first_block`` is true in one block (which writes ``hidden``)."""

    def total(source: str, term: str, target: str, finish: str) -> str:
        return _row_sum(row_sum, source, term, target, finish)

    inverse_rms = f"{rsqrt}(total / K + params[0])"
    # Mean, then the inverse deviation about it, of SOURCE's rows (a layer norm's two passes).
    layer_stats = total("@ROWS@[r * K + i]", "v", "mean", "total / K") + total(
        "@ROWS@[r * K + i] - mean[r]", "v * v", "inverse", inverse_rms
    )
    layer_apply = f"""
    {loop} {{
        const float s = static_cast<float>(norm_scale[i]);
        const float b = static_cast<float>(norm_bias[i]);
        for (int r = 0; r < ROWS; ++r) {{
            const float z = s * ((@ROWS@[r * K + i] - mean[r]) * inverse[r]) + b;
            rows[r * K + i] = @ACTIVATE@;
        }}
    }}
    {barrier}
"""
    prior_apply = f"""
    {loop} {{
        const float s = static_cast<float>(prior_scale[i]);
        const float b = static_cast<float>(prior_bias[i]);
        for (int r = 0; r < ROWS; ++r) {{
            const float z = s * ((x[r * K + i] - mean[r]) * inverse[r]) + b;
            rows[r * K + i] = z;
            if ({first_block}) hidden[r * K + i] = z;
        }}
    }}
    {barrier}
"""
    return {
        # After a norm: the conditional row (0) guided away from the unconditional one (1), in place.
        "guidance": f"""
    {loop} rows[i] = rows[i] + params[3] * (rows[i] - rows[K + i]);
    {barrier}
""",
        "none": "",
        "norm": total("x[r * K + i]", "v * v", "inverse", inverse_rms)
        + f"""
    {loop} {{
        const float s = static_cast<float>(norm_scale[i]);
        for (int r = 0; r < ROWS; ++r) rows[r * K + i] = s * (x[r * K + i] * inverse[r]);
    }}
    {barrier}
""",
        "residual_norm": total("residual[r * K + i]", "v * v", "inverse_r", inverse_rms)
        + f"""
    {loop} {{
        const float s = static_cast<float>(residual_scale[i]);
        for (int r = 0; r < ROWS; ++r) {{
            const float h = x[r * K + i] + s * (residual[r * K + i] * inverse_r[r]);
            rows[r * K + i] = h;
            if ({first_block}) hidden[r * K + i] = h;
        }}
    }}
    {barrier}
"""
        + total("rows[r * K + i]", "v * v", "inverse", inverse_rms)
        + f"""
    {loop} {{
        const float s = static_cast<float>(norm_scale[i]);
        for (int r = 0; r < ROWS; ++r) rows[r * K + i] = s * (rows[r * K + i] * inverse[r]);
    }}
    {barrier}
""",
        "layer_norm": (layer_stats + layer_apply).replace("@ROWS@", "x").replace("@ACTIVATE@", "z"),
        # The previous layer's output norm (kept as ``hidden``, the residual stream), then this one's.
        "layer_norm_twice": (layer_stats + prior_apply).replace("@ROWS@", "x")
        + (layer_stats + layer_apply).replace("@ROWS@", "rows").replace("@ACTIVATE@", "z"),
        # One row (ROWS is 1): the depthwise convolution of the TAPS-row window (the cached rows x, then the
        # newest row), then layer norm and SiLU; one block writes the window's last TAPS - 1 rows on.
        "conv_norm": f"""
    {loop} {{
        float c = 0.0f;
        for (int t = 0; t < TAPS; ++t) {{
            const float v = t < TAPS - 1 ? x[t * K + i] : newest[i];
            c += v * static_cast<float>(depthwise[i * TAPS + t]);
            if ({first_block} && t > 0) next_window[(t - 1) * K + i] = v;
        }}
        rows[i] = c;
    }}
    {barrier}
"""
        + (layer_stats + layer_apply).replace("@ROWS@", "rows").replace("@ACTIVATE@", f"z / (1.0f + {exp}(-z))"),
    }


_CUDA_PROLOGUES = _prologues(
    _CUDA_ROW_SUM,
    "for (int i = threadIdx.x; i < K; i += WARPS * 32)",
    "__syncthreads();",
    "rsqrtf",
    "expf",
    "block == 0",
)

# Eight weights of one row from ``pointer`` (16 bytes of bf16, 32 of float32) into ``w``.
_CUDA_LOAD = {
    mx.bfloat16: """
        {
            const uint4 raw = *reinterpret_cast<const uint4*>(pointer);
            const __nv_bfloat16* packed = reinterpret_cast<const __nv_bfloat16*>(&raw);
            for (int e = 0; e < 8; ++e) w[e] = __bfloat162float(packed[e]);
        }
""",
    mx.float32: """
        {
            const float4 low = *reinterpret_cast<const float4*>(pointer);
            const float4 high = *reinterpret_cast<const float4*>(pointer + 4);
            w[0] = low.x; w[1] = low.y; w[2] = low.z; w[3] = low.w;
            w[4] = high.x; w[5] = high.y; w[6] = high.z; w[7] = high.w;
        }
""",
}

_CUDA_BODY = """
    constexpr int CHUNKS = K / 8;
    constexpr int OUT_ROWS = GUIDED ? 1 : ROWS;  // a guided product multiplies one mixed row
    // Weight rows a warp reads together: a gate's gate and up rows, a GLU's two halves.
    constexpr int STREAMS = (EPILOGUE == 1 || EPILOGUE == 2) ? 2 : 1;
    constexpr int GROUPS = WARPS / SPLIT;  // columns per block; SPLIT warps share each column's sum
    constexpr int PER_SLICE = (CHUNKS + SPLIT - 1) / SPLIT;
    __shared__ float partial[WARPS][ROWS];
    __shared__ float mean[ROWS];
    __shared__ float inverse[ROWS];
    __shared__ float inverse_r[ROWS];
    __shared__ float slices[WARPS][STREAMS][ROWS];
    @ROWS_MEMORY@
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    @PROLOGUE@
    const int column = block * GROUPS + warp % GROUPS;
    const int slice = warp / GROUPS;
    const bool active = column < COLUMNS;
    const int row_of = active ? column : 0;
    const WT* sources[STREAMS];
    if (EPILOGUE == 1) {
        sources[0] = w0 + static_cast<size_t>(row_of) * K;
        sources[STREAMS - 1] = @W1@ + static_cast<size_t>(row_of) * K;
    } else if (EPILOGUE == 2) {
        sources[0] = w0 + static_cast<size_t>(row_of) * K;
        sources[STREAMS - 1] = w0 + static_cast<size_t>(row_of + COLUMNS) * K;
    } else if (row_of < N0) {
        sources[0] = w0 + static_cast<size_t>(row_of) * K;
    } else if (row_of < N0 + N1) {
        sources[0] = @W1@ + static_cast<size_t>(row_of - N0) * K;
    } else {
        sources[0] = @W2@ + static_cast<size_t>(row_of - N0 - N1) * K;
    }
    float acc[STREAMS][OUT_ROWS];
    for (int s = 0; s < STREAMS; ++s) {
        for (int r = 0; r < OUT_ROWS; ++r) acc[s][r] = 0.0f;
    }
    const int end = min(CHUNKS, (slice + 1) * PER_SLICE);
    // The rows' start (an input view may start anywhere; threadgroup rows are aligned): 16-byte reads from a boundary.
    const bool inputs_aligned = reinterpret_cast<unsigned long long>(@INPUT@) % 16 == 0;
    if (active) {
#pragma unroll 4
        for (int c = slice * PER_SLICE + lane; c < end; c += 32) {
            float in[OUT_ROWS][8];
            for (int r = 0; r < OUT_ROWS; ++r) {
                const float* from = @INPUT@ + r * K + c * 8;
                if (inputs_aligned) {
                    // Two 16-byte reads, not eight 4-byte ones (which threadgroup memory serves eight ways apart).
                    const float4 low = reinterpret_cast<const float4*>(from)[0];
                    const float4 high = reinterpret_cast<const float4*>(from)[1];
                    in[r][0] = low.x; in[r][1] = low.y; in[r][2] = low.z; in[r][3] = low.w;
                    in[r][4] = high.x; in[r][5] = high.y; in[r][6] = high.z; in[r][7] = high.w;
                } else {
                    for (int e = 0; e < 8; ++e) in[r][e] = from[e];
                }
            }
            for (int s = 0; s < STREAMS; ++s) {
                const WT* pointer = sources[s] + c * 8;
                float w[8];
                @LOAD@
                for (int r = 0; r < OUT_ROWS; ++r) {
                    for (int e = 0; e < 8; ++e) acc[s][r] += in[r][e] * w[e];
                }
            }
        }
    }
    for (int s = 0; s < STREAMS; ++s) {
        for (int r = 0; r < OUT_ROWS; ++r) {
            for (int offset = 16; offset > 0; offset /= 2) acc[s][r] += __shfl_xor_sync(0xffffffff, acc[s][r], offset);
            if (lane == 0) slices[warp][s][r] = acc[s][r];
        }
    }
    __syncthreads();
    // One lane of a column's first slice writes it (no early return: a chain runs the body for several blocks).
    if (active && slice == 0 && lane == 0) {
        for (int r = 0; r < OUT_ROWS; ++r) {
            float total[STREAMS];
            for (int s = 0; s < STREAMS; ++s) {
                total[s] = 0.0f;
                for (int k = 0; k < SPLIT; ++k) total[s] += slices[warp + k * GROUPS][s][r];
            }
            if (EPILOGUE == 1) {
                const float g = total[0];
                const float inner = params[1] * (g + 0.044715f * (g * g * g));
                y0[r * COLUMNS + column] = (0.5f * g * (1.0f + tanhf(inner))) * total[STREAMS - 1];
            } else if (EPILOGUE == 2) {
                y0[r * COLUMNS + column] = total[0] * (1.0f / (1.0f + expf(-total[STREAMS - 1])));
            } else if (column < N0) {
                float value = total[0];
                if (EPILOGUE == 3) value = value / (1.0f + expf(-value));
                if (EPILOGUE == 4) value = @BASE@[r * N0 + column] + params[2] * value;
                y0[r * N0 + column] = value;
            } else if (column < N0 + N1) {
                @Y1@[r * N1 + column - N0] = total[0];
            } else {
                @Y2@[r * N2 + column - N0 - N1] = total[0];
            }
        }
    }
"""

# --------------------------------------------------------------------------- Metal

_METAL_ROW_SUM = """
    {
        float sums[ROWS];
        for (int r = 0; r < ROWS; ++r) sums[r] = 0.0f;
        for (uint i = local; i < K; i += WARPS * 32) {
            for (int r = 0; r < ROWS; ++r) {
                const float v = @SOURCE@;
                sums[r] += @TERM@;
            }
        }
        for (int r = 0; r < ROWS; ++r) {
            sums[r] = metal::simd_sum(sums[r]);
            if (lane == 0) partial[warp * ROWS + r] = sums[r];
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
        if (local < ROWS) {
            float total = 0.0f;
            for (int w = 0; w < WARPS; ++w) total += partial[w * ROWS + local];
            @TARGET@[local] = @FINISH@;
        }
        threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    }
"""

_METAL_PROLOGUES = _prologues(
    _METAL_ROW_SUM,
    "for (uint i = local; i < K; i += WARPS * 32)",
    "threadgroup_barrier(metal::mem_flags::mem_threadgroup);",
    "metal::rsqrt",
    "metal::precise::exp",
    "block == 0",
)

_METAL_BODY = """
    constexpr int CHUNKS = K / 8;
    constexpr int OUT_ROWS = GUIDED ? 1 : ROWS;  // a guided product multiplies one mixed row
    constexpr int STREAMS = (EPILOGUE == 1 || EPILOGUE == 2) ? 2 : 1;
    constexpr int GROUPS = WARPS / SPLIT;
    constexpr int PER_SLICE = (CHUNKS + SPLIT - 1) / SPLIT;
    threadgroup float partial[WARPS * ROWS];
    threadgroup float mean[ROWS];
    threadgroup float inverse[ROWS];
    threadgroup float inverse_r[ROWS];
    threadgroup float slices[WARPS * STREAMS * ROWS];
    @ROWS_MEMORY@
    const uint local = thread_position_in_threadgroup.x;
    const uint warp = simdgroup_index_in_threadgroup;
    const uint lane = thread_index_in_simdgroup;
    const uint block = threadgroup_position_in_grid.x;
    @PROLOGUE@
    const int column = int(block) * GROUPS + int(warp) % GROUPS;
    const int slice = int(warp) / GROUPS;
    const bool active = column < COLUMNS;
    const int row_of = active ? column : 0;
    size_t offsets[STREAMS];
    const device WT* gate_or_only;
    if (EPILOGUE == 1 || EPILOGUE == 2) {
        gate_or_only = w0;
        offsets[0] = size_t(row_of) * K;
        offsets[STREAMS - 1] = size_t(EPILOGUE == 2 ? row_of + COLUMNS : row_of) * K;
    } else if (row_of < N0) {
        gate_or_only = w0;
        offsets[0] = size_t(row_of) * K;
    } else if (row_of < N0 + N1) {
        gate_or_only = @W1@;
        offsets[0] = size_t(row_of - N0) * K;
    } else {
        gate_or_only = @W2@;
        offsets[0] = size_t(row_of - N0 - N1) * K;
    }
    float acc[STREAMS][OUT_ROWS];
    for (int s = 0; s < STREAMS; ++s) {
        for (int r = 0; r < OUT_ROWS; ++r) acc[s][r] = 0.0f;
    }
    const int end = metal::min(CHUNKS, (slice + 1) * PER_SLICE);
    if (active) {
        for (int c = slice * PER_SLICE + int(lane); c < end; c += 32) {
            float in[OUT_ROWS][8];
            for (int r = 0; r < OUT_ROWS; ++r) {
                for (int e = 0; e < 8; ++e) in[r][e] = @INPUT@[r * K + c * 8 + e];
            }
            for (int s = 0; s < STREAMS; ++s) {
                const device WT* weights = s == 0 ? gate_or_only : @SECOND@;
                for (int e = 0; e < 8; ++e) {
                    const float w = static_cast<float>(weights[offsets[s] + c * 8 + e]);
                    for (int r = 0; r < OUT_ROWS; ++r) acc[s][r] += in[r][e] * w;
                }
            }
        }
    }
    for (int s = 0; s < STREAMS; ++s) {
        for (int r = 0; r < OUT_ROWS; ++r) {
            acc[s][r] = metal::simd_sum(acc[s][r]);
            if (lane == 0) slices[(warp * STREAMS + s) * OUT_ROWS + r] = acc[s][r];
        }
    }
    threadgroup_barrier(metal::mem_flags::mem_threadgroup);
    if (!active || slice != 0 || lane != 0) return;
    for (int r = 0; r < OUT_ROWS; ++r) {
        float total[STREAMS];
        for (int s = 0; s < STREAMS; ++s) {
            total[s] = 0.0f;
            for (int k = 0; k < SPLIT; ++k) total[s] += slices[((warp + k * GROUPS) * STREAMS + s) * OUT_ROWS + r];
        }
        if (EPILOGUE == 1) {
            const float g = total[0];
            const float inner = params[1] * (g + 0.044715f * (g * g * g));
            y0[r * COLUMNS + column] = (0.5f * g * (1.0f + metal::precise::tanh(inner))) * total[STREAMS - 1];
        } else if (EPILOGUE == 2) {
            y0[r * COLUMNS + column] = total[0] * (1.0f / (1.0f + metal::precise::exp(-total[STREAMS - 1])));
        } else if (column < N0) {
            float value = total[0];
            if (EPILOGUE == 3) value = value / (1.0f + metal::precise::exp(-value));
            if (EPILOGUE == 4) value = @BASE@[r * N0 + column] + params[2] * value;
            y0[r * N0 + column] = value;
        } else if (column < N0 + N1) {
            @Y1@[r * N1 + column - N0] = total[0];
        } else {
            @Y2@[r * N2 + column - N0 - N1] = total[0];
        }
    }
"""
