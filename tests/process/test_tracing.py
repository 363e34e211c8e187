"""Traces and structured logs, seen from outside: real `agent-server run` children export
their spans over OTLP/HTTP to a real receiver in this process (a loopback HTTP server that
decodes `ExportTraceServiceRequest` with `opentelemetry-proto`: the collector is not
packaged here), and write JSON log lines this test reads.

One traced server (memory store) serves the module's single-replica tests; the hand-off test
runs two replicas of its own on one Redis."""

from __future__ import annotations

import gzip
import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from agent_server.model.status import TERMINAL
from agent_server.runtime.tracing import attempt_span_id, traceparent
from tests.support.cluster import Replica, wait_for
from tests.support.process import ROOT, ServerProcess, free_port, serving
from tests.support.redis_server import RedisServer
from tests.support.webhooks import HOOKS
from tests.support.webhooks import Receiver as WebhookReceiver

WAIT = 10.0


class Receiver:
    """An OTLP/HTTP trace receiver: POST /v1/traces, protobuf; every span kept, flattened
    with its resource's attributes."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    found.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "kind": span.kind,
                            "attributes": {a.key: _value(a.value) for a in span.attributes},
                            "events": [e.name for e in span.events],
                            "links": [(k.trace_id.hex(), k.span_id.hex()) for k in span.links],
                            "status": span.status.code,
                            "resource": resource,
                        }
                    )
        with self.changed:
            self.spans.extend(found)
            self.changed.notify_all()

    def wait(self, match: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """The first span `match` accepts, once exported (bounded)."""
        deadline = time.monotonic() + WAIT
        with self.changed:
            while True:
                for span in self.spans:
                    if match(span):
                        return span
                left = deadline - time.monotonic()
                if left <= 0:
                    names = [(s["name"], s["trace_id"]) for s in self.spans]
                    raise AssertionError(f"no span {what} in {WAIT}s; spans: {names}")
                self.changed.wait(left)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    return None if kind is None else getattr(value, kind)


def _otel_env(receiver: Receiver) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "tracing-tests",
    }


def _caller() -> tuple[str, str, str]:
    """A caller's trace id, span id and its `traceparent` header."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def _json_lines(server: ServerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    running = Receiver()
    yield running
    running.close()


@pytest.fixture(scope="module")
def hooks() -> Iterator[WebhookReceiver]:
    running = WebhookReceiver()
    yield running
    running.close()


def _finished_traceparent(hooks: WebhookReceiver, execution_id: str) -> str:
    """The `traceparent` of the (verified) webhook about the execution's end."""
    delivered = wait_for(
        lambda: [
            r
            for r in hooks.delivered("execution.finished")
            if r["body"]["data"]["execution_id"] == execution_id
        ],
        WAIT,
        "the end's webhook",
    )
    assert hooks.unverified == []
    return str(delivered[0]["headers"].get("traceparent"))


