"""Answering an execution's pending request (`ctx.ask`) for a caller, as every front answers
one: bounded in size (`--max-answer-bytes`), checked against the request's schema the same
way on every replica (answers.py), taken once whichever replica is asked, by the request's
identity."""

from __future__ import annotations

from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.service import answers
from agent_server.service.refusals import Refusal, Why
from agent_server.store.roles import Asks


class Answering:
    """Takes answers, given the store (which bounds their size and takes each once)."""

    def __init__(self, store: Asks) -> None:
        self.store = store

    def check_size(self, value: Any) -> None:
        """What the record cannot keep (NaN, too deep) or keeps no more of than
        `--max-answer-bytes` is refused before anything else is asked."""
        try:
            jsoncodec.check(value, "the answer")
        except jsoncodec.Unrecordable as exc:
            raise Refusal(Why.UNPROCESSABLE, str(exc)) from None
        size = len(jsoncodec.dumps(value))
        limit = self.store.max_answer_bytes
        if size > limit:
            raise Refusal(
                Why.TOO_LARGE,
                f"the answer is {size} bytes as JSON: an execution keeps at most {limit} "
                "(--max-answer-bytes)",
            )

    @staticmethod
    async def check_schema(pending: dict[str, Any], value: Any) -> None:
        """Refused unless `value` fits the request's JSON schema (JSON's own types, linear
        patterns, off the event loop); the owner's type then reads it in `ctx.ask`. The
        refusal's detail is the list of problems (or why the check gave up)."""
        schema = pending.get("schema")
        if not isinstance(schema, dict):
            return
        try:
            problems = await answers.check(schema, value)
        except answers.TooSlow as exc:
            raise Refusal(Why.UNPROCESSABLE, str(exc)) from None
        if problems:
            raise Refusal(Why.UNPROCESSABLE, problems)

    async def answer(self, execution: Execution, request_id: int | None, value: Any) -> Execution:
        """The answer to its pending request (`request_id`: that one; None: whichever is
        pending), taken once; the execution as the answer left it. The same answer to a
        request answered already is taken again (a retry whose reply was lost: handed over
        once). `answer` was allowed on the execution by the caller."""
        self.check_size(value)
        pending = execution.input_request
        waiting = execution.status is ExecutionStatus.INPUT_REQUIRED and pending is not None
        pending_id = int(pending["request_id"]) if waiting and pending is not None else None
        if request_id is not None and request_id != pending_id:
            again = await self.store.answer(execution, request_id, value)
            if again is not None:
                return again
        if pending is None or pending_id is None:
            raise Refusal(
                Why.CONFLICT, f"execution is {execution.status.value}: it waits for no input"
            )
        if request_id is not None and request_id != pending_id:
            raise Refusal(
                Why.CONFLICT, f"request {request_id} is not pending (request {pending_id} is)"
            )
        await self.check_schema(pending, value)
        taken = await self.store.answer(execution, pending_id, value)
        if taken is None:
            raise Refusal(Why.CONFLICT, f"request {pending_id} was answered already (or ended)")
        return taken
