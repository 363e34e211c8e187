"""`agent-server drill`: real `agent-server run` children of tests/apps/drill_apps.py, judged
shutdown-safe (exit 0) or not (exit 1, each fault named), bad arguments exit 2; reasoners
that wait for input or queue behind a limit judged by the store's kind, the same way every
run, in a bounded number of requests; and the loop-stall WARNING of a real server naming the
reasoner that blocked its loop."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server.process.drill import DrillArgs, judge, run_drill
from agent_server.runtime.settings import Settings
from tests.support.process import APPS_DIR, one_line
from tests.support.redis_server import RedisServer
from tests.support.shutdown import CLIENT_TIMEOUT, FAST, finish, wait_stderr

#: The line of drill_apps.py where `crunch` blocks the loop, as the stall lines name it.
CRUNCH_LINE = next(
    number
    for number, line in enumerate((APPS_DIR / "drill_apps.py").read_text().splitlines(), 1)
    if "time.sleep(seconds)" in line
)
#: A drill starts a child, waits `--signal-after`, then at most the grace period (6 s here)
#: plus the drill's margin: well within this.
DRILL_TIMEOUT = 90.0


def drill(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`agent-server drill ARGS` from the apps' directory, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "agent_server", "drill", *args],
        cwd=APPS_DIR,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        capture_output=True,
        text=True,
        timeout=DRILL_TIMEOUT,
        check=False,
    )


def drilled(*args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """The exit code and the JSON verdict of a drill with the fast budget."""
    done = drill(*args, *FAST, "--json", env=env)
    assert done.stdout.strip(), done.stderr
    verdict: dict[str, Any] = json.loads(done.stdout)
    return done.returncode, verdict


def by_name(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {reasoner["name"]: reasoner for reasoner in verdict["reasoners"]}


def test_a_cooperative_app_is_shutdown_safe() -> None:
    code, verdict = drilled("drill_apps:cooperative", "--executions", "2")
    assert code == 0, verdict
    assert verdict["safe"] and verdict["faults"] == []
    reasoners = by_name(verdict)
    assert list(reasoners) == ["steps", "patient", "greet"]  # the app's order
    assert reasoners["steps"]["finished"] == 2  # returned early in the drain
    assert reasoners["greet"]["finished"] == 2  # input from its schema's example
    patient = reasoners["patient"]
    assert (patient["finished"], patient["cancelled"], patient["abandoned"]) == (0, 2, 0)
    assert 0 <= patient["settle_seconds"] < 0.5  # from the cancel to the settled record
    assert all(r["parked"] == 0 and r["longest_stall"] < 1 for r in reasoners.values())
    shutdown = verdict["shutdown"]
    assert shutdown["exit_code"] == 0 and shutdown["within_grace_period"]
    assert shutdown["report"]["cancelled"] == 2
    assert shutdown["report"]["finished"] == 2  # steps (greet ended before the signal)


#: What a verdict says of a reasoner that must not change from run to run (timings aside).
COUNTS = (
    "started", "finished", "failed", "cancelled", "abandoned", "handed_off", "parked",
    "waiting", "queued", "stranded", "lost", "unknown", "faults", "safe",
)  # fmt: skip


def counts(verdict: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: {k: r.get(k) for k in COUNTS} for name, r in by_name(verdict).items()}


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Callable[[], dict[str, str]]:
    """The environment of a drill's child for each store: an empty Redis every call (what
    one drill leaves queued there is for other replicas, not the next drill)."""
    if request.param == "memory":
        return lambda: {"AGENT_SERVER_STORE": "memory"}
    server = request.getfixturevalue("redis_server")
    assert isinstance(server, RedisServer)
    request.getfixturevalue("redis_url")  # started (again) if a test stopped it

    def fresh() -> dict[str, str]:
        assert server.command("FLUSHALL") == b"+OK\r\n"
        return {"AGENT_SERVER_STORE": server.url}

    return fresh


def drilled_twice(app: str, store: Callable[[], dict[str, str]]) -> list[dict[str, Any]]:
    """Two drills of the same app: the same verdict, exit 0."""
    verdicts = []
    for _ in range(2):
        code, verdict = drilled(app, "--executions", "3", env=store())
        assert code == 0, verdict
        verdicts.append(verdict)
    first, second = verdicts
    assert counts(first) == counts(second)
    assert (first["faults"], first["shutdown"]["exit_code"]) == ([], 0)
    assert (second["faults"], second["shutdown"]["exit_code"]) == ([], 0)
    return verdicts


def assert_few_requests(verdicts: list[dict[str, Any]]) -> None:
    """Each execution followed in at most 2 requests (a long-poll, then its event stream if
    it waits for input), never a poll loop."""
    for verdict in verdicts:
        for reasoner in verdict["reasoners"]:
            assert 1 <= reasoner["requests"] <= 2 * reasoner["started"], json.dumps(reasoner)


def test_a_reasoner_waiting_for_input_is_judged_by_the_store_the_same_every_run(
    store: Callable[[], dict[str, str]],
) -> None:
    """Section 13: a wait inside its task is running work, drained then cancelled at the
    deadline; a resumable one on a shared store is parked (no task, no drain waits)."""
    shared = store()["AGENT_SERVER_STORE"] != "memory"
    verdicts = drilled_twice("drill_apps:asking", store)
    verdict = verdicts[0]
    reasoners = by_name(verdict)
    ask = reasoners["ask"]
    assert (ask["waiting"], ask["cancelled"], ask["parked"], ask["unknown"]) == (3, 3, 0, 0)
    assert 0 <= ask["settle_seconds"] < 0.5
    later = reasoners["ask_later"]
    if shared:
        assert (later["waiting"], later["cancelled"], later["parked"]) == (0, 0, 3)
    else:
        assert (later["waiting"], later["cancelled"], later["parked"]) == (3, 3, 0)
    assert reasoners["quick"]["finished"] == 3
    assert reasoners["quick"]["requests"] <= 3
    assert verdict["shutdown"]["report"]["cancelled"] == (3 if shared else 6)
    assert_few_requests(verdicts)


def test_a_limited_reasoners_queue_is_judged_by_the_store_the_same_every_run(
    store: Callable[[], dict[str, str]],
) -> None:
    """Section 14: queued work belongs to no replica; with the memory store it ends
    cancelled unrun at the shutdown, with a shared store it stays queued for another
    replica. Neither is a hand-off; only the resumable one that ran is handed off."""
    shared = store()["AGENT_SERVER_STORE"] != "memory"
    verdicts = drilled_twice("drill_apps:limited", store)
    verdict = verdicts[0]
    reasoners = by_name(verdict)
    single, later = reasoners["single"], reasoners["single_later"]
    assert (single["handed_off"], later["handed_off"]) == (0, 1 if shared else 0)
    assert (single["cancelled"], single["queued"], single["handed_off"]) == (1, 2, 0)
    expected = (0, 2, 1) if shared else (1, 2, 0)
    assert (later["cancelled"], later["queued"], later["handed_off"]) == expected
    assert reasoners["quick"]["finished"] == 3
    report = verdict["shutdown"]["report"]
    assert report["queued_cancelled"] == (0 if shared else 4)
    assert report["handed_off"] == (1 if shared else 0)
    assert_few_requests(verdicts)


async def test_the_requests_the_drill_counts_are_those_its_server_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The child's own access log (`--access-log`) counts the drill's reads: one or two per
    execution, as the verdict says, where an asking reasoner once drew hundreds of polls."""
    monkeypatch.chdir(APPS_DIR)
    monkeypatch.setenv("AGENT_SERVER_ACCESS_LOG", "true")
    monkeypatch.setenv("AGENT_SERVER_STORE", "memory")
    budget = dict(zip(FAST[::2], map(float, FAST[1::2]), strict=True))
    flags = {name.removeprefix("--").replace("-", "_"): value for name, value in budget.items()}
    args = DrillArgs("drill_apps:asking", (), {}, 3, 1.0, flags, Settings(**flags))
    run = await asyncio.wait_for(run_drill(args), DRILL_TIMEOUT)
    verdict = judge(run, 3, 1.0)
    reads = [
        line
        for line in run.log.records
        if line.get("method") == "GET" and str(line.get("path")).startswith("/executions/")
    ]
    counted = sum(reasoner.requests for reasoner in verdict.reasoners)
    assert len(reads) == counted, reads
    assert counted <= 2 * 3 * len(verdict.reasoners)
    assert verdict.faults == []


