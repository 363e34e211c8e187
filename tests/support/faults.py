"""A seeded fault-injection harness in the spirit of Jepsen (docs/replicas.md).

The parts are real and on loopback: Redis with AOF (by default a primary and a replica under
three real `redis-sentinel`, else one `redis-server`: tests/support/fault_redis.py), small TCP
proxies between the replicas and Redis (so the link can be cut), three `agent-server run
tests_app:agent` replicas on one store behind haproxy. Client threads run a load through
haproxy with the project's `AgentClient` and with raw httpx (runs, starts, cancels, parked
asks of one and of two questions, delayed starts, starts under a concurrency limit, messages
enqueued in a session), and every HTTP exchange goes to a `History`. A nemesis, on a schedule
drawn from `random.Random(seed)`, kills, rolls and pauses replicas, pauses and restarts the
Redis primary, fails it over (`SENTINEL FAILOVER`, and SIGKILL of the primary), and cuts the
proxies, logging each action in the history.
Then everything is healed, the load stops, the system quiesces (bounded), every execution
ever named is read back through a live replica, and `check` (a pure function of the history,
the final records, the reasoners' own evidence files and the replicas' logs) returns the
violations of the invariants.

`run_faults(seed, seconds, directory)` is one run; tests/process/test_faults.py runs a short one in
CI, `python -m bench.faults` long ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from agent_server.client import (
    AgentClient,
    AgentServerError,
    Conflict,
    Execution,
    WaitTimeout,
)
from tests.apps.tests_app import (
    EVIDENCE_DIR_ENV,
    EVIDENCED_LIMIT_HEADER,
    EVIDENCED_STEPS_MAX_ATTEMPTS,
    REPLICA_ID_ENV,
    evidenced_answer,
    evidenced_reply,
)
from tests.support.fault_checks import (
    Evidence,
    Final,
    Violation,
    ask_answers,
    failed_unrun,
    interval_stops,
    limits,
    read_evidence,
    session_order,
)
from tests.support.fault_redis import (
    AofRedis,
    CutProxy,
    PlainRedis,
    RedisUnderTest,
    SentinelRedis,
    stable_port,
)
from tests.support.haproxy import Haproxy
from tests.support.process import APPS_DIR, ServerProcess

__all__ = ["AofRedis", "CutProxy", "stable_port"]

#: Seconds a replica's liveness lasts unrenewed: short, so pauses past it stay short.
LEASE_TTL = 2.0
#: The replicas' shutdown budget: drain 1.5 + cancel 1 + http 1 + margin 1 <= grace 5.
REPLICA_FLAGS = [
    "--grace-period",
    "5",
    "--drain-timeout",
    "1.5",
    "--cancel-timeout",
    "1",
    "--http-timeout",
    "1",
]
#: Bound on a rollout: SIGTERM to exit; past it the replica is killed (and counted so).
ROLLOUT_TIMEOUT = 10.0
#: Bound on a replica's (or all replicas') readiness after a start or a healed fault.
READY_TIMEOUT = 15.0
#: Bound on one client operation (a run, or a start and its wait), seconds.
OP_TIMEOUT = 20.0
#: Seconds a client retries one call through consecutive failures.
RETRY_FOR = 20.0
TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})
#: What no replica's log may hold.
LOG_ERRORS = re.compile(
    r"Traceback|Task exception was never retrieved|unobserved task error"
    r"|Exception in ASGI application"
)
REPLICAS = 3
#: The evidenced reasoners that are resumable (EVIDENCED_STEPS_MAX_ATTEMPTS attempts each).
RESUMABLE = frozenset({"evidenced_steps", "evidenced_asking", "evidenced_two_asks"})


def _log_nothing(message: str) -> None:
    del message


# -- the parts --------------------------------------------------------------------------------


class FaultReplica(ServerProcess):
    """`agent-server run tests_app:agent` on a fixed loopback port, on the proxied store."""

    def __init__(
        self, port: int, replica_id: str, store: str, marker_dir: Path, env: dict[str, str]
    ) -> None:
        self.fixed_port = port
        self.replica_id = replica_id
        args = [
            "tests_app:agent",
            "--store",
            store,
            "--replica-id",
            replica_id,
            "--lease-ttl",
            str(LEASE_TTL),
            *REPLICA_FLAGS,
        ]
        super().__init__(args, {**env, REPLICA_ID_ENV: replica_id}, marker_dir)

    def command(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "agent_server", "run", *args, "--port", str(self.fixed_port)]

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False


class FaultCluster:
    """Redis (AOF) <- proxy <- three replicas <- haproxy, all on loopback. `close` ends every
    process it started, whatever state the run left them in (paused ones included)."""

    def __init__(
        self, directory: Path, source: Path | None = None, *, sentinel: bool = True
    ) -> None:
        self.directory = directory
        self.redis: RedisUnderTest = SentinelRedis(directory) if sentinel else PlainRedis(directory)
        self.evidence_dir = directory / "evidence"
        self.evidence_dir.mkdir()
        self.env = {EVIDENCE_DIR_ENV: str(self.evidence_dir)}
        if source is not None:
            path = os.environ.get("PYTHONPATH")
            self.env["PYTHONPATH"] = str(source) + (os.pathsep + path if path else "")
        self.ports = [stable_port() for _ in range(REPLICAS)]
        self.kinds = fault_kinds(sentinel)
        self.replicas: list[FaultReplica] = []
        #: Every replica ever started, in order (their logs are checked).
        self.started: list[FaultReplica] = []
        self.haproxy: Haproxy | None = None
        self.incarnations = 0

    def server_module(self) -> str:
        """Which agent_server the replicas import (the path of its package)."""
        run = subprocess.run(
            [sys.executable, "-c", "import agent_server; print(agent_server.__file__)"],
            cwd=APPS_DIR,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return run.stdout.strip() or run.stderr.strip()

    def open(self) -> None:
        self.redis.open()
        self.replicas = [self.start(index) for index in range(REPLICAS)]
        for replica in self.replicas:
            replica.wait_ready(READY_TIMEOUT)
        haproxy_dir = self.directory / "haproxy"
        haproxy_dir.mkdir()
        self.haproxy = Haproxy(haproxy_dir, self.ports)
        self.haproxy.start()

    @property
    def url(self) -> str:
        assert self.haproxy is not None
        return self.haproxy.url

    def start(self, index: int) -> FaultReplica:
        self.incarnations += 1
        replica_id = f"r{index}-{self.incarnations}"
        marker_dir = self.directory / replica_id
        marker_dir.mkdir()
        replica = FaultReplica(self.ports[index], replica_id, self.redis.url, marker_dir, self.env)
        self.started.append(replica)
        return replica

    def replace(self, index: int) -> FaultReplica:
        """A fresh replica (a new id) on the port of `index`, once it is ready; one more try
        if the first fails to start."""
        for tries_left in (1, 0):
            fresh = self.start(index)
            self.replicas[index] = fresh
            try:
                fresh.wait_ready(READY_TIMEOUT)
                return fresh
            except AssertionError:
                fresh.close()
                if not tries_left:
                    raise
        raise AssertionError("unreachable")

    def wait_all_ready(self, timeout: float = READY_TIMEOUT) -> list[str]:
        """Wait (bounded) until every replica is ready; the ids of those that were not."""
        deadline = time.monotonic() + timeout
        waiting = list(self.replicas)
        while waiting and time.monotonic() < deadline:
            waiting = [replica for replica in waiting if not replica.ready()]
            if waiting:
                time.sleep(0.05)
        return [replica.replica_id for replica in waiting]

    def live_urls(self) -> list[str]:
        return [replica.url for replica in self.replicas if replica.proc.poll() is None]

    def close(self) -> None:
        for replica in self.started:
            if replica.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
            replica.close()
        if self.haproxy is not None:
            self.haproxy.stop()
        self.redis.close()


# -- the history ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One HTTP request and what came back (or the transport error instead)."""

    client: str
    op: str  # run, start, get, wait, cancel, other
    method: str
    path: str
    key: str | None  # the request's Idempotency-Key
    execution_id: str | None  # from the path or the answer's execution
    invoked: float
    answered: float
    status: int | None  # HTTP status; None: no answer (error says why)
    error: str | None = None
    body_status: str | None = None  # the execution's, when the answer is an execution
    attempt: int | None = None
    replica: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    text: str = ""  # the start of a body that is not an execution
    delay: float | None = None  # a start's `?delay=`
    session: str | None = None  # a start's X-Session-ID

    @property
    def is_execution(self) -> bool:
        return self.body_status is not None

    def describe(self) -> str:
        if self.status is None:
            outcome = f"no answer ({self.error})"
        elif self.is_execution:
            outcome = f"{self.status} {self.body_status}@{self.attempt} on {self.replica or '-'}"
            if self.error_type:
                outcome += f" [{self.error_type}: {(self.error_message or '')[:80]}]"
        else:
            outcome = f"{self.status} {self.text[:80]!r}"
        return (
            f"t={self.invoked:.3f}-{self.answered:.3f} {self.client} {self.method} {self.path}"
            f" -> {outcome}"
        )


