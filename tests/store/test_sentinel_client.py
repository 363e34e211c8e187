"""The Python client on told writes answered in doubt (Sentinel: the replica cannot
acknowledge). A real primary, replica and three sentinels (tests/store/test_sentinel.py's
`redises`), a real `agent-server run`, real HTTP: the replica is stopped (SIGSTOP), so every
told write is answered 503 in doubt, and the client sends the same write again (its
`Idempotency-Key`, its `request_id`) until the replica, let go on, holds it; past its
`retry_for` it raises `InDoubt` naming the execution. Never a second execution, never an
answer handed over twice.
"""

from __future__ import annotations

import json
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.client import AgentClient, InDoubt, Unavailable
from tests.store.test_sentinel import WAIT, Redises, start_agents
from tests.store.test_sentinel import redises as redises  # the fixture

pytestmark = pytest.mark.redis


class Recording(httpx.HTTPTransport):
    """Real HTTP, every exchange remembered: (method, path, request headers, request body,
    status, response body); `doubted` is set once `wanted` answers in doubt have come."""

    def __init__(self, wanted: int = 1) -> None:
        super().__init__()
        self.exchanges: list[tuple[str, str, httpx.Headers, Any, int, Any]] = []
        self.wanted = wanted
        self.doubted = threading.Event()
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        response.read()
        sent = json.loads(request.content) if request.content else None
        try:
            body = json.loads(response.content)
        except ValueError:
            body = None
        with self.lock:
            status = response.status_code
            self.exchanges.append(
                (request.method, request.url.path, request.headers, sent, status, body)
            )
            if len(self.in_doubt()) >= self.wanted:
                self.doubted.set()
        return response

    def in_doubt(self) -> list[tuple[str, str, httpx.Headers, Any, int, Any]]:
        return [
            exchange
            for exchange in self.exchanges
            if exchange[4] == 503
            and isinstance(exchange[5], dict)
            and "execution_id" in exchange[5]
            and "status" not in exchange[5]  # not an execution: the body of an answer in doubt
        ]

    def posts(self, suffix: str) -> list[tuple[str, str, httpx.Headers, Any, int, Any]]:
        return [e for e in self.exchanges if e[0] == "POST" and e[1].endswith(suffix)]


def test_a_start_in_doubt_is_sent_again_and_gets_the_same_execution(
    tmp_path: Path, redises: Redises
) -> None:
    """With the replica stopped: a start whose `retry_for` runs out raises `InDoubt` (an
    `Unavailable`) naming the execution and its Location; a background start and a
    synchronous run, each sent again with its own key, return once the replica holds them,
    each with the execution its first try recorded; the start retried later under the
    `InDoubt` one's key gets that execution. Three starts, three executions, no more."""
    (agent,) = start_agents(tmp_path, redises.url(), 1, "input_app:agent")
    short = Recording()
    patient = Recording(wanted=2)
    try:
        with (
            AgentClient(agent.url, timeout=WAIT, retry_for=1.5, transport=short) as hasty,
            AgentClient(agent.url, timeout=WAIT, retry_for=3 * WAIT, transport=patient) as client,
            ThreadPoolExecutor(2) as pool,
        ):
            redises.replica.proc.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(InDoubt) as gave_up:
                    hasty.start("twice", idempotency_key="given-up")
                started = pool.submit(client.start, "twice")
                ran = pool.submit(client.run_execution, "twice", timeout=3 * WAIT)
                assert patient.doubted.wait(WAIT), patient.exchanges
            finally:
                redises.replica.proc.send_signal(signal.SIGCONT)
            handle = started.result(timeout=3 * WAIT)
            execution = ran.result(timeout=3 * WAIT)

            doubt = gave_up.value
            assert isinstance(doubt, Unavailable) and doubt.status == 503
            assert doubt.location == f"{agent.url}/executions/{doubt.execution_id}"
            assert len(short.exchanges) >= 2  # sent again before giving up
            assert {e[5]["execution_id"] for e in short.exchanges} == {doubt.execution_id}
            assert {e[2]["idempotency-key"] for e in short.exchanges} == {"given-up"}

            # Each start: every try under one key, every answer naming one execution.
            for path, execution_id in (
                ("/async", handle.execution_id),
                ("/twice", execution.execution_id),
            ):
                tries = patient.posts(path)
                assert len({e[2]["idempotency-key"] for e in tries}) == 1, tries
                assert tries[0][4] == 503 and tries[-1][4] in (200, 202), tries
                assert {e[5]["execution_id"] for e in tries} == {execution_id}, tries
            assert handle.execution_id != execution.execution_id
            assert execution.waits_for_input, execution
            assert handle.wait(timeout=WAIT).waits_for_input

            # Read later: the execution the given-up start named, and its key finds it.
            later = client.start("twice", idempotency_key="given-up")
            assert later.execution_id == doubt.execution_id
            names = {e.execution_id for e in client.list(reasoner="twice")}
            assert names == {doubt.execution_id, handle.execution_id, execution.execution_id}
    finally:
        agent.close()