@pytest.fixture(scope="module")
def server(receiver: Receiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(
        tmp_path_factory,
        "traced",
        "tracing_app:agent",
        *("--log-format", "json", "--access-log", "--replica-id", "solo"),
        *HOOKS,
        env=_otel_env(receiver),
    ) as process:
        yield process


def test_the_execution_span_is_a_child_of_the_callers_trace(
    server: ServerProcess, receiver: Receiver, hooks: WebhookReceiver
) -> None:
    trace_id, caller_span, header = _caller()
    answer = httpx.post(
        f"{server.url}/reasoners/chatter",
        json={"count": 3},
        headers={"traceparent": header, "X-Session-ID": "s-1", "X-Webhook-URL": hooks.url},
        timeout=WAIT,
    )
    assert answer.status_code == 200, answer.text
    execution_id = answer.json()["execution_id"]
    # Not in the execution's JSON: the trace context is kept by the store only.
    assert "trace" not in answer.json()

    request = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["name"] == "POST /reasoners/{name}",
        "for the start request",
    )
    assert request["parent_span_id"] == caller_span
    assert request["attributes"]["http.route"] == "/reasoners/{name}"
    assert request["attributes"]["http.response.status_code"] == 200
    span = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["name"] == "execution chatter",
        "execution chatter",
    )
    assert span["parent_span_id"] == request["span_id"]
    assert span["span_id"] == f"{attempt_span_id(execution_id, 1):016x}"
    assert span["links"] == []  # a first attempt links to nothing
    assert span["attributes"] == {
        "agent_server.execution_id": execution_id,
        "agent_server.reasoner": "chatter",
        "agent_server.session_id": "s-1",
        "agent_server.attempt": 1,
        "agent_server.replica": "solo",
        "agent_server.status": "succeeded",
    }
    assert span["events"] == ["progress"] * 3
    assert span["resource"]["service.name"] == "tracing-tests"
    assert span["resource"]["service.instance.id"] == "solo"
    # The webhook about its end continues the trace from the attempt's span.
    assert _finished_traceparent(hooks, execution_id) == f"00-{trace_id}-{span['span_id']}-01"

    # The reasoner's own log line carries the execution and its span as fields.
    own = next(
        line
        for line in _json_lines(server)
        if line.get("logger") == "tracing_app" and line.get("execution_id") == execution_id
    )
    assert own["message"] == "chatter begins with 3 events"
    assert (own["reasoner"], own["session_id"], own["attempt"], own["replica"]) == (
        "chatter",
        "s-1",
        1,
        "solo",
    )
    assert (own["trace_id"], own["span_id"]) == (trace_id, span["span_id"])
    assert set(own) >= {"timestamp", "level", "logger", "message"}
    # The access line's fields, and the request's span.
    access = next(
        line
        for line in _json_lines(server)
        if line.get("logger") == "agent_server.access" and line.get("trace_id") == trace_id
    )
    assert (access["method"], access["path"], access["status"]) == (
        "POST",
        "/reasoners/chatter",
        200,
    )
    assert isinstance(access["duration_ms"], float) and access["duration_ms"] >= 0
    assert access["client"].startswith("127.0.0.1:")
    assert access["span_id"] == request["span_id"]


def test_span_events_are_bounded_and_a_thread_reasoner_logs_in_its_scope(
    server: ServerProcess, receiver: Receiver
) -> None:
    trace_id, _, header = _caller()
    answer = httpx.post(
        f"{server.url}/reasoners/chatter",
        json={"count": 130},
        headers={"traceparent": header},
        timeout=WAIT,
    )
    assert answer.status_code == 200, answer.text
    span = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["name"] == "execution chatter", "bounded"
    )
    assert len(span["events"]) == 100
    assert span["attributes"]["agent_server.events_dropped"] == 30

    trace_id, _, header = _caller()
    answer = httpx.post(
        f"{server.url}/reasoners/blocking",
        json={"word": "threaded"},
        headers={"traceparent": header},
        timeout=WAIT,
    )
    assert answer.status_code == 200, answer.text
    execution_id = answer.json()["execution_id"]
    span = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["name"] == "execution blocking", "blocking"
    )
    line = next(
        line for line in _json_lines(server) if line.get("message") == "blocking says threaded"
    )
    assert (line["execution_id"], line["reasoner"], line["span_id"]) == (
        execution_id,
        "blocking",
        span["span_id"],
    )


def test_the_start_line_names_address_and_budget(server: ServerProcess) -> None:
    start = next(line for line in _json_lines(server) if "reasoners" in line)
    assert start["agent"] == "tracing"
    assert start["reasoners"] == ["blocking", "chatter", "steps"]
    assert start["store"] == "memory"
    assert start["address"] == "127.0.0.1:0"
    assert set(start["shutdown"]) == {
        "grace_period",
        "unready_delay",
        "drain_timeout",
        "cancel_timeout",
        "http_timeout",
    }


