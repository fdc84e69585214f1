"""ticklease: singleton jobs on N replicas, one Postgres row per role, tick-scoped leases and fencing tokens.

The Rust core runs every part of the protocol (leases, heartbeats and the abandon cut, the coordination session,
the timeline rule of multi-host URLs, cron with zones and catch-up, families, metrics); this package gives it
Python's idioms. See the README for a quick start.
"""

import atexit

from ticklease import _native
from ticklease._config import Config, Family, Schedule
from ticklease._native import TickleaseError
from ticklease._ops import Status, escape, history, migrate, pause, run_now, status, unpause
from ticklease._scheduler import Scheduler, Stopped
from ticklease._term import Failed, Fence, Server, Term

__version__: str = _native.__version__

# The core's threads end before the interpreter finalizes.
atexit.register(_native.shutdown)

__all__ = [
    "Config",
    "Failed",
    "Family",
    "Fence",
    "Schedule",
    "Scheduler",
    "Server",
    "Status",
    "Stopped",
    "Term",
    "TickleaseError",
    "__version__",
    "escape",
    "history",
    "migrate",
    "pause",
    "run_now",
    "status",
    "unpause",
]
