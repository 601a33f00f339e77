"""Runtime configuration of a NemotronLabs VoiceChat checkpoint.

The schema is the one written by the mlx-vlm converter into the published
``mlx-community/NemotronLabs-VoiceChat-11B-*`` repositories (``config.json``).
Every section is a frozen dataclass; ``from_dict`` ignores unknown keys and fills
absent ones with the values the reference runtime assumes, so a checkpoint that
loads in mlx-vlm loads here with the same meaning.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from types import UnionType
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

MODEL_TYPE = "nemotron_voicechat"

_T = TypeVar("_T")


def _require_dict(section: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f"config section '{section}' must be an object, got {type(value).__name__}")
    return value


# --------------------------------------------------------------------------- type checks

# Integer fields that may be 0; every other integer field counts or sizes something and must be at least 1.
_ZERO_ALLOWED = frozenset(
    {"pad_to", "bos_token_id", "eos_token_id", "pad_token_id", "silence_token_id", "rnnt_blank_id"}
    | {"num_delay_speech_tokens"}
)
# Fields that set how many times the layout repeats a block: bounded so a hostile file cannot stall loading.
_LOOP_COUNTS = frozenset(
    {"n_layers", "num_hidden_layers", "pred_rnn_layers", "blocks_per_stage", "num_layers", "num_iterations"}
    | {"num_quantizers", "max_symbols"}
)
_MINIMUM = {"att_context_size": -1}  # NeMo's -1: unlimited context
_POSITIVE_FLOATS = frozenset({"frame_duration", "window_size", "window_stride"})
_MAX_INT = 2**31 - 1
_MAX_LOOP = 1024
_MAX_LIST = 64
LAYER_TYPES = "M*-"  # Nemotron-H blocks: Mamba-2, attention, MLP
"""The letters ``hybrid_override_pattern`` may hold."""


def _describe(value: Any) -> str:
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the text {shown!r}"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    if isinstance(value, int):
        return f"{value}" if abs(value) < 10**12 else f"a {len(str(abs(value)))}-digit number"
    if isinstance(value, float):
        return f"{value!r}"
    if value is None:
        return "null"
    if isinstance(value, list | tuple):
        return "a JSON array"
    return "a JSON object" if isinstance(value, dict) else f"a {type(value).__name__}"


def _int(where: str, value: Any, *, minimum: int, maximum: int = _MAX_INT) -> int:
    if isinstance(value, float) and value.is_integer() and abs(value) <= maximum:
        value = int(value)  # 24.0: a converter that writes every number as a float means 24
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} must be a whole number, got {_describe(value)}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{where} must be between {minimum} and {maximum}, got {_describe(value)}")
    return value


def _float(where: str, value: Any, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number, got {_describe(value)}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{where} is too large ({_describe(value)})") from None
    if not math.isfinite(number) or (positive and number <= 0):
        raise ValueError(f"{where} must be a {'positive' if positive else 'finite'} number, got {value!r}")
    return number


def _check_value(where: str, name: str, hint: Any, value: Any) -> Any:
    """``value`` from the JSON file, checked against the field's annotated type (and converted to it)."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, UnionType):
        if value is None and type(None) in args:
            return None
        (hint,) = [arg for arg in args if arg is not type(None)]
        origin, args = get_origin(hint), get_args(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, hint):
            raise ValueError(f"{where} must be an object, got {_describe(value)}")
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where} must be an object, got {_describe(value)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where} must be true or false, got {_describe(value)}")
        return value
    if hint is int:
        minimum = _MINIMUM.get(name, 0 if name in _ZERO_ALLOWED else 1)
        return _int(where, value, minimum=minimum, maximum=_MAX_LOOP if name in _LOOP_COUNTS else _MAX_INT)
    if hint is float:
        return _float(where, value, positive=name in _POSITIVE_FLOATS)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where} must be text, got {_describe(value)}")
        return value
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where} must be a list, got {_describe(value)}")
        if len(args) == 2 and args[1] is Ellipsis:
            item_hints = [args[0]] * len(value)
            if name != "rnnt_vocabulary" and len(value) > _MAX_LIST:
                raise ValueError(f"{where} has {len(value)} entries; at most {_MAX_LIST} are allowed")
        else:
            item_hints = list(args)
            if len(value) != len(args):
                raise ValueError(f"{where} must hold {len(args)} values, got {len(value)}")
        return tuple(
            _check_value(f"{where}[{i}]", name, item_hint, item)
            for i, (item_hint, item) in enumerate(zip(item_hints, value, strict=True))
        )
    raise AssertionError(f"no type check for {where}: {hint!r}")  # a field type added without a check


