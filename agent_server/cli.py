"""`agent-server run [APP]`: load an Agent, validate the settings and budget, serve it.
`agent-server call NAME [JSON]`: run a reasoner on a server through `agent_server.client`."""

from __future__ import annotations

import enum
import importlib
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import click
import uvicorn
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from agent_server import jsoncodec
from agent_server.agent import Agent
from agent_server.auth import TokenError, check_token, read_token_file
from agent_server.client import (
    DEFAULT_URL,
    AgentClient,
    AgentServerError,
    Execution,
    InvalidInput,
    Unavailable,
    WaitTimeout,
)
from agent_server.execution import exception_text
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
    """APP cannot be served: one line, exit 2; `traceback` is the user's own frames when
    their module raised while it was imported."""

    def __init__(self, message: str, traceback: str = "") -> None:
        super().__init__(message)
        self.traceback = traceback


def _own_frames(exc: BaseException) -> str:
    """The traceback of an exception raised by the user's module while it was imported,
    without the frames of the import machinery and of agent-server itself."""
    shown = traceback.TracebackException.from_exception(exc)
    kept = [
        frame
        for frame in shown.stack
        if not frame.filename.startswith("<frozen ")
        and f"{os.sep}importlib{os.sep}" not in frame.filename
        and os.path.dirname(os.path.abspath(frame.filename)) != os.path.dirname(__file__)
    ]
    shown.stack = traceback.StackSummary.from_list(kept)
    return "".join(shown.format())


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
    except ModuleNotFoundError as exc:
        if exc.name == module_name:  # the module itself is missing: no traceback to show
            raise AppLoadError(f"cannot import {module_name!r}: {exc}") from exc
        raise AppLoadError(f"cannot import {module_name!r}: {exc}", _own_frames(exc)) from exc
    except Exception as exc:  # the user's module raised while it was imported
        raise AppLoadError(
            f"importing {module_name!r} raised {type(exc).__name__}: {exception_text(exc)}",
            _own_frames(exc),
        ) from exc
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
        if exc.traceback:
            click.echo(exc.traceback.rstrip("\n"), err=True)
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)
    agent.configure(settings)
    config = uvicorn.Config(
        agent.asgi(),
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


class CallExit(enum.IntEnum):
    """`agent-server call`'s exit codes: one per way a call can end."""

    SUCCEEDED = 0
    FAILED = 1
    INVALID = 2  # usage, input JSON, or the server refused the input (400, 413, 415, 422)
    CANCELLED = 3
    LOST = 4
    UNREACHABLE = 5  # no answer, or still refused (429/503), after the retries
    REFUSED = 6  # 401, 404, 409 and any other error answer
    TIMEOUT = 7  # --timeout passed before the end


END_CODES = {
    "succeeded": CallExit.SUCCEEDED,
    "failed": CallExit.FAILED,
    "cancelled": CallExit.CANCELLED,
    "lost": CallExit.LOST,
}


def _call_token(token_file: str | None) -> str | None:
    if token_file is not None:
        return read_token_file(token_file)
    token = os.environ.get(ENV + "API_TOKEN")
    return check_token(token) if token else None


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


def _ended(execution: Execution) -> int:
    """Print the execution; its end's exit code, with a line on stderr for any other end
    than `succeeded`."""
    _print_json(execution.json)
    if execution.status != "succeeded":
        try:
            execution.outcome()
        except AgentServerError as exc:
            click.echo(f"agent-server: {exc}", err=True)
    return END_CODES.get(execution.status, CallExit.REFUSED)


def _error_code(exc: AgentServerError) -> int:
    if isinstance(exc, WaitTimeout):
        return CallExit.TIMEOUT
    if isinstance(exc, Unavailable):
        return CallExit.UNREACHABLE
    if isinstance(exc, InvalidInput):
        return CallExit.INVALID
    return CallExit.REFUSED


@main.command(context_settings=CONTEXT)
@click.argument("name")
@click.argument("input_json", metavar="[JSON]", required=False)
@click.option(
    "--url",
    default=DEFAULT_URL,
    show_default=True,
    envvar="AGENT_SERVER_URL",
    help="The server (or the Service in front of its replicas). [env: AGENT_SERVER_URL]",
)
@click.option(
    "--async",
    "background",
    is_flag=True,
    help="Start it in the background and print the execution as started (exit 0).",
)
@click.option(
    "--stream", is_flag=True, help="Start it and print its events as they come, one JSON line each."
)
@click.option("--session", default=None, help="The session (X-Session-ID) it belongs to.")
@click.option(
    "--token-file",
    default=None,
    envvar=ENV + "API_TOKEN_FILE",
    help="File holding the bearer token; else AGENT_SERVER_API_TOKEN, if set. "
    "[env: AGENT_SERVER_API_TOKEN_FILE]",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds to wait for the end (a synchronous run is then cancelled).",
)
@click.option(
    "--retry-for",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to keep retrying refusals (429, 503) and connection errors.",
)
def call(
    name: str,
    input_json: str | None,
    url: str,
    background: bool,
    stream: bool,
    session: str | None,
    token_file: str | None,
    timeout: float | None,
    retry_for: float,
) -> None:
    """Run reasoner NAME with JSON input (an object of its parameters) on a server, and print
    the execution as JSON. Rides rollouts like the Python client (docs/client.md).

    \b
    Exit codes:
      0  succeeded (or started, with --async)
      1  failed
      2  usage error, input that is not JSON, or input the server refused (400, 422, ...)
      3  cancelled
      4  lost
      5  unreachable: no answer, or still 429/503, after --retry-for seconds
      6  refused: unauthorized (401), unknown reasoner (404), conflict (409), other errors
      7  --timeout passed before the end

    Anything but 0 also writes one line to stderr.
    """
    if background and stream:
        raise click.UsageError("give --async or --stream, not both")
    try:
        # Strict, as the server reads it: NaN and Infinity are not JSON.
        payload = None if input_json is None else jsoncodec.loads(input_json.encode())
        jsoncodec.check(payload, "JSON input")
    except (ValueError, RecursionError) as exc:
        click.echo(f"agent-server: JSON input is not valid JSON: {exc}", err=True)
        sys.exit(CallExit.INVALID)
    try:
        token = _call_token(token_file)
    except TokenError as exc:
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(CallExit.INVALID)
    try:
        with AgentClient(url, token=token, retry_for=retry_for) as client:
            if background:
                handle = client.start(name, payload, session=session)
                _print_json(handle.execution.json)
                sys.exit(CallExit.SUCCEEDED)
            if stream:
                handle = client.start(name, payload, session=session)
                end: Execution | None = None
                for event in handle.events():
                    _print_json({"id": event.id, "event": event.event, "data": event.data})
                    if event.event == "end" and isinstance(event.data, dict):
                        end = Execution.from_json(event.data)
                if end is None:  # pragma: no cover - a stream ends with its end event
                    end = handle.get()
                code = END_CODES.get(end.status, CallExit.REFUSED)
                if code != CallExit.SUCCEEDED:
                    try:
                        end.outcome()
                    except AgentServerError as exc:
                        click.echo(f"agent-server: {exc}", err=True)
                sys.exit(code)
            execution = client.run_execution(name, payload, session=session, timeout=timeout)
            sys.exit(_ended(execution))
    except AgentServerError as exc:
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(_error_code(exc))
