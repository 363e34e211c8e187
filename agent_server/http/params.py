"""What a request says, read and checked: headers, query parameters and the body's bytes.

Each reader answers a value or raises `ApiError` with the 4xx that names what is wrong, so a
handler reads as the happy path and nothing a client sends reaches a reasoner unchecked.
"""

from __future__ import annotations

import math
import urllib.parse
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.types import Receive

from agent_server.http.routing import ApiError
from agent_server.model import jsoncodec
from agent_server.model.echoes import SHOWN_LENGTH, shown
from agent_server.model.execution import MAX_SECONDS
from agent_server.model.names import (
    REASONER_NAME_RULE,
    SCHEDULE_ID_RULE,
    SESSION_ID_RULE,
    is_reasoner_name,
    is_schedule_id,
    is_session_id,
)
from agent_server.model.scheduling import MAX_DELAY_SECONDS
from agent_server.model.status import ExecutionStatus
from agent_server.runtime.webhooks import check_url
from agent_server.store.cursor import CURSOR_RULE, BadCursor, ListCursor

MAX_IDEMPOTENCY_KEY_LENGTH = 255
#: The most items a list's page holds (`?limit=`), executions or schedules.
MAX_LIST_LIMIT = 1000
#: Bytes of JSON a list's page stops at (with `X-Truncated: true`); it always holds the
#: first item. A list of big results would otherwise be built, and pinned by a client that
#: does not read it, whole: 1000 results of 4 MB are 4 GB.
MAX_LIST_BYTES = 4 * 1024 * 1024
JSON_MEDIA_TYPES = ("application/json",)


def first_values(raw_headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header's first value by its (lower-case, per ASGI) name, in one pass."""
    return dict(reversed(raw_headers))


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or ApiError: 413 past `limit`, 499 when the client goes away (nobody
    to answer; not a server error worth a traceback)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(499, "client disconnected before sending its body")
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)  # one chunk, the usual case, is returned as it is


def statuses(request: Request) -> frozenset[ExecutionStatus]:
    """`status`, repeated or as a comma list: any of them matches."""
    found: set[ExecutionStatus] = set()
    for value in request.query_params.getlist("status"):
        for each in value.split(","):
            try:
                found.add(ExecutionStatus(each.strip()))
            except ValueError:
                allowed = ", ".join(s.value for s in ExecutionStatus)
                raise ApiError(422, f"status must be one of: {allowed}") from None
    return frozenset(found)


def next_link(request: Request, cursor: str) -> str:
    """RFC 8288: the same list (path as received, mount prefix included; the same filters)
    from `cursor` on. A path without a host: behind a proxy the host is the proxy's."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
    query.append(("cursor", cursor))
    return f'<{request.url.path}?{urllib.parse.urlencode(query)}>; rel="next"'


def json_list(items: Iterable[Any], max_bytes: int) -> tuple[bytes, int]:
    """A JSON list of the items, in order, stopped before `max_bytes` would be passed (the
    first always goes in); how many it holds. Items past the cut are never encoded."""
    parts: list[bytes] = []
    size = 2
    for item in items:
        part = jsoncodec.dumps(item)
        size += len(part) + 1
        if parts and size > max_bytes:
            break
        parts.append(part)
    return b"[" + b",".join(parts) + b"]", len(parts)


def page_headers(request: Request, following: str | None, truncated: bool) -> dict[str, str]:
    """A page's headers: `Link` to the page from `following` on, while more follow, and
    `X-Truncated: true` when the page was cut at its bytes."""
    headers: dict[str, str] = {}
    if truncated:
        headers["X-Truncated"] = "true"
    if following is not None:
        headers["Link"] = next_link(request, following)
    return headers


def schedule_cursor(request: Request) -> str | None:
    """`cursor` of `GET /schedules`: the id of the last schedule a page showed (the list is
    by id); what no schedule id can be is the 400 of a bad list cursor."""
    text = query_param(request, "cursor")
    if text is not None and not is_schedule_id(text):
        raise ApiError(400, CURSOR_RULE)
    return text


def list_cursor(request: Request) -> ListCursor | None:
    """`cursor`, read by the one reader both stores share: one no Link header could have
    given (a time that is not a finite number a record can have, a malformed id) is a 400
    before any store sees it."""
    text = query_param(request, "cursor")
    if text is None:
        return None
    try:
        return ListCursor.read(text)
    except BadCursor:
        raise ApiError(400, CURSOR_RULE) from None


def reasoner_filter(request: Request) -> str | None:
    """`reasoner`: a name no reasoner can have (huge, control characters...) is a 400, not
    a silent miss that a store carries around."""
    value = query_param(request, "reasoner")
    if value is not None and not is_reasoner_name(value):
        raise ApiError(400, f"invalid reasoner: {REASONER_NAME_RULE}")
    return value


def schedule_filter(request: Request) -> str | None:
    """`schedule_id`: an id no schedule can have is a 400, as a bad `reasoner` is."""
    value = query_param(request, "schedule_id")
    if value is not None and not is_schedule_id(value):
        raise ApiError(400, f"invalid schedule_id: {SCHEDULE_ID_RULE}")
    return value


def checked_session_id(value: str | None, where: str) -> str | None:
    """The same rule as `X-Session-ID`, for a session id in a path or a query: an id no
    request could have carried is a 400, not a silent miss."""
    if value is not None and not is_session_id(value):
        raise ApiError(400, f"invalid {where}: {SESSION_ID_RULE}")
    return value


def wants_events(raw_headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"accept" and b"text/event-stream" in value for name, value in raw_headers)


def event_cursor(request: Request) -> int:
    """The last event a client has: `Last-Event-ID`, else `?after=N`, else 0."""
    raw = request.headers.get("last-event-id")
    name = "Last-Event-ID"
    if raw is None:
        raw = query_param(request, "after")
        name = "after"
    if raw is None or raw == "":
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, f"{name} must be an event number (a non-negative integer)")
    return int(raw)


def idempotency_key(raw: bytes | None) -> str | None:
    """1 to 255 printable ASCII characters, or 400."""
    if raw is None:
        return None
    if not 0 < len(raw) <= MAX_IDEMPOTENCY_KEY_LENGTH or not all(0x20 <= b < 0x7F for b in raw):
        raise ApiError(
            400,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters",
        )
    return raw.decode("ascii")


def webhook_target(raw: bytes | None, enabled: bool, default: str | None) -> str | None:
    """Where a start's webhooks go: `X-Webhook-URL` (an absolute http(s) URL, or 400; 400
    too when webhooks are off: no secret to sign with), else `--webhook-url`."""
    if raw is None:
        return default
    if not enabled:
        raise ApiError(
            400,
            "X-Webhook-URL needs webhooks on this server (--webhook-secret or "
            "--webhook-secret-file)",
        )
    try:
        return check_url(raw.decode("latin-1"), "X-Webhook-URL")
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None


#: The longest `input` a validation error echoes as it was sent (characters of its JSON):
#: a longer one is echoed as `echoes.shown` cuts it (a string of its repr).
MAX_ECHOED_INPUT = 4 * SHOWN_LENGTH


def validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's error list without echoing internals (`url`, `ctx` objects), made of JSON
    data that UTF-8 can always carry: the input echoed back may hold a lone surrogate (a
    valid JSON escape), which pydantic's own `json()` cannot encode (a 500 otherwise). An
    `input` is echoed whole only when short (a megabyte sent must not come back)."""
    errors = exc.errors(include_url=False, include_context=False)
    return [
        {key: _encodable(_echoed(item) if key == "input" else item) for key, item in error.items()}
        for error in errors
    ]


