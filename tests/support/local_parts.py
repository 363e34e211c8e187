"""A registry on a memory store with its session releases: what an Agent builds, for tests
that drive these parts directly (no HTTP)."""

from __future__ import annotations

from dataclasses import dataclass

from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.sessions import SessionReleases
from agent_server.store.memory import MemoryStore


@dataclass
class Local:
    store: MemoryStore
    registry: InFlightRegistry
    releases: SessionReleases


async def make_local(
    *, max_inflight: int = 1000, result_ttl: float = 3600.0, max_retained: int = 10_000
) -> Local:
    store = MemoryStore("test-replica", result_ttl=result_ttl, max_retained=max_retained)
    registry = InFlightRegistry(store, max_inflight=max_inflight)
    store.deliver_cancels(registry.cancel)
    await store.open()
    return Local(store, registry, SessionReleases(store, registry))


async def local_registry(
    *, max_inflight: int = 1000, result_ttl: float = 3600.0, max_retained: int = 10_000
) -> InFlightRegistry:
    local = await make_local(
        max_inflight=max_inflight, result_ttl=result_ttl, max_retained=max_retained
    )
    return local.registry