def _checked(cls: type[_T], section: str, values: dict[str, Any]) -> dict[str, Any]:
    """The keys of ``values`` that ``cls`` knows, each checked against the field's type (unknown keys are ignored)."""
    hints = get_type_hints(cls)
    return {
        f.name: _check_value(f"{section}.{f.name}" if section else f.name, f.name, hints[f.name], values[f.name])
        for f in fields(cls)  # type: ignore[arg-type]
        if f.name in values
    }


# --------------------------------------------------------------------------- perception


@dataclass(frozen=True)
class PreprocessorConfig:
    """Log-mel front end (NeMo AudioToMelSpectrogramPreprocessor at inference)."""

    sample_rate: int = 16_000
    features: int = 128
    n_fft: int = 512
    window_size: float = 0.025
    window_stride: float = 0.01
    window: str = "hann"
    preemph: float = 0.97
    dither: float = 1.0e-5  # training only; never applied at inference
    normalize: str = "NA"
    log_zero_guard_value: float = 2.0**-24
    pad_to: int = 0
    pad_value: float = 0.0
    pad_mode: str = "reflect"

    @property
    def win_length(self) -> int:
        return int(self.window_size * self.sample_rate)

    @property
    def hop_length(self) -> int:
        return int(self.window_stride * self.sample_rate)


@dataclass(frozen=True)
class EncoderConfig:
    """Cache-aware FastConformer encoder."""

    feat_in: int = 128
    n_layers: int = 24
    d_model: int = 1024
    n_heads: int = 8
    ff_expansion_factor: int = 4
    subsampling_factor: int = 8
    subsampling_conv_channels: int = 256
    conv_kernel_size: int = 9
    causal_downsampling: bool = True
    conv_context_size: Any = "causal"
    conv_norm_type: str = "layer_norm"
    self_attention_model: str = "rel_pos"
    att_context_style: str = "chunked_limited"
    att_context_size: tuple[tuple[int, int], ...] = ((70, 0),)
    pos_emb_max_len: int = 5000
    use_bias: bool = False
    xscaling: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> EncoderConfig:
        values = dict(values)
        context = values.get("att_context_size")
        if isinstance(context, list) and context and all(isinstance(v, int) for v in context):
            values["att_context_size"] = [context]  # one [left, right] pair written without the outer list
        elif not context:
            values.pop("att_context_size", None)
        causal = values.get("conv_context_size", "causal")
        if causal != "causal" and not (
            isinstance(causal, list) and len(causal) == 2 and all(isinstance(v, int) and v >= 0 for v in causal)
        ):
            raise ValueError(
                f'audio_config.encoder.conv_context_size must be "causal" or [left, right], got {_describe(causal)}'
            )
        return cls(**_checked(cls, "audio_config.encoder", values))

    @property
    def left_context(self) -> int:
        return self.att_context_size[0][0]

    @property
    def right_context(self) -> int:
        return self.att_context_size[0][1]

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def subsampled_features(self) -> int:
        """Frequency bins left after the stride-2 causal stages (128 -> 17)."""
        freq = self.feat_in
        for _ in range(int(math.log2(self.subsampling_factor))):
            freq = (freq + 2 + 1 - 3) // 2 + 1
        return freq


@dataclass(frozen=True)
class PredictorConfig:
    """RNN-T prediction network."""

    pred_hidden: int = 640
    pred_rnn_layers: int = 2
    vocab_size: int = 1024
    blank_as_pad: bool = True


