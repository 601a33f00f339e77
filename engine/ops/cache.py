"""Attention caches: the keys and values a layer has seen, for the LLM and the TTS backbone.

Two stores, both written in place and both in the layout the reference runtime uses,
because attention results depend on it (the buffer dtype, and the order the keys are
read in):

* :class:`KVCache` keeps every position (the LLM's attention blocks and the TTS
  backbone's global layers). A zero buffer grows in blocks of :data:`GROWTH_STEP`
  positions; attention reads the filled prefix.
* :class:`SlidingKVCache` keeps the last ``window`` positions (the TTS backbone's
  sliding layers) in a ring buffer read in rotated order once it has wrapped.

Both have the same contract: ``update(keys, values)`` stores ``(B, heads, L, D)``
arrays and returns the keys and values attention must read, ``store(keys, values)``
(one position) returns the whole buffers and how many leading positions are filled,
for a kernel that reads them unsliced (:mod:`engine.kernels.decode_attention`), and ``arrays()``
lists what a frame's evaluation must materialise. ``age(positions, key=...)`` adds random history, so that a
benchmark can time a long conversation's frames without running its frames first. ``store`` is ``reserve`` (room for the
next position: the slot it goes to and the filled count after it), the write, and
``advance``; a compiled program that writes the slot itself calls the two around it.

A kernel that writes the slot into the very buffers the cache holds does so as it runs, a side
effect MLX does not see: the buffers are arrays it has already evaluated. So ``advance`` takes that
kernel's output (``written_by``) and ``arrays()`` lists it until the next position: evaluating the
cache runs the write, also where nothing reads the output (a system prompt's prefill discards the
LLM's last hidden state, so the last attention block's output would otherwise never be computed,
and its positions would stay zeros).

A cache's ``dtype``, where set, is the dtype it stores keys and values in whatever they
arrive as (fast numerics keeps the TTS backbone's in bf16: :mod:`engine.numerics`);
``update`` hands them back in the dtype they came in, ``store`` the buffers as stored.
None, the reference's behaviour, stores them as the keys that made the buffer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import mlx.core as mx

from ..streaming import arrays_nbytes

# What sdpa accepts as a mask: nothing, the "causal" shortcut, or a boolean (L, S) array.
AttentionMask = mx.array | str | None

GROWTH_STEP = 256
"""Positions a growing buffer adds at a time (the reference's ``KVCache.step``)."""


@dataclass(frozen=True)
class PositionLayout:
    """The shape and dtypes of one position's keys and values, (B, heads, 1, D): what a buffer grows by."""

    batch: int
    heads: int
    key_dim: int
    value_dim: int
    key_dtype: mx.Dtype
    value_dtype: mx.Dtype

    @classmethod
    def of(cls, keys: mx.array, values: mx.array) -> PositionLayout:
        return cls(keys.shape[0], keys.shape[1], keys.shape[3], values.shape[3], keys.dtype, values.dtype)

    def stored_as(self, dtype: mx.Dtype | None) -> PositionLayout:
        """This layout in a cache that stores ``dtype`` (None: as it is)."""
        return self if dtype is None else dataclasses.replace(self, key_dtype=dtype, value_dtype=dtype)

    def zeros(self, positions: int) -> tuple[mx.array, mx.array]:
        """Zero key and value buffers of ``positions`` positions."""
        return (
            mx.zeros((self.batch, self.heads, positions, self.key_dim), self.key_dtype),
            mx.zeros((self.batch, self.heads, positions, self.value_dim), self.value_dtype),
        )


def stored(array: mx.array, dtype: mx.Dtype | None) -> mx.array:
    """``array`` as a cache of ``dtype`` stores it (None: as it is)."""
    return array if dtype is None or array.dtype == dtype else array.astype(dtype)


def random_history(buffer: mx.array, positions: int, key: mx.array) -> mx.array:
    """``positions`` random positions shaped and typed like ``buffer``'s (0.1·N(0, 1), drawn from ``key``)."""
    batch, heads, _, dim = buffer.shape
    return (0.1 * mx.random.normal((batch, heads, positions, dim), key=key)).astype(buffer.dtype)


def causal_mask(length: int, offset: int = 0, window: int | None = None) -> mx.array:
    """Boolean (length, offset + length) mask: query i (at position offset + i) sees keys at or before it."""
    key_pos = mx.arange(offset + length)
    query_pos = mx.arange(offset, offset + length) if offset else key_pos
    visible = query_pos[:, None] >= key_pos[None]
    if window is not None:
        visible = visible & (query_pos[:, None] < key_pos[None] + window)
    return visible


@dataclass(eq=False)
class KVCache:
    """Keys and values of every position so far, in a buffer that grows in :data:`GROWTH_STEP` blocks.

    The reference ``KVCache``'s behaviour, which the attention results depend on:

    * a buffer is allocated (zeros) in the dtype of the keys that need the space;
    * later keys are cast into the existing buffer's dtype (bf16 prompt-prefill keys
      make a bf16 buffer that also stores the following float32 steps rounded to bf16);
    * growth concatenates the old buffer (cut to ``offset`` when that is not a multiple
      of the step) with the new zeros, so a float32 step that triggers growth of a bf16
      buffer promotes the whole buffer to float32;
    * attention reads ``keys[..., :offset, :]``.

    With ``dtype`` set (not the reference's behaviour), every position is stored in it instead.
    """

    keys: mx.array | None = None  # (B, kv_heads, capacity, head_dim)
    values: mx.array | None = None
    offset: int = 0
    dtype: mx.Dtype | None = None  # the stored dtype, where not the first keys' (see the module docstring)
    written_by: mx.array | None = None  # the output of the kernel that wrote the last position in place

    GROWTH_STEP: ClassVar[int] = GROWTH_STEP

    @property
    def capacity(self) -> int:
        return 0 if self.keys is None else self.keys.shape[2]

    def update(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Store (B, kv_heads, L, head_dim) keys and values; return every stored position in order (in the
        dtypes they came in, where the cache stores another)."""
        key_buffer, value_buffer, filled = self.store(keys, values)
        read_keys, read_values = key_buffer[..., :filled, :], value_buffer[..., :filled, :]
        if self.dtype is None:
            return read_keys, read_values
        return stored(read_keys, keys.dtype), stored(read_values, values.dtype)

    def store(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array, int]:
        """Store keys and values like :meth:`update`; return the whole buffers and how many leading
        positions of them are filled (a kernel reads the buffer as it is, with no slice)."""
        keys, values = stored(keys, self.dtype), stored(values, self.dtype)
        start = self.offset
        new_positions = keys.shape[2]
        self._make_room(PositionLayout.of(keys, values), new_positions)
        assert self.keys is not None and self.values is not None
        self.offset = start + new_positions
        self.keys[..., start : self.offset, :] = keys
        self.values[..., start : self.offset, :] = values
        return self.keys, self.values, self.offset

    def reserve(self, layout: PositionLayout) -> tuple[int, int]:
        """Make room for one position (as :meth:`store` would); return its slot and the filled count after it."""
        self._make_room(layout.stored_as(self.dtype), 1)
        return self.offset, self.offset + 1

    def advance(self, keys: mx.array, values: mx.array, written_by: mx.array | None = None) -> None:
        """Take the buffers with the reserved position written, and count it; ``written_by``: the output of the
        kernel that writes it into them as it runs (see the module docstring)."""
        self.keys, self.values = keys, values
        self.offset += 1
        self.written_by = written_by

    def _make_room(self, layout: PositionLayout, new_positions: int) -> None:
        if self.keys is None or self.values is None or self.offset + new_positions > self.keys.shape[2]:
            self._grow(layout, new_positions)

    def _grow(self, layout: PositionLayout, new_positions: int) -> None:
        steps = (self.GROWTH_STEP + new_positions - 1) // self.GROWTH_STEP
        extra_keys, extra_values = layout.zeros(steps * self.GROWTH_STEP)
        if self.keys is None or self.values is None:
            self.keys, self.values = extra_keys, extra_values
            return
        if self.offset % self.GROWTH_STEP != 0:
            self.keys = self.keys[..., : self.offset, :]
            self.values = self.values[..., : self.offset, :]
        self.keys = mx.concatenate([self.keys, extra_keys], axis=2)
        self.values = mx.concatenate([self.values, extra_values], axis=2)

    def attention_mask(self, length: int) -> AttentionMask:
        """The mask for ``length`` new positions: none for one, causal for a block."""
        return None if length == 1 else "causal"

    def age(self, positions: int, *, key: mx.array) -> None:
        """Append ``positions`` random keys and values (:func:`random_history`), as if the conversation were that
        much older; nothing before the first position. For timing only: attention then reads noise."""
        if self.keys is not None and self.values is not None:
            self.update(random_history(self.keys, positions, key), random_history(self.values, positions, key))

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.keys, self.values, self.written_by) if a is not None]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())


@dataclass(eq=False)
class SlidingKVCache:
    """Keys and values of the last ``window`` positions (the TTS backbone's sliding-window layers).

    Single positions are written into a ring buffer of ``window`` slots (grown in
    :data:`GROWTH_STEP` blocks until full, then overwritten from slot 0), and attention
    reads the buffer as stored, i.e. in rotated order once it has wrapped. A block of
    several positions is appended after reordering the buffer in time and dropping what
    falls out of the window. This layout is the reference's, so attention reduces over
    the same keys in the same order. With ``dtype`` set, every position is stored in it.
    """

    window: int
    keys: mx.array | None = None
    values: mx.array | None = None
    offset: int = 0  # positions seen (the RoPE position of the next one)
    write_index: int = 0  # next slot of the ring buffer
    # Whether keys and values are buffers of their own. A first block append keeps the block's arrays and a cut
    # to the window keeps a slice, either perhaps a strided view; reserve() copies those once, since fast mode's
    # attention kernel may write the reserved slot into the very buffers it is given (engine.kernels.decode_attention).
    own_buffers: bool = True
    dtype: mx.Dtype | None = None  # the stored dtype, where not the keys' own (see the module docstring)
    written_by: mx.array | None = None  # the output of the kernel that wrote the last position in place

    def update(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        """Add (B, H, L, D) keys/values; returns the keys/values attention reads (in the dtypes they came in)."""
        add = self._write_one if keys.shape[2] == 1 else self._append_block
        read_keys, read_values = add(stored(keys, self.dtype), stored(values, self.dtype))
        if self.dtype is None:
            return read_keys, read_values
        return stored(read_keys, keys.dtype), stored(read_values, values.dtype)

    def _in_time_order(self, buffer: mx.array) -> mx.array:
        if self.write_index == buffer.shape[2]:
            return buffer
        if self.write_index < self.offset:
            return mx.concatenate([buffer[..., self.write_index :, :], buffer[..., : self.write_index, :]], axis=2)
        return buffer[..., : self.write_index, :]

    def _append_block(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
            self.own_buffers = False
        else:
            ordered_keys, ordered_values = self._in_time_order(self.keys), self._in_time_order(self.values)
            # Keep window - 1 old positions so that every new position sees a full window.
            drop = max(ordered_keys.shape[2] - self.window + 1, 0)
            self.keys = mx.concatenate([ordered_keys[..., drop:, :], keys], axis=2)
            self.values = mx.concatenate([ordered_values[..., drop:, :], values], axis=2)
            self.own_buffers = True
        self.offset += keys.shape[2]
        self.write_index = self.keys.shape[2]
        return self.keys, self.values

    def _write_one(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        key_buffer, value_buffer, filled = self.store(keys, values)
        if filled < key_buffer.shape[2]:
            return key_buffer[..., :filled, :], value_buffer[..., :filled, :]
        return key_buffer, value_buffer

    def store(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array, int]:
        """Write one position (B, H, 1, D) into the ring buffer; return the whole buffers and how many
        leading slots are filled (all of them once it has wrapped; read as stored, like :meth:`update`)."""
        if keys.shape[2] != 1:
            raise ValueError(f"store writes one position at a time, not {keys.shape[2]}")
        keys, values = stored(keys, self.dtype), stored(values, self.dtype)
        slot, filled = self.reserve(PositionLayout.of(keys, values))
        assert self.keys is not None and self.values is not None
        key_buffer, value_buffer = self.keys, self.values
        key_buffer[..., slot : slot + 1, :] = keys
        value_buffer[..., slot : slot + 1, :] = values
        self.advance(key_buffer, value_buffer)
        return key_buffer, value_buffer, filled

    def reserve(self, layout: PositionLayout) -> tuple[int, int]:
        """Make room for one position (as :meth:`store` would); return its slot and the filled count after it."""
        layout = layout.stored_as(self.dtype)
        start = self.offset
        if (
            self.keys is None
            or self.values is None
            or (start >= self.keys.shape[2] and self.keys.shape[2] < self.window)
        ):
            fresh_keys, fresh_values = layout.zeros(min(GROWTH_STEP, self.window - start))
            if self.keys is None or self.values is None:
                self.keys, self.values = fresh_keys, fresh_values
            else:
                self.keys = mx.concatenate([self.keys, fresh_keys], axis=2)
                self.values = mx.concatenate([self.values, fresh_values], axis=2)
            self.write_index = start
            self.own_buffers = True
        excess = self.keys.shape[2] - self.window
        if excess > 0:  # a block append left more than a window: keep the newest slots
            self.keys, self.values = self.keys[..., excess:, :], self.values[..., excess:, :]
            self.write_index = self.window
            self.own_buffers = False
        if not self.own_buffers:
            self.keys, self.values = mx.contiguous(self.keys), mx.contiguous(self.values)
            self.own_buffers = True
        if self.write_index == self.window:
            self.write_index = 0
        return self.write_index, min(self.offset + 1, self.keys.shape[2])

    def advance(self, keys: mx.array, values: mx.array, written_by: mx.array | None = None) -> None:
        """Take the buffers with the reserved slot written, and count the position; ``written_by``: as
        :meth:`KVCache.advance`."""
        self.keys, self.values = keys, values
        self.offset += 1
        self.write_index += 1
        self.written_by = written_by

    def age(self, positions: int, *, key: mx.array) -> None:
        """:meth:`KVCache.age`; the buffer then holds what a long conversation holds: the newest ``window``
        positions in time order, the next write at slot 0."""
        if self.keys is None or self.values is None:
            return
        self.update(random_history(self.keys, positions, key), random_history(self.values, positions, key))
        assert self.keys is not None and self.values is not None
        if self.keys.shape[2] > self.window:
            self.keys = mx.contiguous(self.keys[..., -self.window :, :])
            self.values = mx.contiguous(self.values[..., -self.window :, :])
            self.write_index = self.window

    def attention_mask(self, length: int) -> AttentionMask:
        if length == 1:
            return None  # the buffer never holds more than the window
        seen = min(self.window - 1, self.offset)
        if seen + length > self.window:
            return causal_mask(length, seen, self.window)
        return "causal"

    def arrays(self) -> list[mx.array]:
        if self.keys is None or self.values is None:
            return []
        return [self.keys, self.values, *([] if self.written_by is None else [self.written_by])]

    def nbytes(self) -> int:
        return arrays_nbytes(self.arrays())
