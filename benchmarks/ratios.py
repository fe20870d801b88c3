"""How the harness summarises and words ratios of times, shared by the report and the suites' headlines.

A ratio is always ``their time / ours``: above 1, sparsetorch is the faster one. Printed, it says so in words
("1.21x faster than torch_geometric", "1.20x slower than torch.sparse.mm"), so that no reader has to know
which way the division went.
"""
from __future__ import annotations

import math
from typing import List, Optional


def geomean(values: List[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def versus(ratio: Optional[float], other: str = "", subject: str = "") -> str:
    """``ratio`` (their time / ours) in words: "1.21x faster than X" (ratio >= 1) or "1.20x slower than X"
    (the inverse, ratio < 1); with ``subject`` in front ("sparsetorch 1.21x faster than X")."""
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return "-"
    than = f" than {other}" if other else ""
    words = f"{ratio:.2f}x faster{than}" if ratio >= 1 else f"{1 / ratio:.2f}x slower{than}"
    return f"{subject} {words}" if subject else words


def summary(ratios: List[float], other: str, what: str = "cases") -> str:
    """Geomean of ratios against ``other`` in words, with the range over the cases: "1.52x faster than X
    (geomean over 12 cases; from 1.10x slower to 3.11x faster)"."""
    gm = geomean(ratios)
    span = (f"; from {versus(min(ratios))} to {versus(max(ratios))}" if len(ratios) > 1 else "")
    return f"{versus(gm, other)} (geomean over {len(ratios)} {what}{span})"
