"""`/executions/{id}/input`: `POST`, the answer to an execution's pending request
(`ctx.ask`), checked against the request's schema and taken once, whichever replica is asked;
`GET`, the input it was started with (what Run again starts a new execution with)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.executions import Executions
from agent_server.http.params import first_values, read_json
from agent_server.http.routing import ApiError, JSONResponse
from agent_server.model.echoes import shown
from agent_server.service.access import UNKNOWN_EXECUTION
from agent_server.service.answering import Answering
from agent_server.store.roles import Reads


class Inputs:
    """The input route, given the parts it uses."""

    def __init__(
        self,
        store: Reads,
        answering: Answering,
        executions: Executions,
        max_body_size: int,
    ) -> None:
        self.store = store
        self.answering = answering
        self.executions = executions
        self.max_body_size = max_body_size

    async def input(self, request: Request) -> Response:
        """One route for both methods, so a 405 names them both in `Allow`."""
        if request.method == "POST":
            return await self.answer_input(request)
        return await self.start_input(request)

    async def start_input(self, request: Request) -> Response:
        """`GET /executions/{id}/input`: the JSON body it was started with (`null` for none),
        to whoever may `read` its record (the record's 404 and 403 otherwise). Read apart
        from the record, so no list, wait or event carries it."""
        execution = await self.executions.find(request, "read")
        known, body = await self.store.input_of(execution)
        if not known:  # forgotten since it was found
            raise ApiError(404, UNKNOWN_EXECUTION)
        return JSONResponse(body)

    async def answer_input(self, request: Request) -> Response:
        """`POST /executions/{id}/input`: the answer to its pending request, taken once
        (the store decides, on every replica): 202 with the execution, `running` again. The
        same answer to a request answered already is 202 too (a retry; handed over once)."""
        headers = first_values(request.scope["headers"])
        request_id, value = _answer_body(
            await read_json(request.receive, headers, self.max_body_size)
        )
        # Its answer is the record: `read` is asked too, before anything is done.
        execution = await self.executions.find(request, "read", "answer")
        taken = await self.answering.answer(execution, request_id, value)
        return await self.executions.handed(request, taken, 202)


def _answer_body(body: Any) -> tuple[int | None, Any]:
    """`{"request_id": N, "value": ...}` (request_id optional): the request id and the
    value; 422 for anything else."""
    if not isinstance(body, dict):
        raise ApiError(422, 'the body must be a JSON object: {"request_id": N, "value": ...}')
    extra = sorted(set(body) - {"request_id", "value"})
    if extra:
        raise ApiError(422, f"unknown keys {shown(extra)}: the body holds request_id and value")
    if "value" not in body:
        missing = {"type": "missing", "loc": ["body", "value"], "msg": "Field required"}
        raise ApiError(422, [missing])
    request_id = body.get("request_id")
    if isinstance(request_id, float) and request_id.is_integer():
        request_id = int(request_id)  # 2.0 is an integer to JSON Schema
    if request_id is not None and (
        not isinstance(request_id, int) or isinstance(request_id, bool) or request_id < 1
    ):
        raise ApiError(422, "request_id must be a positive integer (or left out: the pending one)")
    return request_id, body["value"]
