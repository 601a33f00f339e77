"""One query position attending over a key/value cache buffer, as one kernel (fast numerics).

The TTS backbone's heads are 72 wide, outside the sizes MLX's fused attention kernels
take, so on CUDA ``mx.fast.scaled_dot_product_attention`` falls back to a scale, a
transpose, two matrix products and a softmax — and the cache is first sliced to its
filled prefix and the result transposed back to rows. For one query position per row
that is about a dozen primitives a layer, each costing host time. :class:`DecodeAttention`
does the same in one kernel (two beyond :data:`KEYS_PER_BLOCK` filled positions, where
blocks share the keys and a second kernel merges their shares): it reads the cache buffer
as stored (no slice; a count says how many leading positions are filled) and writes the
mixed values straight as rows ``(B, heads·D)``, the layout the output projection takes.

On CUDA a second form, :meth:`DecodeAttention.attend_writing`, also stores the new position: it takes the new
key and value as inputs, reads them there at their slot, and one block per key head writes them into the cache
buffers it was given, where the traced backbone step scattered them first (two primitives a layer fewer). The
buffers are written in place behind MLX's back, which takes a kernel's inputs for unchanged: the caller keeps
them (and nothing else reads them) and hands them over contiguous, so that MLX passes them as they are.

On CUDA each form also merges its blocks' shares itself where admitted (``merged_forms``): each block stores its
share and takes a ticket of its (row, head) group's, and the last block to take one merges the group's shares with
the merging kernel's own lines, in the same order, and puts the ticket back to zero. Past 2,048 keys (a conversation
older than 2 minutes 44 seconds) that is one launch a layer where two were: 28 primitives a frame fewer in the
backbone and 4 in the LLM, and no merging kernel's fixed cost.

Layout: :data:`LANES_PER_KEY` lanes read a key together, each every fourth pair of its floats (so a
key's lanes read neighbouring bytes and a warp eight keys side by side), and a warp issues the loads
of :data:`KEYS_PER_STEP` keys and their values before it scores them; on the H200 this took 21–41 %
less GPU time than a warp a key, from 7,500 down to 200 positions (docs/numerics.md, "TTS backbone").

Buffers: float32 (the LLM's caches) or bf16 (fast mode's TTS backbone caches,
:data:`engine.numerics.BACKBONE_CACHE_DTYPE`), each value widened to float32 as it is read; the writing forms
score the new position as the buffer stores it (a bf16 buffer's value rounded to nearest even), so the result
is the fallback's over the written buffers.

Arithmetic: float32 throughout like the reference, with the softmax computed online (a running
maximum and sum per run of keys a lane group reads, merged across the warp, the block and then the
blocks) — the same quantity as the reference's ``softmax(q·Kᵀ·scale)·V``, its sums taken in another
order. Keys are read in buffer order; a sliding-window ring buffer that has wrapped is therefore
read rotated, as the reference also reads it. :func:`decode_attention_ops` is the operations fallback (the
reference's own arithmetic, which the CPU runs) and what the kernel is admitted against
(:func:`engine.kernels.admission.admit_kernel`).

The kernels' CUDA and Metal text is in :mod:`engine.kernels.decode_attention_source`; the heads form's norm and
rotation are :mod:`engine.kernels.norm_rope`'s lines.
"""

from __future__ import annotations

import functools
from typing import Any

import mlx.core as mx

from ..ops.cache import stored
from .admission import TICKET_STRIDE, Kernel, custom_kernel, kernel_constants, kernel_tickets
from .decode_attention_source import ATTENTION_METAL, BUFFER_CUDA, FORM_INPUTS, MERGE_CUDA, MERGE_METAL, attention_cuda
from .norm_rope import norm_rope_ops, norm_rope_samples

