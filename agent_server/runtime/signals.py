"""Keep process signals on the main thread, where Python runs its signal handlers.

The kernel may hand a process-directed SIGTERM to any thread that does not block it. When
that is a worker thread while the main thread is stuck in a blocking call (a reasoner's
`time.sleep` inside `async def`), the main thread is never interrupted, the handler never
runs, and the watchdog is never armed. Threads block these signals from their first
instruction; threads created by C code (libuv's pool) inherit the mask of the thread that
started them, so the server's start-up runs with them blocked too.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SHUTDOWN_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_in_this_thread() -> None:
    """For worker threads (a ThreadPoolExecutor initializer, or a thread's first call)."""
    if threading.current_thread() is not threading.main_thread():
        signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)


@contextlib.contextmanager
def blocked_while_starting_threads() -> Iterator[None]:
    """Block the signals in the main thread while it starts threads that inherit its mask.

    A signal that arrives meanwhile stays pending and is handled as soon as this ends.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, SHUTDOWN_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
