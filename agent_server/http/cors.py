"""Cross-origin requests (`--cors-allow-origin`): what a page of an allowed origin may send
and read back, so a browser client can run, read and cancel executions."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from agent_server.http.route_table import METHODS
from agent_server.http.routing import JSONResponse
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.tracing import TRACE_CONTEXT_HEADERS

#: What a page of an origin given with `--cors-allow-origin` may send, and read back: every
#: method a route answers (the route table's), the headers a client follows (Location,
#: Retry-After, the list's Link) and X-Truncated. The request headers are these, a caller's
#: trace context, and each reasoner's concurrency header (`cors_request_headers`).
CORS_METHODS = METHODS
CORS_REQUEST_HEADERS = (
    "Authorization",
    "Content-Type",
    "Accept",
    "X-Session-ID",
    "Idempotency-Key",
    "Last-Event-ID",
    "X-Webhook-URL",
    "X-Session-Policy",
    *TRACE_CONTEXT_HEADERS,
)
CORS_EXPOSED_HEADERS = ("Location", "Retry-After", "Link", "X-Truncated")


def cors_request_headers(reasoners: Iterable[Reasoner]) -> list[str]:
    """Every request header the API reads: the fixed ones, a caller's trace context (a page
    with OpenTelemetry's browser instrumentation sends it with every request), and the
    header each `concurrency_key="header:NAME"` names."""
    found = dict.fromkeys(CORS_REQUEST_HEADERS)
    for reasoner in reasoners:
        if reasoner.concurrency_header is not None:
            found.setdefault(reasoner.concurrency_header)
    return list(found)


class JsonCORSMiddleware(CORSMiddleware):
    """Starlette's CORS middleware, its refused preflight (a 400 in plain text there)
    answered in JSON, as every refusal of the API is."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        kept = {
            name: value
            for name, value in response.headers.items()
            if name not in ("content-type", "content-length")
        }
        detail = bytes(response.body).decode("utf-8", "replace")
        return JSONResponse({"detail": detail}, response.status_code, kept)


def cors_middleware(
    origins: Sequence[str], reasoners: Iterable[Reasoner] = (), extra: Iterable[str] = ()
) -> Middleware:
    """Starlette's CORS middleware for `--cors-allow-origin`: a page of one of `origins` may
    run, read and cancel executions and follow their event streams (a browser
    `EventSource`), and read the headers clients follow; `extra` request headers too (a
    protocol's, when it is served)."""
    return Middleware(
        JsonCORSMiddleware,
        allow_origins=list(origins),
        allow_methods=list(CORS_METHODS),
        allow_headers=[*cors_request_headers(reasoners), *extra],
        expose_headers=list(CORS_EXPOSED_HEADERS),
    )
