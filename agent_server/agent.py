"""Agent: the user's object. Registers reasoners and is itself an ASGI application."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.api import Api, build_app
from agent_server.docs_page import DocsPage
from agent_server.durable import QueueTaker
from agent_server.events import Closing
from agent_server.logs import configure_unless_configured
from agent_server.loop_errors import install_loop_error_handler
from agent_server.metrics import Metrics
from agent_server.names import REASONER_NAME_RULE, is_reasoner_name
from agent_server.openapi import openapi_document
from agent_server.pushgateway import push_shutdown
from agent_server.reasoner import Reasoner, ReasonerDefinitionError
from agent_server.registry import InFlightRegistry
from agent_server.sessions import SessionReleases
from agent_server.settings import Settings
from agent_server.shutdown import Phase, ShutdownPlan, ShutdownSequence, finish_process
from agent_server.store import ExecutionStore, open_store

logger = logging.getLogger("agent_server.agent")

F = TypeVar("F", bound=Callable[..., Any])


class Agent:
    """A named set of reasoners served over HTTP, with its own registry, store and metrics.

    `uvicorn module:agent` serves it directly; `agent-server run module:agent` adds the full
    signal-driven shutdown sequence around it. The parts that depend on settings (store,
    registry, session releases, shutdown sequence) are built when the settings are known.
    """

    def __init__(self, name: str, settings: Settings | None = None) -> None:
        self.name = name
        self.reasoners: dict[str, Reasoner] = {}
        self.metrics = Metrics()
        self.phase = Phase.SERVING
        self._settings: Settings | None = None
        self._parts: _Parts | None = None
        self._app: ASGIApp | None = None
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
    def _built(self) -> _Parts:
        if self._parts is None:
            self._parts = _Parts.build(
                self.name, self.reasoners, self.settings, self.metrics, self.set_phase
            )
        return self._parts

    @property
    def store(self) -> ExecutionStore:
        return self._built.store

    @property
    def registry(self) -> InFlightRegistry:
        return self._built.registry

    @property
    def releases(self) -> SessionReleases:
        return self._built.releases

    @property
    def shutdown(self) -> ShutdownSequence:
        return self._built.shutdown

    def reasoner(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        resumable: bool = False,
        max_attempts: int | None = None,
    ) -> Callable[[F], F]:
        """Register a function as a reasoner; the function itself is returned unchanged.

        `resumable=True`: the reasoner may `await ctx.checkpoint(state)`; with a shared store
        its executions are handed off to another replica at shutdown, and retried after
        their owner's death up to `max_attempts` attempts in all (default 3).
        """
        attempts = max_attempts if max_attempts is not None else (3 if resumable else 1)

        def register(func: F) -> F:
            reasoner_name = func.__name__ if name is None else name
            if not is_reasoner_name(reasoner_name):
                raise ReasonerDefinitionError(
                    f"reasoner name {reasoner_name!r} cannot be served at /reasoners/{{name}}: "
                    f"{REASONER_NAME_RULE}"
                )
            if reasoner_name in self.reasoners:
                raise ReasonerDefinitionError(f"reasoner {reasoner_name!r} is already registered")
            self.reasoners[reasoner_name] = Reasoner(
                func, reasoner_name, description, resumable=resumable, max_attempts=attempts
            )
            self.metrics.add_reasoner(reasoner_name)
            return func

        return register

    def configure(self, settings: Settings) -> None:
        """Apply settings before serving (the CLI does this with its flags)."""
        if self._parts is not None and self._parts.registry.stats.started:
            raise RuntimeError("configure() after executions started")
        self._settings = settings
        self._parts = None
        self._app = None

    async def push_shutdown(self, hard_end: float) -> bool:
        """Push the shutdown metrics when `--pushgateway` is set, before `hard_end`."""
        return await push_shutdown(
            self.settings.pushgateway, self.metrics.shutdown_registry, self.name, hard_end
        )

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.metrics.set_phase(phase.value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.asgi()(scope, receive, send)

    def asgi(self) -> ASGIApp:
        """The ASGI app this agent serves, built once. The CLI hands it to uvicorn itself:
        one coroutine frame less held by every request (and every open stream)."""
        if self._app is None:
            settings = self.settings
            self._app = build_app(
                self.api(),
                self.lifespan,
                settings.bearer_token,
                self.registry,
                metrics_open=settings.metrics_open,
            )
        return self._app

    def api(self) -> Api:
        """The routes, bound to the parts they use."""
        parts = self._built
        settings = self.settings
        secured = settings.bearer_token is not None
        return Api(
            self.reasoners,
            parts.registry,
            parts.store,
            parts.releases,
            self.metrics,
            phase=lambda: self.phase.value,
            max_body_size=settings.max_body_size,
            idempotency_ttl=settings.idempotency_ttl,
            sse_heartbeat=settings.sse_heartbeat,
            streams_closing=parts.streams_closing,
            openapi=lambda: openapi_document(self.name, self.reasoners.values(), secured=secured),
            docs=DocsPage(self.name, secured=secured) if settings.docs else None,
        )

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        """Open the store; at the end, under plain `uvicorn module:agent`, drain (bounded).

        Under `agent-server run` the sequence has already run while the listener was open.
        """
        parts = self._built  # resolve settings now: a bad environment fails startup
        install_loop_error_handler()  # errors of tasks reasoners dropped become our log lines
        configure_unless_configured(self.settings.log_level, self.settings.log_format)
        await parts.store.open()
        parts.taker.start()
        report = None
        try:
            yield
            # Under `agent-server run` the sequence has run already, or the start failed (the
            # port was taken): nothing was served, so there is no shutdown to begin or report.
            if self.shutdown.started is None and not self.shutdown.driven_by_signals:
                began = time.monotonic()
                self.shutdown.begin(began, time.time(), None)
                report = await self.shutdown.run(skip_unready=True)
                await self.push_shutdown(self.shutdown.plan.hard_end(began))
        finally:
            await parts.taker.close()
            await parts.releases.close()
            await parts.store.close()
            parts.registry.close()  # its idle worker threads end before the check below
        if report is not None:
            plan = self.shutdown.plan
            await finish_process(
                report.exit_code,
                abandoned_pending=parts.registry.abandoned_pending,
                deadline=plan.leftovers_deadline(self.shutdown.started, time.monotonic()),
                cancel_tasks=False,
            )


class _Parts:
    """What one configured agent runs with, each part given only what it uses."""

    def __init__(
        self,
        store: ExecutionStore,
        registry: InFlightRegistry,
        releases: SessionReleases,
        shutdown: ShutdownSequence,
        taker: QueueTaker,
        streams_closing: Closing,
    ) -> None:
        self.store = store
        self.registry = registry
        self.releases = releases
        self.shutdown = shutdown
        self.taker = taker
        #: Set when the listener closes: open event streams end with a retry hint.
        self.streams_closing = streams_closing

    @classmethod
    def build(
        cls,
        name: str,
        reasoners: dict[str, Reasoner],
        settings: Settings,
        metrics: Metrics,
        set_phase: Callable[[Phase], None],
    ) -> _Parts:
        store = open_store(
            settings.store_url,
            replica_id=settings.replica_id,
            agent_name=name,
            result_ttl=settings.result_ttl,
            max_retained=settings.max_retained,
            max_retained_bytes=settings.max_retained_bytes,
            lease_ttl=settings.lease_ttl,
            max_events=settings.max_events,
            observer=metrics,
        )
        streams_closing = Closing()
        registry = InFlightRegistry(
            store,
            max_inflight=settings.max_inflight,
            max_checkpoint_size=settings.max_checkpoint_size,
            max_events=settings.max_events,
            observer=metrics,
        )
        store.deliver_cancels(registry.cancel)
        store.deliver_orphans(registry.runs, registry.adopt)
        releases = SessionReleases(store, registry, observer=metrics)
        shutdown = ShutdownSequence(
            registry,
            metrics,
            set_phase,
            ShutdownPlan.from_settings(settings),
            limit_releases=releases.limit,
            flush_ends=store.flush,
            end_streams=streams_closing.set,
        )
        taker = QueueTaker(store, registry, reasoners)
        return cls(store, registry, releases, shutdown, taker, streams_closing)