# Warps (simdgroups) per block: each reads its own run of the block's share of keys, then they merge.
WARPS = 8
# Keys per block at most: a longer cache is shared evenly among several blocks per head (key_shares), whose
# shares a second kernel merges.
KEYS_PER_BLOCK = 2048
# Blocks' shares the merging kernel loads at once (into shared memory).
MERGED_SHARES = 32
# Lanes that read one key together, each a slice of it (a warp reads 32 / LANES_PER_KEY keys side by side).
LANES_PER_KEY = 4
# Neighbouring keys a warp reads and scores at once (their loads all in flight together).
KEYS_PER_STEP = 32
# The kernels' bounds are two int32s, ``[count, chunk | slot << SLOT_SHIFT]``: the filled count, the keys a block
# takes (at most KEYS_PER_BLOCK) and the slot a writing launch fills. Eight bytes, so that MLX's CUDA allocator
# keeps them in its host-side pool, which a GPU reads in place; a larger array made on the host each frame would
# be unified memory that moves to the GPU and back every frame.
SLOT_SHIFT = 12
CHUNK_BITS = (1 << SLOT_SHIFT) - 1
MAX_SLOT = (1 << (31 - SLOT_SHIFT)) - 1


def decode_attention_ops(queries: mx.array, keys: mx.array, values: mx.array, count: int, scale: float) -> mx.array:
    """The reference's arithmetic for one query position: the kernel's fallback.

    ``queries`` (B, Hq, 1, D); ``keys``/``values`` (B, Hkv, capacity, D) cache buffers of
    which the first ``count`` positions are filled, read in the queries' dtype (float32 arithmetic over bf16
    buffers). Returns the mixed values as rows (B, Hq·D).
    """
    keys, values = stored(keys[..., :count, :], queries.dtype), stored(values[..., :count, :], queries.dtype)
    mixed = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale)
    return mixed.transpose(0, 2, 1, 3).reshape(queries.shape[0], -1)


