"""`DELETE /sessions/{id}`: a session released, its running work cancelled or waited for."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.access import RequestAccess
from agent_server.http.params import checked_session_id, float_param, query_param
from agent_server.http.routing import ApiError, JSONResponse
from agent_server.runtime.sessions import SessionBusy, SessionReleases
from agent_server.store.base import StoreInDoubt, StoreUnavailable

#: Seconds a release waits for the session's running work when the request names none
#: (`?timeout=`); `?timeout=none` waits without bound.
RELEASE_TIMEOUT = 30.0


class Sessions:
    """The session route, given the releases it starts."""

    def __init__(self, releases: SessionReleases, access: RequestAccess | None = None) -> None:
        self.releases = releases
        self.access = access or RequestAccess()

    async def release_session(self, request: Request) -> Response:
        session_id = checked_session_id(request.path_params["session_id"], "session id")
        assert session_id is not None
        timeout_value = query_param(request, "timeout")
        timeout: float | None
        if timeout_value is None:
            timeout = RELEASE_TIMEOUT
        elif timeout_value.lower() == "none":
            timeout = None
        else:
            timeout = float_param(request, "timeout", minimum=0.0, otherwise=", or none")
        cancel_value = request.query_params.get("cancel_running", "true").lower()
        if cancel_value not in ("true", "false", "1", "0"):
            raise ApiError(422, "cancel_running must be true or false")
        # The session of the caller's tenant (an admin's too): names are per tenant.
        await self.access.check(request.scope, "release", {"session_id": session_id})
        principal = self.access.principal(request.scope)
        try:
            release = await self.releases.release(
                session_id,
                timeout=timeout,
                cancel_running=cancel_value in ("true", "1"),
                tenant=None if principal is None else principal.tenant,
            )
        except SessionBusy:
            raise ApiError(409, "session has running executions and cancel_running=false") from None
        except StoreInDoubt as exc:  # one forget not yet on a replica: the release is retried
            raise StoreUnavailable(str(exc)) from None
        return JSONResponse(release.to_json())
