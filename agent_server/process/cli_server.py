"""`agent-server run [APP]`: load an Agent, validate the settings and budget, serve it;
`agent-server drill [APP]`: rehearse its shutdown. `agent_server/process/cli.py`'s group
loads this module only for these two commands: the client verbs (`cli_client.py`) import
none of the server."""

from __future__ import annotations

import functools
import importlib
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterable
from types import UnionType
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

import click
import uvicorn
from pydantic import SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings
from starlette.types import ASGIApp

from agent_server.app.agent import Agent
from agent_server.app.protocols import AgentSetupError
from agent_server.http.http_limits import BoundedHttpToolsProtocol
from agent_server.model.execution import exception_text
from agent_server.process.cli_client import CONTEXT, ENV, Seconds
from agent_server.process.drill import (
    SHUTDOWN_FIELDS,
    DrillArgs,
    DrillError,
    drill_and_print,
    parse_input,
)
from agent_server.process.runner import Runner, exit_on_signal_before_serving, supervise_reloads
from agent_server.runtime.exits import ExitCode
from agent_server.runtime.logs import configure_logging
from agent_server.runtime.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


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
        from agent_server.app.demo import agent as demo

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


def _no_workers(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """uvicorn's and gunicorn's `--workers`: here each process is a replica of its own,
    with its own drain and in-flight work, so the answer is more replicas. One line, as
    every refusal of `run` is (click's usage error would add its usage and a hint)."""
    if value is not None:
        click.echo(
            "agent-server: --workers: agent-server serves one process per replica; run more "
            "replicas instead (Kubernetes `replicas:` on a shared --store redis://, "
            "docs/replicas.md)",
            err=True,
        )
        ctx.exit(ExitCode.INVALID_SETTINGS)


@click.command(context_settings=CONTEXT)
@click.argument("app", required=False, envvar=ENV + "APP")
@click.option(
    "--workers", default=None, hidden=True, expose_value=False, is_eager=True, callback=_no_workers
)
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


@click.command(name="drill", context_settings=CONTEXT)
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
    "schema's examples and defaults, else plain values of its types. Repeat it for several "
    "reasoners.",
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
    type=Seconds(),
    default=1.0,
    show_default=True,
    help="Seconds from the last start to SIGTERM.",
)
@click.option(
    "--next",
    "next_app",
    metavar="NEXT_APP",
    help="The next version's app (module:attribute): say, per resumable reasoner, what its "
    "code makes of work APP hands off (resumes, migrates, waits for APP's version, restarts, "
    'or fails: a fault). docs/durable.md, "Versions".',
)
@click.option(
    "--next-version",
    metavar="VERSION",
    help="The AGENT_SERVER_VERSION NEXT_APP is imported with (its Agent's version when its "
    "code gives none), as its deployment sets it; default: this environment's.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object, not the table.")
@settings_options(Settings, only=SHUTDOWN_FIELDS)
def drill_command(
    app: str | None,
    reasoners: tuple[str, ...],
    inputs: tuple[str, ...],
    executions: int,
    signal_after: float,
    next_app: str | None,
    next_version: str | None,
    as_json: bool,
    **flags: Any,
) -> None:
    """Rehearse a shutdown: serve APP (default: the demo agent) as an `agent-server run`
    child on a free loopback port, start background executions of its reasoners, send
    SIGTERM, and say whether each reasoner is shutdown-safe: it finished in the drain or
    settled once cancelled, never swallowed the cancellation, never blocked the event loop
    over 1 s, and the shutdown ended within the grace period. With --next, also that the
    next version's code resumes, migrates or restarts the work each resumable reasoner
    hands off, rather than failing it.

    \b
    Exit codes:
      0  every reasoner is shutdown-safe
      1  a reasoner (or the server) is not: each fault is named
      2  bad arguments (an unknown reasoner, --input that is not JSON, an input the
         reasoner refuses or cannot be built, a budget that does not fit, APP or
         NEXT_APP not found)
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
    if next_version is not None and next_app is None:
        raise click.BadParameter("needs --next", param_hint="--next-version")
    args = DrillArgs(
        app, reasoners, parsed, executions, signal_after, given, settings, next_app, next_version
    )
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
    agent.configure(settings, served_here=True)
    try:
        app = agent.asgi()
    except AgentSetupError as exc:
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(ExitCode.INVALID_SETTINGS)
    runner = Runner(
        uvicorn_config(app, settings),
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
        app or "agent_server.app.demo:agent",  # uvicorn reloads an import string only
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
