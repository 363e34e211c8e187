"""The client verbs of `agent-server`: `call NAME [JSON]`, `input ID JSON`, `get ID`, `list`,
`cancel ID`, `events ID` and `release SESSION`: a server from a shell, through
`agent_server.client`. `agent_server/process/cli.py` adds them to its group."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, NoReturn, TypeVar

import click
from click.exceptions import NoArgsIsHelpError

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
from agent_server.identity.tokens import TokenError, check_token, read_token_file
from agent_server.model import jsoncodec
from agent_server.model.scheduling import SessionPolicy
from agent_server.model.status import ExecutionStatus
from agent_server.process.cli_output import print_json, say

ENV = "AGENT_SERVER_"
F = TypeVar("F", bound=Callable[..., Any])
#: The `help_option_names` uvicorn users expect.
CONTEXT = {"help_option_names": ["-h", "--help"]}

#: A `--header`'s NAME: an HTTP header name (RFC 9110 token).
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")

#: The verbs, in the order `--help` lists them.
COMMANDS: list[click.Command] = []


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


END_CODES: dict[str, CallExit] = {
    ExecutionStatus.SUCCEEDED: CallExit.SUCCEEDED,
    ExecutionStatus.FAILED: CallExit.FAILED,
    ExecutionStatus.CANCELLED: CallExit.CANCELLED,
    ExecutionStatus.LOST: CallExit.LOST,
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


#: The longest wait a verb takes: a year, the server's bound on every duration.
MAX_SECONDS = 365 * 86_400.0


class Seconds(click.FloatRange):
    """A number of seconds: finite, from 0 (or above it) to a year. click's FloatRange takes
    `nan` (no comparison refuses it) and `inf` or `1e999` without a maximum: each then broke
    a verb with a traceback (exit 1, which means "failed")."""

    name = "seconds"

    def __init__(self, *, above_zero: bool = False, maximum: float = MAX_SECONDS) -> None:
        super().__init__(min=0, max=maximum, min_open=above_zero)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds.", param, ctx)
        return number


class PathName(click.ParamType[str]):
    """An execution id, reasoner name or session id: not empty (it would name another
    route). Any other text is sent percent-encoded as one path segment."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or not value:
            self.fail("must not be empty.", param, ctx)
        return value


PATH_NAME = PathName()


class BadInput(click.ClickException):
    """Input a verb cannot send: exit 2 with one line, as every other end but 0 of a verb
    writes one line (click's own usage errors write three)."""

    exit_code = CallExit.INVALID

    def show(self, file: IO[Any] | None = None) -> None:
        say(self.format_message())


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
            raise BadInput(f"{verb_path(ctx)}: {exc.format_message()}") from exc


