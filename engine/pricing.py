"""What a frame's weight reads cost at full size: the census's counts (:mod:`engine.counters`) priced.

A census counts which weights a frame reads, on whatever model size it ran (the tiny and structure
checkpoints, in tests and on the CPU); :func:`full_size_prices` prices each weight as the full-size
model stores it, so that :func:`weight_bytes` says what the same frame reads at full size. Pricing
needs the model's module tree (:mod:`engine.model`), which is why it sits here, above the model, and
not in the census, which the layers below may use.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .counters import WeightUse
from .loading.config import VoiceChatConfig
from .loading.layout import quantized_modules
from .loading.random_checkpoint import GROUP_SIZE, base_config
from .model import VoiceChatModel
from .weight_names import COPY_MARK, GATHER_MARK


@dataclass(frozen=True)
class WeightPrice:
    """What one whole read of a weight costs at full size, and how many slices its first two axes hold."""

    nbytes: int
    leading: int
    second: int = 1

    def of(self, part: str) -> float:
        if part == "whole":
            return self.nbytes
        if part == "slice_row":
            return self.nbytes / max(self.leading * self.second, 1)
        return self.nbytes / max(self.leading, 1)


def full_size_prices(model: object, bits: int) -> dict[str, WeightPrice]:
    """The bytes of every weight of ``model`` (any size, same module tree) at full size and ``bits``.

    Shapes come from the full-size config (a module tree of lazy arrays, never evaluated);
    dtypes from ``model`` as loaded (float32 where precast, bf16 where stored, and the packed
    integers and scales of quantized modules). Stacked projections cost their members; a copy in
    another dtype (``<parameter>%``) costs the parameter's elements in the copy's dtype, and a copy
    stacking a list of parameters (``<list>%``) its members'.
    """
    config = VoiceChatConfig.from_dict(base_config("full"))
    skeleton = VoiceChatModel(config)
    quantized = set(quantized_modules(config, GROUP_SIZE))
    nn.quantize(
        skeleton,
        class_predicate=lambda path, _: {"group_size": GROUP_SIZE, "bits": bits} if path in quantized else False,
    )
    skeleton_parameters = cast(list[tuple[str, mx.array]], tree_flatten(skeleton.parameters()))
    parameters = cast(list[tuple[str, mx.array]], tree_flatten(model.parameters()))  # type: ignore[attr-defined]
    shapes = {name: value.shape for name, value in skeleton_parameters}
    dtypes = {name: value.dtype for name, value in parameters}
    skeleton_modules = dict(skeleton.named_modules())
    prices: dict[str, WeightPrice] = {}
    for name, shape in shapes.items():
        dtype = dtypes.get(name, mx.bfloat16)
        count = 1
        for size in shape:
            count *= size
        prices[name] = WeightPrice(count * dtype.size, shape[0] if shape else 1, shape[1] if len(shape) > 1 else 1)
    for path, module in model.named_modules():  # type: ignore[attr-defined]
        stacked = getattr(module, "stacked", None)
        if stacked is not None:
            parts = [prices[f"{path}.{member}.weight"] for member in stacked.members]
            prices[f"{path}.stacked"] = WeightPrice(sum(part.nbytes for part in parts), 1)
        views = getattr(module, "weight_views", None)
        if callable(views):
            for name, array in views().items():
                if name.endswith(COPY_MARK):
                    # A parameter, or a list of them stacked along their first axis (the codec's codebooks).
                    source = f"{path}.{name.removesuffix(COPY_MARK)}"
                    members = [source] if source in prices else [n for n in shapes if n.startswith(f"{source}.")]
                    nbytes = sum(
                        prices[member].nbytes // dtypes.get(member, mx.bfloat16).size * array.dtype.size
                        for member in members
                    )
                    leading = sum(prices[member].leading for member in members)
                    second = prices[members[0]].second if len(members) == 1 else array.shape[1]
                    prices[f"{path}.{name}"] = WeightPrice(nbytes, leading, second)
                elif name.endswith(GATHER_MARK):
                    # As many rows as the full-size module's table has (its table_rows()).
                    source = f"{path}.{name.removesuffix(GATHER_MARK)}"
                    rows = skeleton_modules[path].table_rows()[name]
                    prices[f"{path}.{name}"] = WeightPrice(prices[source].nbytes, rows)
    return prices


def _priced_uses(uses: Mapping[WeightUse, int], prices: Mapping[str, WeightPrice]) -> Iterator[tuple[str, float]]:
    """Each priced weight use's name and the bytes it reads (uses of weights without a price are left out)."""
    for use, count in uses.items():
        if use.name in prices:
            yield use.name, prices[use.name].of(use.part) * count


def weight_bytes(uses: Mapping[WeightUse, int], prices: Mapping[str, WeightPrice]) -> int:
    """Bytes of weights a frame with these ``uses`` reads at the prices given."""
    return round(sum(read for _, read in _priced_uses(uses, prices)))


def weight_bytes_by_weight(uses: Mapping[WeightUse, int], prices: Mapping[str, WeightPrice]) -> dict[str, int]:
    """:func:`weight_bytes` per weight, most first: which reads a device's census has that another's lacks."""
    totals: dict[str, float] = {}
    for name, read in _priced_uses(uses, prices):
        totals[name] = totals.get(name, 0.0) + read
    return {name: round(value) for name, value in _most_first(totals)}


def weight_bytes_by_network(uses: Mapping[WeightUse, int], prices: Mapping[str, WeightPrice]) -> dict[str, int]:
    """:func:`weight_bytes` per network (the first two parts of a weight's name, e.g. ``stt_model.llm``), most
    first: where a frame's bytes go, to compare one device's census with another's."""
    totals: dict[str, float] = {}
    for name, read in _priced_uses(uses, prices):
        network = ".".join(name.split(".")[:2])
        totals[network] = totals.get(network, 0.0) + read
    return {network: round(value) for network, value in _most_first(totals)}


def _most_first(totals: dict[str, float]) -> list[tuple[str, float]]:
    """``totals`` largest first, ties in insertion order (as ``Counter.most_common`` orders them)."""
    return sorted(totals.items(), key=lambda item: item[1], reverse=True)
