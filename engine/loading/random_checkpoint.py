"""Random-weight VoiceChat checkpoints in the exact published layout.

The real 11B weights cannot be fetched where Parley is developed and tested, so
correctness is shown on seeded random weights: ``tiny`` shrinks every width while
keeping every component (Mamba and attention LLM layers, sliding and global TTS
layers, every codec stage), ``structure`` has tiny widths but the full size's layer
counts (24 Conformer layers, the 56-block Nemotron-H pattern, 28 TTS layers) and
sliding window, so a frame runs the same operations as at full size (for counting
them; see engine.counters), and ``full`` has the real shapes of
``mlx-community/NemotronLabs-VoiceChat-11B-{bf16,8bit,4bit}`` and is written shard
by shard. Weights are scaled so that the untrained pipeline produces finite,
varied outputs: text and function ids that change from frame to frame with PAD and
EOS among them, RNN-T tokens between blanks, and audible codec output.
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from .config import VoiceChatConfig
from .layout import RANDOM_SIZES, SUBWORD_TABLE_SIZE, RandomSize, TensorSpec, checkpoint_tensors, quantized_modules

Size = RandomSize
QUANTIZE_CHOICES = (None, 4, 8)
GROUP_SIZE = 64
SHARD_BYTES = {"tiny": 2 << 20, "structure": 2 << 20, "full": 5 << 30}
RANDOM_WEIGHTS_KEY = "parley_random_weights"
"""The ``config.json`` field that marks a checkpoint written here: its weights are random, it makes noise, not
speech. Loaders ignore unknown fields, so the published layout still loads; the app reads it to treat the folder
like the demo (label, level, no speed praise)."""

# Same split as the Nemotron-Nano tokenizer's pre-tokenizer.
_PRETOKENIZE_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|"
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|"
    r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Words whose merges come first, so English prompts tokenize into plausible pieces.
_SEED_WORDS = tuple(
    (
        "the and you what is of to in that it for are with this be on your can have not as how do "
        "me my we at hello hi please thank thanks yes no capital france paris weather today time "
        "call function tool assistant user voice chat answer question speak sentence one concise "
        "name is are was were help here there where when who why which would could "
    ).split()
)


# --------------------------------------------------------------------------- configs


def _nemotron_pattern_full() -> str:
    return "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


def base_config(size: Size) -> dict[str, Any]:
    """The runtime ``config.json`` (without quantization) for a model size."""
    if size == "full":
        text: dict[str, Any] = {
            "vocab_size": 131_072,
            "hidden_size": 4480,
            "intermediate_size": 15_680,
            "num_attention_heads": 40,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "mamba_num_heads": 128,
            "mamba_head_dim": 80,
            "ssm_state_size": 128,
            "n_groups": 8,
            "hybrid_override_pattern": _nemotron_pattern_full(),
        }
        encoder = {"n_layers": 24, "d_model": 1024, "n_heads": 8, "subsampling_conv_channels": 256}
        rnnt = {"vocab": 1024, "hidden": 640}
        tts = {
            "hidden_size": 1152,
            "intermediate_size": 4608,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 72,
            "sliding_window": 7500,
            "latent_size": 512,
            "codebook_size": 1024,
        }
        char = {
            "hidden_size": 1152,
            "intermediate_size": 4608,
            "num_hidden_layers": 1,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 72,
        }
        mog = {"intermediate_size": 4608, "low_rank": 64, "num_layers": 3, "num_predictions": 1024}
        codec_channels = 384
    elif size in ("tiny", "structure"):
        text = {
            "vocab_size": 1024,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 2,
            "hybrid_override_pattern": "M-*M-M*",
        }
        encoder = {"n_layers": 2, "d_model": 64, "n_heads": 2, "subsampling_conv_channels": 16}
        rnnt = {"vocab": 64, "hidden": 32}
        # A short sliding window makes the tiny model rotate its TTS caches within a test.
        tts = {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 6,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 16,
            "sliding_window": 48,
            "latent_size": 32,
            "codebook_size": 128,
        }
        char = {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "num_key_value_heads": 4,
            "head_dim": 16,
        }
        mog = {"intermediate_size": 128, "low_rank": 8, "num_layers": 3, "num_predictions": 64}
        codec_channels = 8
        if size == "structure":
            # Full layer counts, and the full head sizes: a GPU picks its attention kernel by head size.
            text.update(hybrid_override_pattern=_nemotron_pattern_full(), head_dim=128)
            encoder.update(n_layers=24, d_model=128, n_heads=1)
            tts.update(num_hidden_layers=28, sliding_window=7500, head_dim=72)
    else:
        raise ValueError(f"size must be one of {', '.join(RANDOM_SIZES)}; got {size!r}")

    text.update(
        model_type="nemotron_h",
        num_hidden_layers=len(text["hybrid_override_pattern"]),
        max_position_embeddings=131_072,
        attention_bias=False,
        mamba_proj_bias=False,
        conv_kernel=4,
        mlp_bias=False,
        layer_norm_epsilon=1e-5,
        use_bias=False,
        use_conv_bias=True,
    )
    return {
        "model_type": "nemotron_voicechat",
        "architectures": ["NemotronVoiceChatForConditionalGeneration"],
        "text_config": text,
        "audio_config": {
            "preprocessor": {
                "sample_rate": 16000,
                "features": 128,
                "n_fft": 512,
                "window_size": 0.025,
                "window_stride": 0.01,
                "window": "hann",
                "preemph": 0.97,
                "dither": 1e-5,
                "normalize": "NA",
                "log_zero_guard_value": 2.0**-24,
                "pad_to": 0,
                "pad_value": 0.0,
            },
            "encoder": {
                "feat_in": 128,
                "ff_expansion_factor": 4,
                "subsampling_factor": 8,
                "conv_kernel_size": 9,
                "causal_downsampling": True,
                "conv_context_size": "causal",
                "conv_norm_type": "layer_norm",
                "self_attention_model": "rel_pos",
                "att_context_style": "chunked_limited",
                "att_context_size": [[70, 0]],
                "pos_emb_max_len": 5000,
                "use_bias": False,
                "xscaling": False,
                **encoder,
            },
            "decoder": {
                "pred_hidden": rnnt["hidden"],
                "pred_rnn_layers": 2,
                "vocab_size": rnnt["vocab"],
                "blank_as_pad": True,
            },
            "joint": {
                "joint_hidden": rnnt["hidden"],
                "activation": "relu",
                "encoder_hidden": encoder["d_model"],
                "pred_hidden": rnnt["hidden"],
                "num_classes": rnnt["vocab"],
            },
            "output_dim": text["hidden_size"],
            "max_symbols": 10,
        },
        "tts_config": {
            **tts,
            "num_quantizers": 31,
            "num_delay_speech_tokens": 2,
            "exponent": 3.0,
            "disable_eos_prediction": True,
            "use_gated_fusion_for_text_audio": True,
            "use_subword_flag_emb": True,
            "use_bos_eos_emb": True,
            "use_audio_prompt_frozen_projection": True,
            "character_encoder": char,
            "mog_head": {**mog, "min_log_std": -4.0},
            "guidance_scale": 0.2,
            "top_p": 0.95,
            "noise_scale": 0.001,
            "audio_prompt_duration": 3.0,
        },
        "codec_config": {
            "sample_rate": 22050,
            "base_channels": codec_channels,
            "channel_multipliers": [1, 2, 4],
            "downsample_rates": [7, 7, 9],
            "blocks_per_stage": 3,
            "block_kernel_size": 7,
            "latent_dim": tts["latent_size"],
            "n_fft": 16,
            "hop_length": 4,
            "num_quantizers": 31,
            "codebook_size": tts["codebook_size"],
        },
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 12,
        "silence_token_id": 11,
        "rnnt_blank_id": rnnt["vocab"],
        "input_sample_rate": 16000,
        "output_sample_rate": 22050,
        "frame_duration": 0.08,
        "function_channel_weight": 2.0,
        "speaker": "Aria",
        "rnnt_vocabulary": rnnt_vocabulary(rnnt["vocab"]),
    }


def quantization_block(config: VoiceChatConfig, bits: int) -> dict[str, Any]:
    """``quantization`` as the published repositories record it: defaults plus one entry per module."""
    block: dict[str, Any] = {"group_size": GROUP_SIZE, "bits": bits}
    for module in quantized_modules(config, GROUP_SIZE):
        block[module] = {"group_size": GROUP_SIZE, "bits": bits}
    return block


# --------------------------------------------------------------------------- tokenizers


def rnnt_vocabulary(size: int) -> list[str]:
    """A SentencePiece-like piece list: specials, a language tag, letters, then words."""
    pieces = ["<unk>", "<en-US>", "\u2581"]
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    pieces += list(letters)
    pieces += ["\u2581" + c for c in letters]
    pieces += ["\u2581" + w for w in _SEED_WORDS]
    pieces += [a + b for a in letters for b in letters]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    unique = list(dict.fromkeys(pieces))
    if len(unique) < size:
        raise ValueError(f"cannot build {size} RNN-T pieces")
    return unique[:size]


def special_token_names(count: int) -> list[str]:
    names = ["<unk>", "<s>", "</s>"]
    names += [f"<SPECIAL_{index}>" for index in range(3, count)]
    return names


def build_tokenizer(vocab_size: int, *, seed: int = 0) -> Tokenizer:
    """A byte-level BPE whose vocabulary covers every id with exactly 256 one-character tokens.

    Layout follows the Nemotron-Nano tokenizer: special tokens first (``<unk>``,
    ``<s>``, ``</s>``, ``<SPECIAL_k>``), then the 256 byte symbols, then merges.
    """
    num_special = 1000 if vocab_size >= 65_536 else 32
    specials = special_token_names(num_special)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    byte_encoder = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for name in specials:
        vocab[name] = len(vocab)
    for char in alphabet:
        vocab[char] = len(vocab)
    merges: list[tuple[str, str]] = []

    def add_merge(left: str, right: str) -> None:
        token = left + right
        if token in vocab or len(vocab) >= vocab_size:
            return
        merges.append((left, right))
        vocab[token] = len(vocab)

    for word in _SEED_WORDS:
        for prefix in ("\u0120", ""):  # 'Ġ' marks a leading space in byte-level BPE
            symbols = [prefix + word[0]] if prefix else [word[0]]
            if prefix:
                add_merge(prefix, word[0])
            for char in word[1:]:
                add_merge(symbols[-1], char)
                symbols.append(symbols[-1] + char)
    # Fill the remaining ids with seeded merges of existing short tokens.
    rng = np.random.default_rng(seed + 7919)
    printable = [byte_encoder[b] for b in range(32, 127)]
    tokens = list(vocab)[num_special:]
    attempts = 0
    while len(vocab) < vocab_size:
        attempts += 1
        if attempts > 50 * vocab_size:
            raise RuntimeError("could not fill the tokenizer vocabulary")
        left = (
            tokens[int(rng.integers(len(tokens)))]
            if rng.random() < 0.7
            else printable[int(rng.integers(len(printable)))]
        )
        right = printable[int(rng.integers(len(printable)))]
        if len(left) > 12:
            continue
        before = len(vocab)
        add_merge(left, right)
        if len(vocab) > before:
            tokens.append(left + right)

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(specials)
    return tokenizer


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {byte: chr(code) for byte, code in zip(printable, codes, strict=True)}


def write_tokenizer_files(tokenizer: Tokenizer, out: Path) -> None:
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<SPECIAL_12>",
                "clean_up_tokenization_spaces": False,
                "model_max_length": 131072,
                "fix_mistral_regex": True,
            },
            indent=2,
        )
        + "\n"
    )
    (out / "special_tokens_map.json").write_text(
        json.dumps(
            {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<SPECIAL_12>"}, indent=2
        )
        + "\n"
    )


def subword_flag_tables(tokenizer: Tokenizer, bos_id: int, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """NeMo's continuation flags and BOS/EOS flags over the full 131072-entry table."""
    is_continuation = np.zeros(SUBWORD_TABLE_SIZE + 1, dtype=np.int64)
    for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if token and not token.startswith(("\u0120", "\u2581", "<")):
            is_continuation[index] = 1
    special_flags = np.zeros(SUBWORD_TABLE_SIZE, dtype=np.int64)
    special_flags[bos_id] = 1
    special_flags[eos_id] = 2
    return is_continuation, special_flags


