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
from agent_server.logs import configure_unless_configured
from agent_server.loop_errors import install_loop_error_handler
from agent_server.metrics import Metrics
from agent_server.names import REASONER_NAME_RULE, is_reasoner_name
from agent_server.pushgateway import push_shutdown
from agent_server.reasoner import Reasoner, ReasonerDefinitionError
from agent_server.registry import InFlightRegistry
from agent_server.settings import Settings
from agent_server.shutdown import Phase, ShutdownPlan, ShutdownSequence, end_leftovers

logger = logging.getLogger("agent_server.agent")

F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """A named set of reasoners served over HTTP, with its own registry and metrics.

    `uvicorn module:agent` serves it directly; `agent-server run module:agent` adds the full
    signal-driven shutdown sequence around it.
    """

    def __init__(self, name: str, settings: Settings | None = None) -> None:
        self.name = name
        self.reasoners: dict[str, Reasoner] = {}
        self.metrics = Metrics()
        self.registry = InFlightRegistry(observer=self.metrics)
        self.phase = Phase.SERVING
        self._settings = settings
        self._shutdown: ShutdownSequence | None = None
        self._app: ASGIApp | None = None
        #: Set by `agent-server run`, whose runner drains while its listener is still open.
        self.served_by_runner = False
        if settings is not None:
            self.configure(settings)

    @property
    def settings(self) -> Settings:
        """Resolved on first use, so importing a module never fails on the environment:
        `agent-server run` configures the agent from its flags before anything reads this."""
        if self._settings is None:
            self.configure(Settings())
        assert self._settings is not None
        return self._settings

    @property
    def shutdown(self) -> ShutdownSequence:
        if self._shutdown is None:
            plan = ShutdownPlan.from_settings(self.settings)
            self._shutdown = ShutdownSequence(self.registry, self.metrics, self.set_phase, plan)
        return self._shutdown

    def reasoner(
        self, name: str | None = None, *, description: str | None = None
    ) -> Callable[[F], F]:
        """Register a function as a reasoner; the function itself is returned unchanged."""

        def register(func: F) -> F:
            reasoner_name = func.__name__ if name is None else name
            if not is_reasoner_name(reasoner_name):
                raise ReasonerDefinitionError(
                    f"reasoner name {reasoner_name!r} cannot be served at /reasoners/{{name}}: "
                    f"{REASONER_NAME_RULE}"
                )
            if reasoner_name in self.reasoners:
                raise ReasonerDefinitionError(f"reasoner {reasoner_name!r} is already registered")
            self.reasoners[reasoner_name] = Reasoner(func, reasoner_name, description)
            self.metrics.add_reasoner(reasoner_name)
            return func

        return register

    def configure(self, settings: Settings) -> None:
        """Apply settings before serving (the CLI does this with its flags)."""
        self._settings = settings
        self._shutdown = None
        self.registry.max_inflight = settings.max_inflight
        self.registry.result_ttl = settings.result_ttl
        self.registry.max_retained = settings.max_retained

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.metrics.set_phase(phase.value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = build_app(self)
        await self._app(scope, receive, send)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """Plain `uvicorn module:agent`: drain (bounded) when uvicorn shuts down.

        Under `agent-server run` the sequence has already run while the listener was open.
        """
        _ = self.shutdown  # resolve settings now: a bad environment fails startup, not the drain
        install_loop_error_handler()  # errors of tasks reasoners dropped become our log lines
        configure_unless_configured(self.settings.log_level, self.settings.log_format)
        yield
        if self.shutdown.started is not None or self.served_by_runner:
            # `agent-server run` has drained already, or its start failed (the port was
            # taken): nothing was served, so there is no shutdown to begin or report.
            self.registry.close()
            return
        self.shutdown.begin(time.monotonic(), time.time(), None)
        report = await self.shutdown.run(skip_unready=True)
        await push_shutdown(self)  # bounded by the time left before the grace period ends
        if self.registry.abandoned_pending:
            end_process(report.exit_code)
        self.registry.close()  # its idle worker threads end before the check below
        deadline = time.monotonic() + self.shutdown.plan.cancel_timeout
        if await end_leftovers(deadline, cancel_tasks=False):
            end_process(report.exit_code, "threads")


def end_process(code: int, still_running: str = "abandoned work") -> None:
    """Exit now: asyncio.run's cleanup would wait without bound for abandoned tasks."""
    logger.warning("exiting with %s still running (exit code %d)", still_running, code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