def _echoed(value: Any) -> Any:
    """The value as an error echoes it: as it is when its JSON is short, else `shown`."""
    try:
        short = len(jsoncodec.dumps(value)) <= MAX_ECHOED_INPUT
    except (TypeError, ValueError, RecursionError, jsoncodec.Unrecordable):
        short = False
    return value if short else shown(value)


def _encodable(value: Any) -> Any:
    """JSON data whose strings all encode to UTF-8: a string that does not is sent with
    its unencodable characters backslash-escaped (`"\\ud800"`); what is not JSON data
    (a validator's own input) is sent as its repr."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {_encodable(str(key)): _encodable(item) for key, item in value.items()}
    return _encodable(repr(value))


def query_param(request: Request, name: str) -> str | None:
    """Most requests carry no query string: skip parsing one (bench/RESULTS.md)."""
    if not request.scope["query_string"]:
        return None
    return request.query_params.get(name)


def float_param(
    request: Request,
    name: str,
    *,
    minimum: float,
    maximum: float = MAX_SECONDS,
    otherwise: str = "",
) -> float | None:
    """A duration parameter: finite and within what the clock and Redis TTLs take (as
    every duration setting is), else 422 naming it, its bounds, and `otherwise` (what else
    the route takes in its place), whatever was wrong with it."""
    value = query_param(request, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not minimum <= number <= maximum:
        # .15g: a bound in whole seconds reads as written (31536000, not 3.1536e+07).
        bounds = (
            f"from {minimum:.15g} to {maximum:.15g}"
            if math.isfinite(maximum)
            else f">= {minimum:.15g}"
        )
        raise ApiError(422, f"{name} must be a finite number of seconds {bounds}{otherwise}")
    return number


def delay_param(request: Request) -> float | None:
    """`?delay=S` of an async start: seconds from 0 to 7 days, else 400."""
    value = query_param(request, "delay")
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or not 0 <= number <= MAX_DELAY_SECONDS:
        raise ApiError(400, "delay must be a number of seconds from 0 to 604800 (7 days)")
    return number


def int_param(request: Request, name: str, *, minimum: int, maximum: int) -> int | None:
    """A count: ASCII digits only (`int` would also take ' 5', '+5', '1_0' and other
    scripts' digits), within the bounds, else 422 naming it."""
    value = query_param(request, name)
    if value is None:
        return None
    rule = f"{name} must be an integer from {minimum} to {maximum}"  # one rule, whatever broke it
    if not value.isascii() or not value.isdigit():
        raise ApiError(422, rule)
    number = int(value) if len(value) <= 20 else maximum + 1
    if not minimum <= number <= maximum:
        raise ApiError(422, rule)
    return number


async def read_json(receive: Receive, headers: dict[bytes, bytes], limit: int) -> Any:
    """The body as JSON, within the size limit; an empty body is None."""
    declared = headers.get(b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body exceeds {limit} bytes")
    raw = await read_body(receive, limit)
    if not raw.strip():
        return None
    content_type = headers.get(b"content-type")
    if content_type is not None:
        media_type = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
        if media_type not in JSON_MEDIA_TYPES and not media_type.endswith("+json"):
            raise ApiError(415, f"unsupported content type {shown(media_type)}: send JSON")
    try:
        body = jsoncodec.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ApiError(400, f"malformed JSON body: {jsoncodec.short_error(exc)}") from None
    try:  # what is accepted must be written back the same (idempotency, hand-off)
        jsoncodec.check(body, "the body")
    except jsoncodec.Unrecordable as exc:
        raise ApiError(400, str(exc)) from None
    return body
