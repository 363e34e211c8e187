"""What the parts of `PostgresStore` share: the settings and parts its `__init__` makes, and
the row helpers every part writes with."""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from typing import Any

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.status import TERMINAL as STATUS_TERMINAL
from agent_server.store.base import ExecutionStore, StoreObserver
from agent_server.store.postgres import codec
from agent_server.store.postgres.coalesce import Coalesced
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
#: Executions that moved lately, remembered for a waiter that registers just after.
RECENT_MOVES = 10_000

#: Statuses no attempt will move again (their names, as the rows keep them).
TERMINAL = frozenset(status.value for status in STATUS_TERMINAL)
#: The columns every statement that returns a record reads, in this order.
ROW = "doc, status, replica, attempt"
#: What follows the incarnation in a create's take token (a claim's is hex alone).
START = "s"


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


class PgPart(ExecutionStore):
    """The attributes a part of `PostgresStore` reads, all set by its `__init__`."""

    agent: str
    replica_id: str
    result_ttl: float
    max_retained: int
    max_retained_bytes: int
    lease_ttl: float
    max_events: int
    observer: StoreObserver | None
    listen: bool
    _link: Link
    channel: str
    _due_at: float | None
    #: Waiters on this replica: execution id -> futures woken by its notices.
    #: Each waiter is given the record when this process wrote its end (its own copy, as
    #: written: no read needed), else None (a notice or the poll: read it).
    _waiters: dict[str, set[asyncio.Future[Execution | None]]]
    #: The last RECENT_MOVES executions that moved, each with its record's document when
    #: this process wrote its end (`_moved`).
    _recent_moves: OrderedDict[str, str | None]
    _queued_event: asyncio.Event
    #: Per execution id, the checkpoint (and its version) a migrating take was given, as
    #: stored: the owner's writes keep it, never the migrated state in memory, until the
    #: body's first checkpoint (a hand-off before it is migrated again from the same one).
    _unread: dict[str, tuple[str | None, str | None]]

    #: This process among those that used its replica id: every take (a create, a claim)
    #: writes a token opening with it into its row (`take`), so the repair knows which
    #: takes are this process's (repair.py).
    incarnation: str
    #: Ids whose create is on its way, and tokens of claims (and begins) on their way: not
    #: orphans, whatever the rows say (their answer, read after the repair's, starts them).
    _creating: set[str]
    _claiming: set[str]
    #: Reads by (id, tenant) made together, one statement (records.py `_read_rows`).
    _reads: Coalesced[tuple[str, str | None], Any]
    #: Plain creates made together, one statement (records.py `_insert_rows`).
    _inserts: Coalesced[Execution, bool]

    def _token(self, *, start: bool = False) -> str:
        """A take's token: this process's incarnation, `START` for a create, then its own."""
        return f"{self.incarnation}{START if start else ''}{os.urandom(8).hex()}"

    def _doubt(self) -> None:
        """A take got no answer it can trust: the repair looks (repair.py)."""
        raise NotImplementedError

    def _as_stored(self, execution: Execution, *, last: bool) -> dict[str, Any]:
        """The checkpoint fields a document of `execution` is written with: the stored ones
        while a migration's are unread ({} otherwise); `last`: this attempt's last write."""
        kept = self._unread.pop if last else self._unread.get
        stored = kept(execution.execution_id, None)
        if stored is None:
            return {}
        return {"checkpoint": stored[0], "checkpoint_version": stored[1]}

    def _renew_soon(self) -> None:
        """This replica's lease lapsed (a pause): renew at the next pass, not a third of a
        lease later."""
        raise NotImplementedError

    def _wake(self, execution_id: str, written: Execution | None = None) -> None:
        for waiter in self._waiters.get(execution_id, ()):
            if not waiter.done():
                waiter.set_result(written)

    def _moved(self, execution_id: str, doc: str | None = None) -> None:
        """The execution moved (a notice, or an end this process wrote, its `doc` given):
        its waiters are woken (with the record as written, decoded once for them all), and
        one that registers just after (its read was before the move) finds it among the
        last RECENT_MOVES."""
        recent = self._recent_moves
        recent[execution_id] = doc
        recent.move_to_end(execution_id)
        if len(recent) > RECENT_MOVES:
            recent.popitem(last=False)
        if execution_id in self._waiters:
            self._wake(execution_id, None if doc is None else codec.decode(doc))

    async def _notify(self, conn: Conn, payload: str) -> None:
        """A wake-up hint (ids only, never records) sent when the transaction commits."""
        await conn.execute("SELECT pg_notify(%s, %s)", (self.channel, payload))

    async def _finish(self, conn: Conn, execution: Execution) -> None:
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
        await self._notify(conn, f"e:{execution.execution_id}")

    async def _owe_webhook(
        self, conn: Conn, execution: Execution, delivery_id: str, kind: str, data: str
    ) -> None:
        await conn.execute(
            "INSERT INTO webhooks (agent, delivery_id, type, url, at, due_at, data, trace,"
            " attempt) VALUES (%s, %s, %s, %s, extract(epoch FROM now()), now(), %s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            (self.agent, delivery_id, kind, execution.webhook_url, data, execution.trace,
             execution.attempt),
        )  # fmt: skip

    async def _judge(self, conn: Conn, ids: list[str] | None = None) -> list[Execution]:
        raise NotImplementedError
