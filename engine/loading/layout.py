"""The tensor layout of a published VoiceChat checkpoint, derived from its config.

Every tensor is described twice: as it is stored in the shards ("source": NeMo key
names and PyTorch layouts, exactly as the mlx-community repositories hold them) and
as the runtime modules expect it after sanitizing (MLX layouts). The loader checks
files against this table before touching MLX, the random-checkpoint generator writes
it, and a test holds it equal to the reference port's parameter set.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from .config import VoiceChatConfig

# What a tensor holds, which decides its storage dtype and its random initialisation.
Role = Literal[
    "weight",  # matmul / conv weight: normal(0, gain / sqrt(fan_in))
    "embedding",  # lookup table: normal(0, gain)
    "bias",  # small normal
    "norm",  # multiplicative norm weight around 1
    "offset_norm",  # Gemma-style (1 + w) norm weight around 0
    "scalar",  # learned scalar or vector parameter with its own init
    "index",  # integer buffer
    "buffer",  # float buffer that is not learned (filterbank, window)
]

# How the stored layout maps to the runtime layout.
Transform = Literal[
    "same",
    "conv1d",  # PyTorch (O, I, K) -> MLX (O, K, I)
    "conv2d",  # PyTorch (O, I, kH, kW) -> MLX (O, kH, kW, I)
    "conv_transpose1d",  # PyTorch (I, O, K) -> MLX (O, K, I)
]


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of the checkpoint."""

    name: str  # runtime key
    shape: tuple[int, ...]  # runtime shape
    role: Role
    source_name: str  # key in the shards
    source_shape: tuple[int, ...]  # shape in the shards (unquantized)
    fan_in: int = 1
    gain: float = 1.0
    quantizable: bool = False  # quantized in the published 4/8-bit repositories
    runtime: bool = True  # False for source-only tensors the runtime drops
    transform: Transform = "same"

    @property
    def module(self) -> str:
        """The owning module path (the key without its last component)."""
        return self.name.rsplit(".", 1)[0]

    @property
    def size(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count


def _t(
    name: str,
    shape: tuple[int, ...],
    role: Role,
    *,
    source_name: str | None = None,
    source_shape: tuple[int, ...] | None = None,
    fan_in: int = 1,
    gain: float = 1.0,
    quantizable: bool = False,
    runtime: bool = True,
    transform: Transform = "same",
) -> TensorSpec:
    return TensorSpec(
        name=name,
        shape=shape,
        role=role,
        source_name=source_name or name,
        source_shape=source_shape or shape,
        fan_in=fan_in,
        gain=gain,
        quantizable=quantizable,
        runtime=runtime,
        transform=transform,
    )


def _linear(
    name: str, out_dim: int, in_dim: int, *, bias: bool = False, gain: float = 1.0, quantizable: bool = False
) -> Iterator[TensorSpec]:
    yield _t(f"{name}.weight", (out_dim, in_dim), "weight", fan_in=in_dim, gain=gain, quantizable=quantizable)
    if bias:
        yield _t(f"{name}.bias", (out_dim,), "bias")


def _conv1d(name: str, out_ch: int, kernel: int, in_ch: int, *, bias: bool, gain: float = 1.0) -> Iterator[TensorSpec]:
    """Conv1d stored PyTorch (O, I, K), used MLX (O, K, I)."""
    yield _t(
        f"{name}.weight",
        (out_ch, kernel, in_ch),
        "weight",
        source_shape=(out_ch, in_ch, kernel),
        fan_in=kernel * in_ch,
        gain=gain,
        transform="conv1d",
    )
    if bias:
        yield _t(f"{name}.bias", (out_ch,), "bias")


def _layer_norm(name: str, dim: int) -> Iterator[TensorSpec]:
    yield _t(f"{name}.weight", (dim,), "norm")
    yield _t(f"{name}.bias", (dim,), "bias")


# --------------------------------------------------------------------------- sections


def _llm(config: VoiceChatConfig) -> Iterator[TensorSpec]:
    text = config.text_config
    hidden, vocab = text.hidden_size, text.vocab_size
    yield _t("stt_model.embed_tokens.weight", (vocab, hidden), "embedding", quantizable=True)
    for head in ("lm_head", "function_head"):
        yield from _linear(f"stt_model.{head}", vocab, hidden, quantizable=True)
    for index, kind in enumerate(text.hybrid_override_pattern):
        prefix = f"stt_model.llm.layers.{index}"
        yield _t(f"{prefix}.norm.weight", (hidden,), "norm")
        mixer = f"{prefix}.mixer"
        if kind == "M":
            inner, conv_dim, heads = text.mamba_intermediate_size, text.mamba_conv_dim, text.mamba_num_heads
            yield from _linear(
                f"{mixer}.in_proj", text.mamba_projection_size, hidden, bias=text.mamba_proj_bias, quantizable=True
            )
            yield _t(
                f"{mixer}.conv1d.weight",
                (conv_dim, text.conv_kernel, 1),
                "weight",
                source_shape=(conv_dim, 1, text.conv_kernel),
                fan_in=text.conv_kernel,
                transform="conv1d",
            )
            if text.use_conv_bias:
                yield _t(f"{mixer}.conv1d.bias", (conv_dim,), "bias")
            yield _t(f"{mixer}.A_log", (heads,), "scalar")
            yield _t(f"{mixer}.D", (heads,), "scalar")
            yield _t(f"{mixer}.dt_bias", (heads,), "scalar")
            yield _t(f"{mixer}.norm.weight", (inner,), "norm")
            yield from _linear(f"{mixer}.out_proj", hidden, inner, bias=text.mamba_proj_bias, quantizable=True)
        elif kind == "*":
            head_dim = text.attention_head_dim
            q_dim, kv_dim = text.num_attention_heads * head_dim, text.num_key_value_heads * head_dim
            for proj, out_dim in (("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)):
                yield from _linear(f"{mixer}.{proj}", out_dim, hidden, bias=text.attention_bias, quantizable=True)
            yield from _linear(f"{mixer}.o_proj", hidden, q_dim, bias=text.attention_bias, quantizable=True)
        elif kind == "-":
            yield from _linear(f"{mixer}.up_proj", text.intermediate_size, hidden, bias=text.mlp_bias, quantizable=True)
            yield from _linear(
                f"{mixer}.down_proj", hidden, text.intermediate_size, bias=text.mlp_bias, quantizable=True
            )
        else:
            raise ValueError(f"unsupported Nemotron-H block type {kind!r} at layer {index}")
    yield _t("stt_model.llm.norm_f.weight", (hidden,), "norm")


def _perception(config: VoiceChatConfig) -> Iterator[TensorSpec]:
    audio = config.audio_config
    enc, pre = audio.encoder, audio.preprocessor
    root = "stt_model.perception"
    # Mel filterbank and window buffers: stored, never used (both ports recompute them).
    yield _t(f"{root}.preprocessor.featurizer.fb", (1, pre.features, pre.n_fft // 2 + 1), "buffer", runtime=False)
    yield _t(f"{root}.preprocessor.featurizer.window", (pre.win_length,), "buffer", runtime=False)

    channels = enc.subsampling_conv_channels
    sub = f"{root}.encoder.pre_encode"
    stages = round(math.log2(enc.subsampling_factor))
    conv_indices: list[tuple[int, int, int, int]] = [(0, channels, 3, 1)]  # (index, out, kernel, in)
    for stage in range(stages - 1):
        conv_indices.append((2 + 3 * stage, channels, 3, 1))  # depthwise 3x3
        conv_indices.append((3 + 3 * stage, channels, 1, channels))  # pointwise 1x1
    for index, out_ch, kernel, in_ch in conv_indices:
        yield _t(
            f"{sub}.conv.{index}.weight",
            (out_ch, kernel, kernel, in_ch),
            "weight",
            source_shape=(out_ch, in_ch, kernel, kernel),
            fan_in=kernel * kernel * in_ch,
            transform="conv2d",
        )
        yield _t(f"{sub}.conv.{index}.bias", (out_ch,), "bias")
    yield from _linear(f"{sub}.out", enc.d_model, channels * enc.subsampled_features, bias=True)

    d, ff = enc.d_model, enc.d_model * enc.ff_expansion_factor
    for layer in range(enc.n_layers):
        prefix = f"{root}.encoder.layers.{layer}"
        for norm in ("norm_feed_forward1", "norm_self_att", "norm_conv", "norm_feed_forward2", "norm_out"):
            yield from _layer_norm(f"{prefix}.{norm}", d)
        for ffn in ("feed_forward1", "feed_forward2"):
            yield from _linear(f"{prefix}.{ffn}.linear1", ff, d, bias=enc.use_bias)
            yield from _linear(f"{prefix}.{ffn}.linear2", d, ff, bias=enc.use_bias)
        for proj in ("linear_q", "linear_k", "linear_v", "linear_out"):
            yield from _linear(f"{prefix}.self_attn.{proj}", d, d, bias=enc.use_bias)
        yield from _linear(f"{prefix}.self_attn.linear_pos", d, d)
        yield _t(f"{prefix}.self_attn.pos_bias_u", (enc.n_heads, enc.head_dim), "bias")
        yield _t(f"{prefix}.self_attn.pos_bias_v", (enc.n_heads, enc.head_dim), "bias")
        yield from _conv1d(f"{prefix}.conv.pointwise_conv1", 2 * d, 1, d, bias=enc.use_bias)
        yield from _conv1d(f"{prefix}.conv.depthwise_conv", d, enc.conv_kernel_size, 1, bias=enc.use_bias)
        yield from _layer_norm(f"{prefix}.conv.batch_norm", d)
        yield from _conv1d(f"{prefix}.conv.pointwise_conv2", d, 1, d, bias=enc.use_bias)
    yield from _linear(f"{root}.proj", audio.output_dim, d, bias=True)


def _rnnt(config: VoiceChatConfig) -> Iterator[TensorSpec]:
    audio = config.audio_config
    pred, joint = audio.decoder, audio.joint
    vocab = pred.vocab_size + 1 if pred.blank_as_pad else pred.vocab_size
    prefix = "stt_model.rnnt_decoder.prediction"
    yield _t(f"{prefix}.embed.weight", (vocab, pred.pred_hidden), "embedding")
    hidden = pred.pred_hidden
    for layer in range(pred.pred_rnn_layers):
        lstm = f"{prefix}.dec_rnn.lstm"
        yield _t(
            f"{lstm}.{layer}.Wx",
            (4 * hidden, hidden),
            "weight",
            source_name=f"{lstm}.weight_ih_l{layer}",
            fan_in=hidden,
        )
        yield _t(
            f"{lstm}.{layer}.Wh",
            (4 * hidden, hidden),
            "weight",
            source_name=f"{lstm}.weight_hh_l{layer}",
            fan_in=hidden,
        )
        # The runtime bias is the sum of PyTorch's two LSTM biases.
        yield _t(f"{lstm}.{layer}.bias", (4 * hidden,), "bias", source_name=f"{lstm}.bias_ih_l{layer}")
        yield _t(
            f"{lstm}.{layer}.bias_hh", (4 * hidden,), "bias", source_name=f"{lstm}.bias_hh_l{layer}", runtime=False
        )
    yield from _linear("stt_model.rnnt_joint.enc", joint.joint_hidden, joint.encoder_hidden, bias=True)
    yield from _linear("stt_model.rnnt_joint.pred", joint.joint_hidden, joint.pred_hidden, bias=True)
    yield from _linear("stt_model.rnnt_joint.joint_net.2", joint.num_classes + 1, joint.joint_hidden, bias=True)


def _gemma_layer(
    prefix: str, hidden: int, inter: int, heads: int, kv_heads: int, head_dim: int
) -> Iterator[TensorSpec]:
    attn = f"{prefix}.self_attn"
    yield from _linear(f"{attn}.q_proj", heads * head_dim, hidden)
    yield from _linear(f"{attn}.k_proj", kv_heads * head_dim, hidden)
    yield from _linear(f"{attn}.v_proj", kv_heads * head_dim, hidden)
    yield from _linear(f"{attn}.o_proj", hidden, heads * head_dim)
    yield from _linear(f"{prefix}.mlp.gate_proj", inter, hidden)
    yield from _linear(f"{prefix}.mlp.up_proj", inter, hidden)
    yield from _linear(f"{prefix}.mlp.down_proj", hidden, inter)


def _tts(config: VoiceChatConfig) -> Iterator[TensorSpec]:
    tts = config.tts_config
    hidden, latent = tts.hidden_size, tts.latent_size
    root = "tts_model.tts_model"
    for layer in range(tts.num_hidden_layers):
        prefix = f"{root}.backbone.layers.{layer}"
        yield from _gemma_layer(
            prefix, hidden, tts.intermediate_size, tts.num_attention_heads, tts.num_key_value_heads, tts.head_dim
        )
        yield _t(f"{prefix}.self_attn.q_norm.weight", (tts.head_dim,), "offset_norm")
        yield _t(f"{prefix}.self_attn.k_norm.weight", (tts.head_dim,), "offset_norm")
        for norm in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            yield _t(f"{prefix}.{norm}.weight", (hidden,), "offset_norm")
    yield _t(f"{root}.backbone.norm.weight", (hidden,), "offset_norm")
    yield _t(f"{root}.bos_emb", (hidden,), "embedding")
    yield _t(f"{root}.null_emb", (hidden,), "embedding")
    yield from _linear(f"{root}.embed_code", hidden, latent, gain=2.0)

    char = tts.character_encoder
    sub = f"{root}.embed_subword"
    for layer in range(char.num_hidden_layers):
        prefix = f"{sub}.backbone.encoder.layers.{layer}"
        yield from _gemma_layer(
            prefix,
            char.hidden_size,
            char.intermediate_size,
            char.num_attention_heads,
            char.num_key_value_heads,
            char.head_dim,
        )
        for norm in (
            "pre_self_attn_layernorm",
            "post_self_attn_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
        ):
            yield _t(f"{prefix}.{norm}.weight", (char.hidden_size,), "offset_norm")
    yield _t(f"{sub}.backbone.encoder.norm.weight", (char.hidden_size,), "offset_norm")
    yield _t(f"{sub}.embed_tokens.weight", (char.char_vocab_size, char.hidden_size), "embedding")
    yield from _linear(f"{sub}.proj_embedding", hidden, char.hidden_size)
    # The flag tables are indexed by the full 131072-entry text vocabulary in every checkpoint.
    yield _t(f"{sub}.subword_flag_emb.cont_emb.weight", (2, char.hidden_size), "embedding", gain=0.5)
    yield _t(f"{sub}.subword_flag_emb.is_continuation", (SUBWORD_TABLE_SIZE + 1,), "index")
    yield _t(f"{sub}.subword_flag_emb.pad_tensor", (), "index")
    yield _t(f"{sub}.bos_eos_emb.special_emb.weight", (3, char.hidden_size), "embedding", gain=0.5)
    yield _t(f"{sub}.bos_eos_emb.special_flags", (SUBWORD_TABLE_SIZE,), "index")
    yield _t(f"{sub}.bos_eos_emb.pad_tensor", (), "index")

    fusion = f"{root}.gated_fusion_audio_text"
    yield from _linear(f"{fusion}.audio_proj", hidden, hidden, bias=True)
    yield from _linear(f"{fusion}.text_proj", hidden, hidden, bias=True)
    yield _t(f"{fusion}.gate", (hidden,), "scalar")
    yield _t(f"{fusion}.residual_scale", (), "scalar")
    yield _t(f"{fusion}.final_norm.weight", (hidden,), "offset_norm")
    yield _t(f"{root}.audio_prompt_projection_W", (hidden, hidden), "weight", fan_in=hidden)

    mog = tts.mog_head
    head = f"{root}.mog_head"
    for layer in range(mog.num_layers):
        yield _t(f"{head}.mlp_stack.{layer}.pre_norm.weight", (hidden,), "offset_norm")
        yield from _linear(f"{head}.mlp_stack.{layer}.mlp.gate_proj", mog.intermediate_size, hidden)
        yield from _linear(f"{head}.mlp_stack.{layer}.mlp.up_proj", mog.intermediate_size, hidden)
        yield from _linear(f"{head}.mlp_stack.{layer}.mlp.down_proj", hidden, mog.intermediate_size)
        yield _t(f"{head}.mlp_stack.{layer}.post_norm.weight", (hidden,), "offset_norm")
    yield _t(f"{head}.mlp_stack.{mog.num_layers}.weight", (hidden,), "offset_norm")
    yield from _linear(f"{head}.proj_logits", mog.num_predictions, hidden, gain=2.0)
    yield from _linear(f"{head}.proj_mus", mog.num_predictions * mog.low_rank, hidden)
    yield from _linear(f"{head}.proj_logs", 1, hidden, gain=0.5)
    yield from _linear(f"{head}.proj_else", latent, hidden, gain=0.5)
    yield _t(f"{head}.low_mat", (mog.num_predictions, latent, mog.low_rank), "weight", fan_in=mog.low_rank)
    yield _t(f"{root}.rvq_embs", (tts.num_quantizers, tts.codebook_size, latent), "embedding", gain=0.5)

    yield _t("tts_model.control_codes", (3,), "index", source_name="tts_model._control_codes")
    yield _t("tts_model.audio_prompt_latents.Aria", (1, PROMPT_FRAMES, hidden), "embedding")
    yield _t("tts_model.codec_silence_tokens", (tts.num_quantizers,), "index")


def _convnext(prefix: str, channels: int, kernel: int) -> Iterator[TensorSpec]:
    yield from _conv1d(f"{prefix}.dwconv", channels, kernel, 1, bias=True)
    yield _t(f"{prefix}.norm.weight", (channels,), "norm")
    yield _t(f"{prefix}.norm.bias", (channels,), "bias")
    yield from _conv1d(f"{prefix}.pwconv1", 4 * channels, 1, channels, bias=True)
    yield from _conv1d(f"{prefix}.pwconv2", channels, 1, 4 * channels, bias=True, gain=0.5)


def _codec(config: VoiceChatConfig) -> Iterator[TensorSpec]:
    codec = config.codec_config
    root = "tts_model.audio_codec"
    channels = codec.stage_channels
    kernel = codec.block_kernel_size

    # Encoder: 1x1 stem, then per stage blocks and a strided downsampling conv.
    index = 0
    yield from _conv1d(f"{root}.encoder.layers.{index}", channels[0], 1, codec.stft_channels, bias=False)
    for stage, (width, rate) in enumerate(zip(channels, codec.downsample_rates, strict=True)):
        for _ in range(codec.blocks_per_stage):
            index += 1
            yield from _convnext(f"{root}.encoder.layers.{index}", width, kernel)
        index += 1
        nxt = channels[stage + 1] if stage + 1 < len(channels) else codec.latent_dim
        yield from _conv1d(f"{root}.encoder.layers.{index}", nxt, rate, width, bias=False)

    # Decoder: per stage an upsampling ConvTranspose (stored (I, O, K)) and blocks, then a 1x1 head.
    index = 0
    source = codec.latent_dim
    for width, rate in zip(reversed(channels), reversed(codec.downsample_rates), strict=True):
        yield _t(
            f"{root}.decoder.layers.{index}.weight",
            (width, rate, source),
            "weight",
            source_shape=(source, width, rate),
            fan_in=source,
            transform="conv_transpose1d",
        )
        for _ in range(codec.blocks_per_stage):
            index += 1
            yield from _convnext(f"{root}.decoder.layers.{index}", width, kernel)
        index += 1
        source = width
    yield from _conv1d(f"{root}.decoder.layers.{index}", codec.stft_channels, 1, channels[0], bias=False)

    for q in range(codec.num_quantizers):
        yield _t(f"{root}.prvq.mus_list.{q}", (codec.codebook_size, codec.latent_dim), "embedding", gain=0.5)
    for q in range(codec.num_quantizers):
        yield _t(
            f"{root}.prvq.variance_list.{q}.variance",
            (),
            "scalar",
            source_name=f"{root}.prvq._variance_list.{q}.variance",
        )


SUBWORD_TABLE_SIZE = 131_072
RandomSize = Literal["tiny", "structure", "full"]
RANDOM_SIZES: tuple[RandomSize, ...] = ("tiny", "structure", "full")
"""Sizes of the random-weight checkpoints in this layout (see engine.loading.random_checkpoint)."""
PROMPT_FRAMES = 37  # the Aria speaker latent covers 3 s at 12.5 frames/s, plus the BOS frame


def checkpoint_tensors(config: VoiceChatConfig) -> list[TensorSpec]:
    """Every tensor a checkpoint for ``config`` holds, in a stable order."""
    specs = [*_llm(config), *_perception(config), *_rnnt(config), *_tts(config), *_codec(config)]
    names = [spec.source_name for spec in specs]
    if len(names) != len(set(names)):
        raise AssertionError("layout produced duplicate tensor names")
    return specs


def runtime_tensors(config: VoiceChatConfig) -> dict[str, TensorSpec]:
    """The tensors the runtime modules hold, keyed by runtime name."""
    return {spec.name: spec for spec in checkpoint_tensors(config) if spec.runtime}


def quantized_modules(config: VoiceChatConfig, group_size: int) -> list[str]:
    """Modules the published 4/8-bit repositories quantize (LLM, embedding, heads)."""
    return [spec.module for spec in checkpoint_tensors(config) if spec.quantizable and spec.shape[-1] % group_size == 0]
