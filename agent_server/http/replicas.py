"""`GET /replicas`: the live replicas of this agent, for the console's replicas view.

Each replica's id, its versions, whether it admits work or drains, how many executions it
runs, and during a shutdown its phase and the seconds left until that phase's planned end.
The replica that answers describes itself as it is now; the others are read from the shared
store, as each last wrote itself there (with its liveness renewal: at most `--lease-ttl`/3
old). The list spans tenants, so with authentication on it is the admin scope's (403 for
another principal); without authentication anyone who reaches the port may read it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.auth import principal_of
from agent_server.http.routing import ApiError, JSONResponse
from agent_server.store.roles import Liveness

#: The JSON schema of one replica in the list (OpenAPI's `Replica`).
REPLICA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [
        "replica_id", "versions", "admitting", "draining", "in_flight", "phase",
        "deadline_seconds", "answering",
    ],
    "properties": {
        "replica_id": {"type": "string"},
        "versions": {
            "type": "array",
            "items": {"type": ["string", "null"]},
            "description": "the versions of the code it runs; null for unversioned",
        },
        "admitting": {"type": "boolean"},
        "draining": {"type": "boolean"},
        "in_flight": {"type": ["integer", "null"], "minimum": 0},
        "phase": {"enum": ["serving", "unready", "draining", "cancelling", "stopped", None]},
        "deadline_seconds": {
            "type": ["number", "null"],
            "description": "seconds left until the end of its shutdown phase; null while serving",
        },
        "answering": {"type": "boolean", "description": "the replica that answered"},
    },
}  # fmt: skip


class Replicas:
    """The route, given how this replica describes itself and the store the others write."""

    def __init__(self, describe: Callable[[], dict[str, Any]], store: Liveness) -> None:
        self.describe = describe
        self.store = store

    async def list_replicas(self, request: Request) -> Response:
        principal = principal_of(request.scope)
        if principal is not None and not principal.is_admin:
            raise ApiError(403, "the replicas span tenants: the admin scope reads them")
        own = self.describe()
        found = [_shown(own, answering=True)]
        for state in await self.store.replica_states():
            if state.get("replica_id") != own["replica_id"]:
                found.append(_shown(state, answering=False))
        return JSONResponse(found)


def _shown(state: dict[str, Any], *, answering: bool) -> dict[str, Any]:
    deadline_at = state.get("deadline_at")
    left = None
    if isinstance(deadline_at, int | float):
        left = max(0.0, round(deadline_at - time.time(), 3))
    versions = state.get("versions")
    in_flight = state.get("in_flight")
    phase = state.get("phase")
    return {
        "replica_id": str(state.get("replica_id", "")),
        "versions": [v if isinstance(v, str) else None for v in versions]
        if isinstance(versions, list)
        else [],
        "admitting": state.get("admitting") is True,
        "draining": state.get("draining") is True,
        "in_flight": in_flight if isinstance(in_flight, int) and in_flight >= 0 else None,
        "phase": phase if isinstance(phase, str) else None,
        "deadline_seconds": left,
        "answering": answering,
    }
