"""Requests for input (`ctx.ask`): the owner's own writes that wait an outage out (through
the owner's writes, owner.py), and the answers any replica takes, each one transaction on
the locked row; the `Asks` part of `PostgresStore`, which keeps where answers for this
replica's waiting executions go (`on_answer`) and how many bytes of them it keeps."""

from __future__ import annotations

from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.asks import Found, Question, Reply
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store import roles
from agent_server.store.base import INPUT_REQUIRED_EVENT
from agent_server.store.postgres import codec
from agent_server.store.postgres.owner import INPUT_REQUIRED, RUNNING, Owner
from agent_server.store.postgres.rows import FENCE, ROW, AgentRows, read_row


class Inputs(roles.Asks):
    """Asks and answers of `PostgresStore`; `webhooks` keeps the handler an ask may wake."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        owner: Owner,
        webhooks: roles.Webhooks,
        max_answer_bytes: int,
    ) -> None:
        self._rows = rows
        self._owner = owner
        self._webhooks = webhooks
        self.max_answer_bytes = max_answer_bytes

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        async def write() -> Reply | None:
            async with self._rows.link.tx("ask") as conn:
                cursor = await conn.execute(
                    f"SELECT ledger FROM executions e WHERE {FENCE} FOR UPDATE",
                    {"agent": self._rows.agent, "id": execution.execution_id,
                     "owner": execution.replica, "attempt": execution.attempt},
                )  # fmt: skip
                row = await cursor.fetchone()
                if row is None:
                    return None
                ledger = codec.ledger_loads(row[0])
                found = ledger.find(question)
                if found is not None:
                    return found
                request = question.request
                # Parked: owned by nobody, and its next run is the next attempt.
                attempt = execution.attempt + 1 if park else execution.attempt
                doc = codec.encode_with(
                    execution, status=INPUT_REQUIRED, input_request=request,
                    replica="" if park else execution.replica, attempt=attempt,
                    **self._owner.as_stored(execution, last=park))  # fmt: skip
                await conn.execute(
                    "UPDATE executions SET status = 'input_required', replica = %s, doc = %s,"
                    " attempt = %s, parked_by = %s, ledger = %s, ask_expires = CASE WHEN %s"
                    " THEN now() + make_interval(secs => %s) END WHERE agent = %s AND id = %s",
                    ("" if park else execution.replica, doc, attempt,
                     f"{execution.replica}|{execution.attempt}" if park else None,
                     codec.ledger_dumps(ledger), park and timeout is not None, timeout or 0.0,
                     self._rows.agent, execution.execution_id),
                )  # fmt: skip
                if execution.webhook_url is not None:
                    data = execution.to_json()
                    data.update(status=INPUT_REQUIRED, input_request=request)
                    delivery = f"{execution.execution_id}.input.{execution.attempt}"
                    await self._rows.owe_webhook(
                        conn, execution, f"{delivery}.{request['request_id']}",
                        INPUT_REQUIRED_EVENT, codec.dumps(data))  # fmt: skip
                await self._rows.notify(conn, f"e:{execution.execution_id}")
                return Reply(Found.PARKED if park else Found.WAIT, question.request_id)

        reply = await self._owner.waiting_out(write)
        if reply is None:
            raise self._owner.stale("ask", execution)
        wake = self._webhooks.on_webhook
        if execution.webhook_url is not None and wake is not None:
            wake()
        return reply

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self._look(execution, request_id, close=True)

    async def poll_answer(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self._look(execution, request_id, close=False)

    async def _look(
        self, execution: Execution, request_id: int, *, close: bool
    ) -> tuple[bool, Any]:
        async def write() -> tuple[bool, Any]:
            async with self._rows.link.tx("expire") as conn:
                cursor = await conn.execute(
                    f"SELECT {ROW}, ledger FROM executions WHERE agent = %s AND id = %s FOR UPDATE",
                    (self._rows.agent, execution.execution_id),
                )
                row = await cursor.fetchone()
                if row is None:
                    return False, None
                ledger = codec.ledger_loads(row[4])
                entry = ledger.entries.get(request_id)
                if entry is not None and entry.answered:
                    return True, entry.value
                if not close:
                    return False, None
                ledger.expire(request_id)
                found = read_row(row)
                held = found.replica == execution.replica and found.attempt == execution.attempt
                if held and found.status is ExecutionStatus.INPUT_REQUIRED:
                    doc = codec.encode_with(found, status=RUNNING, input_request=None)
                    await conn.execute(
                        "UPDATE executions SET status = 'running', doc = %s, ledger = %s"
                        " WHERE agent = %s AND id = %s",
                        (doc, codec.ledger_dumps(ledger), self._rows.agent, execution.execution_id),
                    )
                else:
                    await conn.execute(
                        "UPDATE executions SET ledger = %s WHERE agent = %s AND id = %s",
                        (codec.ledger_dumps(ledger), self._rows.agent, execution.execution_id),
                    )
                return False, None

        return await self._owner.waiting_out(write)

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """One transaction on the locked row: taken only while it waits for that request
        (exactly one answer per request across replicas), kept in its ledger (bounded in
        bytes); a parked execution is queued, a held one's owner is told (a row and a
        notice). The same answer again is taken again, told to nobody."""
        async with self._rows.link.tx("answer") as conn:
            cursor = await conn.execute(
                f"SELECT {ROW}, ledger FROM executions WHERE agent = %s AND id = %s FOR UPDATE",
                (self._rows.agent, execution.execution_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return None
            found = read_row(row)
            ledger = codec.ledger_loads(row[4])
            pending = found.input_request or {}
            number = pending.get("request_id") if request_id is None else request_id
            if not isinstance(number, int):
                return None
            waiting = (
                found.status is ExecutionStatus.INPUT_REQUIRED
                and pending.get("request_id") == number
            )
            if not waiting:
                entry = ledger.entries.get(number)
                same = entry is not None and entry.answered and jsoncodec.canonical(
                    entry.value) == jsoncodec.canonical(value)  # fmt: skip
                return found if same else None
            size = len(jsoncodec.dumps(value))
            ledger.keep(number, value, size, self.max_answer_bytes)
            parked = found.replica == ""
            found.status = ExecutionStatus.QUEUED if parked else ExecutionStatus.RUNNING
            found.input_request = None
            await conn.execute(
                "UPDATE executions SET status = %s, doc = %s, ledger = %s, ask_expires = NULL,"
                " due_at = CASE WHEN %s THEN now() END, queued_seq = CASE WHEN %s THEN"
                " nextval('executions_queue_seq') END WHERE agent = %s AND id = %s",
                (found.status.value, codec.encode(found), codec.ledger_dumps(ledger), parked,
                 parked, self._rows.agent, execution.execution_id),
            )  # fmt: skip
            if parked:
                await self._rows.notify(conn, "q")
            else:
                await conn.execute(
                    "INSERT INTO answers (agent, replica, execution_id, request_id, value)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (
                        self._rows.agent,
                        found.replica,
                        found.execution_id,
                        number,
                        codec.dumps(value),
                    ),
                )
                await self._rows.notify(conn, f"a:{found.replica}")
            await self._rows.notify(conn, f"e:{found.execution_id}")
        return found