@dataclass(frozen=True)
class Call:
    """One logical client operation (a run, a start and its wait, a cancel) and its outcome."""

    client: str
    op: str
    reasoner: str
    execution_id: str | None
    invoked: float
    answered: float
    outcome: str  # the execution's status, or the exception
    failed: bool = False  # the client raised something other than a wait timeout


@dataclass(frozen=True)
class NemesisEvent:
    time: float
    kind: str  # kill9, rollout, pause-replica, pause-redis, restart-redis, cut, start, heal
    target: str  # a replica id, "redis" or "proxy"
    phase: str  # begin, end, note
    detail: str = ""


@dataclass(frozen=True)
class Note:
    """Something the harness saw that is not an HTTP exchange (a replica not ready again)."""

    time: float
    kind: str
    detail: str


class History:
    """Every exchange, call and nemesis action of one run, on one clock (seconds from its
    start). Appended to from many threads."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        #: The wall clock at t=0, to place the replicas' log lines and records' times.
        self.wall0 = time.time()
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self.calls: list[Call] = []
        self.nemesis: list[NemesisEvent] = []
        self.notes: list[Note] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, item: Exchange | Call | NemesisEvent | Note) -> None:
        with self._lock:
            if isinstance(item, Exchange):
                self.exchanges.append(item)
            elif isinstance(item, Call):
                self.calls.append(item)
            elif isinstance(item, NemesisEvent):
                self.nemesis.append(item)
            else:
                self.notes.append(item)

    def nemesis_event(self, kind: str, target: str, phase: str, detail: str = "") -> None:
        self.add(NemesisEvent(self.now(), kind, target, phase, detail))

    def note(self, kind: str, detail: str) -> None:
        self.add(Note(self.now(), kind, detail))


_EXECUTION_PATH = re.compile(r"^/executions/([0-9a-f]{32})(/cancel|/input)?$")
_REASONER_PATH = re.compile(r"^/reasoners/([^/]+)(/async)?$")


def _op(method: str, path: str, params: httpx.QueryParams) -> tuple[str, str | None]:
    """The operation a request is, and the execution its path names."""
    found = _EXECUTION_PATH.match(path)
    if found is not None:
        if found.group(2):
            return found.group(2)[1:], found.group(1)
        return ("wait" if "wait" in params else "get"), found.group(1)
    found = _REASONER_PATH.match(path)
    if found is not None and method == "POST":
        return ("start" if found.group(2) else "run"), None
    return "other", None


class RecordingTransport(httpx.BaseTransport):
    """httpx's own transport, with every exchange written to the history."""

    def __init__(self, history: History, client: str) -> None:
        self._inner = httpx.HTTPTransport()
        self.history = history
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        op, execution_id = _op(request.method, request.url.path, request.url.params)
        base = {
            "client": self.client,
            "op": op,
            "method": request.method,
            "path": request.url.path,
            "key": request.headers.get("idempotency-key"),
            "invoked": self.history.now(),
            "delay": float(request.url.params["delay"]) if "delay" in request.url.params else None,
            "session": request.headers.get("x-session-id"),
        }
        try:
            response = self._inner.handle_request(request)
            response.read()
        except httpx.TransportError as exc:
            self.history.add(
                Exchange(
                    **base,
                    execution_id=execution_id,
                    answered=self.history.now(),
                    status=None,
                    error=type(exc).__name__,
                )
            )
            raise
        answered = self.history.now()
        body = _execution(response)
        if body is None:
            # A 503 + Location (an end not yet recorded, a fenced attempt) names its
            # execution without giving its status: it began then, and nothing was told.
            location = response.headers.get("location", "")
            if response.status_code == 503 and location.startswith("/executions/"):
                execution_id = location.rsplit("/", 1)[-1]
            self.history.add(
                Exchange(
                    **base,
                    execution_id=execution_id,
                    answered=answered,
                    status=response.status_code,
                    text=response.content[:300].decode(errors="replace"),
                )
            )
        else:
            error = body.get("error") or {}
            self.history.add(
                Exchange(
                    **base,
                    execution_id=str(body["execution_id"]),
                    answered=answered,
                    status=response.status_code,
                    body_status=str(body["status"]),
                    attempt=int(body.get("attempt") or 1),
                    replica=body.get("replica"),
                    error_type=error.get("type") if isinstance(error, dict) else None,
                    error_message=error.get("message") if isinstance(error, dict) else None,
                )
            )
        return response

    def close(self) -> None:
        self._inner.close()


def _execution(response: httpx.Response) -> dict[str, Any] | None:
    """The execution an answer carries, if it is one."""
    if "json" not in response.headers.get("content-type", ""):
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    if isinstance(body, dict) and "execution_id" in body and "status" in body:
        return body
    return None


# -- the clients ------------------------------------------------------------------------------

#: (operation, reasoner, weight): sync runs, background starts followed with `?wait=`,
#: background starts cancelled a moment later, starts that wait for input (parked on the
#: store) and are answered, by whichever replica haproxy picks, once or twice with a
#: checkpoint between, delayed starts (`?delay=`; raw clients only, the project's client
#: has no delay: theirs are plain starts), starts under a concurrency limit per `X-Tenant`
#: (some also in a session with `X-Session-Policy: enqueue`, which must not lift the limit),
#: and bursts of messages enqueued in one session (some delayed, some failing once and
#: retried), which must run one at a time in the order they were accepted. The limited and
#: session starts go raw from every client (the project's client sends no such headers).
OPERATIONS = (
    ("run", "evidenced", 3.0),
    ("run", "evidenced_steps", 1.5),
    ("start", "evidenced", 2.0),
    ("start", "evidenced_steps", 2.0),
    ("cancel", "evidenced", 1.0),
    ("cancel", "evidenced_steps", 0.5),
    ("ask", "evidenced_asking", 1.5),
    ("delayed", "evidenced", 1.0),
    ("ask", "evidenced_two_asks", 1.5),
    ("limited", "evidenced_limited", 1.5),
    ("session", "evidenced_session", 1.0),
)
#: The delays a delayed start asks for (seconds).
DELAYS = (0.2, 0.5, 1.0)
#: The `X-Tenant` values of the limited starts: few, so their limits are contended.
TENANTS = ("t0", "t1", "t2")
#: Limited starts a client makes at once for one tenant (the limit is EVIDENCED_LIMIT).
LIMITED_BURST = 4
#: How a session op's messages are enqueued.
ENQUEUE = {"X-Session-Policy": "enqueue"}


