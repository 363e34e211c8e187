"""`agent-server run [APP]`: load an Agent, validate the settings and budget, serve it.
`agent-server call NAME [JSON]`, `get ID`, `list`, `cancel ID`, `events ID` and
`release SESSION`: the same server from a shell, through `agent_server.client`."""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from types import UnionType
from typing import IO, Any, Literal, NoReturn, TypeVar, Union, get_args, get_origin

import click
import uvicorn
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from starlette.types import ASGIApp

from agent_server import jsoncodec
from agent_server.agent import Agent
from agent_server.client import (
    DEFAULT_URL,
    AgentClient,
    AgentServerError,
    Conflict,
    Event,
    Execution,
    InvalidInput,
    Unavailable,
    WaitTimeout,
)
from agent_server.drill import SHUTDOWN_FIELDS, DrillArgs, DrillError, drill_and_print, parse_input
from agent_server.execution import exception_text
from agent_server.exits import ExitCode
from agent_server.http_limits import BoundedHttpToolsProtocol
from agent_server.logs import configure_logging
from agent_server.runner import Runner, exit_on_signal_before_serving, supervise_reloads
from agent_server.settings import Settings
from agent_server.tokens import TokenError, check_token, read_token_file

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


def load_agent(path: str | None, app_dir: str = "") -> Agent:
    """Import `module:attribute`; without a path, the embedded demo agent.

    As uvicorn does, `app_dir` (by default the current directory) goes first on the module
    search path, so APP is found there before anywhere else."""
    if path is None:
        from agent_server.demo import agent as demo

        return demo
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise AppLoadError(f"APP must look like 'module:attribute', got {path!r}")
    directory = os.path.abspath(app_dir or os.getcwd())
    sys.path.insert(0, directory)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (
            module_name == exc.name or module_name.startswith(exc.name + ".")
        ):  # the module itself (or its package) is missing: no traceback to show
            where = "--app-dir" if app_dir else "the current directory"
            raise AppLoadError(
                f"cannot import {module_name!r}: {exc}; modules are looked up in {where} "
                f"({directory}), then the Python path"
                + ("" if app_dir else " (--app-dir names another directory)")
            ) from exc
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


