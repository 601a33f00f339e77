"""How a network names the arrays it derives from its parameters, so that the census can price them.

A network that keeps a derived array (a slice, a transposed or re-typed copy, a table a kernel reads rows of) lists
it in ``weight_views()`` under its parameter's name with one of these marks; :mod:`engine.counters` reads the marks
to bill every byte a frame reads to the parameter it came from. The vocabulary lives here, below the networks and
the census alike, so that neither imports the other. This module imports nothing.
"""

from __future__ import annotations

from typing import Any, Protocol

VIEW_MARK = "#"  # "<parameter>#<index>": a slice of the parameter kept as its own array
TRANSPOSE_MARK = "@T"  # "<parameter>@T": the whole parameter, transposed once and kept (engine.networks.linear)
COPY_MARK = "%"  # "<parameter>%": the whole parameter in another dtype, copied once and kept (engine.networks.linear)
# "<parameter>[]": the parameter viewed as a table whose rows a kernel picks itself (a drawn component's): each
# read is one row of the view, whatever primitive reads it (engine.kernels.mixture_sample).
GATHER_MARK = "[]"


class WeightViews(Protocol):
    """A module that keeps arrays derived from its parameters."""

    def weight_views(self) -> dict[str, Any]:
        """The derived arrays, each named ``<parameter><mark>``."""
        ...
