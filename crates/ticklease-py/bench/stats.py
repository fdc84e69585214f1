"""Percentiles (nearest rank: with 20 samples, p99 is the largest) and the machine's load."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def dist(values: Sequence[float], digits: int = 1) -> str:
    """``p50 / p99 / max`` of ``values``, or a dash."""
    if not values:
        return "-"
    return " / ".join(f"{pct(values, q):.{digits}f}" for q in (0.5, 0.99, 1.0))


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of the whole machine since boot."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


@dataclass
class Phase:
    """How busy the machine was during one phase of the bench (every process on it, ours included)."""

    name: str
    seconds: float
    busy_pct: float
    load_end: str


class PhaseClock:
    def __init__(self, name: str) -> None:
        self.name = name
        self.at = time.monotonic()
        self.jiffies = cpu_jiffies()

    def done(self) -> Phase:
        busy, total = cpu_jiffies()
        b0, t0 = self.jiffies
        pct_busy = 100.0 * (busy - b0) / max(total - t0, 1)
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        return Phase(self.name, time.monotonic() - self.at, pct_busy, load)


def cores() -> int:
    return os.cpu_count() or 0
