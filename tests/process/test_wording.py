"""What the server says matches what it does (issue 43's list): a count of one is singular
in the shutdown's lines, and `?wait` names the bound it really has (any finite number of
seconds from 0, capped at 60), not "from 0 to inf"."""

from __future__ import annotations

import signal
from typing import Any

import httpx

WAIT = 10.0


def test_wait_names_its_real_bound(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    started = httpx.post(f"{server.url}/reasoners/no_params", json={}, timeout=WAIT)
    execution_id = started.json()["execution_id"]
    for value in ("nan", "inf", "-1", "soon"):
        answer = httpx.get(f"{server.url}/executions/{execution_id}?wait={value}", timeout=WAIT)
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert "inf" not in detail, detail
        assert detail.startswith("wait must be a"), detail
    capped = httpx.get(f"{server.url}/executions/{execution_id}?wait=1e9", timeout=WAIT)
    assert capped.status_code == 200


def test_one_execution_is_one_in_the_shutdown_lines(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", *("--grace-period", "10", "--drain-timeout", "0.5"))
    started = httpx.post(
        f"{server.url}/reasoners/sleep/async",
        json={"seconds": 60, "marker": "one"},
        timeout=WAIT,
    )
    assert started.status_code == 202, started.text
    server.wait_marker("one")
    server.signal(signal.SIGTERM)
    server.wait_exit(WAIT)
    log = server.stderr()
    assert "1 execution in flight" in log, log
    assert "cancelling 1 execution" in log, log
    assert "1 executions" not in log, log