def _click_type(annotation: Any) -> tuple[Any, bool, bool]:
    """The click type for a field's annotation, whether it is an on/off switch, and whether
    the flag repeats (a tuple field: one value per use).

    Optional types take their inner type; a Literal becomes a choice; types click has no
    parser for (SecretStr, URLs, ...) are read as text and validated by the model."""
    if get_origin(annotation) in (Union, UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(inner) == 1:
            annotation = inner[0]
    if get_origin(annotation) is tuple:
        kind, _, _ = _click_type(get_args(annotation)[0])
        return kind, False, True
    if get_origin(annotation) is Literal:
        return click.Choice([str(choice) for choice in get_args(annotation)]), False, False
    if annotation is bool:
        return bool, True, False
    if annotation in (int, float):
        return annotation, False, False
    return str, False, False


def _help(field: str, info: FieldInfo) -> str:
    parts = [info.description or ""]
    # A factory's default (a random replica id, say) differs per run: not shown.
    made = info.is_required() or info.default_factory is not None
    default = None if made else info.default
    if default not in (None, "", ()) and not isinstance(default, SecretStr):
        parts.append(f"[default: {_shown(default)}]")
    parts.append(f"[env: {env_name(field)}]")
    return " ".join(part for part in parts if part)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def settings_options(
    model: type[BaseSettings], only: Iterable[str] | None = None
) -> Callable[[F], F]:
    """One flag per field of `model` (or per field named in `only`): `--max-inflight` for
    `max_inflight`, `--x/--no-x` for a bool, a repeatable flag for a tuple. Flags default to
    None (a repeatable one absent is empty), so an absent flag leaves the field to the
    environment (read by the model, under its AGENT_SERVER_* name) and then to its default:
    see `given_flags`."""
    chosen = None if only is None else set(only)

    def decorate(func: F) -> F:
        for field, info in reversed(model.model_fields.items()):
            if chosen is not None and field not in chosen:
                continue
            kind, switch, multiple = _click_type(info.annotation)
            flag = flag_name(field)
            decls = [f"{flag}/--no-{flag.removeprefix('--')}"] if switch else [flag]
            option = click.option(
                *decls,
                field,
                type=None if switch else kind,
                default=None,
                multiple=multiple,
                help=_help(field, info),
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
    given = given_flags(flags)
    settings = _settings_or_exit(given)
    configure_logging(settings.log_level, settings.log_format)
    if settings.reload:
        # The worker imports APP, as uvicorn's does: an import error there is fixed by an
        # edit, which starts a new worker, while this process keeps watching.
        target = functools.partial(serve_reloaded, app, given)
        sys.exit(supervise_reloads(_reloader_config(settings, app), target))
    sys.exit(serve(_agent_or_exit(app, settings), settings))


@main.command(name="drill", context_settings=CONTEXT)
@click.argument("app", required=False, envvar=ENV + "APP")
@click.option(
    "--reasoner",
    "reasoners",
    multiple=True,
    help="Drill only this reasoner; repeat it for several (default: every reasoner).",
)
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="NAME=JSON",
    help="The input of reasoner NAME's executions; by default one is built from its input "
    "schema's examples and defaults. Repeat it for several reasoners.",
)
@click.option(
    "--executions",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Background executions started of each reasoner.",
)
@click.option(
    "--signal-after",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Seconds from the last start to SIGTERM.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, not the table.")
@settings_options(Settings, only=SHUTDOWN_FIELDS)
def drill_command(
    app: str | None,
    reasoners: tuple[str, ...],
    inputs: tuple[str, ...],
    executions: int,
    signal_after: float,
    as_json: bool,
    **flags: Any,
) -> None:
    """Rehearse a shutdown: serve APP (default: the demo agent) as an `agent-server run`
    child on a free loopback port, start background executions of its reasoners, send
    SIGTERM, and say whether each reasoner is shutdown-safe: it finished in the drain or
    settled once cancelled, never swallowed the cancellation, never blocked the event loop
    over 1 s, and the shutdown ended within the grace period.

    \b
    Exit codes:
      0  every reasoner is shutdown-safe
      1  a reasoner (or the server) is not: each fault is named
      2  bad arguments (an unknown reasoner, --input that is not JSON, an input the
         reasoner refuses or cannot be built, a budget that does not fit, APP not found)
    """
    given = given_flags(flags)
    settings = _settings_or_exit(given)
    parsed: dict[str, Any] = {}
    for text in inputs:
        try:
            name, value = parse_input(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--input") from None
        parsed[name] = value
    args = DrillArgs(app, reasoners, parsed, executions, signal_after, given, settings)
    try:
        code = drill_and_print(args, as_json=as_json)
    except DrillError as exc:
        click.echo(f"agent-server: drill: {exc}", err=True)
        code = ExitCode.INVALID_SETTINGS
    except RuntimeError as exc:
        click.echo(f"agent-server: drill: {exc}", err=True)
        code = 1
    sys.exit(code)


def given_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """The flags given on the command line: an absent flag is None, an absent repeatable
    one empty; either leaves its setting to the environment."""
    return {name: value for name, value in flags.items() if value is not None and value != ()}


def _settings_or_exit(given: dict[str, Any]) -> Settings:
    try:
        return Settings(**given)
    except ValidationError as exc:
        click.echo(f"agent-server: invalid settings: {describe_errors(exc, given)}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)


def _agent_or_exit(app: str | None, settings: Settings) -> Agent:
    try:
        return load_agent(app, settings.app_dir)
    except AppLoadError as exc:
        if exc.traceback:
            click.echo(exc.traceback.rstrip("\n"), err=True)
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)


def serve(
    agent: Agent,
    settings: Settings,
    sockets: list[socket.socket] | None = None,
    *,
    supervised: bool = False,
) -> int:
    """Serve `agent` until its shutdown sequence has run; its exit code. `sockets`: the
    listener a reload supervisor bound, whose SIGINT the worker leaves to it."""
    agent.configure(settings)
    runner = Runner(
        uvicorn_config(agent.asgi(), settings),
        agent.shutdown,
        log_format=settings.log_format,
        push=agent.push_shutdown,
        supervised=supervised,
    )
    runner.run(sockets)
    return runner.exit_code


def uvicorn_config(app: ASGIApp, settings: Settings) -> uvicorn.Config:
    """uvicorn's configuration for `app`, from the settings that are uvicorn's own."""
    password = settings.ssl_keyfile_password
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        lifespan="on",
        # Bounds the head (size, time), the body's time, unread answers and pipelining.
        http=BoundedHttpToolsProtocol.with_timeouts(settings.body_timeout, settings.write_timeout),
        log_config=None,
        access_log=False,  # the agent writes its own (--access-log): with the duration, as JSON
        timeout_graceful_shutdown=int(settings.http_timeout)
        if settings.http_timeout.is_integer()
        else settings.http_timeout,  # type: ignore[arg-type]
        root_path=settings.root_path,
        proxy_headers=settings.proxy_headers,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_keyfile_password=None if password is None else password.get_secret_value(),
    )


def _reloader_config(settings: Settings, app: str | None) -> uvicorn.Config:
    """What uvicorn's reload supervisor reads: where to bind (and whether it is TLS, for its
    line), what to watch. The worker builds its own configuration (`serve_reloaded`)."""
    return uvicorn.Config(
        app or "agent_server.demo:agent",  # uvicorn reloads an import string only
        host=settings.host,
        port=settings.port,
        reload=True,
        log_config=None,
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
    )


def serve_reloaded(
    app: str | None, given: dict[str, Any], sockets: list[socket.socket] | None = None
) -> None:
    """A `--reload` worker (a process of its own): settings, APP and serve, as `run`."""
    exit_on_signal_before_serving()
    settings = _settings_or_exit(given)
    configure_logging(settings.log_level, settings.log_format)
    sys.exit(serve(_agent_or_exit(app, settings), settings, sockets, supervised=True))


class CallExit(enum.IntEnum):
    """The exit codes of `call` and every other verb that talks to a server: one per way a
    call can end."""

    SUCCEEDED = 0
    FAILED = 1
    INVALID = 2  # usage, input JSON, or the server refused the input (400, 413, 415, 422)
    CANCELLED = 3
    LOST = 4
    UNREACHABLE = 5  # no answer, or still refused (429/503), after the retries
    REFUSED = 6  # 401, 404, 409 and any other error answer
    TIMEOUT = 7  # --timeout (--wait) passed before the end
    INPUT_REQUIRED = 8  # call: it waits for input and stdin is not a terminal to answer from


END_CODES = {
    "succeeded": CallExit.SUCCEEDED,
    "failed": CallExit.FAILED,
    "cancelled": CallExit.CANCELLED,
    "lost": CallExit.LOST,
}

#: Every verb's help ends with this table (docs/client.md has the same).
EXIT_CODES = """\b
Exit codes:
  0  succeeded; or done: started (--async), read (an execution not ended yet),
     listed, cancel requested, released
  1  failed
  2  usage error, input that is not JSON, or input the server refused (400, 422, ...)
  3  cancelled
  4  lost
  5  unreachable: no answer, or still 429/503, after --retry-for seconds
  6  refused: unauthorized (401), unknown (404), conflict (409), other errors
  7  --timeout (get: --wait) passed before the end
  8  call: it waits for input (input_required) and stdin is not a terminal:
     answer with `agent-server input ID JSON`

Anything but 0 also writes one line to stderr."""


class BadInput(click.ClickException):
    """Input a verb cannot send: exit 2 with one line, as every other end but 0 of a verb
    writes one line (click's own usage errors write three)."""

    exit_code = CallExit.INVALID

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"agent-server: {self.format_message()}", err=True)


class ClientCommand(click.Command):
    """A verb that talks to a server: the exit codes in its help, a usage error as one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", EXIT_CODES)
        kwargs.setdefault("context_settings", CONTEXT)
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise BadInput(f"{ctx.info_name}: {exc.format_message()}") from exc


@dataclass(frozen=True)
class ServerOptions:
    """How a verb reaches the server: `--url`, `--token-file`, `--retry-for`."""

    url: str
    token_file: str | None
    retry_for: float


def server_options(func: Callable[..., None]) -> Callable[..., None]:
    """The options every verb shares, declared once; the verb receives them as `server`."""

    @click.option(
        "--url",
        default=DEFAULT_URL,
        show_default=True,
        envvar="AGENT_SERVER_URL",
        help="The server (or the Service in front of its replicas). [env: AGENT_SERVER_URL]",
    )
    @click.option(
        "--token-file",
        default=None,
        envvar=ENV + "API_TOKEN_FILE",
        help="File holding the bearer token; else AGENT_SERVER_API_TOKEN, if set. "
        "[env: AGENT_SERVER_API_TOKEN_FILE]",
    )
    @click.option(
        "--retry-for",
        type=click.FloatRange(min=0),
        default=30.0,
        show_default=True,
        help="Seconds to keep retrying refusals (429, 503) and connection errors.",
    )
    @functools.wraps(func)
    def verb(*args: Any, url: str, token_file: str | None, retry_for: float, **kwargs: Any) -> None:
        func(*args, server=ServerOptions(url, token_file, retry_for), **kwargs)

    return verb


def seconds_option(flag: str, help: str) -> Callable[[F], F]:
    """A bound in seconds (above 0) on a verb's wait for an end; none without it."""
    return click.option(flag, type=click.FloatRange(min=0, min_open=True), default=None, help=help)


def _call_token(token_file: str | None) -> str | None:
    if token_file is not None:
        return read_token_file(token_file)
    token = os.environ.get(ENV + "API_TOKEN")
    return check_token(token) if token else None


def _reach(server: ServerOptions, work: Callable[[AgentClient], int]) -> NoReturn:
    """Exit with the code of `work` done through a client of the server; an error of the
    client exits with its code (`_error_code`) and one line."""
    try:
        token = _call_token(server.token_file)
    except TokenError as exc:
        raise BadInput(str(exc)) from None
    try:
        with AgentClient(server.url, token=token, retry_for=server.retry_for) as client:
            code = work(client)
    except AgentServerError as exc:
        click.echo(f"agent-server: {exc}", err=True)
        code = _error_code(exc)
    sys.exit(code)


def _print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))


