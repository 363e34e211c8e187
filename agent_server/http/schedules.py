"""`/schedules`: schedules made, read, changed, deleted and triggered, per tenant.

A schedule made here is kept in the store as a JSON document, so every replica fires it;
a declared one may only be disabled or enabled (PATCH `enabled`), never deleted (409).
Another tenant's schedule answers 404, as an unknown one (docs/schedules.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.access import RequestAccess
from agent_server.http.params import (
    MAX_LIST_BYTES,
    MAX_LIST_LIMIT,
    first_values,
    int_param,
    json_list,
    page_headers,
    read_json,
    schedule_cursor,
)
from agent_server.http.routing import ApiError, JSONResponse, acceptance
from agent_server.identity.principal import Principal
from agent_server.model import jsoncodec
from agent_server.model.echoes import SHOWN_LENGTH, one_of, shown
from agent_server.model.ids import new_execution_id
from agent_server.model.reasoner import Reasoner
from agent_server.model.schedules import FiringOutcome, Schedule, ScheduleError, binding_problem
from agent_server.runtime.schedule_entries import Entry
from agent_server.service.refusals import Denied
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.store.base import ScheduleLimit

#: The fields a POST may carry; a PATCH, all but `reasoner`.
FIELDS = frozenset(
    {
        "reasoner",
        "cron",
        "timezone",
        "input",
        "session_id",
        "overlap",
        "catchup_window",
        "enabled",
    }
)
UNKNOWN_SCHEDULE = "schedule not found"


class Schedules:
    """The schedule routes, given the ticker that fires them."""

    def __init__(
        self,
        ticker: ScheduleTicker,
        reasoners: Mapping[str, Reasoner],
        access: RequestAccess,
        max_body_size: int,
        *,
        max_schedules: int = 1000,
        max_input_size: int = 65_536,
    ) -> None:
        self.ticker = ticker
        self.reasoners = reasoners
        self.access = access
        self.max_body_size = max_body_size
        #: A tenant's schedules made through the API, at most (`--max-schedules`: 409), and
        #: the bytes of JSON one's input takes (`--max-schedule-input-size`: 413).
        self.max_schedules = max_schedules
        self.max_input_size = max_input_size

    async def collection(self, request: Request) -> Response:
        """`GET /schedules` lists, `POST /schedules` makes one: one route, so its `Allow`
        names both."""
        if request.method == "POST":
            return await self.create(request)
        return await self.list_schedules(request)

    async def create(self, request: Request) -> Response:
        body = await self._body(request, FIELDS)
        name = body.get("reasoner")
        if not isinstance(name, str) or name not in self.reasoners:
            raise ApiError(
                422,
                f"reasoner: {shown(name)} is not a reasoner of this agent: one of "
                f"{one_of(self.reasoners)}",
            )
        principal = self.access.principal(request.scope)
        await self.access.check(
            request.scope,
            "schedule",
            {
                "operation": "create",
                "reasoner": name,
                "owner": None if principal is None else principal.identity,
                "tenant": None if principal is None else principal.tenant,
            },
        )
        schedule = self._schedule(self.reasoners[name], body)
        await self._may_start(request, name, schedule)
        entry = Entry(new_execution_id(), name, schedule, principal=principal)
        entry.created_at = time.time()
        await self._keep(entry)
        return JSONResponse(entry.view(), status_code=201)

    async def list_schedules(self, request: Request) -> Response:
        """A page, by id: the declared schedules and the caller's tenant's (an admin's:
        every tenant's), `limit` at most (100 by default) and MAX_LIST_BYTES of JSON, with
        a `Link` to the next page while more follow (as `GET /executions` pages)."""
        limit = int_param(request, "limit", minimum=1, maximum=MAX_LIST_LIMIT) or 100
        after = schedule_cursor(request)
        await self.access.check(request.scope, "schedule", {"operation": "list"})
        await self.ticker.sync()  # what another replica changed, read now
        principal = self.access.principal(request.scope)
        listing = self.ticker.listing(
            None if principal is None else principal.tenant,
            principal is None or principal.is_admin,
        )
        first = 0 if after is None else bisect.bisect_right(listing, after, key=_schedule_id)
        page = listing[first : first + limit]
        body, count = json_list((entry.view() for entry in page), MAX_LIST_BYTES)
        more = count < len(page) or first + limit < len(listing)
        following = page[count - 1].schedule_id if more and count else None
        headers = page_headers(request, following, truncated=count < len(page))
        return Response(body, media_type="application/json", headers=headers)

    async def schedule(self, request: Request) -> Response:
        operation = {"PATCH": "change", "DELETE": "delete"}.get(request.method, "read")  # HEAD
        entry = await self._find(request, operation)
        if request.method != "GET":
            self._may_change(request, entry)
        if request.method == "DELETE":
            if entry.declared:
                raise ApiError(409, "a declared schedule cannot be deleted: PATCH enabled=false")
            await self.ticker.forget(entry)
            return Response(status_code=204)
        if request.method == "PATCH":
            allowed = frozenset({"enabled"}) if entry.declared else FIELDS - {"reasoner"}
            body = await self._body(request, allowed)
            changed = Entry(
                entry.schedule_id,
                entry.reasoner,
                self._schedule(self.reasoners[entry.reasoner], body, entry.schedule),
                principal=entry.principal,
                declared=entry.declared,
                created_at=entry.created_at,
            )
            if changed.schedule.enabled and not entry.declared:
                await self._may_start(request, entry.reasoner, changed.schedule)
            await self._keep(changed)
            entry = changed
        return JSONResponse(entry.view())

    async def trigger(self, request: Request) -> Response:
        """Fire now: refused as a start is (429 + Retry-After when full, 409 while its
        session is released, 503 draining or in doubt), 409 when its overlap skips it,
        422 when its input no longer binds the reasoner."""
        entry = await self._find(request, "trigger")
        self._may_change(request, entry)
        await self._may_start(request, entry.reasoner, entry.schedule)
        # A refusal of the start (`Refusal`) is answered by the front as any start's.
        firing = await self.ticker.trigger(entry)
        if firing.outcome is FiringOutcome.SKIPPED and firing.execution is not None:
            raise ApiError(
                409,
                "the previous firing is still running (overlap skip or buffer_one)",
                extra={"execution_id": firing.execution.execution_id},
            )
        if firing.outcome is FiringOutcome.INVALID:
            raise ApiError(422, f"input: {firing.problem}")
        if firing.execution is None:  # this very millisecond's firing, since forgotten
            raise ApiError(409, "this moment's firing was started and forgotten: trigger again")
        # Answered as a start: the record to a caller that may read it; else the id of
        # what it started, and a repeat's (an earlier firing's) not even that (403).
        execution = firing.execution
        if not await self.access.reads(self.access.principal(request.scope), execution):
            if firing.outcome is not FiringOutcome.STARTED:
                raise Denied("read")
            return acceptance(request.scope, execution.execution_id)
        return JSONResponse(execution.to_json(), status_code=202)

    async def _find(self, request: Request, operation: str) -> Entry:
        """The schedule the path names, when the caller sees it (404 otherwise), once
        `@agent.authorize` allows `schedule` on it: the resource is the schedule as the API
        shows it (its `owner` and `tenant` included, so a rule may keep a member to its own)
        and the `operation` (read, change, delete, trigger)."""
        principal = self.access.principal(request.scope)
        schedule_id = request.path_params["schedule_id"]
        await self.ticker.sync()  # what another replica changed, read now
        found = [
            entry
            for entry in self.ticker.entries.values()
            if entry.schedule_id == schedule_id and _sees(principal, entry)
        ]
        if not found:
            raise ApiError(404, UNKNOWN_SCHEDULE)
        entry = found[0]
        await self.access.check(request.scope, "schedule", {**entry.view(), "operation": operation})
        return entry

    async def _may_start(self, request: Request, reasoner: str, schedule: Schedule) -> None:
        """A schedule starts work in its owner's name: who makes, changes (enabled) or
        triggers one must be allowed to `start` that work itself, so `schedule` never
        stands in for `start` (403)."""
        await self.access.check(
            request.scope, "start", {"reasoner": reasoner, "session_id": schedule.session_id}
        )

    def _may_change(self, request: Request, entry: Entry) -> None:
        """A declared schedule is the agent's: every tenant reads it, only an admin (or
        any caller without authentication) disables, enables or triggers it (403)."""
        principal = self.access.principal(request.scope)
        if entry.declared and principal is not None and not principal.is_admin:
            raise Denied("schedule")

    async def _keep(self, entry: Entry) -> None:
        """Into the store for every replica, and fired here from now on; one made through
        the API counts among its tenant's (a new one past `--max-schedules` is 409, and
        nothing changed)."""
        try:
            await self.ticker.keep(entry, None if entry.declared else self.max_schedules)
        except ScheduleLimit:
            raise ApiError(
                409,
                f"the tenant has {self.max_schedules} schedules, as many as --max-schedules "
                "allows: delete one first",
            ) from None

    async def _body(self, request: Request, allowed: frozenset[str]) -> dict[str, Any]:
        headers = first_values(request.scope["headers"])
        body = await read_json(request.receive, headers, self.max_body_size)
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        unknown = sorted(set(body) - allowed)
        if unknown:
            name = unknown[0]
            if not (name.isprintable() and 0 < len(name) <= SHOWN_LENGTH):
                name = shown(name)
            raise ApiError(422, f"{name}: not a field here (one of {sorted(allowed)})")
        return body

    def _schedule(
        self, reasoner: Reasoner, body: dict[str, Any], base: Schedule | None = None
    ) -> Schedule:
        """The schedule the body makes (or makes of `base`), checked: a field refused is
        422 naming it, an input past `--max-schedule-input-size` 413."""
        fields = {k: v for k, v in body.items() if k != "reasoner"}
        try:
            if base is None:
                if "cron" not in fields:
                    raise ScheduleError("cron", "is required")
                schedule = Schedule(**fields)
            else:
                schedule = dataclasses.replace(base, **fields)
        except ScheduleError as exc:
            raise ApiError(422, str(exc)) from None
        try:
            reasoner.bind(dict(schedule.input))
        except ValidationError as exc:  # at most SHOWN_LENGTH characters of it echoed
            raise ApiError(422, f"input: {binding_problem(exc)}") from None
        if "input" in fields:
            self._bounded(schedule)
        return schedule

    def _bounded(self, schedule: Schedule) -> None:
        """Every replica keeps every schedule in memory and reads it again when it changes:
        an input past `--max-schedule-input-size` bytes of JSON is 413, whatever the body's
        own bound."""
        size = len(jsoncodec.dumps(dict(schedule.input)))
        if size > self.max_input_size:
            raise ApiError(
                413,
                f"input: {size} bytes of JSON, more than the {self.max_input_size} "
                "--max-schedule-input-size allows",
            )


def _schedule_id(entry: Entry) -> str:
    return entry.schedule_id


def _sees(principal: Principal | None, entry: Entry) -> bool:
    """Declared ones are everyone's; the others their tenant's (an admin sees all)."""
    if entry.declared or principal is None or principal.is_admin:
        return True
    return entry.tenant == principal.tenant