def test_the_demo_agent_is_shutdown_safe_in_the_table() -> None:
    done = drill("--reasoner", "sleep", "--reasoner", "research")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "drill of 'demo': 2 reasoners x 1 execution, SIGTERM after 1 s"
    assert lines[2].split()[:4] == ["reasoner", "started", "finished", "cancelled"]
    assert [line.split()[0] for line in lines[3:5]] == ["sleep", "research"]
    assert lines[-1] == "verdict: shutdown-safe"
    assert "within the grace period (30 s); exit code 0" in done.stdout


@pytest.mark.parametrize("executions", [1, 25])
def test_a_reasoner_that_swallows_cancellation_is_named(executions: int) -> None:
    """25: more than the settle logs a line each for; the rest come in one line's fields."""
    code, verdict = drilled("drill_apps:swallowing", "--executions", str(executions))
    assert code == 1, verdict
    reasoners = by_name(verdict)
    assert reasoners["stubborn"]["abandoned"] == executions
    fault = f"swallows cancellation ({executions} of {executions} abandoned)"
    assert reasoners["stubborn"]["faults"] == [fault]
    assert reasoners["quick"]["safe"] and reasoners["quick"]["finished"] == executions
    assert f"stubborn: {fault}" in verdict["faults"]
    assert verdict["shutdown"]["exit_code"] == 3  # the server's own code for it


