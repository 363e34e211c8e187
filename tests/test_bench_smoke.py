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

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import http_overhead, scale, session_release  # noqa: E402
from bench.common import (  # noqa: E402
    AGENTFIELD_PYTHON,
    MAF_PYTHON,
    ServerProcess,
    agentfield_argv,
    baseline_argv,
    free_port,
    have_wrk,
    run_wrk,
    split_cpus,
)
from bench.profile_server import collapsed_top  # noqa: E402

PEERS_MISSING = "peer virtualenvs (BENCH_PEERS_DIR) are set up by hand, outside the repository"


def test_http_overhead_smoke() -> None:
    data = http_overhead.run(
        rounds=1, duration=0.5, connections=2, loader="python", peers=False, progress=print
    )
    for scenario in http_overhead.SCENARIOS:
        entry = data["scenarios"][scenario]
        assert set(entry["targets"]) == {"agent-server", "baseline"}
        for figures in entry["targets"].values():
            (run,) = figures["runs"]
            assert run["requests"] > 0
            assert run["errors"] == 0
            assert sum(run["statuses"].values()) == run["requests"]
            assert 0 < run["settle_seconds"] < 60  # waited for quiet, bounded
        ratio = entry["ratios"]["agent-server/baseline"]["rps"]
        assert ratio["n"] == 1 and ratio["median"] > 0
    table = http_overhead.markdown(data)
    assert "| sync | agent-server |" in table and "agent-server/baseline" in table


@pytest.mark.skipif(not have_wrk(), reason="wrk is a Debian package that .ci/run does not install")
def test_wrk_against_the_baseline() -> None:
    """Pinned as http_overhead pins them: the server on one CPU, wrk on another."""
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
