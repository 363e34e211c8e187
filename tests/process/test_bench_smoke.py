"""Each benchmark in bench/, run at a tiny size against real processes, so none can rot.

No timing is asserted (the machine is shared); what is asserted is structure: every server
answered, every request is counted, and the shutdown report's outcomes add up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import need

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import auth, http_overhead, mcp_call, scale, session_release  # noqa: E402
from bench.common import (  # noqa: E402
    AGENTFIELD_PYTHON,
    MAF_PYTHON,
    ServerProcess,
    agentfield_argv,
    baseline_argv,
    free_port,
    run_wrk,
    split_cpus,
)
from bench.profile_server import collapsed_top  # noqa: E402

PEERS_MISSING = "peer virtualenvs (BENCH_PEERS_DIR) are set up by hand, outside the repository"


def run_quick(module: str, *args: str, timeout: float = 180) -> tuple[str, dict[str, Any]]:
    """`python -m bench.<module> --quick ARGS`: what it printed, and the raw results it
    wrote (the path on its last `raw:` line)."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--quick", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    out = done.stdout
    raw: dict[str, Any] = json.loads(Path(out.rsplit("raw: ", 1)[1].strip()).read_text())
    return out, raw


def test_http_overhead_smoke() -> None:
    data = http_overhead.run(
        rounds=1, duration=0.5, connections=2, loader="python", peers=False, progress=print
    )
    for scenario in http_overhead.SCENARIOS:
        entry = data["scenarios"][scenario]
        floor = {"floor"} if scenario == "sync" else set()
        assert set(entry["targets"]) == {"agent-server", "baseline"} | floor
        for figures in entry["targets"].values():
            (run,) = figures["runs"]
            assert run["requests"] > 0
            assert run["errors"] == 0
            assert sum(run["statuses"].values()) == run["requests"]
            assert 0 < run["settle_seconds"] < 60  # waited for quiet, bounded
        ratio = entry["ratios"]["agent-server/baseline"]["rps"]
        assert ratio["n"] == 1 and ratio["median"] > 0
    # The contract's floor answers the record a sync run answers, for the sync scenario only.
    assert data["scenarios"]["sync"]["ratios"]["agent-server/floor"]["rps"]["median"] > 0
    assert "agent-server/floor" not in data["scenarios"]["async"]["ratios"]
    table = http_overhead.markdown(data)
    assert "| sync | agent-server |" in table and "agent-server/baseline" in table


def test_wrk_against_the_baseline() -> None:
    """Pinned as http_overhead pins them: the server on one CPU, wrk on another."""
    need("wrk", package="wrk")
    split = split_cpus()
    server_cpus, load_cpus = (None, None) if split is None else split
    port = free_port()
    with ServerProcess("baseline", baseline_argv(port), port, cpus=server_cpus) as server:
        server.wait_ready()
        if server_cpus is not None:
            assert os.sched_getaffinity(server.proc.pid) == server_cpus
        result = run_wrk(
            f"{server.url}/reasoners/echo",
            method="POST",
            body=b'{"text": "hello"}',
            duration=1,
            connections=2,
            cpus=load_cpus,
        )
    assert result.requests > 0
    assert result.errors == 0
    assert 0 < result.p50_ms <= result.p99_ms


def test_the_floor_does_what_a_sync_run_must() -> None:
    """The contract's floor (bench/baseline_app.py `--floor`) answers the record a sync run
    answers and refuses input its model rejects: what a sync run is held to is the
    contract's work, not less."""
    port = free_port()
    with ServerProcess("floor", baseline_argv(port, "--floor"), port) as server:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            answer = client.post("/reasoners/echo", content=b'{"text": "hello"}')
            refused = client.post("/reasoners/echo", content=b'{"txt": "hello"}')
    assert answer.status_code == 200
    record = answer.json()
    assert record["status"] == "succeeded" and record["result"] == {"text": "hello"}
    assert len(record["execution_id"]) == 32 and record["duration_seconds"] >= 0
    assert refused.status_code == 422 and "text" in refused.json()["detail"]


def test_session_release_smoke() -> None:
    data = session_release.run(repeat=2, timeout=0.03, cleanup=0.1, peers=False, progress=print)
    assert set(data["styles"]) == set(session_release.STYLES)
    for entry in data["styles"].values():
        rounds = entry["agent-server"]["rounds"]
        assert len(rounds) == 2
        for release in rounds:
            # The cleanup (0.1 s) outlasts the timeout (0.03 s): the one execution is abandoned.
            assert release["cancelled"] + release["abandoned"] == 1
            assert release["server_seconds"] > 0  # measured; timings are the benchmark's job
    assert "| robust |" in session_release.markdown(data)


