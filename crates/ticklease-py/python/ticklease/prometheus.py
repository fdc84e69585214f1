"""The core's metrics through ``prometheus_client`` (``pip install ticklease[prometheus]``)::

from prometheus_client import REGISTRY
from ticklease.prometheus import Collector
REGISTRY.register(Collector(scheduler))
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.registry import Collector as _Collector

from ticklease._scheduler import Scheduler


class Collector(_Collector):
    """Collects the scheduler's metrics (refreshed from the database) at each scrape."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[Metric]:
        text = self._scheduler.metrics_text()
        if text:
            yield from text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
