"""What a probe, a scraper or a tool reads: `/healthz`, `/readyz`, `/metrics` and
`/openapi.json`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from agent_server.http.auth import principal_of
from agent_server.http.routing import ApiError, JSONResponse
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.roles import Liveness


class Health:
    """The probe, metrics and schema routes, given what they read."""

    def __init__(
        self,
        registry: InFlightRegistry,
        store: Liveness,
        metrics: Metrics,
        phase: Callable[[], str],
        openapi: Callable[[], dict[str, Any]],
    ) -> None:
        self.registry = registry
        self.store = store
        self.metrics = metrics
        self.phase = phase
        self.openapi_document = openapi

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "phase": self.phase()})

    async def readyz(self, request: Request) -> Response:
        if self.registry.draining:
            return JSONResponse({"status": "draining", "phase": self.phase()}, 503)
        if not self.store.up:
            return JSONResponse({"status": "store unavailable", "phase": self.phase()}, 503)
        return JSONResponse({"status": "ready", "phase": self.phase()})

    async def scrape(self, request: Request) -> Response:
        principal = principal_of(request.scope)
        if principal is not None and not principal.reads_metrics:
            # They count every tenant's work (what waits, what runs, what failed): a
            # tenant's token learns nothing of the others' from them.
            raise ApiError(403, "not allowed to read the metrics (scope metrics or admin)")
        return Response(
            self.metrics.exposition(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def openapi(self, request: Request) -> Response:
        document = self.openapi_document()
        root_path = request.scope.get("root_path", "")
        if root_path:  # mounted or behind a proxy: "Try it out" calls under the prefix too
            document = {**document, "servers": [{"url": root_path}]}
        return JSONResponse(document)