def decode_attention_writing_ops(
    queries: mx.array,
    new_keys: mx.array,
    new_values: mx.array,
    key_buffer: mx.array,
    value_buffer: mx.array,
    count: int,
    slot: int,
    scale: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """:func:`decode_attention_ops` after the new position's ``new_keys``/``new_values`` (B, Hkv, 1, D) are written
    at ``slot`` of the buffers (a scatter, as the traced backbone step writes them); returns the mixed rows and
    the written buffers — what :meth:`DecodeAttention.attend_writing` computes and leaves in its buffers."""
    index = mx.full(new_keys.shape, slot, dtype=mx.int32)
    key_buffer = mx.put_along_axis(key_buffer, index, stored(new_keys, key_buffer.dtype), axis=2)
    value_buffer = mx.put_along_axis(value_buffer, index, stored(new_values, value_buffer.dtype), axis=2)
    return decode_attention_ops(queries, key_buffer, value_buffer, count, scale), key_buffer, value_buffer


def decode_attention_heads_ops(
    q_rows: mx.array,
    k_rows: mx.array,
    new_values: mx.array,
    q_scale: mx.array,
    k_scale: mx.array,
    position: mx.array,
    key_buffer: mx.array,
    value_buffer: mx.array,
    count: int,
    slot: int,
    scale: float,
    *,
    query_heads: int,
    kv_heads: int,
    eps: float,
    base: float,
) -> tuple[mx.array, mx.array, mx.array]:
    """:func:`norm_rope_ops` then :func:`decode_attention_writing_ops`: what :meth:`DecodeAttention.attend_heads`
    computes from the projections' rows, and the buffers it leaves written."""
    queries, keys = norm_rope_ops(
        q_rows, k_rows, q_scale, k_scale, position, query_heads=query_heads, kv_heads=kv_heads, eps=eps, base=base
    )
    return decode_attention_writing_ops(queries, keys, new_values, key_buffer, value_buffer, count, slot, scale)


def decode_attention_heads_samples(
    query_heads: int, kv_heads: int, head_dim: int, scale_dtype: mx.Dtype, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting :meth:`DecodeAttention.attend_heads` (:func:`decode_attention_heads_ops`'
    arguments): the writing kernel's cases (:func:`decode_attention_writing_samples`) with projection rows for
    the heads, at an early and a late position."""
    samples = []
    for index, case in enumerate(decode_attention_writing_samples(query_heads, kv_heads, head_dim, buffer_dtype)):
        _, _, new_values, key_buffer, value_buffer, count, slot, scale = case
        q_rows, k_rows, q_scale, k_scale, position = norm_rope_samples(query_heads, kv_heads, head_dim, scale_dtype)[
            index % 2
        ]
        samples.append(
            (q_rows, k_rows, new_values, q_scale, k_scale, position, key_buffer, value_buffer, count, slot, scale)
        )
    return samples


def bounds_words(count: int, chunk: int, slot: int) -> list[int]:
    """The kernels' two bounds words: ``[count, chunk | slot << SLOT_SHIFT]`` (see :data:`SLOT_SHIFT`)."""
    if not 0 < chunk <= CHUNK_BITS:
        raise ValueError(f"{chunk} keys a block do not fit the bounds' {SLOT_SHIFT} bits")
    if not 0 <= slot <= MAX_SLOT:
        raise ValueError(f"slot {slot} is past the bounds' {MAX_SLOT}")
    return [count, chunk | slot << SLOT_SHIFT]


def key_shares(count: int, keys_per_block: int) -> tuple[int, int]:
    """How :class:`DecodeAttention` shares ``count`` keys among blocks: ``(blocks, keys a block)``. A block per
    ``keys_per_block`` keys or part of them (so the launch changes shape only where the count passes a multiple
    of it), the keys shared evenly among them, the last block taking what is left. The kernels count their
    blocks from the second number, as ``ceil(count / keys a block)``, which is the first."""
    blocks = -(-count // keys_per_block)
    return blocks, -(-count // blocks)


class DecodeAttention:
    """The single-position attention kernel for one head layout, on CUDA or Metal: float32 queries over cache
    buffers of float32 or bf16 (MLX builds a kernel per dtype; each is admitted on buffers of its own).

    Up to :data:`KEYS_PER_BLOCK` filled positions, one block per head computes the result (one
    kernel); beyond, each block takes a share of the keys and a second kernel merges the shares — or, on CUDA
    for the forms in :attr:`merged_forms` (each admitted on this device), the head's last block to finish
    merges them in the same launch.
    """

    def __init__(
        self,
        backend: str,
        query_heads: int,
        kv_heads: int,
        head_dim: int,
        keys_per_step: int = KEYS_PER_STEP,
        keys_per_block: int = KEYS_PER_BLOCK,
        lanes_per_key: int = LANES_PER_KEY,
    ) -> None:
        if query_heads % kv_heads:
            raise ValueError(f"no decode attention for {query_heads} query heads over {kv_heads} key heads")
        if head_dim > 32 * WARPS:
            raise ValueError(f"head size {head_dim} exceeds the kernel's {32 * WARPS} threads per head")
        if 32 % lanes_per_key or head_dim % (2 * lanes_per_key):
            raise ValueError(f"{lanes_per_key} lanes a key do not split a warp and heads of {head_dim} into pairs")
        if keys_per_step % (32 // lanes_per_key):
            raise ValueError(f"{keys_per_step} keys a step are not whole rows of {32 // lanes_per_key} keys")
        self.query_heads, self.kv_heads, self.head_dim = query_heads, kv_heads, head_dim
        self.keys_per_step, self.keys_per_block, self.lanes_per_key = keys_per_step, keys_per_block, lanes_per_key
        # The filled length and the scale go in as arrays (a template value would compile a kernel per
        # length); the arrays of the last few lengths are kept, since every layer of a kind shares one.
        self._bounds: dict[tuple[int, int], mx.array] = {}
        self._scales: dict[float, mx.array] = {}
        if keys_per_block > CHUNK_BITS:
            raise ValueError(f"{keys_per_block} keys a block do not fit the bounds' {SLOT_SHIFT} bits")
        # The kernel's forms (reading its buffers as stored; on CUDA also writing the new position, and making the
        # heads too), each also as the form whose blocks merge their own shares (CUDA), by (form, merged).
        self._forms: dict[tuple[str, bool], Kernel] = {}
        for form, inputs in FORM_INPUTS.items():
            if form != "read" and backend != "cuda":
                continue
            name = "parley_decode_attention" + ("" if form == "read" else f"_{form}")
            for merged in (False, True) if backend == "cuda" else (False,):
                self._forms[(form, merged)] = custom_kernel(
                    backend,
                    name + ("_merged" if merged else ""),
                    [*inputs, "tickets"] if merged else inputs,
                    ["out", "partials"] if merged else ["out"],
                    cuda=attention_cuda(form != "read", heads=form == "heads", merged=merged),
                    metal=ATTENTION_METAL if form == "read" and not merged else "",
                    cuda_header=BUFFER_CUDA,
                )
        # The forms whose blocks merge their shares themselves past KEYS_PER_BLOCK keys (set once admitted on this
        # device), and their tickets (a line per (row, head) group, by the launch's groups).
        self.merged_forms: frozenset[str] = frozenset()
        self._tickets: dict[int, mx.array] = {}
        # Whether the traced backbone step lets the kernel write the new position (set once admitted on this device).
        self.writes_cache = False
        self._merge = custom_kernel(
            backend,
            "parley_decode_attention_merge",
            ["partials", "bounds"],
            ["out"],
            cuda=MERGE_CUDA,
            metal=MERGE_METAL,
        )

    def __call__(self, queries: mx.array, keys: mx.array, values: mx.array, count: int, scale: float) -> mx.array:
        """:func:`decode_attention_ops`'s result, computed by the kernel."""
        return self.attend_bounded(queries, keys, values, self.bounds(count), self.splits(count), scale)

    def splits(self, count: int) -> int:
        """Blocks per head for ``count`` filled positions: the launch's shape (a traced call's depends on it)."""
        return key_shares(count, self.keys_per_block)[0]

    def chunk(self, count: int) -> int:
        """Keys each block takes (:func:`key_shares`)."""
        return key_shares(count, self.keys_per_block)[1]

    def bounds(self, count: int, slot: int = 0) -> mx.array:
        """The kernels' view of ``count`` (and of the ``slot`` a writing launch fills), an array: as an input of a
        traced call it varies without a retrace."""
        key = (count, slot)
        if key not in self._bounds:
            if len(self._bounds) >= 4:
                self._bounds.clear()
            self._bounds[key] = mx.array(bounds_words(count, self.chunk(count), slot), dtype=mx.int32)
        return self._bounds[key]

    def attend_bounded(
        self,
        queries: mx.array,
        keys: mx.array,
        values: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`__call__` with the count as :meth:`bounds` made it and :meth:`splits` of that count (``merge``: see
        :meth:`_launch`)."""
        return self._launch("read", [queries, keys, values], bounds, splits, scale, merge=merge)

    def attend_writing(
        self,
        queries: mx.array,
        new_keys: mx.array,
        new_values: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        position_axis: bool = False,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`attend_bounded` over buffers whose slot (:meth:`bounds`' ``slot``) the launch fills itself with
        ``new_keys``/``new_values`` (B, Hkv, 1, D) — in the given buffers, which MLX takes for unchanged: the
        caller's cache must keep them, contiguous (a copy MLX made of a strided view would take the write), and
        no other reader may expect them unwritten. One launch where a scatter per buffer and the attention took
        three (CUDA only). The kernel reads the queries, keys and values by their memory alone, so one position's
        rows (B, 1, heads·D) may stand for its heads; ``position_axis`` returns the mixed rows as (B, 1, Hq·D)."""
        self._require("writing")
        inputs = [queries, new_keys, new_values, key_buffer, value_buffer]
        return self._launch("writing", inputs, bounds, splits, scale, position_axis, merge)

    def attend_heads(
        self,
        q_rows: mx.array,
        k_rows: mx.array,
        new_values: mx.array,
        q_scale: mx.array,
        k_scale: mx.array,
        position: mx.array,
        rope: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        bounds: mx.array,
        splits: int,
        scale: float,
        merge: bool | None = None,
    ) -> mx.array:
        """:meth:`attend_writing` from the q and k projections' rows (B, H·D): the launch norms and rotates the query
        and key heads itself, as :class:`NormRope` would at ``position`` with its ``rope`` parameters (eps, log2 of
        the base), and writes the new key so made. One launch where the heads and the attention took two (CUDA)."""
        self._require("heads")
        inputs = [q_rows, k_rows, new_values, q_scale, k_scale, position, rope, key_buffer, value_buffer]
        return self._launch("heads", inputs, bounds, splits, scale, merge=merge)

    def heads_kernel(self, rope: mx.array) -> Any:
        """:meth:`heads_check` with the ``rope`` parameters, where this backend has the kernel (else ValueError)."""
        self._require("heads")
        return functools.partial(self.heads_check, rope=rope)

    def merged_kernel(self, form: str, rope: mx.array | None = None) -> Any:
        """The check of ``form`` (``"read"``, ``"writing"`` or ``"heads"``, with its ``rope`` parameters) whose blocks
        merge their own shares, for admitting it against that form's fallback; ValueError where this backend has
        no such kernel (CUDA only)."""
        self._require(form, merged=True)
        if form == "read":
            return lambda queries, keys, values, count, scale: self.attend_bounded(
                queries, keys, values, self.bounds(count), self.splits(count), scale, merge=True
            )
        if form == "writing":
            return functools.partial(self.writing_check, merge=True)
        if rope is None:
            raise ValueError("the heads form's check needs its rope parameters (eps, log2 of the base)")
        return functools.partial(self.heads_check, rope=rope, merge=True)

    def _require(self, form: str, merged: bool = False) -> None:
        if (form, merged) not in self._forms:
            raise ValueError(f"the attention kernel's {form} form{' merging its shares' if merged else ''} is CUDA's")

    def heads_check(
        self,
        q_rows: mx.array,
        k_rows: mx.array,
        new_values: mx.array,
        q_scale: mx.array,
        k_scale: mx.array,
        position: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        count: int,
        slot: int,
        scale: float,
        *,
        rope: mx.array,
        merge: bool | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`attend_heads` on copies of the buffers, returned written: :func:`decode_attention_heads_ops`'s
        signature and results, for admitting the kernel against it."""
        key_buffer, value_buffer = key_buffer * 1.0, value_buffer * 1.0  # fresh buffers (× 1 keeps every bit)
        mixed = self.attend_heads(
            q_rows,
            k_rows,
            new_values,
            q_scale,
            k_scale,
            position,
            rope,
            key_buffer,
            value_buffer,
            self.bounds(count, slot),
            self.splits(count),
            scale,
            merge,
        )
        mx.eval(mixed)  # the buffers hold the write once the launch has run
        return mixed, key_buffer, value_buffer

    def writing_kernel(self) -> Any:
        """:meth:`writing_check`, where this backend has the writing kernel (else ValueError)."""
        self._require("writing")
        return self.writing_check

    def writing_check(
        self,
        queries: mx.array,
        new_keys: mx.array,
        new_values: mx.array,
        key_buffer: mx.array,
        value_buffer: mx.array,
        count: int,
        slot: int,
        scale: float,
        merge: bool | None = None,
    ) -> tuple[mx.array, mx.array, mx.array]:
        """:meth:`attend_writing` on copies of the buffers, returned written: :func:`decode_attention_writing_ops`'s
        signature and results, for admitting the kernel against it."""
        key_buffer, value_buffer = key_buffer * 1.0, value_buffer * 1.0  # fresh buffers (× 1 keeps every bit)
        bounds, splits = self.bounds(count, slot), self.splits(count)
        mixed = self.attend_writing(
            queries, new_keys, new_values, key_buffer, value_buffer, bounds, splits, scale, merge=merge
        )
        mx.eval(mixed)  # the buffers hold the write once the launch has run
        return mixed, key_buffer, value_buffer

    def _launch(
        self,
        form: str,
        inputs: list[mx.array],
        bounds: mx.array,
        splits: int,
        scale: float,
        position_axis: bool = False,
        merge: bool | None = None,
    ) -> mx.array:
        """Launch ``form`` over ``inputs``: one block per (row, head) group, or past one block's keys ``splits`` a
        group, whose shares its last block merges (``merge``; by default where :attr:`merged_forms` has the form) or
        a second kernel does."""
        if scale not in self._scales:
            self._scales[scale] = kernel_constants(scale)
        batch, width = inputs[0].shape[0], self.query_heads * self.head_dim
        rows = (batch, 1, width) if position_axis else (batch, width)
        groups = batch * self.query_heads
        final = splits == 1
        merged = not final and (form in self.merged_forms if merge is None else merge)
        threads = 32 * WARPS
        template: list[tuple[str, Any]] = [
            ("HQ", self.query_heads),
            ("HKV", self.kv_heads),
            ("D", self.head_dim),
            ("WARPS", WARPS),
            ("LANES", self.lanes_per_key),
            ("ROUNDS", self.keys_per_step * self.lanes_per_key // 32),
            ("FINAL", final),
            ("CHUNK_BITS", CHUNK_BITS),
            ("SLOT_SHIFT", SLOT_SHIFT),
        ]
        shares = (groups * splits, self.head_dim + 2)
        if merged:
            if groups not in self._tickets:
                self._tickets[groups] = kernel_tickets(groups)  # each group's counter on a line of its own
            out, _ = self._forms[(form, True)](
                inputs=[*inputs, bounds, self._scales[scale], self._tickets[groups]],
                template=[*template, ("SHARES", MERGED_SHARES), ("TICKET_STRIDE", TICKET_STRIDE)],
                grid=(groups * splits * threads, 1, 1),
                threadgroup=(threads, 1, 1),
                output_shapes=[rows, shares],
                output_dtypes=[mx.float32, mx.float32],
            )
            return out
        (out,) = self._forms[(form, False)](
            inputs=[*inputs, bounds, self._scales[scale]],
            template=template,
            grid=(groups * splits * threads, 1, 1),
            threadgroup=(threads, 1, 1),
            output_shapes=[rows if final else shares],
            output_dtypes=[mx.float32],
        )
        if final:
            return out
        merge_threads = 32 * WARPS
        (merged_rows,) = self._merge(
            inputs=[out, bounds],
            template=[("D", self.head_dim), ("SHARES", MERGED_SHARES), ("CHUNK_BITS", CHUNK_BITS)],
            grid=(groups * merge_threads, 1, 1),
            threadgroup=(merge_threads, 1, 1),
            output_shapes=[rows],
            output_dtypes=[mx.float32],
        )
        return merged_rows


def decode_attention_samples(
    query_heads: int, kv_heads: int, head_dim: int, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the kernel, two rows over partly filled buffers of ``buffer_dtype``: one
    block's worth of keys, and enough for several blocks and the merge."""
    return [
        decode_attention_sample(query_heads, kv_heads, head_dim, capacity=256, count=237, buffer_dtype=buffer_dtype),
        decode_attention_sample(
            query_heads,
            kv_heads,
            head_dim,
            capacity=3 * KEYS_PER_BLOCK,
            count=2 * KEYS_PER_BLOCK + 5,
            buffer_dtype=buffer_dtype,
        ),
    ]


def decode_attention_writing_samples(
    query_heads: int, kv_heads: int, head_dim: int, buffer_dtype: mx.Dtype = mx.float32
) -> list[tuple[Any, ...]]:
    """Random inputs for admitting the writing kernel (:func:`decode_attention_writing_ops`' arguments): the new
    position at the end of the filled part, inside a wrapped ring buffer, and past a block's share of keys; the
    buffers of ``buffer_dtype``, the new position float32 (a bf16 buffer stores it rounded)."""
    cases = ((256, 237, 236), (512, 512, 100), (3 * KEYS_PER_BLOCK, 2 * KEYS_PER_BLOCK + 5, 2 * KEYS_PER_BLOCK + 4))
    samples = []
    for capacity, count, slot in cases:
        queries, key_buffer, value_buffer, _, scale = decode_attention_sample(
            query_heads, kv_heads, head_dim, capacity, count, buffer_dtype
        )
        fresh = mx.random.split(mx.random.key(slot), 2)
        new_keys = mx.random.normal((2, kv_heads, 1, head_dim), key=fresh[0])
        new_values = mx.random.normal((2, kv_heads, 1, head_dim), key=fresh[1])
        samples.append((queries, new_keys, new_values, key_buffer, value_buffer, count, slot, scale))
    return samples


def decode_attention_sample(
    query_heads: int, kv_heads: int, head_dim: int, capacity: int, count: int, buffer_dtype: mx.Dtype = mx.float32
) -> tuple[mx.array, mx.array, mx.array, int, float]:
    """Random inputs: two rows, a buffer of ``capacity`` positions of which ``count`` are filled."""
    keys = mx.random.split(mx.random.key(4321), 3)
    return (
        mx.random.normal((2, query_heads, 1, head_dim), key=keys[0]),
        mx.random.normal((2, kv_heads, capacity, head_dim), key=keys[1]).astype(buffer_dtype),
        mx.random.normal((2, kv_heads, capacity, head_dim), key=keys[2]).astype(buffer_dtype),
        count,
        head_dim**-0.5,
    )