def test_auth_smoke() -> None:
    """bench.auth, briefly: every credential and list answers without an error; structure
    only (timings are the benchmark's job)."""
    data = auth.run(duration=0.3, repeat=1, records=60, tenants=3, tokens=20, progress=print)
    assert set(data["scenarios"]) == {name for name, _, _ in auth.SCENARIOS}
    assert all(entry["rps"]["median"] > 0 for entry in data["scenarios"].values())
    assert "| read, tokens file |" in auth.markdown(data)


def test_scale_smoke() -> None:
    scales = (20, 50)
    data = scale.run(scales=scales, rounds=1, mix_drain=0.3, mix_cancel=0.2, progress=print)
    mixes = data["raw"]["mix"]
    assert [m["n"] for m in mixes] == list(scales)
    for mix in mixes:
        report = mix["report"]
        assert mix["counted"] == mix["n"]
        assert report["abandoned"] == mix["swallowers"] == mix["n"] // 10
        assert report["finished"] == mix["n"] - mix["swallowers"]
        assert mix["exit_code"] == 3
    parks = data["raw"]["park"]
    assert {(p["target"], p["n"]) for p in parks} == {
        (target, n) for target in ("agent-server", "baseline") for n in scales
    }
    for park in parks:
        if park["target"] == "agent-server":
            assert park["exit_code"] == 0
            assert park["report_finished"] == park["n"]
    memory = data["summary"]["memory"]
    for target in ("agent-server", "baseline"):
        assert set(memory[target]) == {"in_flight", "retained"}
    assert set(data["summary"]["growth"]["agent-server"]) == {50}
    table = scale.markdown(data)
    assert "| 20 |" in table and "in_flight" in table


def test_collapsed_stack_ranking(tmp_path: Path) -> None:
    collapsed = tmp_path / "profile.collapsed"
    collapsed.write_text("main;serve;send 6\nmain;serve;parse 3\nmain;idle 1\n")
    total, inclusive, own = collapsed_top(collapsed)
    assert total == 10
    assert inclusive[0] == ("main", 10)
    assert dict(inclusive)["serve"] == 9
    assert own[0] == ("send", 6)