def _end_code(execution: Execution) -> int:
    """The exit code of how the execution ended (0 while it has not), with a line on stderr
    for any other end than `succeeded`."""
    if not execution.is_terminal:
        return CallExit.SUCCEEDED
    if execution.status != "succeeded":
        try:
            execution.outcome()
        except AgentServerError as exc:
            click.echo(f"agent-server: {exc}", err=True)
    return END_CODES.get(execution.status, CallExit.REFUSED)


def _printed(execution: Execution) -> int:
    """Print the execution; the exit code of its end."""
    _print_json(execution.json)
    return _end_code(execution)


def _streamed(events: Iterator[Event]) -> int:
    """Print each event as one JSON line; the exit code of the end the last one carries."""
    end: Execution | None = None
    for event in events:
        _print_json({"id": event.id, "event": event.event, "data": event.data})
        if event.event == "end" and isinstance(event.data, dict):
            end = Execution.from_json(event.data)
    if end is None:  # pragma: no cover - a stream ends with its end event
        raise AgentServerError("the event stream ended without its end event")
    return _end_code(end)


def _error_code(exc: AgentServerError) -> int:
    if isinstance(exc, WaitTimeout):
        return CallExit.TIMEOUT
    if isinstance(exc, Unavailable):
        return CallExit.UNREACHABLE
    if isinstance(exc, InvalidInput):
        return CallExit.INVALID
    return CallExit.REFUSED