def test_a_def_reasoner_past_the_drain_is_named_for_its_thread() -> None:
    code, verdict = drilled("drill_apps:threaded")
    assert code == 1, verdict
    (sleeper,) = verdict["reasoners"]
    assert sleeper["faults"] == [
        "runs past the drain in a thread, which cannot be cancelled (a def reasoner) "
        "(1 of 1 abandoned)"
    ]
    assert sleeper["longest_stall"] < 1  # a thread does not hold the loop


def test_a_reasoner_that_blocks_the_loop_is_named_with_its_function() -> None:
    done = drill("drill_apps:blocking", *FAST, "--input", 'hog={"seconds": 1.6}')
    assert done.returncode == 1, done.stdout + done.stderr
    (fault,) = [line.strip() for line in done.stdout.splitlines() if "blocks the event" in line]
    assert fault.startswith("hog: blocks the event loop (1."), done.stdout
    assert fault.endswith(f" s in crunch at drill_apps.py:{CRUNCH_LINE})"), done.stdout
    assert "verdict: NOT shutdown-safe" in done.stdout
    quick = [line for line in done.stdout.splitlines() if line.startswith("quick ")]
    assert quick and quick[0].endswith(" ok"), done.stdout


def test_an_unknown_reasoner_exits_2() -> None:
    done = drill("drill_apps:cooperative", "--reasoner", "nope")
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_line(done.stderr) == (
        "agent-server: drill: unknown reasoner 'nope' (the app has: steps, patient, greet)"
    )
    assert done.stdout == ""


