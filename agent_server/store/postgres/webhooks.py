"""Webhook deliveries owed (docs/webhooks.md): rows recorded in the transaction of the move
they report (rows.py `owe_webhook`), claimed for one attempt at a time by `FOR UPDATE SKIP
LOCKED` with a lease on the database's clock; the `Webhooks` part of `PostgresStore`, which
keeps who is told of a move that may owe one (`on_webhook`: the owner's writes and the
asks wake it)."""

from __future__ import annotations

from agent_server.store import roles
from agent_server.store.base import Delivery
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import Link


class Webhooks(roles.Webhooks):
    """The webhook deliveries of `PostgresStore`."""

    def __init__(self, link: Link, agent: str) -> None:
        self._link = link
        self._agent = agent

    @property
    def shared(self) -> bool:
        return True

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        """Up to `limit` due deliveries, each leased for `lease` seconds (rows other
        claims hold are skipped), with the number owed."""
        async with self._link.tx("webhooks") as conn:
            cursor = await conn.execute(
                "UPDATE webhooks w SET due_at = now() + make_interval(secs => %s)"
                " FROM (SELECT delivery_id FROM webhooks WHERE agent = %s"
                " AND (due_at <= now() OR NOT %s) ORDER BY due_at LIMIT %s"
                " FOR UPDATE SKIP LOCKED) d WHERE w.agent = %s AND w.delivery_id = d.delivery_id"
                " RETURNING w.delivery_id, w.type, w.url, w.at,"
                " extract(epoch FROM now()) - w.at, w.attempts, w.data, w.trace, w.attempt",
                (lease, self._agent, due_only, limit, self._agent),
            )
            rows = await cursor.fetchall()
            cursor = await conn.execute(
                "SELECT count(*) FROM webhooks WHERE agent = %s", (self._agent,)
            )
            count = await cursor.fetchone()
        claimed = [
            Delivery(r[0], r[1], r[2], float(r[3]), float(r[4]), int(r[5]), codec.loads(r[6]),
                     r[7], int(r[8]))
            for r in rows
        ]  # fmt: skip
        return (int(count[0]) if count else 0), claimed

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        async with self._link.tx("webhooks") as conn:
            if retry_in is None:
                await conn.execute(
                    "DELETE FROM webhooks WHERE agent = %s AND delivery_id = %s",
                    (self._agent, delivery.delivery_id),
                )
            else:
                delivery.attempts += 1
                await conn.execute(
                    "UPDATE webhooks SET attempts = attempts + 1,"
                    " due_at = now() + make_interval(secs => %s)"
                    " WHERE agent = %s AND delivery_id = %s",
                    (retry_in, self._agent, delivery.delivery_id),
                )
            cursor = await conn.execute(
                "SELECT count(*) FROM webhooks WHERE agent = %s", (self._agent,)
            )
            count = await cursor.fetchone()
        return int(count[0]) if count else 0
