"""The agent's schedule ticker, built with its parts: its declared schedules added."""

from __future__ import annotations

from collections.abc import Mapping

from agent_server.model.reasoner import Reasoner
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.schedule_entries import Entry
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.service.starts import Starts
from agent_server.store.base import ExecutionStore


def declared_id(reasoner: str, index: int) -> str:
    """A declared schedule's id: its reasoner's name and its place in the list."""
    return f"{reasoner}-{index}"


def schedule_ticker(
    reasoners: Mapping[str, Reasoner],
    starts: Starts,
    registry: InFlightRegistry,
    store: ExecutionStore,
    metrics: Metrics,
) -> ScheduleTicker:
    """The ticker, with every schedule declared on a reasoner (no tenant: the agent's). It
    starts through `starts`, the fronts' own; the registry only says when it drains."""
    ticker = ScheduleTicker(
        starts,
        store,
        reasoners,
        observe=metrics.schedule_fired,
        draining=lambda: registry.draining,
    )
    for name, reasoner in reasoners.items():
        for index, schedule in enumerate(reasoner.schedules):
            ticker.declare(Entry(declared_id(name, index), name, schedule, declared=True))
    return ticker
