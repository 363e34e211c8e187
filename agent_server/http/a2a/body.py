"""What a JSON-RPC body may hold before the SDK sees it: A2A's values travel as protobuf,
which carries less than the strict JSON the API reads (`model/jsoncodec.py`).

A lone surrogate (`"\\ud800"`, a valid JSON escape the HTTP API keeps) is no Unicode text:
protobuf strings are UTF-8, and the SDK fails on one deep in its dispatch (a 500, or an
internal error quoting the codec). An integer past a double's range, or params nested
deeper than protobuf's parsers go, fail its v0.3 conversions the same way. Each is refused
here, as JSON-RPC says, naming where it is; a v0.3 method name under a v1.0 `A2A-Version`
is "method not found" (A2A 3.6.2: that version's methods are the ones served). An
enumeration's value that names none (which the SDK would read as unset) is invalid params
naming the values allowed (`enums.py`).
"""

from __future__ import annotations

import json
from typing import Any, cast

import orjson
from a2a.compat.v0_3.jsonrpc_adapter import JSONRPC03Adapter
from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
from google.protobuf.message import Message as ProtoMessage
from packaging.version import InvalidVersion, Version

from agent_server.http.a2a.enums import unknown_enum
from agent_server.model.echoes import shown as echoed

#: JSON-RPC's and A2A's codes for the errors answered here.
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
VERSION_NOT_SUPPORTED = -32009
#: The deepest params taken: protobuf holds a JSON level as two messages (a Value and its
#: Struct or ListValue) and its parsers stop at 100 levels of them, the envelope included
#: (v0.3's conversion fails on a data part from about 44 levels).
MAX_PARAMS_DEPTH = 40
#: The longest place named in an error (a key may be long).
MAX_WHERE = 120

#: v0.3's method names and v1.0's for the same call (the hint of a "method not found").
V1_NAME_OF = {
    "message/send": "SendMessage",
    "message/stream": "SendStreamingMessage",
    "tasks/get": "GetTask",
    "tasks/cancel": "CancelTask",
    "tasks/resubscribe": "SubscribeToTask",
    "tasks/pushNotificationConfig/set": "CreateTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/get": "GetTaskPushNotificationConfig",
    "tasks/pushNotificationConfig/list": "ListTaskPushNotificationConfigs",
    "tasks/pushNotificationConfig/delete": "DeleteTaskPushNotificationConfig",
    "agent/getAuthenticatedExtendedCard": "GetExtendedAgentCard",
}


def protocol_version(headers: dict[str, str]) -> str:
    """The request's `A2A-Version`, read as the SDK reads it (a missing or empty one is
    0.3, A2A 3.6.2)."""
    return headers.get("A2A-Version") or headers.get("a2a-version") or "0.3"


def implied_version(body: Any, headers: dict[str, str]) -> str | None:
    """The version a request without `A2A-Version` is served as when its method exists
    only in 1.x (`SendMessage`, `GetTask`, ...): "1.0" (the method names the version; as
    0.3 it could only be "method not found"); None otherwise (the header, or 0.3, rules)."""
    if headers.get("A2A-Version") or headers.get("a2a-version"):
        return None
    method = body.get("method") if isinstance(body, dict) else None
    if not isinstance(method, str) or method in JSONRPC03Adapter.METHOD_TO_MODEL:
        return None
    return "1.0" if method in JsonRpcDispatcher.METHOD_TO_MODEL else None


def major_of(version: str) -> int | None:
    """The version's major number as the SDK compares it (0.3 and 1.0 are served), None
    when it is no version at all."""
    try:
        return Version(version).major
    except InvalidVersion:
        return None


def refusal(body: Any, raw: bytes, headers: dict[str, str]) -> dict[str, Any] | None:
    """The JSON-RPC error answering a parsed body (`raw` as sent) the SDK cannot take,
    else None (the SDK answers the rest, a malformed request included)."""
    clean = _encodes(body)
    if not clean:
        where = _lone_surrogate(body)
        if where is not None:
            return _error(_id_of(body), INVALID_REQUEST, f"invalid request: {where}")
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        return None
    method = body.get("method")
    if not isinstance(method, str):
        return None
    if method in JSONRPC03Adapter.METHOD_TO_MODEL:
        wrong = _version_refusal(method, protocol_version(headers))
        if wrong is not None:
            return _error(_id_of(body), *wrong)
    elif method not in JsonRpcDispatcher.METHOD_TO_MODEL:
        return None
    params = body.get("params")
    if isinstance(params, dict | list):
        shallow = raw.count(b"{") + raw.count(b"[") <= MAX_PARAMS_DEPTH
        problem = _params_problem(params, shallow=shallow, checked_numbers=clean)
        model = JsonRpcDispatcher.METHOD_TO_MODEL.get(method)
        if problem is None and model is not None and isinstance(params, dict):
            problem = unknown_enum(params, cast("type[ProtoMessage]", model))
        if problem is not None:
            return _error(_id_of(body), INVALID_PARAMS, f"invalid params: {problem}")
    return None


