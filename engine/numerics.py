"""Numerics modes: ``exact`` (the reference's arithmetic, bit for bit) and ``fast`` (a written decision).

Exact mode keeps the reference port's decomposition of every network into MLX operations,
so outputs equal mlx-vlm 0.7.10's bit for bit on the CPU and the GPU (docs/numerics.md, "Exact on
the GPU"); a frame then stays several thousand operations, and on a GPU each costs host
time whatever the arithmetic. Fast mode changes the arithmetic where that buys speed, and
nowhere else. What differs from the reference, and why it is safe:

Most changes are custom kernels (``mx.fast.cuda_kernel`` / ``mx.fast.metal_kernel``), each of which
replaces a run of MLX operations — each of which costs host time on a GPU whatever its
arithmetic — with one launch, computing the same quantity in float32 as the reference does,
with sums taken in another order. Each has an operations fallback that the CPU runs, and a
kernel is used only after it matched that fallback on this device at load
(:func:`engine.kernels.admission.admit_kernel`, relative L2 ≤ :data:`engine.kernels.admission.KERNEL_TOLERANCE`);
otherwise the fallback runs and the log says why. One change rounds: the last, the TTS backbone's caches in bf16. The
changes:

* **A fused Mamba-2 step** (:class:`engine.kernels.fused_step.FusedStep`): one position's causal
  convolution, state update, readout ``C·S``, skip term and output gate as one kernel per
  layer, reading the whole input projection (no slices), instead of about fifty operations.
  It sums the convolution tap by tap and reads the output from the new state, where the
  reference sums ``(C·B)·dt·x`` and ``C·S_old`` apart. It also writes the sums of its gated
  readout's squares over each block of rows, which the output projection's kernel turns into the
  mixer's norm (below). Fallback: :func:`engine.kernels.fused_step.fused_step_ops`.
* **Single-position attention for the TTS backbone** (:class:`engine.kernels.decode_attention.DecodeAttention`):
  heads of 72 fall outside MLX's fused attention, whose fallback is a scale, a transpose, two
  products and a softmax over a sliced cache. The kernel reads the cache buffer unsliced and
  computes the softmax online (running maximum and sum per run of keys that four lanes read
  together, merged across the warp, the block and, past 2,048 keys, the blocks — on CUDA by the head's last
  block to finish, in the same launch, where that form is admitted; else by a second kernel). Fallback: the
  reference's ``scaled_dot_product_attention``.
  On CUDA a second form of the kernel also writes the new position's key and value into the cache buffers
  (:meth:`~engine.kernels.decode_attention.DecodeAttention.attend_writing`): its blocks read that position from the new
  key and value themselves, and one block per key head stores them at the slot, where the traced step scattered
  them into each buffer first — 56 scatters a frame fewer, the same numbers. The write lands in buffers MLX
  takes for unchanged: the cache keeps them (contiguous, see :class:`engine.ops.cache.SlidingKVCache`) and nothing
  else reads them. Admitted against the scatters and the attention (outputs and written buffers).
  The LLM's four attention blocks (heads of 128, eight key heads) take the same writing form
  (:meth:`engine.networks.llm.CausalSelfAttention.attend_rows`): it reads the q, k and v projections' rows as their
  heads and writes the mixed values as the output projection's row, where the reference's cache update writes and
  slices its buffers around MLX's fused attention and views make the heads — eight primitives a block fewer.
  The softmax's sums run in another order than MLX's fused kernel's. Admitted against those operations.
* **The TTS query and key heads** (:class:`engine.kernels.decode_attention.NormRope`): the head
  split, the Gemma RMS norms and RoPE of q and k as one kernel, with MLX's own angle
  formula ``offset · 2^(−i/(D/2)·log2 base)`` so the angles match its RoPE kernel. On CUDA,
  where the attention writes its cache, the attention kernel makes them itself from the
  projections' rows (:meth:`~engine.kernels.decode_attention.DecodeAttention.attend_heads`: two of
  its warps run the same lines for the block's query head and new key), bit for bit the two
  kernels' results on the H200; admitted against the operations per RoPE base.
* **The encoder's relative-position attention for the newest frame**
  (:class:`engine.kernels.decode_attention.RelativeDecodeAttention`): content and position scores
  ``(q+u)·k + (q+v)·p`` summed together, then scaled, softmaxed and mixed in one kernel per
  layer. For one query the reference's relative shift leaves the position scores in place,
  so key j pairs with position row j (tested against a float64 computation). Fallback:
  :func:`engine.networks.encoder.attend_relative`, the reference's operations. Its window form reads the
  cached key and value rows and the newest one apart and writes the window it read (the next
  frame's cache) as it goes, where the operations would join them and slice the join: two
  concatenations and two slices a layer fewer. Fallback: :func:`engine.networks.encoder.attend_relative_window`.
* **The greedy residual-VQ step** (:mod:`engine.kernels.residual_vq`): one quantizer's distance
  product, argmin, gather and residual and running-sum updates as one kernel on CUDA
  (:class:`~engine.kernels.residual_vq.NearestCodeProduct`), reading the codebook as stored (bf16 in a
  model loaded for fast); its blocks share the entries and the last to finish picks the code.
  Its dot products sum in another order than MLX's product, so a distance may differ in its
  last bits, and a near tie could go the other way; it is admitted when it picks the
  operations' codes and rows bit for bit. On Metal the product stays MLX's and the rest is one
  kernel (:class:`~engine.kernels.residual_vq.NearestCode`), bit-identical to the operations (the same
  roundings, ties to the lowest index) and admitted only if it is. On CUDA a round's several quantizers run in
  one launch (:class:`~engine.kernels.residual_vq.NearestRoundProduct`): the same arithmetic in the same order, its
  blocks meeting at a bounded barrier between quantizers, admitted only bit for bit.
* **Runs of row products as one launch** (:class:`engine.kernels.row_chain.RowChain`, CUDA only): where row products
  follow one another with nothing else between — an encoder layer's output projection, convolution module and
  second feed-forward, then the next layer's first feed-forward and q/k/v projections (eight); a TTS backbone
  layer's output projection and MLP, then the next layer's q/k/v (four) — one launch runs them: each product's
  own source for one of its blocks is a task, taken in order by the launch's blocks, and a task waits until the
  product before it is done (no block need be resident beside another). :class:`engine.kernels.row_chain.RowSequence`
  gathers the calls until the attention reads them; a load finds each network's runs by one step op by op and
  admits a chain for each only bit for bit against its products one launch each (the same arithmetic in the
  same order).
  Fallback: the products one launch each (on the CPU, their operations).
* **Row products reading bf16 weights** (:class:`engine.kernels.row_product.RowProduct`): a stream's one
  or two rows through a dense projection, with what surrounds it — an RMS or layer norm before it
  (or a depthwise convolution, layer norm and SiLU), the previous sublayer's post-norm and residual
  add, and after it the MLP's ``gelu(gate)·up``, a GLU, a SiLU or a residual add — in one kernel
  that reads the checkpoint's bf16 weight (as stored, or a copy of the precast float32 one in a
  model switched to fast: every bf16 value is exact in float32, so nothing is lost) and sums in
  float32. Used for the TTS backbone's sublayers (q/k/v, output, gate·up, down: 4 launches a
  layer), the MoG head's MLP layers, and the encoder's streaming layer
  (:meth:`engine.networks.encoder.ConformerLayer.stream_rows`: six launches, the attention kernel and the
  output norm, where exact mode runs about thirty operations). The encoder then projects each
  frame's key and value once, as it arrives, and caches them projected, where exact mode caches
  the attention inputs and projects the whole 71-frame window every frame (on CUDA with TF32
  inputs, being several rows). Fallback: :func:`engine.kernels.row_product.row_product_ops`, the reference's
  operations. MLX's CUDA backend multiplies several float32 rows with reduced-precision (TF32)
  inputs, so these kernels are admitted against a float32 reference computed on the CPU, and on a
  GPU they run only where every kernel of their network was admitted.
* **The LLM's quantized projections for one row** (:class:`engine.kernels.quantized_product.QuantizedRowProduct`,
  CUDA only): ``s · Σ x·q + b · Σ x`` per group in float32, as MLX's kernels compute it, with the
  groups summed in another order. Inside each block the last projection adds the residual and the
  MLP's up projection squares its ReLU in the same launch (the same float32 operations, after the
  sum), and the Mamba mixer's output projection first finishes its gated group norm from the step's
  partial sums of squares (the same sum of squares in another order). In the LLM's step the last
  projection of each block also writes the next block's RMS norm of its output (``norm_f``'s after the
  last block): the last of its blocks to finish reads the row back and norms it, so no block launches a
  norm of its own (the same norm with its sum of squares in another order). Fallback and reference: MLX's
  norm, ``quantized_matmul`` and the add or squared ReLU (and the next norm), which Metal keeps (its
  kernel there already reads at the memory's bandwidth).
* **Each RN-T greedy attempt as four kernels** (:mod:`engine.kernels.greedy_attempt`): an LSTM step per layer
  (input and recurrent products, gates and cell update, a warp per unit; the first layer finishes the
  previous attempt's argmax from its partial maxima and reads its token's embedding row itself) and two
  joint rows (the prediction projection added to the encoder projection and activated; the class scores
  reduced to a (max, first index) pair per block). No attempt selects a state; the loop's end masks the
  attempts after the first blank and takes the state of the last emission. The reference's bf16 input
  product is rounded to bf16 once, as the reference rounds it, so a gate differs only where the reordered
  float32 sum crosses a rounding boundary. Fallbacks: :func:`engine.kernels.greedy_attempt.lstm_step_ops` and
  :func:`engine.kernels.greedy_attempt.joint_row_ops`, the reference's operations; on a GPU the attempts run as
  kernels only where all six were admitted (the compiled loop of operations otherwise). On CUDA a frame's
  attempts can run as one launch (:class:`engine.kernels.greedy_attempt.GreedyLoop`): the attempt kernels' own
  sources run in turn by persistent blocks meeting at a bounded barrier after each step, admitted only bit for
  bit against the attempt kernels (51 primitives a frame fewer; :data:`RNNT_LOOP_SETTING` ``=0`` turns it off). Its
  barrier's counters sit on a ticket line of their own (:func:`engine.kernels.admission.kernel_tickets`): in 8 bytes,
  which MLX serves from a pool on the host, each poll crossed PCIe and the loop took 20.3 ms a frame
  (docs/numerics.md, *A frame's RN-T attempts as one launch*).
* **Each MaskGIT round's draw as two kernels**: the last MLP layer's post-norm and residual add, the final
  norm, the guidance mix and the three projections as one guided row product
  (:class:`engine.kernels.row_product.RowProductShape` ``guided``), then
  :class:`engine.kernels.mixture_sample.MixtureSample`:
  softmax, the top-p nucleus (each component's mass above summed directly, where the reference sorts),
  Gumbel-max from the round's uniform draw, the drawn component's low-rank mean and the latent from the
  round's normal draw. The draws stay MLX's and come in the reference's order, so the random stream is the
  same; a component whose nucleus boundary or Gumbel score lies within rounding of another's can be drawn
  differently. Fallback: :func:`engine.kernels.mixture_sample.mixture_sample_ops`, the reference's operations.
* **A step's random draws as one kernel** (:class:`engine.kernels.step_draws.StepDraws`, CUDA only): the ten draws of
  the five rounds — each a key split, its bits and their conversion, six primitives — made at once from a key
  that the TTS cache carries (from the global generator's key at its first step: MLX's Python API cannot set
  that key), handing on the key that drawing them one by one would leave. The same hash, counters and
  conversions as MLX's, so the same bits, and admitted only so; Metal keeps the library's draws. Fallback:
  :func:`engine.kernels.step_draws.step_draws_ops`, the library's draws from explicit key splits.
* **Each encoder layer's output norm inside the next layer's first row product** (the ``"layer_norm_twice"``
  prologue: the previous layer's norm, written out as the residual stream, then the feed-forward's norm):
  the same operations in one launch, the last layer's norm left to MLX.
* **Each codec decoder block's streaming convolution and norm as one kernel**
  (:class:`engine.kernels.conv_norm.ConvNorm`):
  the join of the carried inputs to the frame's, the depthwise convolution and its bias, the channel layer norm and
  its affine map, and the next history, one block of threads per position, where the operations take about nineteen
  primitives; the pointwise convolutions stay MLX's (as matrix products on rows they took another GPU kernel, and the
  teacher-forced waveform fell to 34 dB SNR on the H200). Unlike the float32 kernels above it computes in the
  activations' dtype (bf16), rounding every value the operations store where they store it, and takes the norm's sums
  in the order MLX's CUDA row sum takes them (``row_reduce_simple``: one warp a row for these widths, bf16 adds; of
  the kernel's variants — bf16 or float32 accumulators, three forms of a bf16 ``rsqrt``, MLX's CUDA source's first —
  the first that gives the operations' bits is used); only the convolution's seven-tap float32 sum may run in another
  order, so a value differs by one bf16 step where that sum lands across a rounding boundary. It is admitted bit for
  bit on inputs whose convolution sums are exact in any order; on the H200 the full-size codec teacher-forced over 100
  frames then gave the operations' waveform exactly. Fallback: :func:`engine.kernels.conv_norm.conv_norm_ops`, exact
  mode's operations. The codec's dequantization, one row per quantizer summed in quantizer order, is one kernel too
  (:class:`engine.kernels.code_sum.CodeSum`, where the operations take a gather, 31 slices and the adds): the same adds
  in the same order, bit for bit, and admitted only so.
* **The RN-T greedy loop's cell update left to fuse** (no kernel of its own): both modes unroll the
  loop on rows (:func:`engine.networks.rnnt._greedy_rows`); exact mode stores the LSTM cell update's two
  products before they are added (:func:`engine.jit.materialize`), fast mode lets them fuse where its
  attempts run as operations. On the CPU the two are the same bits; on a GPU the fused multiply-add
  rounds once where the reference rounds twice.
* **One sync a frame: the TTS spells the text id on the device** (no kernel of its own;
  :meth:`engine.session.Session._tts_step_on_device`). Exact mode reads the LLM's text id back before it builds
  the TTS step, because the token's conditioning is looked up by id on the host (its spelling, a memo), so the
  device idles while the host builds the rest of the frame. Fast mode keeps the id on the device: every token's
  spelling is a device table at the longest spelling's width (:meth:`engine.networks.subword.CharacterTable.on_device`),
  the character encoder runs each step on the token's row with its padding masked, and the end-of-speech reset
  is a select; the ids are read with the samples. What differs: the encoder's attention and pooling sum over the
  padded width (the padded terms are zeros), and it runs every frame instead of once per token (about 40 MB of
  bf16 weights a frame). On the CPU the conditioning comes out exact (``tests/test_tts.py``).
* **The text conditioning read from a table of the vocabulary** (CUDA only, no kernel of its own;
  :func:`use_condition_table`). The conditioning above depends on the token id alone, so a load runs the
  character encoder over every token once (:meth:`engine.networks.subword.CharAwareSubwordEncoder.encode_vocabulary`:
  tokens in order of length, each group at its longest spelling's width) and a frame gathers its token's row:
  about 85 primitives and the character encoder's 40 MB of weights a frame fewer, for a table of the vocabulary
  × 1,152 in bf16 (0.3 GB at full size) and a pass of the vocabulary at load. What differs: the table's rows are
  made many tokens at once and over fewer padded terms, so a bf16 value may round one step apart from the token
  encoded alone; the load uses the table only where its rows for the first, the last, the longest-spelled and 13
  drawn tokens match those within relative L2 2^-7, every value a bf16 step apart at most (on the CPU every row
  is bit for bit, ``tests/test_condition_table.py``); the frame's own on-device form differs from exact mode's
  host form by as much (``tests/test_tts.py``). Not on Metal: there the pass would take seconds of a Mac's GPU
  to save primitives that cost the host a few µs each, a trade to measure first.
* **The TTS backbone's keys and values cached in bf16** (:data:`BACKBONE_CACHE_DTYPE`, on every device; no
  kernel of its own: the attention kernels above read bf16 buffers too, admitted on them). The one change that
  rounds. A long conversation's largest read is that cache: every frame reads each of 28 layers' keys and values
  for 2 guided rows × 16 heads × 72 a position, 3.8 GB at ten minutes' 7,400 positions in float32 — more than the
  4-bit model's weights, and on a 200 GB/s laptop 19 ms a frame. In bf16 it is half, and half the memory held.
  What differs: each key and value is rounded to bf16 once, as it is stored (by at most 2^-9 of itself); the
  attention widens them and computes in float32 as before, and the writing kernels score the new position as
  stored. Measured on the tiny checkpoint (CPU, ``parley drift``, 3 seeds): the TTS hidden states 0.6–1.1e-3
  from exact mode's (relative L2) — the size of the TF32 rounding that exact mode's own products carry on CUDA
  (7e-4) — teacher-forced codes equal in 97–100 % of frames, the sampled codes free-running parting after 5 to
  20 frames or not in 30; the LLM, the text and the codec untouched. bf16 rather than fp16, which would round
  eight times less: the values are not normed, and without the trained weights their range cannot be checked
  here; bf16's cannot overflow. Exact mode keeps the reference's float32 caches.

The kernels' results differ from a float32 computation by reordering only (relative L2
5e-8 to 1.2e-6 on the H200); through the networks that stays at float32 rounding. On CUDA
exact mode's own multi-row products carry TF32 rounding, so fast mode's TTS hidden states sit
about 7e-4 (relative L2) from exact mode's there while both are within float32 rounding of each
other on the CPU. The MoG head samples codes from the TTS hidden state, and the LLM's greedy ids
from logits that random weights make nearly flat, so free-running runs part from exact mode's
after some frames, like two machines' would (docs/numerics.md).

The kernels' names carry a hash of their source (:func:`engine.kernels.admission.custom_kernel`): MLX keeps compiled
kernels by name across processes, and an updated kernel must not meet its old build.

Tried and rejected: stacking the projections that share an input on the GPU too (exact mode
stacks them on the CPU only). On CUDA the taller products take another library path with
reduced-precision inputs — the TTS hidden states moved by 6e-4 (relative L2) and free-running
codes parted from exact within 24–36 frames — and the speaking phase got slower, not faster
(docs/numerics.md). And quantizing the MoG head's MLP to 8 bits, which its five reads a frame would make
0.23 GB fewer bytes: on random weights it moved the head's guided features by 1.9e-2 (relative L2) and drew another
component for 3 of 100 draws (``tests/mog_quantized_drift.py``), a change of the voice's distribution, not of a
sum's order.

Memory: a model loaded for fast numerics keeps the weights its kernels read in bf16 as stored
(:func:`fast_bf16_weights`; :mod:`engine.loading.precast` does not cast them): 2.4 GB less at full size
than exact mode's float32 copies. A model switched to fast in place makes bf16 copies
(:meth:`engine.networks.linear.KeepsCopy.weight_in`) and holds them beside its float32 weights until it
switches back to exact, which releases them (:func:`apply_numerics`).

Bounds, measured and guarded in CI (``tests/test_numerics.py``), are in docs/numerics.md
("The bounds CI checks"), with the drift each change causes. Random weights make the
logits flatter than real ones, so the argmax agreement measured on them is a pessimistic
figure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import mlx.core as mx
import numpy as np

from .kernels.admission import admit_kernel, fast_part, gpu_kernel_backend
from .kernels.plan import FastPlan
from .kernels.row_parts import kernel_weight_dtype as _kernel_weight_dtype
from .kernels.row_parts import row_chains as _row_chains
from .kernels.row_parts import row_product_part as _row_product_part
from .kernels.row_parts import row_product_parts as _row_product_parts
from .networks.rnnt.fast import rnnt_loop_wanted

if TYPE_CHECKING:
    from .kernels.quantized_product import RowRole

Numerics = Literal["exact", "fast"]
NUMERICS: tuple[Numerics, ...] = ("exact", "fast")

# The dtype fast mode's TTS backbone caches store keys and values in (see the module docstring). float32 here
# would leave fast mode's arithmetic the reference's but for the order of its sums (what the drift test's tight
# bounds check, with this so set).
BACKBONE_CACHE_DTYPE: mx.Dtype = mx.bfloat16

log = logging.getLogger(__name__)


def check_numerics(value: str) -> Numerics:
    if value not in NUMERICS:
        raise ValueError(f"numerics must be one of {', '.join(NUMERICS)}; got {value!r}")
    return value  # type: ignore[return-value]


def apply_numerics(
    model: object, numerics: Numerics, *, release: bool = True, characters: Any = None
) -> dict[str, bool]:
    """Prepare a loaded model for ``numerics``; returns which of fast mode's changes run as kernels.

    Exact mode runs the reference's operations (undoing fast mode on a model that had it).
    Fast mode gives each Mamba-2 mixer the fused step, the TTS backbone's and the encoder's
    attention their single-position kernels (and the TTS its query and key heads kernel), the
    TTS backbone, the MoG head's MLP and the encoder's streaming layers row products, the MoG head
    its guided projections and draw, the LLM's quantized projections their one-row kernel, the
    MaskGIT rounds the residual-VQ kernel, the RN-T its attempts' kernels (on CUDA a frame's attempts as one
    launch), the codec decoder's blocks their convolution-and-norm kernel, and the codec's dequantization the
    code-sum kernel — and on CUDA the encoder's and the backbone's runs of row products one launch each: each the kernel
    where it matched its fallback on this device, else the fallback (operations; always so on the CPU).
    On CUDA, given the model's ``characters`` (:class:`engine.networks.subword.CharacterTable`), fast mode also reads a
    token's text conditioning from a table made at load (:func:`use_condition_table`).
    Either way the weights are untouched, so a loaded model switches in place. Fast mode on
    precast weights makes bf16 copies of those its row products read; exact mode, with
    ``release``, lets them go with the compiled programs that hold them (a switch back to fast
    makes and traces them again). A benchmark alternating the modes keeps both ready.
    """
    import dataclasses
    import functools

    from .kernels.decode_attention import (
        DecodeAttention,
        NormRope,
        decode_attention_heads_ops,
        decode_attention_heads_samples,
        decode_attention_ops,
        decode_attention_samples,
        decode_attention_writing_ops,
        decode_attention_writing_samples,
        norm_rope_ops,
        norm_rope_samples,
    )
    from .kernels.fused_step import FusedStep, fused_step_ops, fused_step_sample
    from .kernels.residual_vq import (
        NearestRoundProduct,
        nearest_code_ops,
        nearest_code_sample,
        nearest_code_step,
        nearest_codes_ops,
        nearest_round_sample,
        reads_stored_codebook,
    )
    from .kernels.step_draws import StepDraws, step_draws_ops, step_draws_samples
    from .networks.codec import Codec
    from .networks.linear import KeepsCopy, QuantizedLinear
    from .networks.llm import CausalSelfAttention, HybridBlock, Mamba2Mixer, NemotronH
    from .networks.perception import FastConformer, Perception
    from .networks.rnnt import RNNTJoint, RNNTPredictor
    from .networks.tts import (
        GUIDED_ROWS,
        Backbone,
        BackboneAttention,
        BackboneLayer,
        EarTTS,
        LayerRowParts,
        MixtureHead,
        MixtureRowParts,
    )

    fast = check_numerics(numerics) == "fast"
    fast_plan = (
        FastPlan.for_this_device(release=release, rnnt_loop=rnnt_loop_wanted(), characters=characters) if fast else None
    )
    modules = [module for _, module in model.named_modules()]  # type: ignore[attr-defined]
    changes: dict[str, bool] = {}
    mixers = [module for module in modules if isinstance(module, Mamba2Mixer)]
    step: Callable[..., Any] | None = None
    if fast and mixers:
        first = mixers[0]
        step, changes["fused_mamba_step"] = fast_part(
            ("mamba", first.num_heads, first.head_dim, first.n_groups, first.state_size, first.conv1d.weight.dtype),
            "Mamba-2 step",
            functools.partial(fused_step_ops, groups=first.n_groups),
            lambda backend: FusedStep(backend, first.num_heads, first.head_dim, first.n_groups, first.state_size),
            lambda: fused_step_sample(first),
        )
    for mixer in mixers:
        mixer.use_fast_step(step)

    attentions = [module for module in modules if isinstance(module, BackboneAttention)]
    attention: Callable[..., Any] | None = None
    # The backbone's caches store keys and values in bf16 in fast mode (see the module docstring), where its
    # attention kernel (if any) reads them.
    cache_dtype = BACKBONE_CACHE_DTYPE if fast else None
    if fast and attentions:
        first_attention = attentions[0]
        heads = (first_attention.num_heads, first_attention.num_kv_heads, first_attention.head_dim)
        attention, changes["decode_attention"], cache_dtype = _backbone_attention(heads, cache_dtype)
    buffers = cache_dtype or mx.float32
    # The forms of the backbone's attention kernel in use whose blocks merge their own shares (CUDA, each admitted).
    merged_forms: dict[str, bool] = {}
    if fast and isinstance(attention, DecodeAttention):
        merged_forms["read"] = _merges_shares(
            attention,
            "read",
            ("attention_merged", *heads, buffers),
            decode_attention_ops,
            lambda: decode_attention_samples(*heads, buffers),
        )
    if fast and attentions:
        # The kernel that also writes the new position into the cache buffers, where it matches the scatters and
        # the attention it replaces (outputs and written buffers).
        writes = False
        if isinstance(attention, DecodeAttention):
            kernel_attention = attention
            _, writes = fast_part(
                ("attention_writing", *heads, buffers),
                "single-position attention writing its cache",
                decode_attention_writing_ops,
                lambda backend: kernel_attention.writing_kernel(),
                lambda: decode_attention_writing_samples(*heads, buffers),
            )
            kernel_attention.writes_cache = writes
            if writes:
                merged_forms["writing"] = _merges_shares(
                    kernel_attention,
                    "writing",
                    ("attention_writing_merged", *heads, buffers),
                    decode_attention_writing_ops,
                    lambda: decode_attention_writing_samples(*heads, buffers),
                )
        changes["attention_writes_cache"] = writes
    for module in attentions:
        module.fast_attention = attention
        module.fast_heads = None
        module.heads_in_attention = False
        module.cache_dtype = cache_dtype
    # The LLM's attention blocks: the writing form of the same kernel for their heads (CUDA only), reading the
    # projections' rows as heads and writing each new position into the cache's buffers.
    llm_attentions = [module for module in modules if isinstance(module, CausalSelfAttention)]
    llm_attention: DecodeAttention | None = None
    if fast and llm_attentions:
        llm_heads = (llm_attentions[0].num_heads, llm_attentions[0].num_kv_heads, llm_attentions[0].head_dim)
        writing_part, changes["llm_attention"] = fast_part(
            ("llm_attention_writing", *llm_heads),
            "the LLM's single-position attention writing its cache",
            decode_attention_writing_ops,
            lambda backend: DecodeAttention(backend, *llm_heads).writing_kernel(),
            lambda: decode_attention_writing_samples(*llm_heads),
        )
        owner = getattr(writing_part, "__self__", None)  # the admitted check is a method of its DecodeAttention
        llm_attention = owner if changes["llm_attention"] and isinstance(owner, DecodeAttention) else None
        changes["llm_attention_merges_shares"] = False
        if llm_attention is not None:
            merges = _merges_shares(
                llm_attention,
                "writing",
                ("llm_attention_writing_merged", *llm_heads),
                decode_attention_writing_ops,
                lambda: decode_attention_writing_samples(*llm_heads),
            )
            llm_attention.merged_forms = frozenset({"writing"} if merges else ())
            changes["llm_attention_merges_shares"] = merges
    for llm_module in llm_attentions:
        llm_module.fast_attention = llm_attention
    if fast:
        # The norm-and-rotate kernel per RoPE base (local and global layers differ), its fallback per base too.
        for base in sorted({module.rope.base for module in attentions}):
            first_base = next(module for module in attentions if module.rope.base == base)
            layout = (first_base.num_heads, first_base.num_kv_heads, first_base.head_dim)
            eps, scale_dtype = first_base.q_norm.eps, first_base.q_norm.weight.dtype
            heads_part, used = fast_part(
                ("norm_rope", *layout, eps, base, scale_dtype),
                "query and key heads",
                functools.partial(norm_rope_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base),
                functools.partial(
                    NormRope, head_dim=layout[2], query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                ),
                functools.partial(norm_rope_samples, *layout, scale_dtype),
            )
            changes["norm_rope"] = changes.get("norm_rope", True) and used
            # Where the attention writes the cache, it may make the heads too (per base: its parameters differ).
            folded = False
            if writes and isinstance(heads_part, NormRope) and isinstance(attention, DecodeAttention):
                _, folded = fast_part(
                    ("attention_heads", *layout, eps, base, scale_dtype, buffers),
                    "single-position attention making its heads and writing its cache",
                    functools.partial(
                        decode_attention_heads_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                    ),
                    functools.partial(_heads_kernel, attention, heads_part.params),
                    functools.partial(decode_attention_heads_samples, *layout, scale_dtype, buffers),
                )
                changes["attention_heads"] = changes.get("attention_heads", True) and folded
                if folded:
                    merged_forms["heads"] = merged_forms.get("heads", True) and _merges_shares(
                        attention,
                        "heads",
                        ("attention_heads_merged", *layout, eps, base, scale_dtype, buffers),
                        functools.partial(
                            decode_attention_heads_ops, query_heads=layout[0], kv_heads=layout[1], eps=eps, base=base
                        ),
                        functools.partial(decode_attention_heads_samples, *layout, scale_dtype, buffers),
                        rope=heads_part.params,
                    )
            for module in attentions:
                if module.rope.base == base:
                    module.fast_heads = heads_part
                    module.heads_in_attention = folded
    if isinstance(attention, DecodeAttention):
        attention.merged_forms = frozenset(form for form, merges in merged_forms.items() if merges)
    if fast and attentions:
        changes["attention_merges_shares"] = bool(merged_forms) and all(merged_forms.values())

    on_gpu = gpu_kernel_backend() is not None
    for perception in (module for module in modules if isinstance(module, Perception)):
        changes.update(perception.use_numerics(fast_plan))

    layers = [module for module in modules if isinstance(module, BackboneLayer)]
    row_parts: LayerRowParts | None = None
    weight_dtype: mx.Dtype | None = None
    if fast and layers:
        projections = [linear for layer in layers for linear in layer.projection_layers()]
        weight_dtype = _kernel_weight_dtype(projections, on_gpu)
        row_parts, changes["tts_row_products"] = _backbone_row_parts(layers[0], GUIDED_ROWS, weight_dtype)
        if on_gpu and not changes["tts_row_products"]:
            # On a GPU the fallbacks, run op by op, would cost more than the compiled step they replace;
            # the CPU keeps them (the same arithmetic as that step), so the wiring is tested there.
            row_parts, weight_dtype = None, None
    for layer in layers:
        layer.rows = row_parts
        layer.row_weights = None if row_parts is None else layer.make_row_weights(weight_dtype)
    backbones = [module for module in modules if isinstance(module, Backbone)]
    _apply_row_chains("tts", backbones, fast and row_parts is not None, fast, changes)

    tts_configs = [module.config for module in modules if isinstance(module, EarTTS)]
    for head in (module for module in modules if isinstance(module, MixtureHead)):
        mixture_parts: MixtureRowParts | None = None
        weight_dtype = None
        mixture_layers = head.mlp_stack[:-1]
        if fast and mixture_layers:
            projections = [linear for layer in mixture_layers for linear in layer.projection_layers()]
            weight_dtype = _kernel_weight_dtype(projections, on_gpu)
            first_layer = mixture_layers[0]
            mixture_parts, changes["mog_row_products"] = _mixture_row_parts(first_layer, GUIDED_ROWS, weight_dtype)
            if on_gpu and not changes["mog_row_products"]:
                mixture_parts, weight_dtype = None, None  # the compiled MaskGIT rounds' own operations
            if mixture_parts is not None and len(tts_configs) == 1:
                mixture_parts, changes["mog_sample"] = _mixture_sample_parts(head, mixture_parts, tts_configs[0])
                if on_gpu and not changes["mog_sample"]:
                    mixture_parts = dataclasses.replace(mixture_parts, sampling=None, projections=None, sample=None)
        head.rows = mixture_parts
        head.sample_weights = None if mixture_parts is None else head.make_sample_weights()
        for layer in mixture_layers:
            layer.row_weights = None if mixture_parts is None else layer.make_row_weights(weight_dtype)

    if not fast and release:
        # Exact mode reads no bf16 copy: release those a switch to fast made, and the programs holding them.
        for module in modules:
            if isinstance(module, KeepsCopy):
                module.copied = None
            elif isinstance(module, EarTTS):
                module.forget_row_programs()
                module.forget_condition_tables()  # exact mode never reads them
            elif isinstance(module, FastConformer):
                module.forget_row_programs()
    if fast and characters is not None:
        changes["condition_table"] = gpu_kernel_backend() == "cuda" and use_condition_table(model, characters)

    quantized = [module for module in modules if isinstance(module, QuantizedLinear)]
    every_row = bool(quantized)
    for module in quantized:
        module.fast_row, used = _quantized_row_part(module) if fast else (None, False)
        module.fused_row = None
        module.chained_row = None
        every_row = every_row and used
    for attention_mixer in (module for module in modules if isinstance(module, CausalSelfAttention)):
        attention_mixer.one_row_views = fast
    for block in (module for module in modules if isinstance(module, HybridBlock)):
        # A block runs fused only when every projection of it has its fused part (kernel or operations).
        fused = block.fused_projections()
        block.fused_rows = fast and all(
            isinstance(projection, QuantizedLinear) and "bias" not in projection for projection, _ in fused
        )
        if block.fused_rows:
            for projection, role in fused:
                norm_dtype = block.mixer.norm.weight.dtype if role.prologue == "group_norm" else None
                projection.fused_row, used = _quantized_row_part(projection, role, norm_dtype)
                block.fused_rows = block.fused_rows and projection.fused_row is not None
                every_row = every_row and used
    for llm in (module for module in modules if isinstance(module, NemotronH)):
        # With every block fused, each block's last projection also writes the next block's norm of its output
        # (the LLM's chained step): all of them, or none.
        if fast and all(block.fused_rows for block in llm.layers):
            lasts = [block.fused_projections()[-1] for block in llm.layers]
            for index, (block, (projection, role)) in enumerate(zip(llm.layers, lasts, strict=True)):
                norm_dtype = block.mixer.norm.weight.dtype if role.prologue == "group_norm" else None
                next_norm = llm.next_norm(index)
                chained_role = dataclasses.replace(role, epilogue="residual_norm", next_eps=next_norm.eps)
                projection.chained_row, used = _quantized_row_part(
                    projection, chained_role, norm_dtype, next_norm.weight.dtype
                )
                every_row = every_row and used
            if any(projection.chained_row is None for projection, _ in lasts):
                for projection, _ in lasts:
                    projection.chained_row = None
    if fast and quantized:
        changes["quantized_rows"] = every_row

    joints = [module for module in modules if isinstance(module, RNNTJoint)]
    for predictor in (module for module in modules if isinstance(module, RNNTPredictor)):
        changes.update(predictor.use_numerics(fast_plan, joints[0] if len(joints) == 1 else None))

    for tts in (module for module in modules if isinstance(module, EarTTS)):
        nearest: Callable[..., Any] = nearest_code_ops
        if fast:
            shape = (tts.config.codebook_size, tts.config.latent_size)
            types = (tts.rvq_embs.dtype, tts.codebook_norms[0].dtype)  # precast codebooks keep bf16 norms
            nearest, changes["residual_vq"] = fast_part(
                ("residual_vq", *shape, *types),
                "residual-VQ step",
                nearest_code_ops,
                nearest_code_step,
                functools.partial(nearest_code_sample, *shape, *types),
                tolerance=0.0,  # the operations' codes and rows, bit for bit, or not used
            )
        tts.nearest_code = nearest
        # A round's quantizers in one launch, per round size, where the step with its product was admitted.
        rounds: dict[int, Callable[..., Any]] = {}
        if fast and changes.get("residual_vq") and reads_stored_codebook(gpu_kernel_backend()):
            every_round = True
            for count in sorted({round_.count for round_ in tts.plan if round_.count > 1}):
                part, used = fast_part(
                    ("residual_vq_round", count, *shape, *types),
                    f"residual-VQ round of {count} quantizers",
                    nearest_codes_ops,
                    functools.partial(NearestRoundProduct, count=count),
                    functools.partial(nearest_round_sample, count, *shape, *types),
                    tolerance=0.0,
                )
                every_round = every_round and used
                if used:
                    rounds[count] = part
            changes["residual_vq_rounds"] = every_round
        elif fast:
            changes["residual_vq_rounds"] = False
        tts.nearest_rounds = rounds
        draws: Callable[..., Any] | None = None
        if fast:
            plan = tts.draw_plan()
            draws, changes["step_draws"] = fast_part(
                ("step_draws", plan),
                "step's random draws",
                functools.partial(step_draws_ops, plan=plan),
                functools.partial(StepDraws, plan=plan),
                step_draws_samples,
                tolerance=0.0,  # the library's draws, bit for bit, or not used
            )
            if on_gpu and not changes["step_draws"]:
                draws = None  # drawn one by one, as in exact mode
        tts.step_draws = draws

    for codec in (module for module in modules if isinstance(module, Codec)):
        changes.update(codec.use_numerics(fast_plan))
    return changes


def _backbone_attention(
    heads: tuple[int, int, int], cache_dtype: mx.Dtype | None
) -> tuple[Callable[..., Any], bool, mx.Dtype | None]:
    """The TTS backbone's single-position attention for caches of ``cache_dtype`` (None: float32), its kernel
    admitted on such buffers: ``(attention, kernel in use, cache dtype)``. Where a GPU's kernel reads no such
    buffers, the caches stay float32 and the kernel is admitted on those (a slower attention would cost more than
    the bytes saved); the CPU has no kernel and keeps the dtype."""
    from .kernels.decode_attention import DecodeAttention, decode_attention_ops, decode_attention_samples

    def admitted_on(dtype: mx.Dtype) -> tuple[Callable[..., Any], bool]:
        return fast_part(
            ("attention", *heads, dtype),
            "single-position attention",
            decode_attention_ops,
            lambda backend: DecodeAttention(backend, *heads),
            lambda: decode_attention_samples(*heads, dtype),
        )

    buffers = cache_dtype or mx.float32
    attention, used = admitted_on(buffers)
    if not used and buffers != mx.float32 and gpu_kernel_backend() is not None:
        log.warning("the backbone's caches stay float32: its attention kernel reads no %s buffers here", buffers)
        cache_dtype = None
        attention, used = admitted_on(mx.float32)
    return attention, used, cache_dtype


def _merges_shares(
    attention: Any,
    form: str,
    key: tuple[Any, ...],
    fallback: Callable[..., Any],
    sample: Callable[[], list[tuple[Any, ...]]],
    rope: mx.array | None = None,
) -> bool:
    """Whether ``attention``'s (an :class:`engine.kernels.decode_attention.DecodeAttention`) ``form`` may run with its
    blocks merging their own shares: that kernel admitted against the form's ``fallback`` on ``sample``, whose inputs
    include one past a block's keys (CUDA only)."""
    _, merges = fast_part(
        key,
        f"single-position attention ({form} form) merging its shares",
        fallback,
        lambda backend: attention.merged_kernel(form, rope),
        sample,
    )
    return merges