@pytest.mark.skipif(not MAF_PYTHON.exists(), reason=PEERS_MISSING)
def test_agent_framework_peer_smoke() -> None:
    done = subprocess.run(
        [str(MAF_PYTHON), str(ROOT / "bench" / "peer_maf_release.py"), "--repeat", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["elapsed"]) == 1
    assert result["elapsed"][0] > 0  # measured; timings are the benchmark's job


@pytest.mark.skipif(not AGENTFIELD_PYTHON.exists(), reason=PEERS_MISSING)
def test_agentfield_peer_smoke() -> None:
    port = free_port()
    with ServerProcess("agentfield", agentfield_argv(port), port, ready_path="/health") as server:
        server.wait_ready()
        answer = httpx.post(f"{server.url}/reasoners/echo", json={"text": "hi"}, timeout=10)
    assert answer.status_code == 200
    assert answer.json() == {"text": "hi"}


def test_store_smoke() -> None:
    """bench.store --quick against this tree (item 3 compares it with itself): every item
    runs and is printed; structure only. Needs redis-server, as the store tests do."""
    need("redis-server", package="redis-server")
    out, raw = run_quick("store", "--before", str(ROOT), timeout=120)
    for heading in (
        "### Item 1: Redis round trips",
        "### Item 2: background start + wait",
        "### Item 3: sync echo",
        "### Item 4: renewal cost",
        "### Item 5: long-poll wake latency",
        "### Item 6: Redis memory",
        "### Item 7: sync echo",
    ):
        assert heading in out, heading
    items = raw["items"]
    one_by_one = items["1"]["scenarios"]["start, end, GET (one at a time)"]
    assert one_by_one["statuses"] == {"succeeded": one_by_one["lives"]}
    assert one_by_one["evalsha_per_life"] > 0 and one_by_one["round_trips_per_life"] > 0
    for store in ("memory", "redis"):
        assert items["2"]["targets"][store]["errors"] == 0
        assert items["2"]["targets"][store]["lives"] > 0
    assert all(t["errors"] == 0 for t in items["3"]["targets"].values())
    assert [row["in_flight"] for row in items["4"]["rows"]] == [1, 20]
    assert all(row["running_in_redis"] == row["in_flight"] for row in items["4"]["rows"])
    for results in items["5"]["rounds"].values():
        assert all(
            r["measured"] + r["failed"] + r["not_waiting_at_end"] == r["waiters"] for r in results
        )
    assert items["6"]["points"][-1]["keys_added"] >= items["6"]["points"][-1]["retained"]
    for store in ("memory", "redis"):
        assert items["7"]["targets"][store]["errors"] == 0
        assert items["7"]["targets"][store]["requests"] > 0
    assert items["7"]["ratio"]["rps"]["median"] > 0


def test_events_smoke() -> None:
    """bench.events --quick: fan-out to 1 and 10 readers (memory) and 1 across replicas
    (redis), a few idle streams, the emit microbenchmark; structure only."""
    need("redis-server", package="redis-server")
    out, raw = run_quick("events")
    for heading in ("### Item 1: events per second", "### Items 2 and 3", "### Item 4: `await"):
        assert heading in out, heading
    items = raw["items"]
    for where in ("one process (memory)", "cross-replica (redis)"):
        for readers, level in items["1"][where]["levels"].items():
            assert level["incomplete"] == 0 and not level["errors"], (where, readers)
            assert all(run["readers"] == int(readers) for run in level["runs"])
    rows = items["2"]["rows"]
    assert [row["streams_open_metric"] for row in rows] == [row["streams"] for row in rows]
    assert items["2"]["streams_open_after_close"] == 0
    assert items["4"]["ratio_emit_to_put"] > 0


def test_durable_smoke() -> None:
    """bench.durable --quick: one drain handing 10 executions to one replica, and the
    command counts; structure only."""
    need("redis-server", package="redis-server")
    out, raw = run_quick("durable")
    assert "### Item 1: hand-off latency" in out and "### Item 2: Redis commands" in out
    (drain,) = raw["items"]["1"]["rounds"]
    assert drain["handed_over"] == drain["executions"] == 10
    assert drain["statuses"] == {"succeeded": 10}
    assert drain["deadline_logged_minus_planned_ms"] is not None
    scenarios = raw["items"]["2"]["scenarios"]
    assert all(entry["ok"] == entry["lives"] for entry in scenarios.values())
    assert raw["items"]["2"]["added"]["per checkpoint"]["round_trips"] > 0


def test_versions_smoke() -> None:
    """bench.versions --quick: every case claims every execution it seeded, one batch at a
    time, and case e's claims meet work waiting in a version queue; structure only (this
    tree stands in for the one before versions)."""
    need("redis-server", package="redis-server")
    out, raw = run_quick("versions", "--before", str(ROOT), timeout=120)
    assert "| (a) before versions" in out and "| (e) v1 claims v1, live v0" in out
    assert set(raw["left_queued"].values()) == {0}
    for label, per_round in raw["rounds_figures"].items():
        assert [entry["claims"] for entry in per_round] == [raw["count"]], label
    summary = raw["summary"]
    assert summary["e"]["waiting"] == raw["waiting"] > 0
    assert summary["e"]["by_command"]["hgetall"] == 1  # the live replicas' adverts, per claim
    assert summary["b"]["by_command"]["smembers"] == 1  # each claim looks at the vqs set


def test_protocols_smoke() -> None:
    """bench.protocols --quick: the sync route and A2A SendMessage on one server, each run
    twice, every request answered; structure only."""
    need("wrk", package="wrk")
    out, raw = run_quick("protocols")
    assert "| a2a |" in out and "| sync |" in out
    scenarios = [run["scenario"] for run in raw["runs"]]
    assert sorted(scenarios) == ["a2a", "a2a", "sync", "sync"]
    assert all(run["rps"] > 0 for run in raw["runs"])


def test_mcp_call_smoke() -> None:
    """bench.mcp_call at a tiny size: both requests answered (it checks each once before
    the load), counted without errors, and their ratio taken; structure only."""
    need("wrk", package="wrk")
    report = mcp_call.run(rounds=1, duration=2, connections=2)
    for which in ("sync", "mcp"):
        assert report[which]["rps"]["n"] == 2 and report[which]["rps"]["median"] > 0
        assert report[which]["server_cpu_us"]["median"] > 0
    assert report["mcp_over_sync_rps"]["n"] == 1 and report["mcp_over_sync_rps"]["median"] > 0
