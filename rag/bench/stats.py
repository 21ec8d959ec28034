"""The percentile every bench number is reported at: statistics.quantiles' inclusive
method (linear interpolation between the measured values, never beyond them), so
p50, p95 and p99 mean the same thing in every table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

__all__ = ["percentile"]


def percentile(xs: Sequence[float], q: int, ndigits: int | None = None) -> float | None:
    """The q-th percentile (1-99) of `xs`, rounded to `ndigits` where given; None for no values."""
    if not xs:
        return None
    value = statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else xs[0]
    return value if ndigits is None else round(value, ndigits)