@main.command(cls=ClientCommand)
@click.argument("name")
@click.argument("input_json", metavar="[JSON]", required=False)
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
@seconds_option(
    "--timeout",
    "Seconds to wait for the end (a synchronous run is then cancelled; with --stream, the "
    "stream ends and the execution goes on).",
)
@server_options
def call(
    name: str,
    input_json: str | None,
    background: bool,
    stream: bool,
    session: str | None,
    timeout: float | None,
    server: ServerOptions,
) -> None:
    """Run reasoner NAME with JSON input (an object of its parameters) on a server, and print
    the execution as JSON. Rides rollouts like the Python client (docs/client.md)."""
    if background and stream:
        raise BadInput("give --async or --stream, not both")
    try:
        # Strict, as the server reads it: NaN and Infinity are not JSON.
        payload = None if input_json is None else jsoncodec.loads(input_json.encode())
        jsoncodec.check(payload, "JSON input")
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"JSON input is not valid JSON: {exc}") from None

    def work(client: AgentClient) -> int:
        if not (background or stream):
            deadline = None if timeout is None else time.monotonic() + timeout
            execution = client.run_execution(name, payload, session=session, timeout=timeout)
            while execution.waits_for_input:
                if not _answered_from_terminal(client, execution):
                    _print_json(execution.json)
                    return CallExit.INPUT_REQUIRED
                left = None if deadline is None else max(0.001, deadline - time.monotonic())
                execution = client.wait(execution.execution_id, left)
            return _printed(execution)
        handle = client.start(name, payload, session=session)
        if background:
            _print_json(handle.execution.json)
            return CallExit.SUCCEEDED
        return _streamed(handle.events(timeout=timeout))

    _reach(server, work)


