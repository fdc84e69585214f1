"""Import time of the package, from outside the checkout (cwd /): ``-X importtime``'s cumulative time of the
``ticklease`` line, and the wall time of ``python -c "import ticklease"`` less that of ``python -c pass`` (run
alternately, so a load on the machine falls on both), with ``python -c "import asyncio"`` beside them: the package
imports asyncio, whose own cost is the floor."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

RUN_TIMEOUT_S = 60.0


@dataclass
class ImportRuns:
    importtime_ms: list[float]
    wall_import_ms: list[float]
    wall_pass_ms: list[float]
    #: The standard library's asyncio alone (the package imports it).
    wall_asyncio_ms: list[float]

    @property
    def wall_diff_ms(self) -> list[float]:
        return [a - b for a, b in zip(self.wall_import_ms, self.wall_pass_ms)]


def wall_ms(python: Path, code: str) -> float:
    at = time.perf_counter()
    subprocess.run([str(python), "-c", code], cwd="/", check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    return (time.perf_counter() - at) * 1000


def importtime_ms(python: Path) -> float:
    """The cumulative µs that ``-X importtime`` gives the top-level ``ticklease`` import, in ms."""
    run = subprocess.run(
        [str(python), "-X", "importtime", "-c", "import ticklease"],
        cwd="/", check=True, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    for line in run.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == "ticklease":
            return int(parts[1]) / 1000
    raise RuntimeError(f"no ticklease line in -X importtime's output: {run.stderr[-500:]}")


def measure_imports(python: Path, runs: int) -> ImportRuns:
    out = ImportRuns([], [], [], [])
    wall_ms(python, "import ticklease")  # the first run reads the files from disk
    for _ in range(runs):
        out.importtime_ms.append(importtime_ms(python))
        out.wall_pass_ms.append(wall_ms(python, "pass"))
        out.wall_import_ms.append(wall_ms(python, "import ticklease"))
        out.wall_asyncio_ms.append(wall_ms(python, "import asyncio"))
    return out
