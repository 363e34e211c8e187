"""Agent: the user's object. Registers reasoners and is itself an ASGI application."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.middleware import Middleware
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.types import ASGIApp, Lifespan, Receive, Scope, Send

from agent_server.app.cut_off import Answer
from agent_server.app.parts import Parts
from agent_server.app.protocols import a2a_routes, mcp_endpoint, protocol_request_headers
from agent_server.app.schedules import schedule_ticker
from agent_server.app.start_line import log_start
from agent_server.http.access import RequestAccess
from agent_server.http.api import Api
from agent_server.http.auth import authenticator_from
from agent_server.http.console_page import ConsolePage
from agent_server.http.cors import cors_middleware
from agent_server.http.docs_page import DocsPage
from agent_server.http.front import build_app
from agent_server.http.openapi import openapi_document
from agent_server.identity.authenticators import Authenticator
from agent_server.model.names import REASONER_NAME_RULE, is_reasoner_name
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerDefinitionError, ReasonerOptions
from agent_server.model.schedules import Schedule
from agent_server.model.scheduling import RetryPolicy
from agent_server.model.versions import VERSION_VARIABLE, Migrate, version_rule
from agent_server.runtime.exits import ExitCode, exit_with_line, finish_process
from agent_server.runtime.logs import ACCESS_LOGGER, AccessLog, configure_unless_configured
from agent_server.runtime.loop_errors import install_loop_error_handler
from agent_server.runtime.loop_lag import LoopLagSampler, reasoner_codes
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.pushgateway import push_shutdown
from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.sessions import SessionReleases
from agent_server.runtime.settings import Settings
from agent_server.runtime.shutdown import Phase, ShutdownSequence
from agent_server.service.access import Authorize
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.service.use_cases import UseCases
from agent_server.store import ExecutionStore, SchemaTooNew

if TYPE_CHECKING:
    from agent_server.http.mcp_server import McpEndpoint

logger = logging.getLogger("agent_server.agent")

F = TypeVar("F", bound=Callable[..., Any])
A = TypeVar("A", bound=Authenticator)
Z = TypeVar("Z", bound=Authorize)

#: What uvicorn's cancellation of a request says when its shutdown stops waiting for open
#: requests (`Server.shutdown`, read in uvicorn 0.54): only that one ends in `cut_off`.
UVICORN_GAVE_UP = "timeout graceful shutdown exceeded"


class Agent:
    """A named set of reasoners served over HTTP, with its own registry, store and metrics.

    `uvicorn module:agent` serves it directly; `agent-server run module:agent` adds the full
    signal-driven shutdown sequence around it. The parts that depend on settings (store,
    registry, session releases, shutdown sequence) are built when the settings are known.

    Beside the reasoners, as in Starlette: `routes`, the user's own (HTTP; they answer what
    no route of the API matches, behind the same bearer check and error handling);
    `middleware` around every route; `lifespan(app)`, an async context manager for the
    user's own clients, entered once the store is open and before the first request, and
    exited after the shutdown sequence has ended (what it yields is each request's
    `request.state`). Mounted in another app, that app's lifespan must run this one:
    `Starlette(routes=[Mount("/agent", agent)], lifespan=agent.lifespan)`.
    """

    def __init__(
        self,
        name: str,
        settings: Settings | None = None,
        *,
        routes: Sequence[BaseRoute] = (),
        middleware: Sequence[Middleware] = (),
        lifespan: Lifespan[Any] | None = None,
        default_reasoner: str | None = None,
        version: str | None = None,
    ) -> None:
        for route in routes:
            if isinstance(route, WebSocketRoute):
                raise ValueError(
                    f"route {route.path!r} is a WebSocket route: the agent serves plain HTTP "
                    "and refuses WebSocket requests"
                )
        self.name = name
        #: Its code's version (docs/durable.md, "Versions"): `AGENT_SERVER_VERSION` by default.
        self.version = version if version is not None else os.environ.get(VERSION_VARIABLE) or None
        version_rule(self.version, None, (), None, "fail")  # ValueError for one that cannot be
        self.reasoners: dict[str, Reasoner] = {}
        self.metrics = Metrics()
        self.phase = Phase.SERVING
        self.user_routes = list(routes)
        self.user_middleware = list(middleware)
        self.user_lifespan = lifespan
        #: The reasoner a protocol message that names none reaches (A2A, docs/protocols.md).
        self.default_reasoner = default_reasoner
        self._settings: Settings | None = None
        #: Whether `agent-server run` serves it with these settings' host and port; under
        #: another ASGI server (plain uvicorn's `--port`) the address is not known here.
        self._served_here = False
        self._parts: Parts | None = None
        #: `@agent.authenticate`'s function: it replaces the flags' authentication.
        self._authenticate: Authenticator | None = None
        #: `@agent.authorize`'s function: it narrows what a principal may do.
        self._authorize: Authorize | None = None
        self._app: ASGIApp | None = None
        #: `/mcp` with `--mcp` (agent_server/http/mcp_server.py), built with the routes.
        self._mcp: McpEndpoint | None = None
        self._cases: UseCases | None = None
        #: Whether `lifespan` has begun; a request before it is told about once (`__call__`).
        self._lifespan_began = False
        self._told_no_lifespan = False
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
    def _built(self) -> Parts:
        if self._parts is None:
            self._parts = Parts.build(
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

    def authenticate(self, func: A) -> A:
        """Authenticate every request but the open ones with `func`, an async function of
        the request's headers (a case-insensitive `Mapping[str, str]`) that returns a
        `Principal` or raises `Unauthorized`; it replaces the authentication flags
        (docs/security.md). The function itself is returned unchanged."""
        given: object = func  # checked apart: the check would narrow `func`'s type
        if not inspect.iscoroutinefunction(given):
            raise TypeError("@agent.authenticate takes an async def function of the headers")
        if self._app is not None:
            raise RuntimeError("@agent.authenticate must come before the agent serves")
        self._authenticate = func
        return func

    def authorize(self, func: Z) -> Z:
        """Decide with `func`, an async function of `(principal, action, resource)` that
        returns True or False (for `list`, optionally a filter `{"owner": identity}`), what
        a principal may do within its tenant (docs/security.md#authorization)."""
        given: object = func
        if not inspect.iscoroutinefunction(given) or self._app is not None:
            raise TypeError("@agent.authorize takes an async def function, before serving")
        self._authorize = func
        return func

    def _authenticator(self) -> Authenticator | None:
        """What authenticates requests: `@agent.authenticate`'s function, else the flags'
        (built anew: called once, when the app is)."""
        if self._authenticate is not None:
            return self._authenticate
        return authenticator_from(self.settings)

    def reasoner(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        resumable: bool = False,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        max_concurrency: int | None = None,
        concurrency_key: str | None = None,
        session_policy: str = "parallel",
        schedules: Sequence[Schedule] = (),
        version: str | None = None,
        compatible: Sequence[str | None] = (),
        migrate: Migrate | None = None,
        on_version_change: str = "fail",
    ) -> Callable[[F], F]:
        """Register a function as a reasoner; the function itself is returned unchanged.

        `resumable=True`: the reasoner may `await ctx.checkpoint(state)`; with a shared store
        its executions are handed off to another replica at shutdown, and retried after
        their owner's death up to `max_attempts` attempts in all (default 3).
        `timeout=S`: an attempt running longer (waiting for input not counted) is cancelled
        and fails with `ExecutionTimeout`. `retry=RetryPolicy(...)`: a failed attempt runs
        again after a backoff, queued with its `scheduled_at` (docs/scheduling.md).
        `max_concurrency=N`: at most N attempts at once per value of `concurrency_key`
        (`"header:NAME"`, `"session"`, or None: the whole reasoner) across the replicas
        sharing the store; the rest wait queued, first in first out per value.
        `session_policy=`: what a start in a session does beside the session's other work
        (`parallel`, `reject`, `enqueue`, `interrupt`, `rollback`; `X-Session-Policy`
        overrides it per request). `schedules=[Schedule(cron, ...)]`: docs/schedules.md.
        `version=` (else the agent's), `compatible=`, `migrate=`, `on_version_change=`:
        which checkpoints this code resumes (docs/durable.md, "Versions").
        """
        # The keywords above as they came, one ReasonerOptions field each (the test of its
        # fields holds the two together); the options check them and apply the defaults.
        given = dict(locals())
        del given["self"], given["name"]

        def register(func: F) -> F:
            reasoner_name = func.__name__ if name is None else name
            if not is_reasoner_name(reasoner_name):
                raise ReasonerDefinitionError(
                    f"reasoner name {reasoner_name!r} cannot be served at /reasoners/{{name}}: "
                    f"{REASONER_NAME_RULE}"
                )
            if reasoner_name in self.reasoners:
                raise ReasonerDefinitionError(f"reasoner {reasoner_name!r} is already registered")
            options = ReasonerOptions(reasoner_name, agent_version=self.version, **given)
            self.reasoners[reasoner_name] = Reasoner(func, options)
            self.metrics.add_reasoner(reasoner_name)
            return func

        return register

    def configure(self, settings: Settings, *, served_here: bool = False) -> None:
        """Apply settings before serving (the CLI does this with its flags; `served_here`:
        it binds their host and port itself)."""
        if self._parts is not None and self._parts.registry.stats.started:
            raise RuntimeError("configure() after executions started")
        self._settings = settings
        self._served_here = served_here
        self._parts = None
        self._app = None
        self._mcp = None
        self._cases = None

    async def _exit_user_lifespan(self, own: contextlib.AbstractAsyncContextManager[Any]) -> None:
        """Exit the user's lifespan, bounded (`ShutdownPlan.lifespan_exit_deadline`); what it
        raises is logged (the store is closed and the process ends all the same)."""
        sequence = self.shutdown
        deadline = sequence.plan.lifespan_exit_deadline(sequence.started, time.monotonic())
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                await own.__aexit__(None, None, None)
        except TimeoutError:
            logger.warning("the lifespan of agent %r did not exit in time: cut short", self.name)
        except Exception as exc:
            logger.error("the lifespan of agent %r raised on exit", self.name, exc_info=exc)

    async def push_shutdown(self, hard_end: float) -> bool:
        """Push the shutdown metrics when `--pushgateway` is set, before `hard_end`."""
        return await push_shutdown(
            self.settings.pushgateway, self.metrics.shutdown.registry, self.name, hard_end
        )

    def set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.metrics.shutdown.set_phase(phase.value)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The agent under plain uvicorn, or mounted in another app. A request the server
        cancels (uvicorn's --timeout-graceful-shutdown) ends here with one line and a 503,
        not in a traceback of the cancellation."""
        app = self.asgi()
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if not self._lifespan_began and not self._told_no_lifespan:
            self._told_no_lifespan = True
            configure_unless_configured(self.settings.log_level, self.settings.log_format)
            logger.warning(
                "agent %r answers requests but its lifespan has not run (mounted in another "
                "app? give that app lifespan=agent.lifespan): no start, and no shutdown "
                "sequence or report at the end",
                self.name,
            )
        answer = Answer(send)
        try:
            await app(scope, receive, answer)
        except asyncio.CancelledError as exc:
            if not any(UVICORN_GAVE_UP in str(arg) for arg in exc.args):
                raise  # anyone else's cancellation is theirs to handle
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()  # this request's task ends here, as if the app had returned
            await answer.cut_off(scope)

    def asgi(self) -> ASGIApp:
        """The ASGI app this agent serves, built once. The CLI hands it to uvicorn itself:
        one coroutine frame less held by every request (and every open stream)."""
        if self._app is None:
            settings = self.settings
            middleware = list(self.user_middleware)
            if settings.cors_allow_origin:  # outermost: preflights never need the token
                cors = cors_middleware(
                    settings.cors_allow_origin,
                    self.reasoners.values(),
                    protocol_request_headers(settings),
                )
                middleware.insert(0, cors)
            api = self.api()
            protocol_routes, public_paths = a2a_routes(
                settings,
                api,
                self.name,
                self.reasoners,
                self.default_reasoner,
                secured=self._authenticate is not None or settings.authenticates,
            )
            app = build_app(
                api,
                self.lifespan,
                self._authenticator(),
                self.registry,
                metrics_open=settings.metrics_open,
                routes=self.user_routes,
                middleware=middleware,
                protocol_routes=protocol_routes,
                public_paths=public_paths,
            )
            if settings.access_log:
                app = AccessLog(app, logging.getLogger(ACCESS_LOGGER))
            self._app = self._built.tracing.server(app)  # outermost: the access line's span
        return self._app

    def api(self) -> Api:
        """The routes, bound to the parts they use."""
        parts, settings = self._built, self.settings
        secured = self._authenticate is not None or settings.authenticates
        hooked = parts.webhooks is not None
        mcp = self._mcp_endpoint()
        ticker = self._ticker()
        return Api(
            self.reasoners,
            parts.registry,
            parts.store,
            parts.releases,
            self.metrics,
            self._use_cases(),
            phase=lambda: self.phase.value,
            max_body_size=settings.max_body_size,
            sse_heartbeat=settings.sse_heartbeat,
            webhooks=hooked,
            webhook_url=settings.webhook_url,
            openapi=lambda: openapi_document(
                self.name,
                self.reasoners.values(),
                secured=secured,
                webhooks=hooked,
                schedules=True,
            ),
            docs=DocsPage(self.name, secured=secured) if settings.docs else None,
            console=ConsolePage() if settings.console else None,
            describe=parts.describe,
            mcp=None if mcp is None else mcp.endpoint,
            schedules=ticker,
            schedule_limits=(settings.max_schedules, settings.max_schedule_input_size),
        )

    def _mcp_endpoint(self) -> McpEndpoint | None:
        """`/mcp` with `--mcp`, built once."""
        if self._mcp is None:
            self._mcp = mcp_endpoint(self.settings, self.name, self.reasoners, self._use_cases())
        return self._mcp

    def _use_cases(self) -> UseCases:
        """The use cases every front shares (agent_server/service/), built once."""
        if self._cases is None:
            parts, settings = self._built, self.settings
            self._cases = UseCases(
                parts.registry,
                parts.store,
                RequestAccess(self._authorize),
                parts.streams_closing,
                idempotency_ttl=settings.idempotency_ttl,
                webhook_url=settings.webhook_url,
            )
        return self._cases

    def _ticker(self) -> ScheduleTicker:
        """The schedule ticker, built once with the use cases every front shares: a firing
        starts as a request's start does (agent_server/app/schedules.py)."""
        parts = self._built
        if parts.schedules is None:
            parts.schedules = schedule_ticker(
                self.reasoners, self._use_cases().starts, parts.registry, parts.store, self.metrics
            )
        return parts.schedules

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Any) -> AsyncIterator[Any]:
        """Open the store, then enter the user's lifespan; at the end, under plain `uvicorn
        module:agent`, drain (bounded), then exit the user's lifespan and close the store.

        Under `agent-server run` the sequence has already run while the listener was open.
        """
        self._lifespan_began = True
        parts = self._built  # resolve settings now: a bad environment fails startup
        install_loop_error_handler()  # errors of tasks reasoners dropped become our log lines
        configure_unless_configured(self.settings.log_level, self.settings.log_format)
        try:
            await parts.store.open()
        except SchemaTooNew as exc:  # a later release migrated the database: one line, exit 2
            exit_with_line(f"agent-server: {exc}", ExitCode.INVALID_SETTINGS)
        parts.taker.start()
        self._ticker().start()
        if parts.webhooks is not None:
            parts.webhooks.start()
        # Loop lag and stalls, through the shutdown sequence too: stopped in the `finally`.
        sampler = LoopLagSampler(
            self.metrics.loop_lagged,
            reasoner_codes((name, reasoner.func) for name, reasoner in self.reasoners.items()),
        )
        sampler.start()
        report = None
        mcp = self._mcp_endpoint()
        mcp_running = None if mcp is None else mcp.run()
        try:
            if mcp_running is not None:
                await mcp_running.__aenter__()
            own = None if self.user_lifespan is None else self.user_lifespan(app)
            state = None if own is None else await own.__aenter__()
            try:
                log_start(
                    self.name, self.reasoners, self.settings, self.shutdown.plan, self._served_here
                )
                yield state
                # Under `agent-server run` the sequence has run already, or the start failed
                # (the port was taken): nothing was served, so there is no shutdown to begin
                # or report.
                if self.shutdown.started is None and not self.shutdown.driven_by_signals:
                    began = time.monotonic()
                    self.shutdown.begin(began, time.time(), None)
                    report = await self.shutdown.run(skip_unready=True)
                    await self.push_shutdown(self.shutdown.plan.hard_end(began))
            finally:
                if own is not None:
                    await self._exit_user_lifespan(own)
        finally:
            if mcp_running is not None:
                await mcp_running.__aexit__(None, None, None)
            await sampler.stop()
            await self._close_parts(parts)
            parts.registry.close()  # its idle worker threads end before the check below
        if report is not None:
            plan = self.shutdown.plan
            await finish_process(
                report.exit_code,
                abandoned_pending=parts.registry.abandoned_pending,
                deadline=plan.leftovers_deadline(self.shutdown.started, time.monotonic()),
                cancel_tasks=False,
            )

    async def _close_parts(self, parts: Parts) -> None:
        """Stop taking work, then close webhooks, releases and the store; after a shutdown,
        by the exit deadline (`lifespan_exit_deadline`): a Redis that does not answer (paused)
        must not hold the exit past the watchdog. Left unclosed, the replica's liveness
        lapses within its lease instead of ending at once."""
        started, plan = self.shutdown.started, self.shutdown.plan
        end = None if started is None else plan.lifespan_exit_deadline(started, time.monotonic())
        limit = None if end is None else max(0.0, end - time.monotonic())
        try:
            async with asyncio.timeout(limit):
                if parts.schedules is not None:
                    await parts.schedules.close()
                await parts.taker.close()
                if parts.webhooks is not None:
                    await parts.webhooks.close()
                await parts.releases.close()
                await parts.store.close()
        except TimeoutError:
            logger.warning(
                "store not closed within the exit deadline (%.3fs): this replica's liveness "
                "lapses within its lease",
                limit,
            )