def _heads_kernel(attention: Any, rope: mx.array, backend: str) -> Callable[..., Any]:
    """The attention kernel that makes its heads (:meth:`engine.kernels.decode_attention.DecodeAttention.heads_kernel`),
    as :func:`engine.kernels.admission.fast_part` makes kernels: by backend (the attention's is fixed already)."""
    return attention.heads_kernel(rope)


def _quantized_row_part(
    module: Any,
    role: RowRole | None = None,
    norm_dtype: mx.Dtype | None = None,
    next_dtype: mx.Dtype | None = None,
) -> tuple[Callable[..., Any] | None, bool]:
    """The one-row product for an affine-quantized projection (:mod:`engine.kernels.quantized_product`), plain or in
    the ``role`` of its place in a block (a group norm's weight in ``norm_dtype``, the next block's norm weight
    in ``next_dtype``): the kernel where admitted, else MLX's own operations (the fallback; None for a layout
    the kernel does not read)."""
    import functools

    from .kernels.quantized_product import (
        QuantizedRowProduct,
        QuantizedRowShape,
        RowRole,
        quantized_row_ops,
        quantized_row_samples,
    )

    role = role or RowRole()
    if module.mode != "affine" or module.get("biases") is None or module.bits not in (4, 8):
        return None, False
    outputs, words = module.weight.shape
    try:
        shape = QuantizedRowShape(words * 32 // module.bits, outputs, module.bits, module.group_size, role)
    except ValueError:
        return None, False
    scale_dtype = module.scales.dtype
    parts = "".join(f" {part}" for part in (role.prologue, role.epilogue) if part != "none")
    return fast_part(
        ("quantized_row", shape, scale_dtype, norm_dtype, next_dtype),
        f"{shape.bits}-bit {shape.width}→{shape.outputs}{parts} row product",
        functools.partial(quantized_row_ops, group_size=shape.group_size, bits=shape.bits, role=role),
        functools.partial(QuantizedRowProduct, shape=shape),
        functools.partial(
            quantized_row_samples, shape, scale_dtype, norm_dtype or mx.float32, next_dtype or mx.float32
        ),
    )


def fast_bf16_weights(model: object, backend: str | None) -> frozenset[str]:
    """Parameter names of the weights fast mode's kernels read in bf16, directly: the encoder's one-row
    projections, the TTS backbone's projections and the MoG head's MLP projections (the row products), the
    MoG head's mean tables (``proj_mus.weight``, ``low_mat``: the draw reads its component's rows of them,
    and the operations, gathering those rows first, widen only them), and where ``backend``'s residual-VQ
    step forms the distance product (:func:`engine.kernels.residual_vq.reads_stored_codebook`) the codebooks. A
    model loaded for fast numerics does not precast them (:func:`engine.loading.precast.precast_float32`)."""
    from .kernels.residual_vq import reads_stored_codebook
    from .networks.perception import encoder_row_projections
    from .networks.tts import BackboneLayer, EarTTS, MixtureHead, MixtureLayer

    modules = [module for _, module in model.named_modules()]  # type: ignore[attr-defined]
    read = {id(projection) for projection in encoder_row_projections(model)}
    for module in modules:
        if isinstance(module, BackboneLayer | MixtureLayer):
            read.update(id(linear) for linear in module.projection_layers())
    named = model.named_modules()  # type: ignore[attr-defined]
    names = {f"{path}.weight" for path, module in named if id(module) in read}
    for path, module in model.named_modules():  # type: ignore[attr-defined]
        if isinstance(module, MixtureHead):
            names.update((f"{path}.proj_mus.weight", f"{path}.low_mat"))
        if isinstance(module, EarTTS) and reads_stored_codebook(backend):
            names.add(f"{path}.rvq_embs")
    return frozenset(names)


def _apply_row_chains(network: str, modules: list[Any], chained: bool, fast: bool, changes: dict[str, bool]) -> None:
    """Give each of a network's ``modules`` (those with ``row_chains`` and ``row_runs()``) its chains where
    ``chained`` (fast numerics with the network's row parts) on CUDA (the only backend with a chain kernel: the
    runs are not even looked for elsewhere), else none; fast mode records the flag as
    ``changes[f"{network}_row_chains"]``."""
    from .kernels.row_chain import ChainBook

    for module in modules:
        module.row_chains = ChainBook()
        if chained and gpu_kernel_backend() == "cuda":
            module.row_chains, changes[f"{network}_row_chains"] = _row_chains(network, module.row_runs(), "cuda")
        elif fast:
            changes[f"{network}_row_chains"] = False


def _backbone_row_parts(layer: Any, rows: int, weight_dtype: mx.Dtype | None) -> tuple[Any, bool]:
    """The row-product parts of a TTS backbone layer (the kernels where admitted, else the fallbacks);
    the flag says whether every one is a kernel."""
    from .kernels.row_product import RowProductShape
    from .networks.tts import LayerRowParts

    attention, mlp, norm = layer.self_attn, layer.mlp, layer.input_layernorm
    width, eps, scale_dtype = norm.weight.shape[0], norm.eps, norm.weight.dtype
    dtype = weight_dtype if weight_dtype is not None else attention.q_proj.weight.dtype
    qkv = (attention.q_proj.weight.shape[0], attention.k_proj.weight.shape[0], attention.v_proj.weight.shape[0])
    inner = mlp.gate_proj.weight.shape[0]
    heads = attention.num_kv_heads  # the values come out as the cache stores them
    shapes = {
        "first_qkv": RowProductShape(rows, width, qkv, "norm", value_heads=heads),
        "qkv": RowProductShape(rows, width, qkv, "residual_norm", value_heads=heads),
        "output": RowProductShape(rows, attention.o_proj.weight.shape[1], (width,), "none"),
        "gate_up": RowProductShape(rows, width, (inner, inner), "residual_norm", "gelu_gate"),
        "down": RowProductShape(rows, inner, (width,), "none"),
    }
    parts, every = _row_product_parts("TTS", shapes, dtype, scale_dtype, dict.fromkeys(shapes, eps))
    return LayerRowParts(rows=rows, **parts, shapes=tuple(shapes.items())), every


def _mixture_row_parts(layer: Any, rows: int, weight_dtype: mx.Dtype | None) -> tuple[Any, bool]:
    """The row-product parts of the MoG head's MLP layers (the kernels where admitted, else the fallbacks);
    the flag says whether every one is a kernel."""
    from .kernels.row_product import RowProductShape
    from .networks.tts import MixtureRowParts

    mlp = layer.mlp
    width, eps = mlp.gate_proj.weight.shape[1], layer.pre_norm.eps
    inner = mlp.gate_proj.weight.shape[0]
    dtype = weight_dtype if weight_dtype is not None else mlp.gate_proj.weight.dtype
    shapes = {
        "first_gate_up": RowProductShape(rows, width, (inner, inner), "norm", "gelu_gate"),
        "gate_up": RowProductShape(rows, width, (inner, inner), "residual_norm", "gelu_gate"),
        "down": RowProductShape(rows, inner, (width,), "none"),
    }
    # The norms' 1 + w is formed in float32 (engine.networks.subword.FloatRMSNorm).
    parts, every = _row_product_parts("MoG", shapes, dtype, mx.float32, dict.fromkeys(shapes, eps))
    return MixtureRowParts(rows=rows, **parts), every


def _mixture_sample_parts(head: Any, parts: Any, config: Any) -> tuple[Any, bool]:
    """``parts`` with the MoG head's draw after its layers (:class:`engine.networks.tts.MixtureRowParts`): the guided
    row product of the three projections and :mod:`engine.kernels.mixture_sample`'s kernel, each the kernel where
    admitted, else its operations; the flag says whether both are kernels. A config the kernel does not take
    (no guidance, or no nucleus) keeps the head's operations (False)."""
    import dataclasses
    import functools

    from .kernels.mixture_sample import MixtureSample, MixtureSampleShape, mixture_sample_ops, mixture_sample_samples
    from .kernels.row_product import RowProductShape

    final_norm = head.mlp_stack[-1]
    width, eps = final_norm.weight.shape[0], final_norm.eps
    latent = head.proj_else.weight.shape[0]
    if head.mlp_stack[-2].post_norm.eps != eps:  # the guided product's prologue takes one eps for both norms
        return parts, False
    try:
        shape = MixtureSampleShape(
            head.num_components,
            latent,
            head.low_rank,
            width,
            eps,
            config.guidance_scale,
            config.top_p,
            head.min_log_std,
            config.noise_scale,
        )
    except ValueError as exc:
        log.info("the MoG draw keeps its operations (%s)", exc)
        return parts, False
    weight_dtype = head.proj_logits.weight.dtype
    product = RowProductShape(2, width, (head.num_components, latent, 1), "residual_norm", guided=True)
    projections, kernel = _row_product_part(
        product, weight_dtype, mx.float32, eps, "MoG guided projections row product", config.guidance_scale
    )
    means_dtype = head.proj_mus.weight.dtype
    sample, sampled = fast_part(
        ("mixture_sample", shape, means_dtype),
        "MoG draw",
        functools.partial(mixture_sample_ops, shape=shape),
        functools.partial(MixtureSample, shape=shape),
        functools.partial(mixture_sample_samples, shape, means_dtype),
        reference_device=mx.cpu,
    )
    sampling = (config.guidance_scale, config.top_p, config.noise_scale)
    return dataclasses.replace(parts, sampling=sampling, projections=projections, sample=sample), kernel and sampled


# A token's conditioning read from the vocabulary's table against the same token encoded alone, as a frame
# encoded it before the table (relative L2 over the checked tokens). The table's rows come from bf16 products over
# many rows, which accumulate in another order than one row's, so a bf16 value may round one step apart (at most
# 2^-7 of it): the bound is every value a step apart. A row of another token is about 1.4 away.
CONDITION_TABLE_TOLERANCE = 2**-7
# Tokens the load checks the table on: the first and last ids, the longest spelling, and this many more at random.
CONDITION_TABLE_CHECKS = 13


def use_condition_table(model: Any, characters: Any) -> bool:
    """Fast numerics' table of every token's text conditioning: a frame gathers its token's row where it
    encoded the token's spelling (about 85 primitives a frame on CUDA, and the character encoder's weights read
    every frame). Made once per vocabulary size
    (:meth:`engine.networks.subword.CharAwareSubwordEncoder.encode_vocabulary`)
    and used only where its rows match the tokens encoded alone, as a frame encodes them, within
    :data:`CONDITION_TABLE_TOLERANCE` (else the log says why and frames encode the token as before). True when in
    use. The table holds the vocabulary × the TTS width in the character embedding's dtype (0.3 GB at full size
    in bf16). Made on CUDA only (:func:`apply_numerics`), where a primitive costs the host about 20 µs and the
    vocabulary's pass a fraction of a second; on Metal the trade (seconds of a Mac's GPU at load against about
    85 primitives a frame at a few µs each) is not measured, and the CPU would take hours at full size."""
    tts = model.tts_model.tts_model
    size = model.stt_model.text_vocabulary_size
    if tts.has_condition_table(size):
        return True
    spelling = characters.on_device(size)
    encoder = tts.embed_subword
    table = encoder.encode_vocabulary(spelling)
    lengths = np.array(spelling.lengths)
    picks = np.random.default_rng(0).choice(size, size=min(size, CONDITION_TABLE_CHECKS), replace=False)
    checked = mx.array(np.unique([0, size - 1, int(lengths.argmax()), *picks.tolist()]).astype(np.int32))

    def alone(ids: mx.array) -> mx.array:
        rows = [encoder.encode_on_device(ids[index : index + 1].reshape(1, 1), spelling) for index in range(ids.size)]
        return mx.concatenate([row.reshape(1, -1) for row in rows])

    admitted = admit_kernel(
        "text conditioning table", lambda ids: table[ids], alone, (checked,), tolerance=CONDITION_TABLE_TOLERANCE
    )
    tts.use_condition_table(table if admitted else None, size)
    return admitted


def set_numerics(voicechat: object, numerics: Numerics, *, release: bool = True) -> None:
    """Switch a loaded :class:`engine.model.VoiceChat` to ``numerics`` in place (sessions opened after it use it;
    ``release``: see :func:`apply_numerics`)."""
    voicechat.fast_changes = apply_numerics(  # type: ignore[attr-defined]
        voicechat.model,  # type: ignore[attr-defined]
        numerics,
        release=release,
        characters=voicechat.characters,  # type: ignore[attr-defined]
    )
    voicechat.numerics = numerics  # type: ignore[attr-defined]