def _input(rng: random.Random, op: str, reasoner: str) -> dict[str, Any]:
    if reasoner == "evidenced_asking":
        return {"pause": rng.choice((0.05, 0.2, 0.5))}
    if reasoner == "evidenced_two_asks":
        return {"from_top": rng.random() < 0.5, "pause": rng.choice((0.05, 0.2))}
    if reasoner == "evidenced_limited":
        return {"tenant": rng.choice(TENANTS), "seconds": rng.choice((0.1, 0.3, 0.6))}
    if reasoner == "evidenced_session":
        return {"messages": rng.randint(3, 5)}
    if op == "delayed":
        return {"seconds": rng.choice((0.05, 0.2))}
    if reasoner == "evidenced":
        if op == "cancel":
            return {"seconds": round(rng.uniform(1.0, 3.0), 2)}
        return {
            "seconds": rng.choice((0.05, 0.2, 0.5, 1.0)),
            "fail": rng.random() < 0.15,
        }
    return {"count": rng.randint(3, 6), "pause": rng.choice((0.1, 0.2, 0.3))}


def _reply(execution: Execution) -> str:
    """The answer a client gives to the request `execution` waits on: derived from its id
    and, for `evidenced_two_asks`, from the question asked."""
    prompt = (execution.input_request or {}).get("prompt")
    if isinstance(prompt, dict) and prompt.get("question") in ("first", "second"):
        return evidenced_reply(str(prompt["question"]), execution.execution_id)
    return evidenced_answer(execution.execution_id)