def test_input_that_is_not_json_exits_2() -> None:
    done = drill("drill_apps:cooperative", "--input", "greet={name: Ada}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--input: the input of 'greet' is not valid JSON" in done.stderr


def test_a_required_field_without_example_or_default_exits_2_naming_it() -> None:
    done = drill("drill_apps:strict")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "reasoner 'needs': input field 'text' is required" in one_line(done.stderr)
    given = drill("drill_apps:strict", *FAST, "--input", 'needs={"text": "ABC"}')
    assert given.returncode == 0, given.stdout + given.stderr


def test_a_served_agent_names_the_reasoner_blocking_its_loop(server_factory: Any) -> None:
    server = server_factory("drill_apps:blocking", "--log-format", "json", *FAST)
    answer = httpx.post(
        f"{server.url}/reasoners/hog", json={"seconds": 1.5}, timeout=CLIENT_TIMEOUT
    )
    assert answer.status_code == 200, answer.text  # the stall is over
    wait_stderr(server, "event loop stall ended")
    lines = [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]
    (warning,) = [line for line in lines if line["level"] == "warning"]
    assert warning["logger"] == "agent_server.loop_lag"
    assert warning["reasoner"] == "hog" and warning["function"] == "crunch"
    assert warning["file"] == str(APPS_DIR / "drill_apps.py") and warning["line"] == CRUNCH_LINE
    assert f"by reasoner 'hog' in crunch at drill_apps.py:{CRUNCH_LINE}" in warning["message"]
    (ended,) = [line for line in lines if "stall_seconds" in line]
    assert 1.2 < ended["stall_seconds"] < 1.6
    scraped = httpx.get(f"{server.url}/metrics", timeout=CLIENT_TIMEOUT).text
    (family,) = [
        f
        for f in text_string_to_metric_families(scraped)
        if f.name.endswith("event_loop_lag_seconds")
    ]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    count = samples[("agent_server_event_loop_lag_seconds_count", None)]
    assert count >= 1
    assert samples[("agent_server_event_loop_lag_seconds_bucket", "1.0")] <= count - 1
    server.signal(signal.SIGTERM)
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()


def test_the_readmes_own_agent_is_drilled_without_inputs(tmp_path: Path) -> None:
    """README.md's agent gives no examples (`echo(text: str)`, `sleep(seconds: float)`, a
    model parameter): the drill builds plain inputs of their types instead of refusing it."""
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("```python\n# mymodule.py\n", 1)[1].split("```", 1)[0]
    (tmp_path / "mymodule.py").write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "agent_server", "drill", "mymodule:agent"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=DRILL_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("drill of 'support-bot': 3 reasoners x")
    assert done.stdout.splitlines()[-1] == "verdict: shutdown-safe"


#: The drill of v1 against v2 (tests/apps/drill_versions.py), quick: its reasoners return at
#: once, so the rehearsal is short and the comparison is what is judged.
VERSIONS = ("drill_versions:old", "--next", "drill_versions:new", "--signal-after", "0.2")


def test_the_next_version_says_what_becomes_of_each_resumable_reasoners_work() -> None:
    """Section 22: same version, compatible and migrate resume; a version v2 cannot read
    waits for a live v1 replica, then restarts or fails (a fault, exit 1); a reasoner v2
    lacks is gone (a fault); a reasoner that is not resumable hands nothing off."""
    code, verdict = drilled(*VERSIONS)
    assert code == 1, verdict
    assert verdict["next"] == "drill_versions:new"
    met = {name: r["next_version"] for name, r in by_name(verdict).items()}
    assert met["plain"] is None
    changes = {name: (m["change"], m["waits"]) for name, m in met.items() if m is not None}
    assert changes == {
        "pinned": ("same version", False),
        "compat": ("compatible", False),
        "migrating": ("migrate", False),
        "restarting": ("restart", True),
        "failing": ("fail", True),
        "removed": ("gone", False),
    }
    assert (met["pinned"]["from_version"], met["pinned"]["to_version"]) == ("r1", "r1")
    assert (met["failing"]["from_version"], met["failing"]["to_version"]) == ("v1", "v2")
    assert met["removed"]["to_version"] is None
    assert "waits for a replica of 'v1' while one runs, then restart" in met["restarting"]["said"]
    assert verdict["faults"] == [
        "failing: handed-off work fails with VersionMismatch on drill_versions:new ('v1' -> "
        "'v2': neither compatible nor migrated) once no replica of 'v1' runs",
        "removed: drill_versions:new has no reasoner 'removed': handed-off work fails",
    ]
    safe = {name for name, r in by_name(verdict).items() if r["safe"]}
    assert safe == {"pinned", "compat", "migrating", "restarting", "plain"}
    assert verdict["shutdown"]["exit_code"] == 0  # the rehearsal itself was fine


def test_a_next_version_that_resumes_or_restarts_everything_is_safe_in_the_table() -> None:
    picked = [arg for name in ("pinned", "compat", "restarting") for arg in ("--reasoner", name)]
    done = drill(*VERSIONS, *FAST, *picked)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[2].split()[-4:] == ["stall", "next", "version", "verdict"]
    rows = {line.split()[0]: line for line in lines[3:6]}
    assert rows["compat"].endswith("  compatible           ok"), done.stdout
    assert rows["restarting"].endswith("  waits, then restart  ok"), done.stdout
    said = lines[lines.index("next version (drill_versions:new), for work handed off to it:") :]
    assert said[1].split() == ["pinned", "same", "version", "('r1'):", "resumes"]
    assert said[2].split()[:5] == ["compat", "'v1'", "->", "'v2':", "compatible:"]
    assert lines[-1] == "verdict: shutdown-safe"


def test_next_version_is_the_version_the_next_app_reads_from_its_environment() -> None:
    """An Agent without version= takes AGENT_SERVER_VERSION, which a deployment sets from
    the image tag: --next-version sets it for NEXT_APP, as the new pods will have it. One
    app against itself under another version: its checkpoints cannot be read."""
    code, verdict = drilled(
        "drill_versions:from_env", "--next", "drill_versions:from_env",
        "--next-version", "v2", "--signal-after", "0.2",
        env={"AGENT_SERVER_VERSION": "v1"},
    )  # fmt: skip
    assert code == 1, verdict
    (job,) = verdict["reasoners"]
    assert job["next_version"]["change"] == "fail"
    assert (job["next_version"]["from_version"], job["next_version"]["to_version"]) == ("v1", "v2")


def test_a_next_app_that_cannot_be_loaded_exits_2_before_the_rehearsal() -> None:
    done = drill("drill_versions:old", "--next", "drill_versions:nope")
    assert done.returncode == 2, done.stdout + done.stderr
    assert one_line(done.stderr) == (
        "agent-server: drill: cannot load --next 'drill_versions:nope': module "
        "'drill_versions' has no attribute 'nope'"
    )
    assert done.stdout == ""
    alone = drill("drill_versions:old", "--next-version", "v2")
    assert alone.returncode == 2 and "--next-version" in alone.stderr, alone.stderr