@dataclass(frozen=True)
class JointConfig:
    """RNN-T joint network."""

    joint_hidden: int = 640
    activation: str = "relu"
    encoder_hidden: int = 1024
    pred_hidden: int = 640
    num_classes: int = 1024


@dataclass(frozen=True)
class PerceptionConfig:
    """``audio_config``: front end, encoder, projection and the RNN-T head."""

    preprocessor: PreprocessorConfig = field(default_factory=PreprocessorConfig)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: PredictorConfig = field(default_factory=PredictorConfig)
    joint: JointConfig = field(default_factory=JointConfig)
    output_dim: int = 4480
    max_symbols: int = 10

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PerceptionConfig:
        parts = {
            "preprocessor": PreprocessorConfig(
                **_checked(
                    PreprocessorConfig,
                    "audio_config.preprocessor",
                    _require_dict("audio_config.preprocessor", values.get("preprocessor")),
                )
            ),
            "encoder": EncoderConfig.from_dict(_require_dict("audio_config.encoder", values.get("encoder"))),
            "decoder": PredictorConfig(
                **_checked(
                    PredictorConfig,
                    "audio_config.decoder",
                    _require_dict("audio_config.decoder", values.get("decoder")),
                )
            ),
            "joint": JointConfig(
                **_checked(JointConfig, "audio_config.joint", _require_dict("audio_config.joint", values.get("joint")))
            ),
        }
        return cls(**_checked(cls, "audio_config", {**values, **parts}))


# --------------------------------------------------------------------------- language model


