"""Runner: a uvicorn.Server whose signals start the shutdown sequence, not an exit.

Read top to bottom: startup (uvicorn's), main loop (serve until the first signal, then run
the shutdown phases while the listener is still open), then close the listener and let
uvicorn finish open responses within the http timeout, and finally end what would hold
`asyncio.run`'s cleanup or the interpreter's exit. The exit code is the report's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from types import FrameType

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.server import HANDLED_SIGNALS
from uvicorn.supervisors.watchfilesreload import WatchFilesReload

from agent_server.http.http_limits import BoundedHttpToolsProtocol
from agent_server.model.counts import counted
from agent_server.runtime.exits import ExitCode, Watchdog, exit_with_line, finish_process
from agent_server.runtime.logs import format_line
from agent_server.runtime.shutdown import ShutdownSequence
from agent_server.runtime.signals import block_in_this_thread, blocked_while_starting_threads

logger = logging.getLogger("agent_server.runner")

#: After the listening socket closes, requests already accepted on open connections are
#: still read and answered (503 + Connection: close) for this long, so none is reset.
LISTENER_LINGER = 0.1
#: uvicorn's shutdown pauses this long after asking open connections to close.
UVICORN_CLOSE_PAUSE = 0.1
#: Connections whose clients do not read are aborted this long before the http deadline:
#: uvicorn checks every 0.1 s whether its connections and tasks have ended.
UNREAD_ABORT_LEAD = 0.3


def exit_on_signal_before_serving() -> None:
    """Until the server listens nothing can be in flight: a signal ends the process at once.

    Installed first thing by the CLI, because importing an application can take long and
    without a handler PID 1 ignores SIGTERM (the pod then waits for SIGKILL), while any
    other process is killed by it (exit 143). The Runner replaces these handlers.

    A process inherits the signal mask of the thread that started it: one started by a
    thread that blocks them (a supervisor's worker, or our own reasoner threads' mask) would
    never see them, so they are unblocked here too.
    """
    for sig in HANDLED_SIGNALS:
        signal.signal(sig, _exit_before_serving)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED_SIGNALS)


def _exit_before_serving(sig: int, frame: FrameType | None) -> None:
    name = signal.Signals(sig).name
    exit_with_line(
        f"agent-server: {name} before serving: nothing to drain, exit code 0", ExitCode.OK
    )


class Runner(uvicorn.Server):
    """Serves one Agent; the first SIGTERM/SIGINT drains, the second cancels, the third exits."""

    def __init__(
        self,
        config: uvicorn.Config,
        shutdown: ShutdownSequence,
        *,
        log_format: str,
        push: Callable[[float], Awaitable[object]],
        supervised: bool = False,
    ) -> None:
        """`shutdown` is the agent's sequence, which this runner now drives; `push` sends
        the shutdown metrics before the process ends at the monotonic time it is given.
        `supervised`: a `--reload` worker, whose signals come from its `Reloader` (see
        `handle_exit`)."""
        super().__init__(config)
        self.sequence = shutdown
        self.log_format = log_format
        self.push = push
        self.supervised = supervised
        shutdown.driven_by_signals = True
        self.exit_code: int = ExitCode.OK
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requested: asyncio.Event | None = None
        #: When the listener closed (after the report): the http phase runs from there.
        self._listener_closed: float | None = None
        self.watchdog = Watchdog(self._watchdog_line)

    # -- signals (main thread, between bytecodes: set flags and hand over to the loop) -----
    # uvicorn's own handle_exit records each signal and re-raises it after `serve`, which
    # would kill the process by SIGTERM (exit 143) before it returns its exit code; this one
    # records nothing, so nothing is re-raised.

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.supervised and sig == signal.SIGINT:
            # Ctrl+C reaches the terminal's whole process group: the supervisor turns it into
            # the SIGTERM that counts, so one Ctrl+C is one signal here, not two.
            return
        self.signals += 1
        now = time.monotonic()
        if self.signals == 1:
            self.watchdog.arm(self.sequence.plan.watchdog_after, now)
            if self._loop is None:  # before startup: nothing to drain yet
                self.should_exit = True
                return
            self._loop.call_soon_threadsafe(self._begin, now, time.time(), sig)
        elif self.signals == 2:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.sequence.skip_to_cancel)
        else:
            self._exit_now(ExitCode.FORCED, "third signal: exiting now")

    def _begin(self, started: float, wall_time: float, sig: int) -> None:
        # A full garbage collection walks every live object: with 100,000 executions in
        # flight it stalls the loop for seconds. From here on only objects made during the
        # shutdown are collected; the process ends soon after.
        gc.freeze()
        self.sequence.begin(started, wall_time, signal.Signals(sig).name)
        assert self._requested is not None
        self._requested.set()

    def _exit_late(self, sig: int, frame: FrameType | None) -> None:
        """A signal outside uvicorn's serving: before it (nothing to drain), or once the
        shutdown is over (exit with the code already decided)."""
        if self.sequence.started is None:
            _exit_before_serving(sig, frame)
        self._exit_now(self.exit_code, f"{signal.Signals(sig).name} after the shutdown")

    def _exit_now(self, code: int, why: str) -> None:
        exit_with_line(self._critical_line(f"{why} (exit code {code})"), code)

    def _critical_line(self, message: str) -> str:
        """A log line in the configured format, built without the logging machinery."""
        return format_line(self.log_format, "critical", logger.name, message)

    # -- lifecycle ---------------------------------------------------------------------------

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        if threading.current_thread() is threading.main_thread():
            # uvicorn restores, when it stops serving, the handlers it found: these, so no
            # signal falls between its restore and a handler of ours.
            for sig in HANDLED_SIGNALS:
                signal.signal(sig, self._exit_late)
        try:
            await super().serve(sockets)
        except SystemExit as exc:  # the port is taken, the lifespan startup failed, ...
            if exc.code == STARTUP_FAILURE:
                raise SystemExit(ExitCode.STARTUP_FAILED) from None
            raise
        sequence = self.sequence
        if sequence.started is not None:  # last: bounded by the time left before the watchdog
            if self._listener_closed is not None:
                sequence.took("http", time.monotonic() - self._listener_closed)
            pushing = time.monotonic()
            await self.push(sequence.plan.hard_end(sequence.started))
            sequence.took("push", time.monotonic() - pushing)
            sequence.last_line(self.exit_code)
        await finish_process(
            self.exit_code,
            abandoned_pending=sequence.registry.abandoned_pending,
            deadline=sequence.plan.leftovers_deadline(sequence.started, time.monotonic()),
            cancel_tasks=True,
        )

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._requested = asyncio.Event()
        self._loop.set_default_executor(ThreadPoolExecutor(initializer=block_in_this_thread))
        with blocked_while_starting_threads(), contextlib.suppress(OSError):
            # libuv starts its whole thread pool on first use: let it inherit the mask.
            await self._loop.getaddrinfo(self.config.host, self.config.port)
        await super().startup(sockets)

    async def main_loop(self) -> None:
        """Serve until the first signal, then run the shutdown with the listener open."""
        assert self._requested is not None
        ticker = asyncio.create_task(super().main_loop(), name="uvicorn-main-loop")
        requested = asyncio.create_task(self._requested.wait(), name="shutdown-requested")
        try:
            await asyncio.wait({ticker, requested}, return_when=asyncio.FIRST_COMPLETED)
            if self._requested.is_set():
                report = await self.sequence.run()
                self.exit_code = report.exit_code
                await self._close_listener()
        finally:
            self.should_exit = True
            for task in (ticker, requested):
                task.cancel()
            await asyncio.gather(ticker, requested, return_exceptions=True)

    async def _close_listener(self) -> None:
        """Stop accepting connections, let already-accepted requests be answered, and give
        uvicorn what is left of the http phase for open responses."""
        sequence = self.sequence
        assert sequence.started is not None
        self._listener_closed = time.monotonic()
        deadline = sequence.plan.http_deadline(sequence.started, self._listener_closed)
        for server in self.servers:
            server.close()
        if sequence.end_streams is not None:  # open event streams end with a retry hint
            sequence.end_streams()
        if self.server_state.connections:
            await asyncio.sleep(LISTENER_LINGER)
        # uvicorn passes it to asyncio.wait_for, which takes any number of seconds.
        self.config.timeout_graceful_shutdown = max(  # type: ignore[assignment]
            0.0, deadline - time.monotonic() - UVICORN_CLOSE_PAUSE
        )
        loop = asyncio.get_running_loop()
        loop.call_at(max(loop.time(), deadline - UNREAD_ABORT_LEAD), self._abort_unread)

    def _abort_unread(self) -> None:
        """Clients that are not reading their answers are cut off just before uvicorn's
        deadline: their tasks end, where uvicorn would cancel them and log an ERROR (and an
        "Exception in ASGI application") for what is the client's doing."""
        aborted = sum(
            connection.abort_if_unread()
            for connection in list(self.server_state.connections)
            if isinstance(connection, BoundedHttpToolsProtocol)
        )
        if aborted:
            logger.info("closed %s whose clients were not reading", counted(aborted, "connection"))

    def _watchdog_line(self, elapsed: float) -> str:
        try:
            account = self.sequence.account()
        except Exception as exc:  # the line must come: the exit depends on it
            account = f"its account unreadable ({type(exc).__name__})"
        message = (
            f"watchdog fired {elapsed:.2f}s after the first signal (grace period "
            f"{self.sequence.plan.grace_period:g}s), {account}: exiting "
            f"with code {int(ExitCode.WATCHDOG)}"
        )
        return self._critical_line(message)