def test_with_the_variables_unset_nothing_of_opentelemetry_is_imported() -> None:
    """Traces off: the app is built and serves an execution without loading the SDK."""
    program = (
        "import sys, asyncio, httpx\n"
        "from agent_server.app.demo import agent\n"
        "async def main():\n"
        "    app = agent.asgi()\n"
        "    async with agent.lifespan(app):\n"
        "        transport = httpx.ASGITransport(app=app)\n"
        "        async with httpx.AsyncClient(transport=transport, base_url='http://t') as c:\n"
        "            r = await c.post('/reasoners/echo', json={'text': 'x'})\n"
        "            assert r.status_code == 200, r.text\n"
        "asyncio.run(main())\n"
        "assert agent._built.tracing.enabled is False\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
        "print(loaded)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-c", program],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_handed_off_attempt_joins_the_trace_with_a_link_to_the_first(
    receiver: Receiver,
    hooks: WebhookReceiver,
    redis_url: str,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    flags = ["--unready-delay", "0", "--drain-timeout", "0.3", "--cancel-timeout", "1"]
    flags += ["--grace-period", "5", "--log-format", "json", *HOOKS]
    replicas = []
    try:
        for index in range(2):
            folder = tmp_path / f"r{index}"
            folder.mkdir()
            replica = Replica(
                free_port(), f"r{index}", redis_url, folder, flags, _otel_env(receiver)
            )
            replicas.append(replica)
        first, second = replicas
        for replica in replicas:
            replica.wait_ready()
        trace_id, caller_span, header = _caller()
        answer = httpx.post(
            f"{first.url}/reasoners/steps/async",
            json={"count": 15, "pause": 0.1, "marker": "steps-began"},
            headers={"traceparent": header, "X-Webhook-URL": hooks.url},
            timeout=WAIT,
        )
        assert answer.status_code == 202, answer.text
        execution_id = answer.json()["execution_id"]
        first.wait_marker("steps-began")
        first.signal(signal.SIGTERM)
        code, _ = first.wait_exit(WAIT)
        assert code == 0, first.stderr()
        ended = _final(second.url, execution_id)
        assert (ended["status"], ended["attempt"], ended["replica"]) == ("succeeded", 2, "r1")
        # Exported by the second replica's batch processor while it still runs.
        two = receiver.wait(
            lambda s: (
                s["trace_id"] == trace_id and s["attributes"].get("agent_server.attempt") == 2
            ),
            "of attempt 2",
        )
        # The end's webhook, sent from the record's snapshot by whichever replica claims
        # it, continues the trace from the span of the attempt that ended.
        webhook_parent = _finished_traceparent(hooks, execution_id)
    finally:
        for replica in replicas:
            replica.close()

    start = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["name"] == "POST /reasoners/{name}/async",
        "for the start",
    )
    assert start["parent_span_id"] == caller_span
    # Exported by the first replica within its shutdown budget.
    one = receiver.wait(
        lambda s: s["trace_id"] == trace_id and s["attributes"].get("agent_server.attempt") == 1,
        "of attempt 1",
    )
    assert one["name"] == two["name"] == "execution steps"
    assert one["parent_span_id"] == two["parent_span_id"] == start["span_id"]
    assert (
        one["resource"]["service.instance.id"],
        one["attributes"]["agent_server.status"],
    ) == (
        "r0",
        "queued",
    )
    assert (
        two["resource"]["service.instance.id"],
        two["attributes"]["agent_server.status"],
    ) == (
        "r1",
        "succeeded",
    )
    assert two["links"] == [(trace_id, one["span_id"])]
    assert webhook_parent == f"00-{trace_id}-{two['span_id']}-01"
    assert traceparent(f"00-{trace_id}-{start['span_id']}-01", execution_id, 2) == webhook_parent


