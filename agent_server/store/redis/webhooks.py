"""Webhook deliveries (lua/webhooks.lua): claimed by any replica for a lease, then
settled; the `Webhooks` part of `RedisStore`, which keeps who is told of a move that may owe
one (`on_webhook`: the owner's writes and the asks wake it)."""

from __future__ import annotations

import logging
from typing import Any

from agent_server.store import roles
from agent_server.store.base import Delivery
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link

logger = logging.getLogger("agent_server.store")


class Webhooks(roles.Webhooks):
    """The webhook deliveries of `RedisStore`."""

    def __init__(self, link: Link, keys: Keys, row_codec: RowCodec) -> None:
        self._link = link
        self._keys = keys
        self._codec = row_codec

    @property
    def shared(self) -> bool:
        return True

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        """One script: the due deliveries of every replica, each claimed for `lease`
        seconds. `due_only` is for the memory store: what is owed here stays for others."""
        with self._link.operation("webhook_claim"):
            reply = await self._link.script(
                "webhook_claim", self._keys.script.for_webhooks(), round(lease * 1000), limit
            )
        pending, now = int(reply[0]), int(reply[1]) / 1000
        deliveries = []
        for delivery_id, text in reply[2:]:
            try:
                deliveries.append(self._delivery(str(delivery_id), text, now))
            except Exception as exc:  # one body unread must not hold the others back
                logger.warning(
                    "webhook %s: its stored body cannot be read here (%s); left claimed for "
                    "a replica that can",
                    delivery_id,
                    type(exc).__name__,
                )
        return pending, deliveries

    def _delivery(self, delivery_id: str, text: Any, now: float) -> Delivery:
        """A delivery as webhooks.lua stored it (`now`: Redis's clock, seconds)."""
        body = codec.loads(text)
        at = float(body["at"]) / 1000
        execution = self._codec.restore([*body["row"], 0])
        return Delivery(
            delivery_id,
            str(body["type"]),
            str(body["url"]),
            at,
            max(0.0, now - at),
            int(body["attempts"]),
            execution.to_json(),
            str(body.get("trace") or "") or None,
            int(body.get("attempt") or execution.attempt),
        )

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        """One script: the delivery goes, or is due again `retry_in` seconds from now on
        Redis's clock."""
        delay = "" if retry_in is None else str(max(0, round(retry_in * 1000)))
        with self._link.operation("webhook_settle"):
            reply = await self._link.script(
                "webhook_settle", self._keys.script.for_webhooks(), delivery.delivery_id, delay
            )
        return int(reply)