def _answered_from_terminal(client: AgentClient, execution: Execution) -> bool:
    """Show what a waiting execution asks (stderr); when stdin is a terminal, read the
    answer there as JSON, again until the server takes one (True). False when stdin is not
    a terminal: the caller prints the execution and exits 8."""
    request = execution.input_request or {}
    request_id = request.get("request_id")
    asked = json.dumps(request.get("prompt"), ensure_ascii=False)
    if not sys.stdin.isatty():
        click.echo(
            f"agent-server: execution {execution.execution_id} waits for input (request "
            f"{request_id}): {asked}; answer with `agent-server input "
            f"{execution.execution_id} JSON`",
            err=True,
        )
        return False
    click.echo(f"execution {execution.execution_id} asks (request {request_id}): {asked}", err=True)
    if request.get("schema") is not None:
        click.echo(f"the answer's schema: {json.dumps(request['schema'])}", err=True)
    while True:
        line = click.prompt("answer (JSON)", err=True)
        try:
            value = jsoncodec.loads(line.encode())
            jsoncodec.check(value, "the answer")
        except (ValueError, RecursionError) as exc:
            click.echo(f"agent-server: not JSON ({exc}); again", err=True)
            continue
        try:
            client.respond(execution.execution_id, value, request_id)
        except InvalidInput as exc:
            click.echo(f"agent-server: refused: {exc}; again", err=True)
            continue
        except Conflict as exc:  # answered elsewhere meanwhile: follow it
            click.echo(f"agent-server: {exc}", err=True)
        return True


