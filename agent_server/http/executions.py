"""One execution and the list of them: read (long-polled with `?wait=`), cancel, delete,
its events (`/executions/{id}/events`), and `GET /executions`, a page at a time."""

from __future__ import annotations

import math
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.access import RequestAccess
from agent_server.http.params import (
    MAX_LIST_BYTES,
    MAX_LIST_LIMIT,
    checked_session_id,
    event_cursor,
    float_param,
    int_param,
    json_list,
    list_cursor,
    page_headers,
    reasoner_filter,
    schedule_filter,
    statuses,
)
from agent_server.http.routing import ApiError, JSONResponse, execution_response
from agent_server.http.sse import EventStream, Streams, source_of
from agent_server.model.execution import Execution
from agent_server.model.record import isoformat
from agent_server.service.access import UNKNOWN_EXECUTION
from agent_server.service.use_cases import UseCases
from agent_server.store.base import ExecutionRunning

MAX_WAIT_SECONDS = 60.0


class Executions:
    """The routes of recorded executions, given the parts they use."""

    def __init__(self, use_cases: UseCases, streams: Streams) -> None:
        self.use_cases = use_cases
        self.registry = use_cases.registry
        self.store = use_cases.store
        self.streams = streams
        assert isinstance(use_cases.access, RequestAccess)
        self.access: RequestAccess = use_cases.access

    async def execution(self, request: Request) -> Response:
        """One route for both methods, so a 405 names them both in `Allow`."""
        if request.method == "DELETE":
            return await self.delete_execution(request)
        return await self.get_execution(request)

    async def get_execution(self, request: Request) -> Response:
        execution = await self.find(request, "read")
        # Finite, and any size: a wait past MAX_WAIT_SECONDS is capped, as documented.
        wait = float_param(request, "wait", minimum=0.0, maximum=math.inf)
        if wait is not None and wait > 0 and not execution.reached_end(asked=True):
            return await self._long_poll(request, execution, min(wait, MAX_WAIT_SECONDS))
        return execution_response(execution)

    async def _long_poll(self, request: Request, execution: Execution, timeout: float) -> Response:
        """The execution once terminal or waiting for input (`input_required`: someone must
        answer before it can end), or after `timeout`; when the listener closes first
        (shutdown), as it is now, with `Connection: close`, so the client polls again on
        another replica instead of being cut into a 500 by the http phase's end."""
        waiting = await self.use_cases.waits.before_close(
            self.store.wait(execution, timeout, asked=True)
        )
        if waiting.cancelled():
            return execution_response(execution, headers={"Connection": "close"})
        return await self.handed(request, waiting.result())

    async def cancel_execution(self, request: Request) -> Response:
        # Its answer is the record: `read` is asked too, before anything is done.
        execution = await self.find(request, "read", "cancel")
        if execution.is_terminal:
            return execution_response(execution)
        # Nobody runs it: it ended where it waited (or was taken meanwhile: 202 then).
        latest = await self.use_cases.cancels.cancel(execution)
        return await self.handed(request, latest, 200 if latest.is_terminal else 202)

    async def delete_execution(self, request: Request) -> Response:
        execution = await self.find(request, "delete")
        try:
            known = await self.store.forget(execution.execution_id)
        except ExecutionRunning as exc:
            raise ApiError(409, f"execution is {exc.status}: cancel it first") from None
        if not known:
            raise ApiError(404, "unknown execution")
        return Response(status_code=204)

    async def list_executions(self, request: Request) -> Response:
        limit = int_param(request, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        wanted = statuses(request)
        reasoner = reasoner_filter(request)
        session_id = checked_session_id(request.query_params.get("session_id"), "session_id")
        schedule_id = schedule_filter(request)
        after = list_cursor(request)
        reach = await self.access.list_scope(
            request.scope,
            {"reasoner": reasoner, "session_id": session_id, "statuses": sorted(wanted)},
        )
        page = await self.store.page(
            statuses=wanted,
            reasoner=reasoner,
            session_id=session_id,
            limit=100 if limit is None else limit,
            max_bytes=MAX_LIST_BYTES,
            after=after,
            tenant=reach.tenant,
            every_tenant=reach.every_tenant,
            owner=reach.owner,
            schedule_id=schedule_id,
        )
        found = page.executions
        body, shown = json_list((execution.to_json() for execution in found), MAX_LIST_BYTES)
        following = page.cursors[shown - 1] if shown < len(found) else page.next
        headers = page_headers(request, following, truncated=shown < len(found))
        return Response(body, media_type="application/json", headers=headers)

    async def find(self, request: Request, *actions: str) -> Execution:
        """The execution the path names, when the request's principal may see it (else the
        404 of an unknown id, whoever's it is: the store tells them apart from neither) and
        do each of `actions` to it (else 403)."""
        principal = self.access.principal(request.scope)
        execution_id = request.path_params["execution_id"]
        found = await self.access.find(self.store, principal, execution_id, *actions)
        if found is None:
            raise ApiError(404, UNKNOWN_EXECUTION)
        return found

    async def handed(
        self,
        request: Request,
        execution: Execution,
        status_code: int = 200,
        headers: dict[str, str] | None = None,
    ) -> Response:
        """A record the call came to after the one it found (a wait's, a cancel's), `read`
        asked on it as it is now (403 when denied)."""
        await self.access.allowed(request.scope, "read", execution)
        return execution_response(execution, status_code, headers)

    async def execution_history(self, request: Request) -> Response:
        """`GET /executions/{id}/history`: its moves that neither made nor ended it (a claim,
        a hand-off, a retry, a requeue, a park, an answer), oldest first, the last
        status.py KEPT_MOVES, to whoever may `read` it; its record dates its start and end.
        Read apart from the record, so no list or wait carries it (the console draws its
        attempts from both)."""
        execution = await self.find(request, "read")
        known, moves = await self.store.moves_of(execution)
        if not known:  # forgotten since it was found
            raise ApiError(404, UNKNOWN_EXECUTION)
        return JSONResponse([_move_json(entry) for entry in moves])

    async def execution_events(self, request: Request) -> EventStream:
        cursor = event_cursor(request)
        execution = await self.find(request, "read")
        return self.stream(execution, cursor, None)

    def stream(self, execution: Execution, cursor: int, first: bytes | None) -> EventStream:
        """Its events, from where `source_of` says they are read."""
        source = source_of(self.registry, self.store, execution)
        return EventStream(self.streams, source, cursor, first)


def _move_json(entry: list[Any]) -> dict[str, Any]:
    """One entry of a history (status.py `kept_move`) as the API shows it."""
    at, source, target, attempt, replica, version, how = entry
    return {
        "at": isoformat(float(at)),
        "move": how,
        "from": source,
        "to": target,
        "attempt": attempt,
        "replica": replica,
        "version": version,
    }
