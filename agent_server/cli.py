"""`agent-server run [APP]`: load an Agent, validate the settings and budget, serve it."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import click
import uvicorn
from pydantic import ValidationError

from agent_server.agent import Agent
from agent_server.http_limits import BoundedHttpToolsProtocol
from agent_server.logs import configure_logging
from agent_server.runner import Runner, exit_on_signal_before_serving
from agent_server.settings import Settings
from agent_server.shutdown import ExitCode

ENV = "AGENT_SERVER_"
F = TypeVar("F", bound=Callable[..., Any])


class Decorator(Protocol):
    def __call__(self, func: F, /) -> F: ...


class AppLoadError(Exception):
    pass


def load_agent(path: str | None) -> Agent:
    """Import `module:attribute`; without a path, the embedded demo agent."""
    if path is None:
        from agent_server.demo import agent as demo

        return demo
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"APP must look like 'module:attribute', got {path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppLoadError(f"cannot import {module_name!r}: {exc}") from exc
    candidate = getattr(module, attribute, None)
    if not isinstance(candidate, Agent):
        raise AppLoadError(
            f"{path!r} is not an agent_server.Agent (found {type(candidate).__name__})"
        )
    return candidate


def _option(flag: str, kind: Any, help_text: str) -> Decorator:
    """A flag whose AGENT_SERVER_* twin is read when the flag is absent (the flag wins)."""
    name = flag.removeprefix("--").replace("-", "_")
    option: Decorator = click.option(
        flag, name, type=kind, default=None, envvar=ENV + name.upper(), help=help_text
    )
    return option


@click.group()
def main() -> None:
    """agent-server: serve reasoners, and shut down gracefully."""


@main.command()
@click.argument("app", required=False, envvar=ENV + "APP")
@_option("--host", str, "Address to listen on [127.0.0.1].")
@_option("--port", int, "Port to listen on [8000].")
@_option(
    "--grace-period", float, "Seconds from SIGTERM to SIGKILL (terminationGracePeriodSeconds) [30]."
)
@_option("--unready-delay", float, "Seconds readiness is 503 while work is still accepted [0].")
@_option(
    "--drain-timeout",
    float,
    "Seconds running work may take to finish [what the grace period leaves].",
)
@_option("--cancel-timeout", float, "Seconds cancelled work may take to settle [5].")
@_option("--http-timeout", float, "Seconds open responses get after the listener closes [1].")
@_option("--max-inflight", int, "Running executions at once; beyond it, 429 [1000].")
@_option("--max-body-size", int, "Request body bytes; beyond it, 413 [1048576].")
@_option("--body-timeout", float, "Seconds a request body may take after its head; then 408 [30].")
@_option(
    "--write-timeout", float, "Seconds a client may read none of its answer; then cut off [30]."
)
@_option("--result-ttl", float, "Seconds finished executions are kept [3600].")
@_option("--max-retained", int, "Finished executions kept at most [10000].")
@_option("--log-level", click.Choice(["critical", "error", "warning", "info", "debug"]), "[info].")
@_option("--log-format", click.Choice(["text", "json"]), "[text].")
@_option("--pushgateway", str, "Prometheus Pushgateway URL to push the shutdown metrics to.")
@_option("--api-token", str, "Bearer token every route but health and metrics requires [none].")
@_option("--api-token-file", str, "File holding the bearer token (a mounted secret) [none].")
def run(app: str | None, **flags: Any) -> None:
    """Serve APP (module:attribute, an Agent); without APP, the embedded demo agent."""
    exit_on_signal_before_serving()  # importing APP can take long; PID 1 must not ignore it
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        messages = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'settings'}: "
            + error["msg"].removeprefix("Value error, ")
            for error in exc.errors()
        )
        click.echo(f"agent-server: invalid settings: {messages}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)
    configure_logging(settings.log_level, settings.log_format)
    try:
        agent = load_agent(app)
    except AppLoadError as exc:
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)
    agent.configure(settings)
    config = uvicorn.Config(
        agent,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        # Bounds the head (size, time), the body's time, unread answers and pipelining.
        http=BoundedHttpToolsProtocol.with_timeouts(settings.body_timeout, settings.write_timeout),
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=int(settings.http_timeout)
        if settings.http_timeout.is_integer()
        else settings.http_timeout,  # type: ignore[arg-type]
    )
    runner = Runner(config, agent)
    runner.run()
    sys.exit(runner.exit_code)