@dataclass(frozen=True)
class LLMConfig:
    """``text_config``: the Nemotron-H hybrid (Mamba-2 / attention / ReLU² MLP)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    mamba_num_heads: int
    mamba_head_dim: int
    ssm_state_size: int
    n_groups: int
    conv_kernel: int
    hybrid_override_pattern: str
    head_dim: int | None = None
    attention_bias: bool = False
    mamba_proj_bias: bool = False
    mlp_bias: bool = False
    use_bias: bool = False
    use_conv_bias: bool = True
    layer_norm_epsilon: float = 1e-5
    max_position_embeddings: int = 131_072
    # Absent from the published config: the runtime then applies no clamp.
    time_step_limit: tuple[float, float] = (0.0, math.inf)
    model_type: str = "nemotron_h"

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> LLMConfig:
        values = dict(values)
        pattern = values.get("hybrid_override_pattern")
        if isinstance(pattern, list) and all(isinstance(letter, str) for letter in pattern):
            values["hybrid_override_pattern"] = pattern = "".join(pattern)
        if isinstance(pattern, str):
            unknown = sorted(set(pattern) - set(LAYER_TYPES))
            if unknown or not 0 < len(pattern) <= _MAX_LOOP:
                raise ValueError(
                    f"text_config.hybrid_override_pattern must be 1 to {_MAX_LOOP} of the letters "
                    f"{', '.join(LAYER_TYPES)}; it holds {len(pattern)}"
                    + (f", with the unknown block letter {unknown[0]!r}" if unknown else "")
                )
        if "ssm_state_size" not in values and "mamba_state_dim" in values:
            values["ssm_state_size"] = values["mamba_state_dim"]
        if "n_groups" not in values and "mamba_num_groups" in values:
            values["n_groups"] = values["mamba_num_groups"]
        if values.get("time_step_limit") is None:
            values.pop("time_step_limit", None)  # absent: no clamp (the field's default)
        required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
        missing = [name for name in required if name not in values]
        if missing:
            raise ValueError(f"text_config lacks required keys: {', '.join(missing)}")
        return cls(**_checked(cls, "text_config", values))

    @property
    def num_hidden_layers(self) -> int:
        return len(self.hybrid_override_pattern)

    @property
    def attention_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def mamba_intermediate_size(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        return self.mamba_intermediate_size + 2 * self.n_groups * self.ssm_state_size

    @property
    def mamba_projection_size(self) -> int:
        return self.mamba_intermediate_size + self.mamba_conv_dim + self.mamba_num_heads


# --------------------------------------------------------------------------- speech generation


@dataclass(frozen=True)
class CharEncoderConfig:
    """The one-layer T5Gemma encoder inside the character-aware subword encoder."""

    hidden_size: int = 1152
    intermediate_size: int = 4608
    num_hidden_layers: int = 1
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 72
    rms_norm_eps: float = 1e-6
    query_pre_attn_scalar: float = 256.0
    attn_logit_softcapping: float = 50.0
    rope_base: float = 10_000.0
    char_vocab_size: int = 257


@dataclass(frozen=True)
class MoGConfig:
    """Mixture-of-Gaussians head of EAR-TTS."""

    intermediate_size: int = 4608
    low_rank: int = 64
    min_log_std: float = -4.0
    num_layers: int = 3
    num_predictions: int = 1024
    eps: float = 1e-6


@dataclass(frozen=True)
class TTSConfig:
    """EAR-TTS: Gemma-3 backbone, subword conditioning, MoG head and RVQ search."""

    hidden_size: int = 1152
    intermediate_size: int = 4608
    num_hidden_layers: int = 28
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int = 72
    sliding_window: int = 7500
    sliding_window_pattern: int = 6
    rms_norm_eps: float = 1e-6
    query_pre_attn_scalar: float = 256.0
    rope_global_base_freq: float = 1_000_000.0
    rope_local_base_freq: float = 10_000.0
    latent_size: int = 512
    num_quantizers: int = 31
    codebook_size: int = 1024
    num_delay_speech_tokens: int = 2
    num_iterations: int = 8
    guidance_scale: float = 0.2
    top_p: float = 0.95
    noise_scale: float = 0.001
    exponent: float = 3.0
    disable_eos_prediction: bool = True
    use_gated_fusion_for_text_audio: bool = True
    use_subword_flag_emb: bool = True
    use_bos_eos_emb: bool = True
    use_audio_prompt_frozen_projection: bool = True
    audio_prompt_duration: float = 3.0
    character_encoder: CharEncoderConfig = field(default_factory=CharEncoderConfig)
    mog_head: MoGConfig = field(default_factory=MoGConfig)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TTSConfig:
        values = dict(values)
        values["character_encoder"] = CharEncoderConfig(
            **_checked(
                CharEncoderConfig,
                "tts_config.character_encoder",
                _require_dict("tts_config.character_encoder", values.get("character_encoder")),
            )
        )
        values["mog_head"] = MoGConfig(
            **_checked(MoGConfig, "tts_config.mog_head", _require_dict("tts_config.mog_head", values.get("mog_head")))
        )
        return cls(**_checked(cls, "tts_config", values))

    def is_global_layer(self, index: int) -> bool:
        return (index + 1) % self.sliding_window_pattern == 0

    @property
    def mask_code(self) -> int:
        """Code id meaning 'not yet generated' (one past the codebook)."""
        return self.codebook_size

    @property
    def refinement_counts(self) -> tuple[int, ...]:
        """Quantizers filled per MaskGIT iteration (cosine-cubed schedule)."""
        rates = [i / self.num_iterations for i in range(self.num_iterations)]
        masked = [
            math.ceil(((1.0 - rate**self.exponent) ** (1.0 / self.exponent)) * self.num_quantizers) for rate in rates
        ]
        return tuple(masked[i] - (masked[i + 1] if i + 1 < len(masked) else 0) for i in range(len(masked)))


@dataclass(frozen=True)
class CodecConfig:
    """The 22.05 kHz, 31-codebook ConvNeXt/iSTFT codec."""

    sample_rate: int = 22_050
    base_channels: int = 384
    channel_multipliers: tuple[int, ...] = (1, 2, 4)
    downsample_rates: tuple[int, ...] = (7, 7, 9)
    blocks_per_stage: int = 3
    block_kernel_size: int = 7
    latent_dim: int = 512
    n_fft: int = 16
    hop_length: int = 4
    num_quantizers: int = 31
    codebook_size: int = 1024

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> CodecConfig:
        return cls(**_checked(cls, "codec_config", values))

    @property
    def samples_per_frame(self) -> int:
        ratio = self.hop_length
        for rate in self.downsample_rates:
            ratio *= rate
        return ratio

    @property
    def stft_channels(self) -> int:
        return 2 * (self.n_fft // 2 + 1)

    @property
    def stage_channels(self) -> tuple[int, ...]:
        return tuple(self.base_channels * m for m in self.channel_multipliers)


# --------------------------------------------------------------------------- whole model


@dataclass(frozen=True)
class VoiceChatConfig:
    """The whole ``config.json`` of a VoiceChat checkpoint."""

    text_config: LLMConfig
    audio_config: PerceptionConfig = field(default_factory=PerceptionConfig)
    tts_config: TTSConfig = field(default_factory=TTSConfig)
    codec_config: CodecConfig = field(default_factory=CodecConfig)
    model_type: str = MODEL_TYPE
    bos_token_id: int = 1
    eos_token_id: int = 2
    pad_token_id: int = 12
    silence_token_id: int = 11
    rnnt_blank_id: int = 1024
    input_sample_rate: int = 16_000
    output_sample_rate: int = 22_050
    frame_duration: float = 0.08
    function_channel_weight: float = 2.0
    default_system_prompt: str = ""
    rnnt_vocabulary: tuple[str, ...] = ()
    speaker: str = "Aria"
    quantization: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> VoiceChatConfig:
        if not isinstance(values, dict):
            raise ValueError("config.json must hold a JSON object")
        model_type = values.get("model_type")
        if model_type != MODEL_TYPE:
            raise ValueError(f"model_type is {model_type!r}, expected {MODEL_TYPE!r}")
        if not values.get("text_config"):
            raise ValueError("config.json lacks 'text_config'")
        top = dict(values)
        top["text_config"] = LLMConfig.from_dict(_require_dict("text_config", values["text_config"]))
        top["audio_config"] = PerceptionConfig.from_dict(_require_dict("audio_config", values.get("audio_config")))
        top["tts_config"] = TTSConfig.from_dict(_require_dict("tts_config", values.get("tts_config")))
        top["codec_config"] = CodecConfig.from_dict(_require_dict("codec_config", values.get("codec_config")))
        top["quantization"] = _quantization(values.get("quantization", values.get("quantization_config")))
        return cls(**_checked(cls, "", top))

    @property
    def frame_samples(self) -> int:
        """Input samples per 80 ms frame (1280 at 16 kHz)."""
        return round(self.input_sample_rate * self.frame_duration)

    @property
    def output_frame_samples(self) -> int:
        """Output samples per frame (1764 at 22.05 kHz)."""
        return self.codec_config.samples_per_frame

    @property
    def special_text_ids(self) -> frozenset[int]:
        """Channel ids that carry no text: PAD, silence, BOS, EOS."""
        return frozenset({self.pad_token_id, self.silence_token_id, self.bos_token_id, self.eos_token_id})

    @property
    def quantization_bits(self) -> int | None:
        return None if self.quantization is None else int(self.quantization["bits"])

    @property
    def quantization_group_size(self) -> int | None:
        return None if self.quantization is None else int(self.quantization["group_size"])


def _quantization(block: Any) -> dict[str, Any] | None:
    """The ``quantization`` object, checked: ``group_size`` and ``bits`` whole numbers, per-module entries alike."""
    if not block:
        return None
    if not isinstance(block, dict):
        raise ValueError(f"quantization must be an object, got {_describe(block)}")
    for key in ("group_size", "bits"):
        if key not in block:
            raise ValueError(f"quantization lacks {key!r}")
        _int(f"quantization.{key}", block[key], minimum=1, maximum=64 if key == "bits" else _MAX_INT)
    if block.get("mode", "affine") != "affine":
        raise ValueError(f"quantization.mode {_describe(block['mode'])} is not supported (only affine)")
    for module, entry in block.items():
        if isinstance(entry, dict):
            for key in ("group_size", "bits"):
                if key in entry:
                    _int(
                        f"quantization.{module}.{key}", entry[key], minimum=1, maximum=64 if key == "bits" else _MAX_INT
                    )
    return dict(block)
