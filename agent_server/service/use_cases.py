"""The use cases together, built once for a server and handed to every front."""

from __future__ import annotations

from agent_server.model.waiting import Closing
from agent_server.runtime.registry import InFlightRegistry
from agent_server.service.access import Access
from agent_server.service.answering import Answering
from agent_server.service.cancels import Cancels
from agent_server.service.starts import Starts
from agent_server.service.waits import Waits
from agent_server.store.base import ExecutionStore


class UseCases:
    """Start, wait, cancel, answer and the access rule, over one registry and store."""

    __slots__ = ("access", "answering", "cancels", "registry", "starts", "store", "waits")

    def __init__(
        self,
        registry: InFlightRegistry,
        store: ExecutionStore,
        access: Access,
        closing: Closing,
        *,
        idempotency_ttl: float = 86_400.0,
        webhook_url: str | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.access = access
        self.starts = Starts(
            registry,
            store,
            access,
            closing,
            idempotency_ttl=idempotency_ttl,
            webhook_url=webhook_url,
        )
        self.waits = Waits(registry, store, closing)
        self.cancels = Cancels(registry, store)
        self.answering = Answering(store)
