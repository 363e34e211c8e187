"""`agent-server run [APP]`: load an Agent, validate the settings and budget, serve it."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import click
import uvicorn
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from agent_server.agent import Agent
from agent_server.http_limits import BoundedHttpToolsProtocol
from agent_server.logs import configure_logging
from agent_server.runner import Runner, exit_on_signal_before_serving
from agent_server.settings import Settings
from agent_server.shutdown import ExitCode

ENV = "AGENT_SERVER_"
F = TypeVar("F", bound=Callable[..., Any])
#: The `help_option_names` uvicorn users expect.
CONTEXT = {"help_option_names": ["-h", "--help"]}


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
    if not hasattr(module, attribute):
        raise AppLoadError(f"module {module_name!r} has no attribute {attribute!r}")
    candidate = getattr(module, attribute)
    if not isinstance(candidate, Agent):
        raise AppLoadError(
            f"{path!r} is not an agent_server.Agent (found {type(candidate).__name__})"
        )
    return candidate


def env_name(field: str) -> str:
    return ENV + field.upper()


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """The click type for a field's annotation, and whether it is an on/off switch.

    Optional types take their inner type; a Literal becomes a choice; types click has no
    parser for (SecretStr, URLs, ...) are read as text and validated by the model."""
    if get_origin(annotation) in (Union, UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(inner) == 1:
            annotation = inner[0]
    if get_origin(annotation) is Literal:
        return click.Choice([str(choice) for choice in get_args(annotation)]), False
    if annotation is bool:
        return bool, True
    if annotation in (int, float):
        return annotation, False
    return str, False


def _help(field: str, info: FieldInfo) -> str:
    parts = [info.description or ""]
    # A factory's default (a random replica id, say) differs per run: not shown.
    made = info.is_required() or info.default_factory is not None
    default = None if made else info.default
    if default is not None and not isinstance(default, SecretStr):
        parts.append(f"[default: {_shown(default)}]")
    parts.append(f"[env: {env_name(field)}]")
    return " ".join(part for part in parts if part)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_options(model: type[BaseSettings]) -> Callable[[F], F]:
    """One flag per field of `model`: `--max-inflight` for `max_inflight`, `--x/--no-x` for a
    bool. Flags default to None, so an absent flag leaves the field to the environment
    (read by the model, under its AGENT_SERVER_* name) and then to its default."""

    def decorate(func: F) -> F:
        for field, info in reversed(model.model_fields.items()):
            kind, switch = _click_type(info.annotation)
            flag = flag_name(field)
            decls = [f"{flag}/--no-{flag.removeprefix('--')}"] if switch else [flag]
            option = click.option(
                *decls, field, type=None if switch else kind, default=None, help=_help(field, info)
            )
            func = option(func)
        return func

    return decorate


def describe_errors(exc: ValidationError, flags: Iterable[str]) -> str:
    """Each error under the name the user gave: the flag, else the environment variable;
    errors about the settings as a whole (the budget) need no name."""
    given = set(flags)
    environment = {name.upper() for name in os.environ}
    messages = []
    for error in exc.errors():
        message = error["msg"].removeprefix("Value error, ")
        field = str(error["loc"][0]) if error["loc"] else None
        if field is None:
            messages.append(message)
        elif field in given:
            messages.append(f"{flag_name(field)}: {message}")
        elif env_name(field) in environment:
            messages.append(f"{env_name(field)}: {message}")
        else:
            messages.append(f"{field}: {message}")
    return "; ".join(messages)


def _version() -> str:
    try:
        return version("agent-server")
    except PackageNotFoundError:
        return "unknown"


@click.group(invoke_without_command=True, context_settings=CONTEXT)
@click.version_option(_version(), "--version", prog_name="agent-server")
@click.pass_context
def main(ctx: click.Context) -> None:
    """agent-server: serve reasoners, and shut down gracefully."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)


@main.command(context_settings=CONTEXT)
@click.argument("app", required=False, envvar=ENV + "APP")
@settings_options(Settings)
def run(app: str | None, **flags: Any) -> None:
    """Serve APP (module:attribute, an Agent); without APP, the embedded demo agent.

    Every flag has an AGENT_SERVER_* environment twin, named in its help; the flag wins.
    APP is AGENT_SERVER_APP.
    """
    exit_on_signal_before_serving()  # importing APP can take long; PID 1 must not ignore it
    given = {name: value for name, value in flags.items() if value is not None}
    try:
        settings = Settings(**given)
    except ValidationError as exc:
        click.echo(f"agent-server: invalid settings: {describe_errors(exc, given)}", err=True)
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
        access_log=settings.access_log,
        timeout_graceful_shutdown=int(settings.http_timeout)
        if settings.http_timeout.is_integer()
        else settings.http_timeout,  # type: ignore[arg-type]
    )
    runner = Runner(
        config, agent.shutdown, log_format=settings.log_format, push=agent.push_shutdown
    )
    runner.run()
    sys.exit(runner.exit_code)