def test_an_answer_in_doubt_is_sent_again_taken_once_and_handed_over_once(
    tmp_path: Path, redises: Redises
) -> None:
    """With the replica stopped, `respond` is answered in doubt, sends the same answer
    (request 1) again until the replica holds it: one 202, and the reasoner's next question
    is request 2, asked after that one answer. A cancel and a DELETE in doubt are sent
    again too: the execution ends cancelled, then is gone."""
    (agent,) = start_agents(tmp_path, redises.url(), 1, "input_app:agent")
    recording = Recording()
    try:
        with (
            AgentClient(agent.url, timeout=WAIT, retry_for=3 * WAIT, transport=recording) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            handle = client.start("twice")
            assert handle.wait(timeout=WAIT).waits_for_input
            redises.replica.proc.send_signal(signal.SIGSTOP)
            try:
                answered = pool.submit(handle.respond, {"x": [1, 2]})
                assert recording.doubted.wait(WAIT), recording.exchanges
            finally:
                redises.replica.proc.send_signal(signal.SIGCONT)
            taken = answered.result(timeout=3 * WAIT)
            assert taken.execution_id == handle.execution_id
            tries = recording.posts("/input")
            assert tries[0][4] == 503 and [e[4] for e in tries].count(202) == 1, tries
            assert tries[-1][4] == 202, tries
            assert {json.dumps(e[3], sort_keys=True) for e in tries} == {
                json.dumps({"request_id": 1, "value": {"x": [1, 2]}}, sort_keys=True)
            }
            second = handle.wait(timeout=WAIT)
            assert second.input_request is not None, second
            assert second.input_request["request_id"] == 2, second
            assert second.input_request["prompt"] == {"after": {"x": [1, 2]}}

            # A cancel of a queued execution (a told write; one running is cancelled by
            # its owner, in its process) and a DELETE of an ended one, each in doubt.
            queued = httpx.post(f"{agent.url}/reasoners/twice/async?delay=600", json={})
            assert queued.status_code == 202, queued.text
            queued_id = queued.json()["execution_id"]
            recording.doubted.clear()
            recording.wanted = len(recording.in_doubt()) + 1
            redises.replica.proc.send_signal(signal.SIGSTOP)
            try:
                cancelled = pool.submit(client.cancel, queued_id)
                assert recording.doubted.wait(WAIT), recording.exchanges
            finally:
                redises.replica.proc.send_signal(signal.SIGCONT)
            assert cancelled.result(timeout=3 * WAIT).execution_id == queued_id
            assert recording.posts("/cancel")[0][4] == 503
            assert client.wait(queued_id, timeout=WAIT).status == "cancelled"
            recording.doubted.clear()
            recording.wanted = len(recording.in_doubt()) + 1
            redises.replica.proc.send_signal(signal.SIGSTOP)
            try:
                forgotten = pool.submit(client.forget, queued_id)
                assert recording.doubted.wait(WAIT), recording.exchanges
            finally:
                redises.replica.proc.send_signal(signal.SIGCONT)
            assert forgotten.result(timeout=3 * WAIT) is None
            deletes = [e[4] for e in recording.exchanges if e[0] == "DELETE"]
            assert deletes[0] == 503 and deletes[-1] in (204, 404), deletes
            assert httpx.get(f"{agent.url}/executions/{queued_id}").status_code == 404
    finally:
        agent.close()