class Reloader(WatchFilesReload):
    """uvicorn's `--reload` supervisor, with every signal after the first passed on to the
    worker: its first signal (and every restart) sends the worker one SIGTERM, which runs
    the whole shutdown sequence there; a second skips to the cancellation, a third ends it
    at once, as for a server without a supervisor. (uvicorn's own takes note of the first
    signal only, then waits for the worker without bound.)"""

    def __init__(
        self,
        config: uvicorn.Config,
        target: Callable[..., None],
        sockets: list[socket.socket],
    ) -> None:
        super().__init__(config, target, sockets)
        self.signals = 0
        # watchfiles says "1 change detected" at INFO for any file, `*.py` or not (a log file
        # in the watched directory: a line per line); uvicorn's own line names what reloads.
        logging.getLogger("watchfiles.main").setLevel(logging.WARNING)

    def signal_handler(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        if self.signals == 1:
            self.should_exit.set()  # the watch ends; `shutdown` sends the worker SIGTERM
            return
        process = getattr(self, "process", None)
        if process is not None and process.pid is not None and process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)


def supervise_reloads(config: uvicorn.Config, target: Callable[..., None]) -> int:
    """Bind the listener once, run `target(sockets=[...])` in a worker process and start a
    new one whenever a watched file changes, until a signal; the last worker's exit code
    (128 + the signal's number when a signal ended it)."""
    listener = config.bind_socket()  # exits 1 (uvicorn's message) when the port is taken
    supervisor = Reloader(config, target=target, sockets=[listener])
    supervisor.run()
    code = supervisor.process.exitcode
    if code is None:  # pragma: no cover - run() joins the worker
        return int(ExitCode.STARTUP_FAILED)
    return 128 - code if code < 0 else code