class LoadClient(threading.Thread):
    """One client thread: a loop, bounded in count and time, of operations through haproxy,
    with the project's AgentClient (`kind="client"`) or raw httpx (`kind="raw"`, every start
    with its own Idempotency-Key, retried with it)."""

    def __init__(
        self,
        name: str,
        kind: str,
        url: str,
        history: History,
        seed: int,
        stop: threading.Event,
        until: float,
        max_ops: int = 5000,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.kind = kind
        self.url = url
        self.history = history
        self.rng = random.Random(f"{seed}:{name}")
        self.jitter = random.Random()
        self.stop = stop
        self.until = until
        self.max_ops = max_ops
        self.ops = 0
        #: The execution the last raw read returned.
        self._last: dict[str, Any] = {}

    def run(self) -> None:
        transport = RecordingTransport(self.history, self.name)
        try:
            with httpx.Client(base_url=self.url, transport=transport) as http:
                if self.kind == "client":
                    with AgentClient(
                        self.url,
                        timeout=10.0,
                        retry_for=RETRY_FOR,
                        transport=RecordingTransport(self.history, self.name),
                    ) as client:
                        self._loop(
                            lambda op, name, body: self._with_client(client, http, op, name, body)
                        )
                else:
                    self._loop(lambda op, name, body: self._raw(http, op, name, body))
        except Exception as exc:  # the loop catches per call: this is the harness failing
            self.history.note("client-crash", f"{self.name}: {exc!r}")

    def _loop(
        self, once: Callable[[str, str, dict[str, Any]], tuple[str | None, str, bool]]
    ) -> None:
        names = [(op, name) for op, name, _ in OPERATIONS]
        weights = [weight for _, _, weight in OPERATIONS]
        while not self.stop.is_set() and self.ops < self.max_ops and time.monotonic() < self.until:
            op, name = self.rng.choices(names, weights)[0]
            body = _input(self.rng, op, name)
            invoked = self.history.now()
            execution_id, outcome, failed = once(op, name, body)
            self.history.add(
                Call(
                    self.name, op, name, execution_id, invoked, self.history.now(), outcome, failed
                )
            )
            self.ops += 1
            time.sleep(self.rng.uniform(0.0, 0.1))

    # -- with the project's client

    def _with_client(
        self, client: AgentClient, http: httpx.Client, op: str, name: str, body: dict[str, Any]
    ) -> tuple[str | None, str, bool]:
        if op in ("limited", "session"):
            return self._raw(http, op, name, body)
        execution_id: str | None = None
        try:
            if op == "run":
                execution: Execution = client.run_execution(name, body, timeout=OP_TIMEOUT)
                return execution.execution_id, execution.status, False
            handle = client.start(name, body)
            execution_id = handle.execution_id
            if op == "ask":
                deadline = time.monotonic() + OP_TIMEOUT
                while True:
                    execution = handle.wait(timeout=max(0.1, deadline - time.monotonic()))
                    if execution.is_terminal:
                        return execution_id, execution.status, False
                    if time.monotonic() > deadline:
                        return execution_id, f"still {execution.status} at the deadline", False
                    with contextlib.suppress(Conflict):  # a retry that found its answer taken
                        # As a user writes it: the value only; the handle knows the request.
                        handle.respond(_reply(execution))
            if op == "cancel":
                time.sleep(self.rng.uniform(0.0, 0.6))
                client.cancel(execution_id)
            execution = handle.wait(timeout=OP_TIMEOUT)
            return execution_id, execution.status, False
        except WaitTimeout as exc:
            return execution_id, f"WaitTimeout: {exc}", False
        except AgentServerError as exc:
            return execution_id, f"{type(exc).__name__}: {exc}", True

    # -- raw httpx

    def _pause(self, response: httpx.Response | None, failures: int) -> None:
        hint = None if response is None else response.headers.get("retry-after")
        delay = min(1.0, float(hint)) if hint and hint.isdigit() else 0.05 * 2 ** min(failures, 4)
        time.sleep(delay * self.jitter.uniform(0.5, 1.0))

    def _raw(
        self, http: httpx.Client, op: str, name: str, body: dict[str, Any]
    ) -> tuple[str | None, str, bool]:
        deadline = time.monotonic() + OP_TIMEOUT
        if op == "session":
            return self._raw_session(http, name, int(body["messages"]), deadline)
        sync = op == "run"
        delay = self.rng.choice(DELAYS) if op == "delayed" else None
        if op == "limited":
            return self._raw_limited(http, name, body, deadline)
        started = self._raw_start(http, name, body, sync, deadline, delay)
        if started is None:
            return None, "no execution", True
        if isinstance(started, str):
            return None, started, True
        execution_id = str(started["execution_id"])
        if sync and started["status"] in TERMINAL:
            return execution_id, str(started["status"]), False
        if op == "cancel":
            time.sleep(self.rng.uniform(0.0, 0.6))
            self._raw_cancel(http, execution_id, deadline)
        while True:
            execution_id, last, failed = self._raw_wait(http, execution_id, deadline)
            if last != "input_required":
                return execution_id, last, failed
            self._raw_answer(http, execution_id, self._last, deadline)

    def _raw_limited(
        self, http: httpx.Client, name: str, body: dict[str, Any], deadline: float
    ) -> tuple[str | None, str, bool]:
        """A burst of LIMITED_BURST starts for one tenant, more than its limit, so they
        queue; some also in a session of their own with `X-Session-Policy: enqueue`, which
        must not lift the limit. Then each is waited for."""
        ids: list[str] = []
        for number in range(LIMITED_BURST):
            headers = {EVIDENCED_LIMIT_HEADER: str(body["tenant"])}
            if self.rng.random() < 0.3:
                headers.update(ENQUEUE, **{"X-Session-ID": f"{self.name}-l{self.ops}-{number}"})
            started = self._raw_start(http, name, body, False, deadline, None, headers)
            if isinstance(started, str) and started.startswith("400") and len(headers) > 1:
                continue  # the policy refused on a limited reasoner: nothing started
            if not isinstance(started, dict):
                return (ids or [None])[-1], f"start {number + 1}: {started}", True
            ids.append(str(started["execution_id"]))
        ends = [self._raw_wait(http, execution_id, deadline)[1] for execution_id in ids]
        return (ids or [None])[-1], " ".join(ends), False

    def _raw_session(
        self, http: httpx.Client, name: str, messages: int, deadline: float
    ) -> tuple[str | None, str, bool]:
        """`messages` starts in one new session, each enqueued once the one before was
        accepted (202), some delayed, some failing once (and retried); then each waited for."""
        headers = {**ENQUEUE, "X-Session-ID": f"{self.name}-s{self.ops}"}
        ids: list[str] = []
        for _ in range(messages):
            body = {"seconds": self.rng.choice((0.05, 0.2)), "fail_first": self.rng.random() < 0.2}
            delay = self.rng.choice((None, None, 0.3))
            started = self._raw_start(http, name, body, False, deadline, delay, headers)
            if not isinstance(started, dict):
                return (ids or [None])[-1], f"message {len(ids) + 1}: {started}", True
            ids.append(str(started["execution_id"]))
        ends = [self._raw_wait(http, execution_id, deadline)[1] for execution_id in ids]
        return ids[-1], " ".join(ends), False

    def _raw_start(
        self,
        http: httpx.Client,
        name: str,
        body: dict[str, Any],
        sync: bool,
        deadline: float,
        delay: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any] | str | None:
        """The execution a start answered (a sync run: its end, or the `queued` of a
        hand-off), an unexpected answer as text, or None past the deadline."""
        key = uuid.uuid4().hex
        path = f"/reasoners/{name}" if sync else f"/reasoners/{name}/async"
        if delay is not None:
            path += f"?delay={delay}"
        read = max(0.5, deadline - time.monotonic()) if sync else 10.0
        failures = 0
        while time.monotonic() < deadline:
            try:
                response = http.post(
                    path,
                    json=body,
                    headers={**(headers or {}), "Idempotency-Key": key},
                    timeout=httpx.Timeout(10.0, read=read),
                )
            except httpx.TransportError:
                failures += 1
                self._pause(None, failures)
                continue
            execution = _execution(response)
            if execution is not None:
                return execution
            if response.status_code in (429, 502, 503, 504):
                failures += 1
                self._pause(response, failures)
                continue
            return f"{response.status_code}: {response.text[:200]}"
        return None

    def _raw_cancel(self, http: httpx.Client, execution_id: str, deadline: float) -> None:
        self._raw_post(http, f"/executions/{execution_id}/cancel", None, deadline)

    def _raw_answer(
        self, http: httpx.Client, execution_id: str, waiting: dict[str, Any], deadline: float
    ) -> None:
        """Answer the request `waiting` (the execution as last read) names, naming it, so a
        retry whose first try was taken is 409, never the answer to the next request. A 409
        ends the tries: the wait that follows tells."""
        request = waiting.get("input_request") or {}
        body: dict[str, Any] = {"value": _reply(Execution.from_json(waiting))}
        if request.get("request_id") is not None:
            body["request_id"] = request["request_id"]
        self._raw_post(http, f"/executions/{execution_id}/input", body, deadline)

    def _raw_post(
        self, http: httpx.Client, path: str, body: dict[str, Any] | None, deadline: float
    ) -> None:
        """POST until an answer that is not a refusal, or the deadline."""
        failures = 0
        while time.monotonic() < deadline:
            try:
                response = http.post(path, json=body, timeout=10.0)
            except httpx.TransportError:
                failures += 1
                self._pause(None, failures)
                continue
            if response.status_code in (429, 502, 503, 504) and _execution(response) is None:
                failures += 1
                self._pause(response, failures)
                continue
            return

    def _raw_wait(
        self, http: httpx.Client, execution_id: str, deadline: float
    ) -> tuple[str | None, str, bool]:
        failures = 0
        last = "unknown"
        while time.monotonic() < deadline:
            wait = max(0.0, min(5.0, deadline - time.monotonic()))
            try:
                response = http.get(
                    f"/executions/{execution_id}",
                    params={"wait": f"{wait:.1f}"},
                    timeout=httpx.Timeout(10.0, read=wait + 10.0),
                )
            except httpx.TransportError:
                failures += 1
                self._pause(None, failures)
                continue
            execution = _execution(response)
            if execution is None:
                # 503 is a refusal; anything else (a 500 text/plain, a 404) is recorded in
                # the history, and reading again is safe.
                failures += 1
                self._pause(response, failures)
                last = f"{response.status_code}"
                continue
            failures = 0
            last = str(execution["status"])
            self._last = execution
            if last in TERMINAL or last == "input_required":
                return execution_id, last, False
        return execution_id, f"still {last} at the deadline", False


# -- the nemesis ------------------------------------------------------------------------------

REPLICA_KINDS = ("kill9", "rollout", "pause-replica")
#: Every kind of fault, with Sentinel; one Redis has no failover (PlainRedis.kinds).
FAULT_KINDS = (*REPLICA_KINDS, *SentinelRedis.kinds)


def fault_kinds(sentinel: bool) -> tuple[str, ...]:
    return (*REPLICA_KINDS, *(SentinelRedis if sentinel else PlainRedis).kinds)


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int  # the replica's index, for the replica faults
    seconds: float  # how long a pause or a cut lasts
    mode: str  # a cut's: refuse or reset
    gap: float  # seconds of calm before it


def schedule(seed: int, kinds_of_faults: tuple[str, ...] = FAULT_KINDS) -> Iterator[Fault]:
    """The seeded faults, without end: rounds of the kinds, each round in its own seeded
    order, so every kind comes once in every round."""
    rng = random.Random(seed)
    while True:
        kinds = list(kinds_of_faults)
        rng.shuffle(kinds)
        for kind in kinds:
            target = rng.randrange(REPLICAS)
            if kind == "pause-replica":
                seconds = rng.uniform(1.3, 2.2) * LEASE_TTL  # past the lease
            elif kind == "pause-redis":
                seconds = rng.uniform(1.0, 4.0)
            elif kind == "cut":
                seconds = rng.uniform(1.0, 3.0)
            else:
                seconds = 0.0
            yield Fault(
                kind, target, seconds, rng.choice(("refuse", "reset")), rng.uniform(1.5, 3.5)
            )


class Nemesis:
    """Runs the faults one at a time; each is healed (and every replica ready again, bounded)
    before the calm that precedes the next. It stops once `seconds` have passed and every
    kind has come (a round can outlast a short schedule: a failover waits for the sentinels
    to make the deposed primary a replica again)."""

    def __init__(self, cluster: FaultCluster, history: History, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.history = history
        self.log = log
        self.counts: Counter[str] = Counter()

    def run(self, seed: int, seconds: float) -> None:
        until = time.monotonic() + seconds
        for number, fault in enumerate(schedule(seed, self.cluster.kinds)):
            calm_until = time.monotonic() + fault.gap
            if calm_until >= until and number >= len(self.cluster.kinds):
                break  # past its time, once every kind has come
            time.sleep(fault.gap)  # pacing of the schedule, not a synchronisation
            self.apply(fault)
            self.counts[fault.kind] += 1
            unready = self.cluster.wait_all_ready()
            if unready:
                self.history.note(
                    "unready", f"{', '.join(unready)} not ready {READY_TIMEOUT:g}s after {fault}"
                )

    def apply(self, fault: Fault) -> None:
        cluster, event = self.cluster, self.history.nemesis_event
        self.log(f"nemesis: {fault.kind} {fault}")
        if fault.kind in ("kill9", "rollout", "pause-replica"):
            replica = cluster.replicas[fault.target]
            if replica.proc.poll() is not None:  # it died of itself: that is worth a look
                self.history.note(
                    "exited", f"{replica.replica_id} exited {replica.proc.returncode} unasked"
                )
                replica.close()
                self._replace(fault.target)
                return
            rid = replica.replica_id
            if fault.kind == "kill9":
                event("kill9", rid, "begin")
                replica.proc.kill()
                replica.proc.wait(timeout=10)
                event("kill9", rid, "end", f"exit {replica.proc.returncode}")
                replica.close()
                self._replace(fault.target)
            elif fault.kind == "rollout":
                event("rollout", rid, "begin")
                replica.signal(signal.SIGTERM)
                try:
                    code = replica.proc.wait(timeout=ROLLOUT_TIMEOUT)
                    event("rollout", rid, "end", f"exit {code}")
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait(timeout=10)
                    event("rollout", rid, "end", "forced: killed after the rollout bound")
                replica.close()
                self._replace(fault.target)
            else:
                event("pause-replica", rid, "begin", f"{fault.seconds:.2f}s")
                os.kill(replica.proc.pid, signal.SIGSTOP)
                try:
                    time.sleep(fault.seconds)
                finally:
                    os.kill(replica.proc.pid, signal.SIGCONT)
                event("pause-replica", rid, "end")
        elif fault.kind == "pause-redis":
            primary = cluster.redis.primary()
            event("pause-redis", "redis", "begin", f":{primary.port} {fault.seconds:.2f}s")
            primary.send(signal.SIGSTOP)
            try:
                time.sleep(fault.seconds)
            finally:
                primary.send(signal.SIGCONT)
            event("pause-redis", "redis", "end")
        elif fault.kind == "restart-redis":
            event("restart-redis", "redis", "begin")
            event("restart-redis", "redis", "end", cluster.redis.restart_primary())
        elif fault.kind == "cut":
            event("cut", "proxy", "begin", f"{fault.mode} {fault.seconds:.2f}s")
            cluster.redis.cut(fault.mode)
            try:
                time.sleep(fault.seconds)
            finally:
                cluster.redis.restore()
            event("cut", "proxy", "end")
        elif fault.kind in ("failover", "kill-primary") and isinstance(
            cluster.redis, SentinelRedis
        ):
            event(fault.kind, "redis", "begin")
            if fault.kind == "failover":
                detail = cluster.redis.failover()
            else:
                detail = cluster.redis.kill_primary()
            # The fault is over once a replica is in sync again (a told write needs one):
            # a failover the sentinels aborted can leave its chosen replica a primary alone.
            detail += f"; {cluster.redis.settle() or 'settled'}"
            event(fault.kind, "redis", "end", detail)
        else:
            raise AssertionError(f"unknown fault {fault.kind}")

    def _replace(self, index: int) -> None:
        try:
            fresh = self.cluster.replace(index)
        except AssertionError as exc:
            self.history.note("start-failed", f"replica {index}: {exc}"[:2000])
            return
        self.history.nemesis_event("start", fresh.replica_id, "note", f"index {index}")

    def heal(self) -> None:
        """Everything back: Redis running and not paused, the proxy open, every replica
        running and not paused, and ready."""
        cluster = self.cluster
        unsettled = cluster.redis.heal()
        if unsettled:
            self.history.note("redis-unsettled", f"at the heal: {unsettled}")
        for index, replica in enumerate(cluster.replicas):
            if replica.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
            else:
                self.history.note(
                    "exited", f"{replica.replica_id} exited {replica.proc.returncode}"
                )
                self._replace(index)
        self.history.nemesis_event("heal", "all", "note")
        unready = cluster.wait_all_ready()
        if unready:
            self.history.note("unready", f"{', '.join(unready)} not ready after the heal")


# -- the store's final state, the evidence, the logs -----------------------------------------


def read_record(urls: list[str], execution_id: str, timeout: float = 10.0) -> Final:
    """GET /executions/{id} from the live replicas in turn, through refusals (bounded)."""
    deadline = time.monotonic() + timeout
    status: int | None = None
    turn = 0
    while True:
        url = urls[turn % len(urls)]
        turn += 1
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", timeout=5.0)
            status = response.status_code
            body = _execution(response)
            if body is not None or status == 404:
                return Final(status, body)
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return Final(status, None)
        time.sleep(0.1)


def quiesce(
    urls: list[str], ids: set[str], timeout: float, log: Callable[[str], None]
) -> dict[str, Final]:
    """Read every execution until each is terminal, or `timeout` has passed; the last reads."""
    final: dict[str, Final] = {}
    pending = sorted(ids)
    deadline = time.monotonic() + timeout
    while True:
        for execution_id in pending:
            final[execution_id] = read_record(urls, execution_id)
        pending = [
            i for i in pending if final[i].body is not None and final[i].state not in TERMINAL
        ]
        if not pending or time.monotonic() > deadline:
            break
        log(f"quiesce: {len(pending)} executions not terminal yet")
        time.sleep(0.5)
    return final


def read_logs(replicas: list[FaultReplica]) -> dict[str, str]:
    logs: dict[str, str] = {}
    for replica in replicas:
        try:
            logs[replica.replica_id] = replica.stderr_path.read_text(errors="replace")
        except OSError as exc:
            logs[replica.replica_id] = f"(log unreadable: {exc})"
    return logs


# -- the checker ------------------------------------------------------------------------------

INVARIANTS = {
    "told-means-final": "1. a terminal status a client was told is the final one",
    "living-judged": "2. no execution lost or retried while its owner lived",
    "accepted-vanished": "3/7. accepted never vanishes: every execution answered (200, 202,"
    " ...) is readable at the end (no 404 on any read) and ends visibly (terminal)",
    "accepted-runs": "3. an accepted execution that succeeded ran; a resumable one is lost only"
    " with no attempt left",
    "one-per-key": "4. one execution per idempotency key",
    "runs-once": "5. a non-resumable body never runs twice",
    "steps": "6. a resumable loses no step, repeats at most one per extra attempt",
    "log-errors": "8. no traceback or unobserved task error in a replica's log",
    "failed-by-server": "an execution failed with an error its reasoner never raises (a store"
    " error: a transient refusal that failed it instead of being retried)",
    "answers": "9. every answer is one the API documents; no client call gives up",
    "answer-taken": "10. an execution waiting for input returns the answer it was given, and"
    " none times out once an answer was accepted (202)",
    "delayed": "11. a delayed start's body never runs before its delay has passed",
    "failed-unrun": "12. accepted work is never failed unrun: a failed execution's failing"
    " attempt began its body",
    "ask-answer": "13. an ask never returns another question's answer",
    "limit": "14. a concurrency limit is never exceeded (bodies of one key at once)",
    "session-order": "15. a session's enqueued messages run one at a time, in the order they"
    " were accepted",
    "harness": "the harness itself: a replica that would not start or be ready again",
}


@dataclass
class _Faulted:
    """When each replica id was killed, paused or rolled (end times of those actions)."""

    killed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    paused: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rolled: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rollouts: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, events: list[NemesisEvent]) -> _Faulted:
        faulted = cls()
        for event in events:
            if event.phase != "end":
                continue
            if event.kind == "kill9":
                faulted.killed[event.target].append(event.time)
            elif event.kind == "pause-replica":
                faulted.paused[event.target].append(event.time)
            elif event.kind == "rollout":
                faulted.rollouts[event.target].append((event.time, event.detail))
                if event.detail.startswith("forced"):
                    faulted.killed[event.target].append(event.time)
                else:
                    faulted.rolled[event.target].append(event.time)
        return faulted

    def may_be_judged(self, replica: str, since: float) -> bool:
        """Killed or paused past its lease after `since`: its running work may read lost."""
        return any(
            t >= since for t in (*self.killed.get(replica, ()), *self.paused.get(replica, ()))
        )

    def may_hand_off(self, replica: str, since: float) -> bool:
        """Killed, paused or rolled after `since`: its attempt may be followed by another."""
        return self.may_be_judged(replica, since) or any(
            t >= since for t in self.rolled.get(replica, ())
        )


#: The head of a log record (the text format): time, level, logger.
_LOG_HEAD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
#: A reasoner's own failure, logged with its traceback by design: its record is judged.
_REASONER_FAILED = re.compile(
    r" agent_server\.(?:runtime\.)?registry: execution [0-9a-f]{32} \(\S+\) failed$"
)
#: The line of a traceback that names the exception.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Group)\b")


def log_errors(replica: str, text: str) -> list[Violation]:
    """Log records of one replica that hold a traceback, an exception never retrieved or an
    unobserved task error, grouped by their head and last exception line. A reasoner's own
    failure (logged with its traceback, by design) is left to the check of its record."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if _LOG_HEAD.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    found: Counter[str] = Counter()
    sample: dict[str, list[str]] = {}
    for record in records:
        if not any(LOG_ERRORS.search(line) for line in record):
            continue
        if _REASONER_FAILED.search(record[0]):
            continue
        head = _LOG_HEAD.sub("", record[0])
        head = re.sub(r"[0-9a-f]{32}", "<id>", head)[:160]
        last = next((line for line in reversed(record) if _EXCEPTION_LINE.match(line)), "")
        last = re.sub(r"0x[0-9a-f]+", "0x...", last)  # addresses differ, the error is one
        summary = f"{head} ... {last[:200]}" if last else head
        found[summary] += 1
        # The head and the innermost frames: where it was raised, and what.
        shown = record if len(record) <= 12 else [*record[:2], "  ...", *record[-10:]]
        sample.setdefault(summary, shown)
    return [
        Violation(
            "log-errors",
            None,
            f"{replica}: {n}x {summary}\n      " + "\n      ".join(sample[summary]),
        )
        for summary, n in found.items()
    ]


_OWNER = re.compile(r"replica (\S+)")


@dataclass
class _Index:
    """The history arranged for the checks: answers by execution and by key, when each
    execution may have begun, which replicas were faulted when."""

    exchanges: list[Exchange]
    by_id: dict[str, list[Exchange]]
    by_key: dict[str, list[Exchange]]
    first: dict[str, float]
    reasoner_of: dict[str, str]
    faulted: _Faulted

    @classmethod
    def of(cls, history: History) -> _Index:
        exchanges = sorted(history.exchanges, key=lambda e: e.invoked)
        by_id: dict[str, list[Exchange]] = defaultdict(list)
        by_key: dict[str, list[Exchange]] = defaultdict(list)
        reasoner_of: dict[str, str] = {}
        for exchange in exchanges:
            if exchange.execution_id is not None:
                by_id[exchange.execution_id].append(exchange)
                found = _REASONER_PATH.match(exchange.path)
                if found is not None:
                    reasoner_of[exchange.execution_id] = found.group(1)
            if exchange.key is not None:
                by_key[exchange.key].append(exchange)
        # An execution may have begun with the first request of its key (whose answer may
        # have been lost), or the first naming it.
        first = {i: min(e.invoked for e in seen) for i, seen in by_id.items()}
        for seen in by_key.values():
            began = min(e.invoked for e in seen)
            for e in seen:
                if e.is_execution and e.execution_id is not None:
                    first[e.execution_id] = min(first[e.execution_id], began)
        return cls(exchanges, by_id, by_key, first, reasoner_of, _Faulted.of(history.nemesis))

    def sessions(self) -> dict[str, list[tuple[float, str]]]:
        """Per session of `evidenced_session`, when each start was answered with its
        execution, and its id."""
        found: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for e in self.exchanges:
            if (
                e.session is not None
                and e.is_execution
                and e.execution_id is not None
                and e.path.startswith("/reasoners/evidenced_session")
            ):
                found[e.session].append((e.answered, e.execution_id))
        return found

    def accepted(self) -> list[str]:
        """Every execution some answer carried (202, 200, 500, 409, 503 with its body)."""
        return sorted(i for i, seen in self.by_id.items() if any(e.is_execution for e in seen))

    def timeline(self, execution_id: str, limit: int = 12) -> str:
        seen = self.by_id.get(execution_id, [])
        shown = [e.describe() for e in seen[:limit]]
        if len(seen) > limit:
            shown.append(f"... {len(seen) - limit} more")
        return "\n      " + "\n      ".join(shown)


def _attempt(record: Final) -> int:
    return int((record.body or {}).get("attempt") or 1)


def _told_means_final(index: _Index, final: Mapping[str, Final]) -> Iterator[Violation]:
    """1. Every terminal status (and attempt) a client was told is the final record's, and
    no answer to a request sent after the first such answer says otherwise."""
    for execution_id, seen in index.by_id.items():
        told = [e for e in seen if e.is_execution and e.body_status in TERMINAL]
        if not told:
            continue
        record = final.get(execution_id)
        if record is not None and record.body is not None:
            wrong = [
                e for e in told if (e.body_status, e.attempt) != (record.state, _attempt(record))
            ]
            if wrong:
                yield Violation(
                    "told-means-final",
                    execution_id,
                    f"told {wrong[0].body_status}@{wrong[0].attempt}, final record "
                    f"{record.state}@{_attempt(record)} on {record.body.get('replica') or '-'}"
                    + index.timeline(execution_id),
                )
                continue
        first_told = min(told, key=lambda e: e.answered)
        later = [
            e
            for e in seen
            if e.is_execution
            and e.invoked > first_told.answered
            and (e.body_status, e.attempt) != (first_told.body_status, first_told.attempt)
        ]
        if later:
            yield Violation(
                "told-means-final",
                execution_id,
                f"told {first_told.body_status}@{first_told.attempt} at "
                f"t={first_told.answered:.3f}, then {later[0].describe()}",
            )


def _accepted_runs(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """3. Every accepted execution is readable at the end and terminal after quiescence (7:
    accepted never vanishes), and ran if it succeeded; a resumable one is lost only with no
    attempt left. Also: nothing fails with an error its reasoner never raises (a store error
    that was not retried)."""
    for execution_id in index.accepted():
        record = final.get(execution_id)
        if record is None or record.body is None:
            yield Violation(
                "accepted-vanished",
                execution_id,
                f"final read: {record.state if record else 'never read'}"
                + index.timeline(execution_id),
            )
            continue
        body = record.body
        reasoner = body.get("reasoner") or index.reasoner_of.get(execution_id)
        if record.state not in TERMINAL:
            yield Violation(
                "accepted-vanished",
                execution_id,
                f"{reasoner} still {record.state}@{_attempt(record)} on "
                f"{body.get('replica') or '-'} after quiescence" + index.timeline(execution_id),
            )
        if record.state == "succeeded" and not evidence.get(execution_id):
            yield Violation(
                "accepted-runs",
                execution_id,
                f"{reasoner} ended {record.state} but its body never ran",
            )
        error = body.get("error") or {}
        if record.state == "failed" and error.get("type") != "ValueError":
            yield Violation(
                "failed-by-server",
                execution_id,
                f"{reasoner} failed@{_attempt(record)} on {body.get('replica')}: "
                f"{error.get('type')}: {str(error.get('message'))[:200]}",
            )
        if (
            reasoner in RESUMABLE
            and record.state == "lost"
            and _attempt(record) < EVIDENCED_STEPS_MAX_ATTEMPTS
        ):
            yield Violation(
                "accepted-runs",
                execution_id,
                f"resumable, lost at attempt {_attempt(record)} of "
                f"{EVIDENCED_STEPS_MAX_ATTEMPTS}: {error.get('message')}",
            )


def _living_judged(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """2. An execution reads lost only if its owner was killed or paused past its lease
    after the execution began; a next attempt follows one only if the replica that ran it
    was killed, paused or rolled after the execution began."""
    faulted = index.faulted
    for execution_id in index.accepted():
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        since = index.first.get(execution_id, 0.0)
        if record.state == "lost":
            message = str((record.body.get("error") or {}).get("message", ""))
            named = _OWNER.search(message)
            owner = named.group(1) if named else str(record.body.get("replica") or "")
            if not faulted.may_be_judged(owner, since):
                rolled = [
                    f"t={t:.3f} ({how})" for t, how in faulted.rollouts.get(owner, ()) if t >= since
                ]
                yield Violation(
                    "living-judged",
                    execution_id,
                    f"lost ({message}) though {owner} was never killed or paused after it "
                    f"began (t={since:.3f})"
                    + (f"; {owner} was rolled at {', '.join(rolled)}" if rolled else "")
                    + index.timeline(execution_id),
                )
        lines = evidence.get(execution_id, [])
        attempts = max([_attempt(record), *(e.attempt for e in lines)])
        for attempt in range(1, attempts):
            kinds = {e.kind for e in lines if e.attempt == attempt}
            if "asked" in kinds and "answered" not in kinds:
                continue  # it parked waiting for input: the answer queued the next attempt
            if "end" in kinds and record.reasoner == "evidenced_session":
                continue  # its body failed (on purpose): its retry policy queued the next
            for replica in sorted({e.replica for e in lines if e.attempt == attempt}):
                if not faulted.may_hand_off(replica, since):
                    yield Violation(
                        "living-judged",
                        execution_id,
                        f"attempt {attempt} ran on {replica}, never killed, paused or rolled "
                        f"after it began (t={since:.3f}), yet attempt {attempt + 1} followed "
                        f"(final {record.state}@{_attempt(record)})",
                    )


def _one_per_key(index: _Index) -> Iterator[Violation]:
    """4. Every answer to one Idempotency-Key names the same execution."""
    for key, seen in index.by_key.items():
        named = sorted({e.execution_id for e in seen if e.is_execution and e.execution_id})
        if len(named) > 1:
            yield Violation(
                "one-per-key", None, f"key {key} answered {len(named)} executions: {named}"
            )


def _evidence(
    final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """5. A non-resumable body runs at most once per execution. 6. A succeeded resumable
    one ran every step; steps repeat at most once per extra attempt."""
    for execution_id, lines in sorted(evidence.items()):
        runs = [e for e in lines if e.kind == "run"]
        starts = Counter(e.attempt for e in lines if e.kind == "start")
        if len(runs) > 1 or any(n > 1 for n in starts.values()):
            runs += [e for e in lines if e.kind == "start"]
            yield Violation(
                "runs-once",
                execution_id,
                f"body ran {len(runs)} times: "
                + "; ".join(f"attempt {e.attempt} on {e.replica} pid {e.pid}" for e in runs),
            )
        steps = [e for e in lines if e.kind == "step"]
        if not steps:
            continue
        record = final.get(execution_id)
        state = record.state if record is not None else "never read"
        attempt = _attempt(record) if record is not None else 1
        attempts = max(attempt, *(e.attempt for e in steps))
        done = Counter(e.step for e in steps)
        missing = sorted(set(range(steps[0].count or 0)) - set(done))
        if state == "succeeded" and missing:
            yield Violation(
                "steps", execution_id, f"succeeded@{attempt} without running steps {missing}"
            )
        repeats = sum(n - 1 for n in done.values())
        if repeats > attempts - 1:
            yield Violation(
                "steps",
                execution_id,
                f"{repeats} steps repeated over {attempts} attempts: "
                + ", ".join(f"{e.step}@{e.attempt} on {e.replica}" for e in steps),
            )


def _refused_policy(exchange: Exchange) -> bool:
    """A 400 to a limited start that carried a session policy: a server may refuse the
    policy on a limited reasoner (it starts nothing) rather than keep both."""
    return (
        exchange.status == 400
        and exchange.session is not None
        and exchange.path.startswith("/reasoners/evidenced_limited")
    )


def _answers(index: _Index, calls: list[Call]) -> Iterator[Violation]:
    """7. No 404 for an execution (the test deletes none). 9. Every answer is one the API
    documents (an execution with 200, 202, 409, 500 or 503; a refusal: 429, 502, 503, 504),
    and no client call gives up or raises."""
    missing: dict[str, list[Exchange]] = defaultdict(list)
    for exchange in index.exchanges:
        status = exchange.status
        if status is None:  # no answer: the client retried (the history has it)
            continue
        if status == 404 and exchange.execution_id is not None:
            missing[exchange.execution_id].append(exchange)
            continue
        if exchange.is_execution and status in (200, 202, 409, 500, 503):
            continue
        if not exchange.is_execution and status in (429, 502, 503, 504):
            continue
        if exchange.op == "input" and status == 409:  # its answer taken by an earlier try
            continue
        if _refused_policy(exchange):
            continue
        yield Violation("answers", exchange.execution_id, exchange.describe())
    for execution_id, seen in missing.items():
        more = f" (and {len(seen) - 1} more 404s)" if len(seen) > 1 else ""
        yield Violation("accepted-vanished", execution_id, seen[0].describe() + more)
    for call in calls:
        if call.failed:
            yield Violation(
                "answers",
                call.execution_id,
                f"{call.client} {call.op} {call.reasoner} at t={call.invoked:.3f}: "
                f"{call.outcome[:300]}",
            )


def _answer_taken(index: _Index, final: Mapping[str, Final]) -> Iterator[Violation]:
    """10. A succeeded `evidenced_asking` returns the answer its clients sent (derived from
    its id); one whose answer was accepted (a 202 to its input) never times out waiting."""
    for execution_id, seen in index.by_id.items():
        if index.reasoner_of.get(execution_id) != "evidenced_asking":
            continue
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        body = record.body
        if record.state == "succeeded" and body.get("result") != {
            "answer": evidenced_answer(execution_id)
        }:
            yield Violation("answer-taken", execution_id, f"succeeded with {body.get('result')!r}")
        accepted = [e for e in seen if e.op == "input" and e.status == 202]
        message = str((body.get("error") or {}).get("message", ""))
        if record.state == "failed" and accepted and "no answer in time" in message:
            yield Violation(
                "answer-taken",
                execution_id,
                f"timed out though its answer was accepted at t={accepted[0].answered:.3f}"
                + index.timeline(execution_id),
            )


def _delayed(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """11. No run of a delayed start's body before its creation plus the delay (the
    evidence and the record's time are this machine's clock; 50 ms of rounding allowed)."""
    delays: dict[str, float] = {}
    for key_seen in index.by_key.values():
        asked = [e.delay for e in key_seen if e.delay is not None]
        for e in key_seen:
            if asked and e.execution_id is not None:
                delays[e.execution_id] = max(asked)
    for execution_id, delay in delays.items():
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        created = datetime.fromisoformat(str(record.body["created_at"])).timestamp()
        for line in evidence.get(execution_id, []):
            if line.at < created + delay - 0.05:
                yield Violation(
                    "delayed",
                    execution_id,
                    f"ran {line.at - created:.3f}s after its creation, delayed {delay}s",
                )


def check(
    history: History,
    final: Mapping[str, Final],
    evidence: Mapping[str, list[Evidence]],
    logs: Mapping[str, str],
) -> list[Violation]:
    """The violations of the invariants (INVARIANTS) in one run: a pure function of the
    history, the final records, the reasoners' evidence and the replicas' logs."""
    index = _Index.of(history)
    stops = interval_stops(history.nemesis, history.wall0)
    violations = [
        *_told_means_final(index, final),
        *_living_judged(index, final, evidence),
        *_accepted_runs(index, final, evidence),
        *_one_per_key(index),
        *_evidence(final, evidence),
        *_answers(index, history.calls),
        *_answer_taken(index, final),
        *_delayed(index, final, evidence),
        *failed_unrun(final, evidence),
        *ask_answers(final, evidence),
        *limits(final, evidence, stops),
        *session_order(index.sessions(), final, evidence, stops),
    ]
    for replica, text in logs.items():
        violations.extend(log_errors(replica, text))
    violations.extend(
        Violation("harness", None, f"t={note.time:.3f} {note.kind}: {note.detail[:600]}")
        for note in history.notes
    )
    return violations


# -- one run ----------------------------------------------------------------------------------


@dataclass
class FaultRun:
    seed: int
    seconds: float
    server: str  # which agent_server the replicas ran
    calls: int
    exchanges: int
    executions: int
    faults: Counter[str]
    kinds: tuple[str, ...]
    violations: list[Violation]
    outcomes: Counter[str]
    reasoners: Counter[str]  # the executions of each reasoner
    elapsed: float

    def by_invariant(self) -> Counter[str]:
        return Counter(v.invariant for v in self.violations)

    def summary(self) -> str:
        faults = " ".join(f"{kind}={self.faults.get(kind, 0)}" for kind in self.kinds)
        broken = " ".join(f"{k}={n}" for k, n in sorted(self.by_invariant().items())) or "none"
        return (
            f"seed {self.seed}: {self.seconds:g}s of faults, {self.elapsed:.0f}s in all; "
            f"{self.calls} calls, {self.exchanges} HTTP exchanges, {self.executions} "
            f"executions; faults: {faults}; violations: {len(self.violations)} ({broken})"
        )

    def report(self, limit: int = 8) -> str:
        """The seed, the counts and the violations (at most `limit` of each invariant)."""
        lines = [self.summary(), f"server: {self.server}"]
        shown: Counter[str] = Counter()
        for violation in self.violations:
            shown[violation.invariant] += 1
            if shown[violation.invariant] <= limit:
                lines.append(f"  {violation}")
        for invariant, count in sorted(shown.items()):
            if count > limit:
                lines.append(f"  [{invariant}] ... {count - limit} more")
        return "\n".join(lines)


def write_history(history: History, final: Mapping[str, Final], path: Path) -> None:
    """The whole history and the final records, one JSON object a line, for a post-mortem."""
    with path.open("w") as out:
        out.write(json.dumps({"type": "start", "wall_clock": history.wall0}) + "\n")
        for kind, items in (
            ("nemesis", history.nemesis),
            ("note", history.notes),
            ("exchange", history.exchanges),
            ("call", history.calls),
        ):
            for item in items:
                out.write(json.dumps({"type": kind, **asdict(item)}) + "\n")
        for execution_id, record in sorted(final.items()):
            line = {"type": "final", "execution_id": execution_id, **asdict(record)}
            out.write(json.dumps(line) + "\n")


def run_faults(
    seed: int,
    seconds: float,
    directory: Path,
    *,
    clients: int = 6,
    source: Path | None = None,
    sentinel: bool = True,
    log: Callable[[str], None] = _log_nothing,
) -> FaultRun:
    """One run: start the parts, load and faults for `seconds`, heal, stop the load,
    quiesce, read back, check. Every process it started is ended, whatever happens.
    `sentinel`: Redis is a primary and a replica under Sentinel (else one redis-server)."""
    began = time.monotonic()
    history = History()
    cluster = FaultCluster(directory, source, sentinel=sentinel)
    stop = threading.Event()
    threads: list[LoadClient] = []
    try:
        server = cluster.server_module()
        log(f"seed {seed}: replicas import {server}")
        cluster.open()
        nemesis = Nemesis(cluster, history, log)
        until = time.monotonic() + seconds + OP_TIMEOUT + 30
        threads = [
            LoadClient(
                f"{'client' if n % 2 == 0 else 'raw'}{n}",
                "client" if n % 2 == 0 else "raw",
                cluster.url,
                history,
                seed,
                stop,
                until,
            )
            for n in range(clients)
        ]
        for thread in threads:
            thread.start()
        nemesis.run(seed, seconds)
        log("nemesis done: healing")
        nemesis.heal()
        stop.set()
        joined_by = time.monotonic() + OP_TIMEOUT + RETRY_FOR + 10
        for thread in threads:
            thread.join(timeout=max(0.0, joined_by - time.monotonic()))
            if thread.is_alive():
                history.note("client-stuck", f"{thread.name} still running after its bound")
        ids = {e.execution_id for e in history.exchanges if e.execution_id is not None}
        log(f"load stopped: {len(ids)} executions; quiescing")
        final = quiesce(cluster.live_urls(), ids, 3 * LEASE_TTL + 15, log)
        evidence = read_evidence(cluster.evidence_dir)
        logs = read_logs(cluster.started)
        violations = check(history, final, evidence, logs)
        write_history(history, final, directory / "history.jsonl")
        return FaultRun(
            seed=seed,
            seconds=seconds,
            server=server,
            calls=len(history.calls),
            exchanges=len(history.exchanges),
            executions=len(ids),
            faults=nemesis.counts,
            kinds=cluster.kinds,
            violations=violations,
            outcomes=Counter(f.state for f in final.values()),
            reasoners=Counter(f.reasoner or "-" for f in final.values()),
            elapsed=time.monotonic() - began,
        )
    except Exception as exc:
        raise RuntimeError(
            f"seed {seed}: the harness failed (its parts are in {directory})"
        ) from exc
    finally:
        stop.set()
        cluster.close()
