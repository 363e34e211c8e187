"""How the process ends: its exit codes, the watchdog, and exits that wait on nothing.

A shutdown must end the process before Kubernetes sends SIGKILL, whatever user code left
behind: a blocked event loop (the watchdog thread), a task that swallows cancellation or a
thread in a blocking call (`end_leftovers`), a stderr pipe nobody reads (`exit_with_line`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from agent_server.runtime.signals import block_in_this_thread

logger = logging.getLogger("agent_server.shutdown")

#: How often the end of the remaining non-daemon threads is checked.
THREAD_POLL = 0.01


class ExitCode(enum.IntEnum):
    OK = 0
    STARTUP_FAILED = 1  # uvicorn's own code for it is 3, which here means work abandoned
    INVALID_SETTINGS = 2
    ABANDONED = 3
    WATCHDOG = 4
    FORCED = 5
    UNRECORDED = 6  # ends that could not be written to the shared store


#: Seconds an exit that cannot wait gives its last line to reach stderr.
EXIT_LINE_WAIT = 0.1


def exit_with_line(line: str, code: int) -> None:
    """Write one line to the stderr descriptor, then end the process at once, whether or
    not the line could be written.

    For exits that cannot wait for the event loop or the logging machinery: a signal
    handler may run while the interrupted code holds the logging locks, and a blocked loop
    never gets back to anything else. The write happens in a thread of its own, waited for
    at most `EXIT_LINE_WAIT`: stderr may be a full pipe nobody reads, where a write blocks
    for good (the descriptor's blocking mode is shared with other processes, so it is not
    changed).
    """
    writer = threading.Thread(
        target=_write_stderr, args=((line + "\n").encode(),), name="exit-line", daemon=True
    )
    try:
        writer.start()
        writer.join(EXIT_LINE_WAIT)
    finally:
        os._exit(code)


def _write_stderr(data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(2, data)


class Watchdog:
    """Ends the process at a deadline even when the event loop is blocked.

    A daemon thread: it needs nothing from the loop. It writes its one line straight to the
    stderr file descriptor, since a blocked main thread may hold the logging locks.
    """

    def __init__(self, line: Callable[[float], str]) -> None:
        self._line = line
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, after: float, started: float) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._watch, args=(started + after, started), name="watchdog", daemon=True
        )
        self._thread.start()

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self, deadline: float, started: float) -> None:
        block_in_this_thread()
        if self._disarmed.wait(max(0.0, deadline - time.monotonic())):
            return
        exit_with_line(self._line(time.monotonic() - started), ExitCode.WATCHDOG)


async def finish_process(
    code: int, *, abandoned_pending: int, deadline: float, cancel_tasks: bool
) -> None:
    """The last step of every shutdown, `agent-server run` or plain uvicorn: never wait
    without bound in `asyncio.run`'s cleanup or the interpreter's exit. Abandoned work ends
    the process at once; other leftovers get until `deadline`, then end it too."""
    if abandoned_pending:
        end_process(code)
    if await end_leftovers(deadline, cancel_tasks=cancel_tasks):
        end_process(code, "tasks or threads")


def end_process(code: int, still_running: str = "abandoned work") -> None:
    """Exit now: asyncio.run's cleanup would wait without bound for abandoned tasks."""
    logger.warning("exiting with %s still running (exit code %d)", still_running, code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def end_leftovers(deadline: float, *, cancel_tasks: bool) -> list[str]:
    """Give what would hold the exit without bound until `deadline`; name what still runs.

    `asyncio.run` ends by cancelling the remaining tasks and waiting for them, then for the
    default executor's threads, with no bound; the interpreter then joins every non-daemon
    thread. A task user code left behind that swallows cancellation, or a thread still in a
    blocking call (`asyncio.to_thread`), would hold the process until the watchdog or
    SIGKILL. With `cancel_tasks`, every other task is cancelled first: only the process's
    last coroutine may do that (under plain uvicorn the lifespan runs while uvicorn's own
    tasks wait for it). An empty answer means the exit will not wait on anything.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current] if cancel_tasks else []
    for task in tasks:
        task.cancel()
    existing = set(threading.enumerate())  # not the helper thread the executor shutdown starts
    executor = asyncio.create_task(
        loop.shutdown_default_executor(), name="shutdown-default-executor"
    )
    _, pending = await asyncio.wait(
        [*tasks, executor], timeout=max(0.0, deadline - time.monotonic())
    )
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            logger.error("task %s raised", task.get_name(), exc_info=task.exception())
    threads = [thread for thread in await _joinable_threads(deadline) if thread in existing]
    stuck = sorted(task.get_name() for task in pending if task is not executor)
    stuck += sorted(f"thread {thread.name}" for thread in threads)
    if pending or threads:
        logger.warning(
            "not ending after the shutdown: %s", ", ".join(stuck) or "default executor threads"
        )
        stuck = stuck or ["default executor"]
    return stuck


async def _joinable_threads(deadline: float) -> list[threading.Thread]:
    """Non-daemon threads (the interpreter's exit joins them) still alive at `deadline`."""
    while True:
        threads = [
            thread
            for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon
        ]
        if not threads or time.monotonic() >= deadline:
            return threads
        await asyncio.sleep(THREAD_POLL)
