"""`/schedules`: schedules made, read, changed, deleted and triggered, per tenant.

A schedule made here is kept in the store as a JSON document, so every replica fires it;
a declared one may only be disabled or enabled (PATCH `enabled`), never deleted (409).
Another tenant's schedule answers 404, as an unknown one (docs/schedules.md).
"""

from __future__ import annotations

import dataclasses
import reprlib
import time
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.access import Access, Denied
from agent_server.http.params import first_values, read_json, validation_detail
from agent_server.http.routing import ApiError, JSONResponse
from agent_server.model.ids import new_execution_id
from agent_server.model.principal import Principal
from agent_server.model.reasoner import Reasoner
from agent_server.model.schedules import Schedule, ScheduleError
from agent_server.runtime.admission import AdmissionError
from agent_server.runtime.schedules import Entry, ScheduleTicker

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
#: How much of a value a refusal echoes.
SHOWN_LENGTH = 64


class Schedules:
    """The schedule routes, given the ticker that fires them."""

    def __init__(
        self,
        ticker: ScheduleTicker,
        reasoners: Mapping[str, Reasoner],
        access: Access,
        max_body_size: int,
    ) -> None:
        self.ticker = ticker
        self.reasoners = reasoners
        self.access = access
        self.max_body_size = max_body_size

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
            raise ApiError(422, f"reasoner: {_shown(name)} is not a reasoner of this agent")
        await self.access.check(request.scope, "schedule", {"reasoner": name})
        schedule = self._schedule(self.reasoners[name], body)
        principal = self.access.principal(request.scope)
        entry = Entry(new_execution_id(), name, schedule, principal=principal)
        entry.created_at = time.time()
        await self._keep(entry)
        return JSONResponse(entry.view(), status_code=201)

    async def list_schedules(self, request: Request) -> Response:
        await self.access.check(request.scope, "schedule", {})
        await self.ticker.sync()  # what another replica changed, read now (one GET)
        principal = self.access.principal(request.scope)
        shown = [
            entry.view()
            for entry in sorted(self.ticker.entries.values(), key=lambda e: e.schedule_id)
            if _sees(principal, entry)
        ]
        return JSONResponse(shown)

    async def schedule(self, request: Request) -> Response:
        entry = await self._find(request)
        if request.method != "GET":
            self._may_change(request, entry)
        if request.method == "DELETE":
            if entry.declared:
                raise ApiError(409, "a declared schedule cannot be deleted: PATCH enabled=false")
            await self.ticker.store.delete_schedule(entry.key)
            self.ticker.remove(entry.key)
            self.ticker.wake()
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
            await self._keep(changed)
            entry = changed
        return JSONResponse(entry.view())

    async def trigger(self, request: Request) -> Response:
        entry = await self._find(request)
        self._may_change(request, entry)
        try:
            firing = await self.ticker.fire(entry, round(time.time(), 3))
        except AdmissionError as exc:
            raise ApiError(503, f"the firing was not started: {exc.reason.value}") from None
        if firing.outcome == "skipped":
            assert firing.execution is not None
            raise ApiError(
                409,
                "the previous firing is still running (overlap skip or buffer_one)",
                extra={"execution_id": firing.execution.execution_id},
            )
        assert firing.execution is not None
        return JSONResponse(firing.execution.to_json(), status_code=202)

    async def _find(self, request: Request) -> Entry:
        principal = self.access.principal(request.scope)
        schedule_id = request.path_params["schedule_id"]
        await self.ticker.sync()  # what another replica changed, read now (one GET)
        found = [
            entry
            for entry in self.ticker.entries.values()
            if entry.schedule_id == schedule_id and _sees(principal, entry)
        ]
        if not found:
            raise ApiError(404, UNKNOWN_SCHEDULE)
        entry = found[0]
        await self.access.check(
            request.scope,
            "schedule",
            {"schedule_id": entry.schedule_id, "reasoner": entry.reasoner},
        )
        return entry

    def _may_change(self, request: Request, entry: Entry) -> None:
        """A declared schedule is the agent's: every tenant reads it, only an admin (or
        any caller without authentication) disables, enables or triggers it (403)."""
        principal = self.access.principal(request.scope)
        if entry.declared and principal is not None and not principal.is_admin:
            raise Denied("schedule")

    async def _keep(self, entry: Entry) -> None:
        """Into the store for every replica, and fired here from now on."""
        entry.document = entry.to_document()
        await self.ticker.store.put_schedule(entry.key, entry.document)
        self.ticker.add(entry)
        self.ticker.wake()

    async def _body(self, request: Request, allowed: frozenset[str]) -> dict[str, Any]:
        headers = first_values(request.scope["headers"])
        body = await read_json(request.receive, headers, self.max_body_size)
        if not isinstance(body, dict):
            raise ApiError(422, "the body must be a JSON object")
        unknown = sorted(set(body) - allowed)
        if unknown:
            name = unknown[0]
            if not (name.isprintable() and 0 < len(name) <= SHOWN_LENGTH):
                name = _shown(name)
            raise ApiError(422, f"{name}: not a field here (one of {sorted(allowed)})")
        return body

    @staticmethod
    def _schedule(
        reasoner: Reasoner, body: dict[str, Any], base: Schedule | None = None
    ) -> Schedule:
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
        except ValidationError as exc:
            raise ApiError(422, f"input: {validation_detail(exc)}") from None
        return schedule


def _shown(value: object) -> str:
    """A value a client sent, as a refusal echoes it: its repr (any character escaped),
    cut to about SHOWN_LENGTH characters."""
    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = SHOWN_LENGTH
    return shown.repr(value)


def _sees(principal: Principal | None, entry: Entry) -> bool:
    """Declared ones are everyone's; the others their tenant's (an admin sees all)."""
    if entry.declared or principal is None or principal.is_admin:
        return True
    return entry.tenant == principal.tenant
