"""The memory store's webhook deliveries owed (docs/webhooks.md): claimed for a lease, then
settled, in this process; bounded, the oldest dropped first."""

from __future__ import annotations

import heapq
import logging
import time

from agent_server.store.values import Delivery

logger = logging.getLogger("agent_server.store")


class OwedWebhooks:
    """Deliveries owed: id -> (when due, monotonic; the delivery), and a heap of (due, id)
    where an entry whose due time changed since is skipped."""

    __slots__ = ("_due", "_owed")

    def __init__(self) -> None:
        self._owed: dict[str, tuple[float, Delivery]] = {}
        self._due: list[tuple[float, str]] = []

    def owe(self, delivery: Delivery, most: int) -> None:
        """Owe it, due now; past `most` owed the oldest is dropped, with a WARNING naming
        it."""
        self._schedule(delivery, time.monotonic())
        if len(self._owed) > most:
            oldest = next(iter(self._owed))  # dicts keep the order deliveries were owed
            del self._owed[oldest]
            logger.warning(
                "webhook %s dropped undelivered: more than %d deliveries owed",
                oldest,
                most,
            )

    def _schedule(self, delivery: Delivery, due: float) -> None:
        self._owed[delivery.delivery_id] = (due, delivery)
        heapq.heappush(self._due, (due, delivery.delivery_id))

    def claim(self, limit: int, lease: float, due_only: bool) -> tuple[int, list[Delivery]]:
        """As `Webhooks.claim_webhooks` (roles.py)."""
        now = time.monotonic()
        claimed: list[Delivery] = []
        heap = self._due
        if not due_only:  # every one owed, at once (the last chance at shutdown)
            heap[:] = [(now, delivery_id) for delivery_id in self._owed]
            for delivery_id, (_, delivery) in list(self._owed.items()):
                self._owed[delivery_id] = (now, delivery)
        while heap and heap[0][0] <= now and len(claimed) < limit:
            due, delivery_id = heapq.heappop(heap)
            owed = self._owed.get(delivery_id)
            if owed is None or owed[0] != due:
                continue  # settled, or rescheduled since this entry was pushed
            delivery = owed[1]
            delivery.age = time.time() - delivery.at
            self._schedule(delivery, now + lease)
            claimed.append(delivery)
        return len(self._owed), claimed

    def settle(self, delivery: Delivery, retry_in: float | None) -> int:
        """As `Webhooks.settle_webhook` (roles.py)."""
        owed = self._owed.get(delivery.delivery_id)
        if owed is not None:
            if retry_in is None:
                del self._owed[delivery.delivery_id]
            else:
                delivery.attempts += 1
                self._schedule(delivery, time.monotonic() + retry_in)
        if not self._owed:
            self._due.clear()
        return len(self._owed)