def _final(url: str, execution_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        body: dict[str, Any] = httpx.get(
            f"{url}/executions/{execution_id}", params={"wait": 2}, timeout=5
        ).json()
        if body["status"] in TERMINAL or time.monotonic() > deadline:
            return body


#: `OTEL_*` values the SDK refuses (it raised, and the server exited 1 with a traceback) or
#: complains of in its own words (some with a traceback, some naming no variable); the
#: variable each warning must name. Every part the SDK builds at setup is here once or more.
BAD_SETTINGS: list[tuple[dict[str, str], str]] = [
    ({"OTEL_PROPAGATORS": "tracecontext,xray-nope"}, "OTEL_PROPAGATORS"),
    ({"OTEL_BSP_SCHEDULE_DELAY": "-20"}, "OTEL_BSP_SCHEDULE_DELAY"),
    ({"OTEL_BSP_MAX_QUEUE_SIZE": "8", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "64"}, "OTEL_BSP_"),
    ({"OTEL_BSP_EXPORT_TIMEOUT": "soon"}, "OTEL_BSP_EXPORT_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_TIMEOUT": "a while"}, "OTEL_EXPORTER_OTLP_TIMEOUT"),
    ({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, "OTEL_EXPORTER_OTLP_COMPRESSION"),
    (
        {"OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20s3cr3t-token,broken-pair"},
        "OTEL_EXPORTER_OTLP_HEADERS",
    ),
    ({"OTEL_TRACES_SAMPLER": "sometimes"}, "OTEL_TRACES_SAMPLER"),
    ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "SAMPLER"),
    ({"OTEL_RESOURCE_ATTRIBUTES": "team,tier=gold"}, "OTEL_RESOURCE_ATTRIBUTES"),
    ({"OTEL_SPAN_EVENT_COUNT_LIMIT": "-3"}, "OTEL_SPAN_EVENT_COUNT_LIMIT"),
    ({"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "lots"}, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"),
]


@pytest.mark.parametrize(("bad", "named"), BAD_SETTINGS, ids=["-".join(b) for b, _ in BAD_SETTINGS])
def test_a_bad_telemetry_setting_is_one_warning_and_the_server_serves(
    receiver: Receiver, tmp_path: Path, bad: dict[str, str], named: str
) -> None:
    """Telemetry never stops a replica (docs/observability.md): each value here is one
    WARNING line naming its variable, no traceback, and the server serves (that part of
    the SDK at its defaults, or traces off when the SDK itself cannot load)."""
    env = {**_otel_env(receiver), **bad}
    if not any(name.startswith("OTEL_BSP_") for name in bad):
        env.pop("OTEL_BSP_SCHEDULE_DELAY")
    process = ServerProcess(["tests_app:agent", "--log-format", "json"], env, tmp_path)
    try:
        process.wait_ready()
        trace_id, caller_span, header = _caller()
        with httpx.Client(base_url=process.url, timeout=WAIT) as client:
            answer = client.post(
                "/reasoners/echo", json={"text": "traced"}, headers={"traceparent": header}
            )
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == {"text": "traced"}
        process.signal(signal.SIGTERM)
        code, _ = process.wait_exit(timeout=WAIT)
        stderr = process.stderr()
    finally:
        process.close()
    assert code == 0, stderr
    if named != "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT":  # the SDK cannot load: traces are off
        # The part at its defaults still works: the request's span, flushed at the exit,
        # is a child of the caller's (tracecontext read, sampled, exported).
        span = receiver.wait(
            lambda s: s["trace_id"] == trace_id and s["name"] == "POST /reasoners/{name}",
            "for the request in the caller's trace",
        )
        assert span["parent_span_id"] == caller_span
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    warnings = [line for line in lines if line["level"] in ("warning", "error", "critical")]
    assert len(warnings) == 1, warnings
    assert named in warnings[0]["message"].split(":")[0], warnings[0]
    assert "Traceback" not in stderr and "exc_info" not in warnings[0]
    assert "s3cr3t" not in stderr


def test_spans_and_lines_name_the_caller_and_its_tenant_never_its_token(
    receiver: Receiver, server_factory: Any, tmp_path: Path
) -> None:
    token = "tok-traced-7e1d2c3b4a5968778695a4b3c2d1e0f9"
    tokens = tmp_path / "tokens"
    tokens.write_text(f"{token} ann acme\n")
    server = server_factory(
        "tracing_app:agent",
        *("--log-format", "json", "--access-log", "--api-tokens-file", str(tokens)),
        env=_otel_env(receiver),
    )
    trace_id, _, header = _caller()
    answer = httpx.post(
        f"{server.url}/reasoners/chatter",
        json={"count": 1},
        headers={"traceparent": header, "Authorization": f"Bearer {token}"},
        timeout=WAIT,
    )
    assert answer.status_code == 200, answer.text
    for name in ("POST /reasoners/{name}", "execution chatter"):
        span = receiver.wait(lambda s, n=name: s["trace_id"] == trace_id and s["name"] == n, name)
        assert span["attributes"]["agent_server.identity"] == "ann", name
        assert span["attributes"]["agent_server.tenant"] == "acme", name
    lines = _json_lines(server)
    access = [line for line in lines if line["logger"] == "agent_server.access"]
    assert access and access[-1]["identity"] == "ann" and access[-1]["tenant"] == "acme"
    assert token not in server.stderr()
