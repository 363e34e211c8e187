"""Input (`ctx.ask`): an owner's own writes that wait Redis out, and the answers any
replica takes; the `Asks` part of `RedisStore`, which keeps where answers for this
replica's waiting executions go (`on_answer`) and how many bytes of them it keeps."""

from __future__ import annotations

from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.asks import Found, Question, Reply
from agent_server.model.context import StaleAttempt
from agent_server.model.execution import Execution
from agent_server.store import roles
from agent_server.store.base import StoreInDoubt
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link
from agent_server.store.redis.outbox import Outbox
from agent_server.store.redis.scripts import Asked


class Inputs(roles.Asks):
    """Asks and answers of `RedisStore`; `webhooks` keeps the handler an ask may wake."""

    def __init__(
        self,
        link: Link,
        keys: Keys,
        row_codec: RowCodec,
        *,
        outbox: Outbox,
        webhooks: roles.Webhooks,
        max_answer_bytes: int,
    ) -> None:
        self._link = link
        self._keys = keys
        self._codec = row_codec
        self._outbox = outbox
        self._webhooks = webhooks
        self.max_answer_bytes = max_answer_bytes

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        """One script (`ask.lua`), fenced by owner and attempt: the record reads
        `input_required` with its request before anyone is told (the reply, the event),
        parked with `park`. A request an earlier attempt had answered or let expire is not
        asked again: its answer, or its timeout, matched by the question's identity."""
        number = question.request_id
        reply = await self._outbox.waiting_out(
            "ask",
            self._keys.script.for_ask(execution.execution_id, execution.replica),
            execution.replica,
            str(execution.attempt),
            str(number),
            codec.dumps(question.request),
            "1" if park else "0",
            "" if timeout is None else str(max(1, round(timeout * 1000))),
            question.identity,
            question.label,
            str(question.after),
        )
        code = Asked(int(reply[0]))
        if code is Asked.FENCED:
            self._outbox.fence("ask", execution, reply[1])
            raise StaleAttempt(
                f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
                f"owns it (the record is {reply[1] or 'gone'})"
            )
        if code is Asked.ANSWERED:
            return Reply(Found.ANSWERED, int(reply[2]), codec.loads(reply[1]))
        if code is Asked.TIMED_OUT:
            return Reply(Found.TIMED_OUT, int(reply[2]))
        if code is Asked.AGAIN:
            return Reply(Found.AGAIN, int(reply[2]))
        if code is Asked.MISMATCH:
            other = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return Reply(Found.MISMATCH, int(reply[2]), other=other)
        wake = self._webhooks.on_webhook
        if wake is not None and (execution.webhook_url is not None or execution.attempt > 1):
            wake()  # ask.lua may have recorded a delivery
        return Reply(Found.PARKED if code is Asked.PARKED else Found.WAIT, number)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """`expire.lua`: closed unanswered, unless an answer was taken first (returned)."""
        return await self._look(execution, request_id, close=True)

    async def poll_answer(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """`expire.lua`, looking only: the answer taken, if one was (its notice missed)."""
        return await self._look(execution, request_id, close=False)

    async def _look(
        self, execution: Execution, request_id: int, *, close: bool
    ) -> tuple[bool, Any]:
        reply = await self._outbox.waiting_out(
            "expire",
            self._keys.script.for_expire(execution.execution_id),
            execution.replica,
            str(execution.attempt),
            str(request_id),
            "1" if close else "0",
        )
        if int(reply[0]) == 2:
            return True, codec.loads(reply[1])
        return False, None

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """One script (`answer.lua`): taken only while the record waits for that request,
        so exactly one answer per request wins across replicas; published to the owner,
        whose waiting `ctx.ask` returns it. The same answer again (the same JSON data for
        a request whose answer is kept) is taken again without a second publish: a retry of
        an answer in doubt or whose reply was lost is not refused."""
        if request_id is None:
            pending = execution.input_request or {}
            request_id = pending.get("request_id")
            if not isinstance(request_id, int):
                return None
        keys = self._keys.script.for_answer(execution.execution_id)
        text: str | bytes = codec.dumps(value)
        with self._link.operation("answer"):
            reply, held = await self._link.told(
                "answer", keys, str(request_id), text, str(self.max_answer_bytes)
            )
            if int(reply[0]) == 3 and jsoncodec.canonical(
                codec.loads(reply[1])
            ) == jsoncodec.canonical(value):
                # A retry of the answer taken, in other JSON text: taken again in the kept text.
                text = reply[1]
                reply, held = await self._link.told(
                    "answer", keys, str(request_id), text, str(self.max_answer_bytes)
                )
        if int(reply[0]) not in (1, 2):
            return None
        if not held:
            raise StoreInDoubt(execution.execution_id, "the answer")
        return self._codec.restore([*reply[1], 0])