class ClientGroup(click.Group):
    """Verbs under one name (`agent-server schedules ...`): an unknown verb or option is a
    usage error in one line too (no verb at all still shows the help)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except NoArgsIsHelpError:
            raise
        except click.UsageError as exc:
            raise BadInput(f"{verb_path(ctx)}: {exc.format_message()}") from exc

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            raise BadInput(f"{verb_path(ctx)}: {exc.format_message()}") from exc


def verb_path(ctx: click.Context) -> str:
    """The verb as typed after `agent-server` (`schedules create`), to name it in an error
    (whatever the program's name: `python -m agent_server` too)."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(reversed(names)) or (ctx.info_name or "")


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
        type=Seconds(),
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
    return click.option(flag, type=Seconds(above_zero=True), default=None, help=help)


def _call_token(token_file: str | None) -> str | None:
    if token_file is not None:
        return read_token_file(token_file)
    token = os.environ.get(ENV + "API_TOKEN")
    return check_token(token) if token else None


def reach(server: ServerOptions, work: Callable[[AgentClient], int]) -> NoReturn:
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
        say(exc)
        code = _error_code(exc)
    sys.exit(code)


def _end_code(execution: Execution) -> int:
    """The exit code of how the execution ended (0 while it has not), with a line on stderr
    for any other end than `succeeded`."""
    if not execution.is_terminal:
        return CallExit.SUCCEEDED
    if execution.status != ExecutionStatus.SUCCEEDED:
        try:
            execution.outcome()
        except AgentServerError as exc:
            say(exc)
    return END_CODES.get(execution.status, CallExit.REFUSED)


def _printed(execution: Execution) -> int:
    """Print the execution; the exit code of its end."""
    print_json(execution.json)
    return _end_code(execution)


def _streamed(events: Iterator[Event]) -> int:
    """Print each event as one JSON line; the exit code of the end the last one carries."""
    end: Execution | None = None
    for event in events:
        print_json({"id": event.id, "event": event.event, "data": event.data})
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


@click.command(cls=ClientCommand)
@click.argument("name", type=PATH_NAME)
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
@click.option(
    "--policy",
    type=click.Choice([policy.value for policy in SessionPolicy]),
    default=None,
    help="What it does beside its session's other work (X-Session-Policy); else the "
    "reasoner's default.",
)
@click.option(
    "--delay",
    type=Seconds(),
    default=None,
    help="Start it this many seconds from now (?delay=, at most 7 days): a background start, "
    "then followed as without it.",
)
@click.option(
    "--webhook-url",
    default=None,
    help="Where its webhooks go (X-Webhook-URL; the server needs a webhook secret).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Another request header of the start, e.g. the one a concurrency_key names; repeatable.",
)
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
    policy: str | None,
    delay: float | None,
    webhook_url: str | None,
    headers: tuple[str, ...],
    timeout: float | None,
    server: ServerOptions,
) -> None:
    """Run reasoner NAME with JSON input (an object of its parameters) on a server, and print
    the execution as JSON. Rides rollouts like the Python client (docs/client.md)."""
    if background and stream:
        raise BadInput("give --async or --stream, not both")
    extra = _headers(headers)
    try:
        # Strict, as the server reads it: NaN and Infinity are not JSON.
        payload = None if input_json is None else jsoncodec.loads(input_json.encode())
        jsoncodec.check(payload, "JSON input")
    except (ValueError, RecursionError) as exc:
        raise BadInput(f"JSON input is not valid JSON: {exc}") from None

    options: dict[str, Any] = {
        "session": session,
        "session_policy": policy,
        "webhook_url": webhook_url,
        "headers": extra,
    }

    def work(client: AgentClient) -> int:
        if not (background or stream):
            deadline = None if timeout is None else time.monotonic() + timeout
            if delay is None:
                execution = client.run_execution(name, payload, timeout=timeout, **options)
            else:  # a delayed start is a background one (the API has no delayed sync run)
                started = client.start(name, payload, delay=delay, **options)
                execution = client.wait(started.execution_id, timeout)
            while execution.waits_for_input:
                if not _answered_from_terminal(client, execution):
                    print_json(execution.json)
                    return CallExit.INPUT_REQUIRED
                left = None if deadline is None else max(0.001, deadline - time.monotonic())
                execution = client.wait(execution.execution_id, left)
            return _printed(execution)
        handle = client.start(name, payload, delay=delay, **options)
        if background:
            print_json(handle.execution.json)
            return CallExit.SUCCEEDED
        return _streamed(handle.events(timeout=timeout))

    reach(server, work)


def _headers(given: tuple[str, ...]) -> dict[str, str]:
    """`--header NAME:VALUE` options as headers; one that is not is exit 2."""
    headers: dict[str, str] = {}
    for text in given:
        name, colon, value = text.partition(":")
        name, value = name.strip(), value.strip()
        if not colon or not HEADER_NAME.fullmatch(name) or not value.isprintable():
            raise BadInput(f"--header {text!r}: give NAME:VALUE (NAME a header name)")
        headers[name] = value
    return headers


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
            say(f"refused: {exc}; again")
            continue
        except Conflict as exc:  # answered elsewhere meanwhile: follow it
            say(exc)
        return True


@click.command(name="input", cls=ClientCommand)
@click.argument("execution_id", metavar="ID", type=PATH_NAME)
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
        print_json(client.respond(execution_id, value, request_id).json)
        return CallExit.SUCCEEDED

    reach(server, work)


@click.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID", type=PATH_NAME)
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
                print_json(exc.execution.json)
            raise

    reach(server, work)


@click.command(name="list", cls=ClientCommand)
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
    type=click.IntRange(min=1, max=1000),
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
        print_json([execution.json for execution in found])
        return CallExit.SUCCEEDED

    reach(server, work)


@click.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID", type=PATH_NAME)
@server_options
def cancel(execution_id: str, server: ServerOptions) -> None:
    """Request the cancellation of execution ID and print it as the server answered: still
    running while it settles, or already ended (exit 0 either way)."""

    def work(client: AgentClient) -> int:
        print_json(client.cancel(execution_id).json)
        return CallExit.SUCCEEDED

    reach(server, work)


@click.command(cls=ClientCommand)
@click.argument("execution_id", metavar="ID", type=PATH_NAME)
@seconds_option("--timeout", "Seconds the whole stream may take (the execution goes on after it).")
@server_options
def events(execution_id: str, timeout: float | None, server: ServerOptions) -> None:
    """Print the events of execution ID as they come, one JSON line each ({"id", "event",
    "data"}), through its end (kept ones first); the exit code is its end's."""
    reach(server, lambda client: _streamed(client.events(execution_id, timeout=timeout)))


@click.command(cls=ClientCommand)
@click.argument("session_id", metavar="SESSION", type=PATH_NAME)
@click.option(
    "--timeout",
    type=Seconds(),
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
        print_json(dataclasses.asdict(released))
        return CallExit.SUCCEEDED

    reach(server, work)


COMMANDS += [call, input_, get, list_, cancel, events, release]
