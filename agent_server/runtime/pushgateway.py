"""Push the shutdown metrics once to a Prometheus Pushgateway, as the process's last word.

A stopped pod can no longer be scraped, so the scrape before it may miss how its shutdown
ended; the Pushgateway keeps that. The push runs after everything else (listener closed,
open responses finished) and must never delay the exit past the budget: it is waited for at
most `min(PUSH_TIMEOUT, time left before the watchdog less EXIT_RESERVE)`. The HTTP call
runs in a daemon thread, because urllib cannot be interrupted: when the bound passes the
thread is left to its own socket timeout (the same bound), and a daemon thread never holds
the interpreter's exit. The gateway's answer is judged by its status alone: no byte of its
body is read, and a redirect is not followed (urllib's would read the redirect's whole body
first). Failures are logged, never raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import push_to_gateway
from prometheus_client.registry import Collector

from agent_server.model.redaction import shown_url
from agent_server.runtime.signals import block_in_this_thread

logger = logging.getLogger("agent_server.pushgateway")

#: The longest a push may take, when the budget leaves more.
PUSH_TIMEOUT = 1.0
#: Kept free before the watchdog deadline for what follows the push: the interpreter's exit.
EXIT_RESERVE = 0.5
#: The Pushgateway `job`; the grouping key adds the agent's name and the instance (pod name).
#: Not "agent-server": that is the job of the pods' own scrapes (the ServiceMonitor's).
JOB = "agent-server-shutdown"


def push_bound(deadline: float, now: float | None = None) -> float:
    """Seconds the push may take before `deadline` (monotonic): 0 means do not push."""
    left = deadline - EXIT_RESERVE - (time.monotonic() if now is None else now)
    return max(0.0, min(PUSH_TIMEOUT, left))


def grouping_key(agent_name: str) -> dict[str, str]:
    """One group per agent and instance: each pod's last shutdown replaces only its own."""
    return {"agent": agent_name, "instance": socket.gethostname()}


async def push_shutdown(
    url: str | None, registry: Collector, agent_name: str, hard_end: float | None
) -> bool:
    """After a shutdown, push its metrics if `--pushgateway` is set, before the watchdog
    ends the process at `hard_end` (monotonic; None: no shutdown has begun)."""
    if url is None or hard_end is None:
        return False
    return await push_metrics(url, registry, grouping_key(agent_name), push_bound(hard_end))


async def push_metrics(url: str, registry: Collector, key: Mapping[str, str], bound: float) -> bool:
    """PUT `registry` to the Pushgateway at `url`; True when it answered with success.

    Returns within `bound` seconds whatever the gateway does.
    """
    where = _display(url)
    if bound <= 0:
        logger.warning("pushgateway %s: no time left before the watchdog; not pushing", where)
        return False
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[BaseException | None] = loop.create_future()

    def deliver(outcome: BaseException | None) -> None:
        if not answer.done():
            answer.set_result(outcome)

    def push() -> None:
        block_in_this_thread()
        outcome: BaseException | None = None
        try:
            push_to_gateway(
                url, JOB, registry, grouping_key=dict(key), timeout=bound, handler=_status_only
            )
        except Exception as exc:
            outcome = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(deliver, outcome)

    started = time.monotonic()
    threading.Thread(target=push, name="pushgateway", daemon=True).start()
    done, _ = await asyncio.wait({answer}, timeout=bound)
    elapsed = time.monotonic() - started
    if not done:
        answer.cancel()
        logger.warning(
            "pushgateway %s: no answer within %.2fs; exiting without waiting longer",
            where,
            bound,
        )
        return False
    error = answer.result()
    if error is not None:
        logger.warning(
            "pushgateway %s: push failed after %.2fs: %s: %s",
            where,
            elapsed,
            type(error).__name__,
            error,
        )
        return False
    logger.info("pushgateway %s: shutdown metrics pushed in %.3fs", where, elapsed)
    return True


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an error (HTTPError, its body unread), not a second request."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _status_only(
    url: str, method: str, timeout: float | None, headers: Sequence[tuple[str, str]], data: bytes
) -> Callable[[], None]:
    """prometheus_client's push `handler`: the request, its answer's body never read, an
    answer other than 2xx (a redirect too) closed and raised as OSError."""

    def handle() -> None:
        request = urllib.request.Request(url, data=data, method=method)
        for name, value in headers:
            request.add_header(name, value)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(request, timeout=timeout):
                pass
        except urllib.error.HTTPError as exc:  # it holds the answer open: close it now
            exc.close()
            raise OSError(f"the gateway answered {exc.code} {exc.reason}") from None

    return handle


def _display(url: str) -> str:
    """The URL as a log line may show it (agent_server/model/redaction.py)."""
    return shown_url(url if "://" in url else f"http://{url}")
