"""Agent: the user's object. Registers reasoners and is itself an ASGI application."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.api import build_app
from agent_server.metrics import Metrics
from agent_server.reasoner import Reasoner, ReasonerDefinitionError
from agent_server.registry import InFlightRegistry
from agent_server.settings import Settings
from agent_server.shutdown import Phase, ShutdownPlan, ShutdownSequence

logger = logging.getLogger("agent_server.agent")

F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """A named set of reasoners served over HTTP, with its own registry and metrics.

    `uvicorn module:agent` serves it directly; `agent-server run module:agent` adds the full
    signal-driven shutdown sequence around it.
    """

    def __init__(self, name: str, settings: Settings | None = None) -> None:
        self.name = name
        self.settings = settings if settings is not None else Settings()
        self.reasoners: dict[str, Reasoner] = {}
        self.metrics = Metrics()
        self.registry = InFlightRegistry(observer=self.metrics)
        self.phase = Phase.SERVING
        self.shutdown = self._make_shutdown()
        self._apply_settings()
        self._app: ASGIApp | None = None

    def reasoner(
        self, name: str | None = None, *, description: str | None = None
    ) -> Callable[[F], F]:
        """Register a function as a reasoner; the function itself is returned unchanged."""

        def register(func: F) -> F:
            reasoner_name = name or func.__name__
            if reasoner_name in self.reasoners:
                raise ReasonerDefinitionError(f"reasoner {reasoner_name!r} is already registered")
            self.reasoners[reasoner_name] = Reasoner(func, reasoner_name, description)
            self.metrics.add_reasoner(reasoner_name)
            return func

        return register

    def configure(self, settings: Settings) -> None:
        """Apply settings before serving (the CLI does this with its flags)."""
        self.settings = settings
        self._apply_settings()
        self.shutdown = self._make_shutdown()

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.metrics.set_phase(phase.value)

    def _apply_settings(self) -> None:
        self.registry.max_inflight = self.settings.max_inflight
        self.registry.result_ttl = self.settings.result_ttl
        self.registry.max_retained = self.settings.max_retained

    def _make_shutdown(self) -> ShutdownSequence:
        plan = ShutdownPlan.from_settings(self.settings)
        return ShutdownSequence(self.registry, self.metrics, self.set_phase, plan)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = build_app(self)
        await self._app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """Plain `uvicorn module:agent`: drain (bounded) when uvicorn shuts down.

        Under `agent-server run` the sequence has already run while the listener was open.
        """
        yield
        if self.shutdown.started is None:
            self.shutdown.begin(time.monotonic(), time.time(), None)
            report = await self.shutdown.run(skip_unready=True)
            if self.registry.abandoned_pending:
                end_process(report.exit_code)
        self.registry.close()


def end_process(code: int) -> None:
    """Exit now: asyncio.run's cleanup would wait without bound for abandoned tasks."""
    logger.warning("exiting with abandoned work still running (exit code %d)", code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
