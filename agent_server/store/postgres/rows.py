"""The row helpers every part of `PostgresStore` writes with: the columns a statement reads
and writes, a record from its row, and `AgentRows`, what the parts that write this agent's
rows share (the pool, the agent, this replica, the notices' channel, the result TTL) with
the statements several of them run in their own transactions (a notice, a terminal write a
statement decided, a webhook delivery owed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.status import TERMINAL as STATUS_TERMINAL
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import Conn, Link

#: Counts the records a statement finished (`done`: their rows' `kept_bytes`) in what the
#: agent retains; a delete's trigger counts the other way (migrations/0001_initial.sql).
COUNTED = (
    "INSERT INTO retained AS r (agent, records, bytes) SELECT %(agent)s, count(*),"
    " coalesce(sum(kept_bytes), 0) FROM done ON CONFLICT (agent) DO UPDATE"
    " SET records = r.records + EXCLUDED.records, bytes = r.bytes + EXCLUDED.bytes"
)
#: Between an end notice's id and the replica that wrote the end (owner.py `_ends`).
WRITER = "\x1f"

#: Statuses no attempt will move again (their names, as the rows keep them).
TERMINAL = frozenset(status.value for status in STATUS_TERMINAL)
#: The columns every statement that returns a record reads, in this order.
ROW = "doc, status, replica, attempt"
#: What follows the incarnation in a create's take token (a claim's is hex alone).
START = "s"
#: What a read sees: a finished record past its expiry is gone.
LIVE = "(expires_at IS NULL OR expires_at > now())"
#: An owner's write is fenced by this `WHERE`: still held by that owner and attempt.
FENCE = "agent = %(agent)s AND id = %(id)s AND replica = %(owner)s AND attempt = %(attempt)s" \
    " AND status IN ('running', 'input_required')"  # fmt: skip


def read_row(row: Any) -> Execution:
    """The record from `ROW`'s columns (the columns are the truth where a statement moved
    the record without rewriting the document)."""
    execution = codec.decode(row[0])
    execution.status = ExecutionStatus(row[1])
    execution.replica = row[2]
    execution.attempt = int(row[3])
    return execution


def columns(execution: Execution) -> dict[str, Any]:
    """The columns written with the document, from the same object."""
    return {
        "status": execution.status.value,
        "reasoner": execution.reasoner,
        "session": execution.session_name,
        "tenant": execution.tenant,
        "started_by": execution.owner,
        "schedule_id": execution.schedule_id,
        "created_at": execution.created_at,
        "replica": execution.replica,
        "attempt": execution.attempt,
        "ckey": execution.concurrency_key,
        "climit": execution.concurrency_limit,
        "doc": codec.encode(execution),
    }


@dataclass(frozen=True)
class AgentRows:
    """What the parts of `PostgresStore` that write this agent's rows all use, and none
    changes: the pool, the agent every row carries, this replica, the channel its notices go
    on, and how long a finished record is kept; with the statements several parts run in
    their own transactions."""

    link: Link
    agent: str
    replica_id: str
    channel: str
    result_ttl: float

    async def notify(self, conn: Conn, payload: str) -> None:
        """A wake-up hint (ids only, never records) sent when the transaction commits."""
        await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))

    async def finish(self, conn: Conn, execution: Execution) -> None:
        """Write a terminal record a statement decided (not its owner's end): finished on
        the database's clock, expiring after the result TTL, its waiters told."""
        values = columns(execution)
        values.update(
            agent=self.agent,
            id=execution.execution_id,
            ttl=self.result_ttl,
            bytes=codec.result_bytes(execution),
            kept=codec.kept_bytes(execution),
        )
        await conn.execute(
            "WITH done AS (UPDATE executions SET status = %(status)s, replica = %(replica)s,"
            " attempt = %(attempt)s, doc = %(doc)s, due_at = NULL, ledger = NULL,"
            " ask_expires = NULL, unbegun = false, finished = clock_timestamp(),"
            " expires_at = now() + make_interval(secs => %(ttl)s),"
            " result_bytes = %(bytes)s, kept_bytes = %(kept)s"
            " WHERE agent = %(agent)s AND id = %(id)s AND finished IS NULL"
            f" RETURNING kept_bytes) {COUNTED}",
            values,
        )
        await self.notify(conn, f"e:{execution.execution_id}")

    async def owe_webhook(
        self, conn: Conn, execution: Execution, delivery_id: str, kind: str, data: str
    ) -> None:
        """A delivery owed for a move, in the move's own transaction (once: its id)."""
        await conn.execute(
            "INSERT INTO webhooks (agent, delivery_id, type, url, at, due_at, data, trace,"
            " attempt) VALUES (%s, %s, %s, %s, extract(epoch FROM now()), now(), %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (self.agent, delivery_id, kind, execution.webhook_url, data, execution.trace,
             execution.attempt),
        )  # fmt: skip
