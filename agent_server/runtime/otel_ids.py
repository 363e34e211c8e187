"""The span ids of attempts: the SDK's random ids, except an attempt's span id, derived
from its execution and number (`attempt_span_id`) and given just before its span starts."""

from __future__ import annotations

import contextvars
from typing import Any


def _id_generator_base() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    return RandomIdGenerator


class AttemptIds:
    """The SDK's random ids, except the span id of an attempt, given just before its span
    starts (in a context variable: other threads' spans are not affected)."""

    def __init__(self) -> None:
        self._random = _id_generator_base()()
        self._next: contextvars.ContextVar[int] = contextvars.ContextVar(
            "agent_server_next_span_id", default=0
        )

    def preset(self, span_id: int) -> _Preset:
        return _Preset(self._next, span_id)

    def generate_span_id(self) -> int:
        preset = self._next.get()
        if preset:
            self._next.set(0)
            return preset
        return int(self._random.generate_span_id())

    def generate_trace_id(self) -> int:
        return int(self._random.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        return True


class _Preset:
    """`with ids.preset(span_id):` the next span started in this context gets `span_id`."""

    __slots__ = ("_token", "_var", "span_id")

    def __init__(self, var: contextvars.ContextVar[int], span_id: int) -> None:
        self._var = var
        self.span_id = span_id
        self._token: contextvars.Token[int] | None = None

    def __enter__(self) -> None:
        self._token = self._var.set(self.span_id)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._var.reset(self._token)