@main.command(name="input", cls=ClientCommand)
@click.argument("execution_id", metavar="ID")
@click.argument("value_json", metavar="JSON")
@click.option(
    "--request-id",
    type=click.IntRange(min=1),
    default=None,
    help="The request answered (its input_request's request_id); else the pending one.",
)
@server_options
def input_(
    execution_id: str, value_json: str, request_id: int | None, server: ServerOptions
) -> None:
    """Answer the pending request for input of execution ID with JSON, and print the
    execution as the server took it (running again): 0; 6 when it waits for no input or the
    request was answered already (409); 2 when the value does not fit its schema (422)."""
    try:
        value = jsoncodec.loads(value_json.encode())
        jsoncodec.check(value, "JSON input")
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"JSON input is not valid JSON: {exc}") from None

    def work(client: AgentClient) -> int:
        _print_json(client.respond(execution_id, value, request_id).json)
        return CallExit.SUCCEEDED

    _reach(server, work)


@main.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID")
@seconds_option(
    "--wait",
    "Seconds to long-poll for its end; if it has not ended by then, print it as it is and exit 7.",
)
@server_options
def get(execution_id: str, wait: float | None, server: ServerOptions) -> None:
    """Print execution ID as JSON; the exit code is its end's (0 while it runs)."""

    def work(client: AgentClient) -> int:
        if wait is None:
            return _printed(client.get(execution_id))
        try:
            return _printed(client.wait(execution_id, wait))
        except WaitTimeout as exc:
            if exc.execution is not None:
                _print_json(exc.execution.json)
            raise

    _reach(server, work)


@main.command(name="list", cls=ClientCommand)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    help="Only executions in this status; repeat it for any of several.",
)
@click.option("--reasoner", default=None, help="Only executions of this reasoner.")
@click.option("--session", default=None, help="Only executions of this session.")
@click.option(
    "--limit",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="Executions a page (the server's bound: 1000).",
)
@click.option(
    "--all", "every", is_flag=True, help="Follow the pages (Link: rel=next) to the last one."
)
@server_options
def list_(
    statuses: tuple[str, ...],
    reasoner: str | None,
    session: str | None,
    limit: int,
    every: bool,
    server: ServerOptions,
) -> None:
    """Print the executions, newest first, as one JSON list: one page, or with --all all."""
    filters = (statuses or None, reasoner, session, limit)

    def work(client: AgentClient) -> int:
        found = client.iter_executions(*filters) if every else client.list(*filters)
        _print_json([execution.json for execution in found])
        return CallExit.SUCCEEDED

    _reach(server, work)


@main.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID")
@server_options
def cancel(execution_id: str, server: ServerOptions) -> None:
    """Request the cancellation of execution ID and print it as the server answered: still
    running while it settles, or already ended (exit 0 either way)."""

    def work(client: AgentClient) -> int:
        _print_json(client.cancel(execution_id).json)
        return CallExit.SUCCEEDED

    _reach(server, work)


@main.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID")
@seconds_option("--timeout", "Seconds the whole stream may take (the execution goes on after it).")
@server_options
def events(execution_id: str, timeout: float | None, server: ServerOptions) -> None:
    """Print the events of execution ID as they come, one JSON line each ({"id", "event",
    "data"}), through its end (kept ones first); the exit code is its end's."""
    _reach(server, lambda client: _streamed(client.events(execution_id, timeout=timeout)))


@main.command(cls=ClientCommand)
@click.argument("session_id", metavar="SESSION")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds its cancelled executions may take to settle before they are abandoned "
    "(0: do not wait).",
)
@click.option(
    "--keep-running",
    is_flag=True,
    help="Cancel nothing: with running work the release is refused (409, exit 6).",
)
@server_options
def release(session_id: str, timeout: float, keep_running: bool, server: ServerOptions) -> None:
    """Release session SESSION: cancel its running executions, wait for them, forget its
    records; print what it did as JSON."""

    def work(client: AgentClient) -> int:
        released = client.release_session(session_id, timeout, cancel_running=not keep_running)
        _print_json(dataclasses.asdict(released))
        return CallExit.SUCCEEDED

    _reach(server, work)