def _error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _id_of(body: Any) -> str | int | None:
    """The request's id, echoed when it is one JSON-RPC allows that the answer can carry."""
    found = body.get("id") if isinstance(body, dict) else None
    if isinstance(found, str) and _valid(found):
        return found
    if isinstance(found, int) and not isinstance(found, bool):
        return found
    return None


def _version_refusal(method: str, version: str) -> tuple[int, str] | None:
    """A v0.3 method under another version: "method not found" under 1.0 (served, without
    that name), "version not supported" under one not served; None under 0.x."""
    major = major_of(version)
    if major == 0:
        return None
    shown = echoed(version)
    if major == 1:
        return (
            METHOD_NOT_FOUND,
            f"method not found: {method} is A2A 0.3's name; under A2A-Version {shown} "
            f"call {V1_NAME_OF.get(method, 'its v1.0 method')} (or send A2A-Version 0.3)",
        )
    return (
        VERSION_NOT_SUPPORTED,
        f"A2A version {shown} is not supported: this server speaks 1.0 and 0.3",
    )


def _encodes(body: Any) -> bool:
    """Whether every string encodes to UTF-8 and every integer fits 64 bits: orjson's
    check, in C, of the usual body; only one it refuses is walked to say why."""
    try:
        orjson.dumps(body)
    except TypeError:
        return False
    return True


def _valid(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _lone_surrogate(body: Any) -> str | None:
    """Where the body holds a string (or a key) that is not Unicode text, and why it is
    refused; None when none does."""
    pending: list[tuple[Any, str]] = [(body, "")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, str):
            if not _valid(value):
                return _surrogate_message(path or "the body", value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if not _valid(key):
                    return _surrogate_message(f"a key of {path or 'the body'}", key)
                pending.append((item, _member(path, key)))
        elif isinstance(value, list):
            pending.extend((item, f"{path}[{i}]") for i, item in enumerate(value))
    return None


def _surrogate_message(where: str, text: str) -> str:
    code = next(ord(c) for c in text if 0xD800 <= ord(c) <= 0xDFFF)
    return (
        f"strings must be valid Unicode (A2A carries them as UTF-8), and {_bounded(where)} "
        f"holds a lone surrogate (\\u{code:04x})"
    )


def _params_problem(
    params: dict[str, Any] | list[Any], *, shallow: bool, checked_numbers: bool
) -> str | None:
    """Why protobuf cannot carry the params (nested past MAX_PARAMS_DEPTH, or an integer
    past a double's range), None when it can. What a cheap bound has settled is not
    walked: `shallow`, a body with fewer brackets than the levels allowed; `checked_numbers`,
    integers orjson took (64 bits)."""
    if not shallow and not _within(params, MAX_PARAMS_DEPTH):
        deep = _too_deep(params, MAX_PARAMS_DEPTH)
        return f"{_bounded(deep)} is nested deeper than {MAX_PARAMS_DEPTH} levels"
    if checked_numbers:
        return None
    pending: list[tuple[Any, str]] = [(params, "params")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                float(value)
            except OverflowError:
                return (
                    f"{_bounded(path)} is an integer beyond a double's range "
                    "(A2A carries numbers as doubles)"
                )
        elif isinstance(value, dict):
            pending.extend((item, _member(path, key)) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, f"{path}[{index}]") for index, item in enumerate(value))
    return None


def _within(value: Any, room: int) -> bool:
    """Whether `value` nests at most `room` levels (a plain recursion: the body is at most
    jsoncodec.MAX_DEPTH deep, and it stops at `room`)."""
    if type(value) is dict:
        if room == 0:
            return False
        return all(_within(item, room - 1) for item in value.values())
    if type(value) is list:
        if room == 0:
            return False
        return all(_within(item, room - 1) for item in value)
    return True


def _too_deep(params: Any, limit: int) -> str:
    """The path of a container nested past `limit` levels in the params (they count as
    one); `_within` found one."""
    pending: list[tuple[Any, str, int]] = [(params, "params", 1)]
    while pending:
        value, path, depth = pending.pop()
        if isinstance(value, dict | list) and depth > limit:
            return path
        if isinstance(value, dict):
            pending.extend((item, _member(path, key), depth + 1) for key, item in value.items())
        elif isinstance(value, list):
            pending.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
    return "params"


def _member(path: str, key: str) -> str:
    """`path.key`, or `path["key"]` (escaped to ASCII) for a key that is no plain name."""
    if key.isascii() and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{_shown(key)}]"


def _shown(text: str) -> str:
    """The text as a JSON string escaped to ASCII: it is echoed in an error."""
    return json.dumps(text)


def _bounded(where: str) -> str:
    return where if len(where) <= MAX_WHERE else where[:MAX_WHERE] + "..."