# --------------------------------------------------------------------------- weights


def _key(seed: int, name: str) -> mx.array:
    return mx.random.key((seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0xFFFFFFFF)


class _WeightFactory:
    """Seeded values for each tensor; every tensor has its own key, so order does not matter."""

    def __init__(self, config: VoiceChatConfig, tokenizer: Tokenizer, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.is_continuation, self.special_flags = subword_flag_tables(
            tokenizer, config.bos_token_id, config.eos_token_id
        )
        self._codebooks: mx.array | None = None

    def normal(self, spec: TensorSpec, scale: float, shape: tuple[int, ...] | None = None) -> mx.array:
        return mx.random.normal(shape or spec.source_shape, key=_key(self.seed, spec.source_name)) * scale

    def codebooks(self) -> mx.array:
        # NeMo binds the TTS RVQ embeddings to the codec's PRVQ means; keep them equal.
        if self._codebooks is None:
            codec = self.config.codec_config
            shape = (codec.num_quantizers, codec.codebook_size, codec.latent_dim)
            self._codebooks = mx.random.normal(shape, key=_key(self.seed, "codebooks")) * 0.5
        return self._codebooks

    def value(self, spec: TensorSpec) -> mx.array:
        name, config = spec.source_name, self.config
        if spec.role == "weight":
            value = self.normal(spec, spec.gain / math.sqrt(spec.fan_in))
            return self._steer(spec, value)
        if spec.role == "embedding":
            if name.endswith("rvq_embs"):
                return self.codebooks()
            if ".prvq.mus_list." in name:
                return self.codebooks()[int(name.rsplit(".", 1)[1])]
            return self.normal(spec, spec.gain)
        if spec.role == "bias":
            value = self.normal(spec, 0.02)
            if name == "stt_model.rnnt_joint.joint_net.2.bias":
                # Lean towards blank so transcripts grow by a token or two per frame, not ten.
                value = value + mx.array(np.eye(1, spec.shape[0], config.rnnt_blank_id)[0] * 1.0, mx.float32)
            return value
        if spec.role == "norm":
            return 1.0 + self.normal(spec, 0.05)
        if spec.role == "offset_norm":
            return self.normal(spec, 0.05)
        if spec.role == "scalar":
            return self._scalar(spec)
        if spec.role == "index":
            return self._index(spec)
        if spec.role == "buffer":
            return mx.abs(self.normal(spec, 0.01))
        raise AssertionError(spec.role)

    def _steer(self, spec: TensorSpec, value: mx.array) -> mx.array:
        """Enlarge the rows of special ids in the vocab heads so they are chosen now and then."""
        config = self.config
        if spec.source_name == "stt_model.lm_head.weight":
            boosts = {config.pad_token_id: 3.0, config.eos_token_id: 2.2, config.bos_token_id: 1.8}
        elif spec.source_name == "stt_model.function_head.weight":
            boosts = {config.pad_token_id: 3.5, 20: 2.0, 21: 2.0}
        else:
            return value
        scale = np.ones((spec.shape[0], 1), dtype=np.float32)
        for token, factor in boosts.items():
            scale[token] = factor
        return value * mx.array(scale)

    def _scalar(self, spec: TensorSpec) -> mx.array:
        name = spec.source_name
        if name.endswith(".A_log"):
            heads = spec.shape[0]
            return mx.log(mx.linspace(1.0, 16.0, heads))
        if name.endswith(".D"):
            return 1.0 + self.normal(spec, 0.1)
        if name.endswith(".dt_bias"):
            return -3.0 + self.normal(spec, 0.5)
        if name.endswith("gated_fusion_audio_text.gate"):
            return self.normal(spec, 1.0)
        if name.endswith("residual_scale"):
            return mx.array(0.5)
        if name.endswith(".variance"):
            return mx.array(1.0)
        raise AssertionError(f"no initialiser for {name}")

    def _index(self, spec: TensorSpec) -> mx.array:
        name, tts = spec.source_name, self.config.tts_config
        if name.endswith("is_continuation"):
            return mx.array(self.is_continuation)
        if name.endswith("special_flags"):
            return mx.array(self.special_flags)
        if name.endswith("subword_flag_emb.pad_tensor"):
            return mx.array(SUBWORD_TABLE_SIZE, dtype=mx.int64)
        if name.endswith("bos_eos_emb.pad_tensor"):
            return mx.array(SUBWORD_TABLE_SIZE - 1, dtype=mx.int64)
        if name.endswith("_control_codes"):
            # NeMo order: speech BOS, speech EOS, speech PAD (= the mask code).
            return mx.array([tts.codebook_size + 2, tts.codebook_size + 1, tts.codebook_size], dtype=mx.int64)
        if name.endswith("codec_silence_tokens"):
            rng = np.random.default_rng(self.seed + 31)
            return mx.array(rng.integers(0, tts.codebook_size, tts.num_quantizers), dtype=mx.int64)
        raise AssertionError(f"no initialiser for {name}")


def generate_tensors(
    config: VoiceChatConfig, tokenizer: Tokenizer, *, seed: int, bits: int | None
) -> Iterator[tuple[str, mx.array]]:
    """Yield ``(source name, array)`` for every stored tensor, quantized where the published repos are."""
    factory = _WeightFactory(config, tokenizer, seed)
    quantized = set(quantized_modules(config, GROUP_SIZE)) if bits else set()
    for spec in checkpoint_tensors(config):
        value = factory.value(spec)
        if spec.role in ("index",):
            yield spec.source_name, value
            continue
        if spec.module in quantized and spec.name.endswith(".weight"):
            weight, scales, biases = mx.quantize(value.astype(mx.float32), group_size=GROUP_SIZE, bits=bits)
            yield spec.source_name, weight
            yield spec.source_name.removesuffix(".weight") + ".scales", scales
            yield spec.source_name.removesuffix(".weight") + ".biases", biases
        elif spec.role == "buffer":
            yield spec.source_name, value.astype(mx.float32)
        else:
            yield spec.source_name, value.astype(mx.bfloat16)


def make_checkpoint(
    out: str | Path,
    *,
    size: Size = "tiny",
    quantize: int | None = None,
    seed: int = 0,
    shard_bytes: int | None = None,
    overwrite: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write a seeded random checkpoint to ``out`` and return its path.

    Args:
        out: target folder (created; must be empty unless ``overwrite``).
        size: ``"tiny"`` for tests and the demo, ``"full"`` for the real 11B shapes.
        quantize: ``None`` for bf16, or 4 / 8 for the published affine quantization
            (group size 64, float32 scales and biases).
        seed: seeds every tensor and the tokenizer merges.
        shard_bytes: shard size limit; defaults to 2 MiB (tiny) or 5 GiB (full).
    """
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of none, 4, 8; got {quantize!r}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise FileExistsError(f"{out} is not empty")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    report = progress or (lambda message: None)

    raw = base_config(size)
    config = VoiceChatConfig.from_dict(raw)
    if quantize:
        block = quantization_block(config, quantize)
        raw["quantization"] = block
        raw["quantization_config"] = block
    raw[RANDOM_WEIGHTS_KEY] = {"size": size, "seed": seed, "note": "random weights: noise, not speech"}
    (out / "config.json").write_text(json.dumps(raw, indent=2, ensure_ascii=False) + "\n")

    tokenizer = build_tokenizer(config.text_config.vocab_size, seed=seed)
    write_tokenizer_files(tokenizer, out)

    limit = shard_bytes or SHARD_BYTES[size]
    shards: list[dict[str, mx.array]] = [{}]
    pending_bytes = 0
    written: list[tuple[str, list[str]]] = []
    total_bytes = 0

    def flush(final: bool) -> None:
        nonlocal pending_bytes
        if not shards[-1]:
            return
        name = f"model-{len(written) + 1:05d}.safetensors"
        mx.save_safetensors(str(out / name), shards[-1], metadata={"format": "mlx"})
        written.append((name, list(shards[-1])))
        report(f"wrote shard {len(written)} ({_human_bytes(pending_bytes)})")
        shards[-1] = {}
        pending_bytes = 0

    for name, value in generate_tensors(config, tokenizer, seed=seed, bits=quantize):
        mx.eval(value)
        if pending_bytes and pending_bytes + value.nbytes > limit:
            flush(final=False)
        shards[-1][name] = value
        pending_bytes += value.nbytes
        total_bytes += value.nbytes
    flush(final=True)

    # Rename to the Hugging Face "-of-" pattern now that the shard count is known.
    weight_map: dict[str, str] = {}
    count = len(written)
    for index, (name, keys) in enumerate(written, start=1):
        final_name = f"model-{index:05d}-of-{count:05d}.safetensors"
        (out / name).rename(out / final_name)
        weight_map.update({key: final_name for key in keys})
    index_doc = {"metadata": {"total_size": total_bytes}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index_doc, indent=2) + "\n")
    return out


def has_random_weights(raw_config: dict[str, Any]) -> bool:
    """Whether a checkpoint's ``config.json`` (as read) marks it as written by :func:`make_checkpoint`."""
    return isinstance(raw_config.get(RANDOM_WEIGHTS_KEY), dict)


def _human_bytes(count: int) -> str:
    return f"{count / 1e9:.2f} GB" if count >= 1e9 else f"{count / 1e6:.1f} MB"


def checkpoint_nbytes(size: Size, quantize: int | None) -> int:
    """Bytes of tensor data a checkpoint of this size and quantization holds (computed, not written)."""
    config = VoiceChatConfig.from_dict(base_config(size))
    quantized = set(quantized_modules(config, GROUP_SIZE)) if quantize else set()
    total = 0
    for spec in checkpoint_tensors(config):
        count = math.prod(spec.source_shape)
        if spec.role == "index":
            total += 8 * count
        elif spec.role == "buffer":
            total += 4 * count
        elif quantize and spec.module in quantized and spec.name.endswith(".weight"):  # quantized: empty without
            out_dim, in_dim = spec.shape
            total += out_dim * in_dim * quantize // 8 + 2 * 4 * out_dim * (in_dim // GROUP_SIZE)
        else:
            total += 2 * count
    return total


def random_weights(
    size: Size = "tiny", *, quantize: int | None = None, seed: int = 0
) -> tuple[dict[str, Any], VoiceChatConfig, dict[str, mx.array], dict[str, tuple[int, int]], Tokenizer, int]:
    """Seeded random weights made in memory, exactly those :func:`make_checkpoint` would write.

    Returns ``(raw_config, config, runtime_weights, quantized_modules, tokenizer, stored_bytes)``.
    """
    from .checkpoint import sanitize

    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of none, 4, 8; got {quantize!r}")
    raw = base_config(size)
    config = VoiceChatConfig.from_dict(raw)
    if quantize:
        raw["quantization"] = quantization_block(config, quantize)
        raw["quantization_config"] = raw["quantization"]
        config = VoiceChatConfig.from_dict(raw)
    tokenizer = build_tokenizer(config.text_config.vocab_size, seed=seed)
    stored: dict[str, mx.array] = {}
    nbytes = 0
    for name, value in generate_tensors(config, tokenizer, seed=seed, bits=quantize):
        mx.eval(value)  # keep the graph small: a full-size model is generated tensor by tensor
        stored[name] = value
        nbytes += value.nbytes
    quantized = {module: (GROUP_SIZE, quantize) for module in quantized_modules(config, GROUP_SIZE)} if quantize else {}
    return raw, config, sanitize(stored, config), quantized, tokenizer, nbytes
