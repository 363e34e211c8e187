"""The load of a fault run: client threads through haproxy, with the project's
`AgentClient` and with raw httpx, each call and exchange written to the history."""

from __future__ import annotations

import contextlib
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
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
    EVIDENCED_LIMIT_HEADER,
    evidenced_answer,
    evidenced_reply,
)
from tests.support.faults.history import (
    TERMINAL,
    Call,
    History,
    RecordingTransport,
    execution_of,
)

#: Bound on one client operation (a run, or a start and its wait), seconds: as long as a
#: call retries (below), so a raw client rides the same in-doubt window the client does.
OP_TIMEOUT = 30.0
#: Seconds a client retries one call through consecutive failures: the client's default
#: (`AgentClient(retry_for=30.0)`), what its users get. After a planned failover, told writes
#: are in doubt until Sentinel has converted the old primary and it has synced (docs/
#: replicas.md, "How long in doubt lasts"): about 10 s, past 20 s on a machine at load 9.
RETRY_FOR = 30.0


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
            execution = execution_of(response)
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
            if response.status_code in (429, 502, 503, 504) and execution_of(response) is None:
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
            execution = execution_of(response)
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
