"""Settings: the shutdown budget, flags and their AGENT_SERVER_* twins (the flag wins).

The budget `unready + drain + cancel + http + margin <= grace` is checked at start: an
impossible budget is exit code 2 with a message naming every term, before anything listens.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from agent_server import Settings
from agent_server.runtime.settings import SHUTDOWN_MARGIN
from agent_server.runtime.shutdown import EXIT_RESERVE, ShutdownPlan
from tests.support.process import ROOT, ServerProcess, agent_server_cli
from tests.support.shutdown import ASYNCIO_COMPLAINTS, finish, shutdown_report

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tests set the environment they mean; none leaks in from the caller's."""
    for name in list(os.environ):
        if name.startswith("AGENT_SERVER_"):
            monkeypatch.delenv(name)


# -- the budget, in-process --------------------------------------------------------------


def test_default_drain_is_what_the_grace_period_leaves() -> None:
    settings = Settings()
    assert settings.grace_period == 30
    assert settings.effective_drain_timeout == 30 - 0 - 5 - 1 - SHUTDOWN_MARGIN
    plan = ShutdownPlan.from_settings(settings)
    assert plan.drain_timeout == 23
    assert plan.watchdog_after == 29


def test_derived_drain_takes_every_other_term() -> None:
    settings = Settings(grace_period=60, unready_delay=5, cancel_timeout=10, http_timeout=2)
    assert settings.effective_drain_timeout == 60 - 5 - 10 - 2 - 1


def test_a_budget_that_fits_exactly_is_accepted() -> None:
    settings = Settings(grace_period=4, drain_timeout=1, cancel_timeout=1, http_timeout=1)
    assert settings.effective_drain_timeout == 1


@pytest.mark.parametrize(
    ("values", "total"),
    [
        ({"grace_period": 4, "drain_timeout": 1.5, "cancel_timeout": 1, "http_timeout": 1}, "4.5"),
        ({"grace_period": 10, "unready_delay": 5, "cancel_timeout": 5}, "12"),
    ],
)
def test_a_budget_over_the_grace_period_is_refused(values: dict[str, float], total: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(**values)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "shutdown budget does not fit" in message
    assert f"= {total} s exceeds grace-period {values['grace_period']:g} s" in message
    for term in ("unready-delay", "cancel-timeout", "http-timeout", "margin"):
        assert term in message


@pytest.mark.parametrize(
    "values",
    [
        {"grace_period": 0},
        {"drain_timeout": -1},
        {"cancel_timeout": -0.5},
        {"unready_delay": -1},
        {"http_timeout": -1},
    ],
)
def test_impossible_values_are_refused(values: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        Settings(**values)  # type: ignore[arg-type]


def test_environment_twin_and_the_argument_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_SERVER_GRACE_PERIOD", "12")
    monkeypatch.setenv("AGENT_SERVER_CANCEL_TIMEOUT", "2")
    assert Settings().effective_drain_timeout == 12 - 2 - 1 - 1
    assert Settings(cancel_timeout=4).effective_drain_timeout == 12 - 4 - 1 - 1
    monkeypatch.setenv("AGENT_SERVER_GRACE_PERIOD", "2")
    with pytest.raises(ValidationError, match="shutdown budget does not fit"):
        Settings()
    assert Settings(grace_period=30).grace_period == 30


def test_http_phase_never_reaches_the_watchdog() -> None:
    plan = ShutdownPlan.from_settings(
        Settings(grace_period=6, drain_timeout=1, cancel_timeout=1, http_timeout=0.5)
    )
    # Early in the budget the http phase gets its full timeout ...
    assert plan.http_deadline(100.0, 101.0) == 101.5
    # ... and when the phases used the whole budget, it ends before the watchdog's deadline.
    full = ShutdownPlan.from_settings(Settings(grace_period=6, cancel_timeout=1, http_timeout=2))
    assert full.drain_timeout == 2
    assert full.http_deadline(100.0, 103.0) == 100.0 + 5.0 - EXIT_RESERVE
    assert full.hard_end(100.0) == 105.0


# -- flags and environment of a real `agent-server run` -------------------------------------


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`agent-server run` expected to refuse its settings and exit at once."""
    result = agent_server_cli("run", "tests_app:agent", *args, env=env)
    for complaint in ASYNCIO_COMPLAINTS:
        assert complaint not in result.stderr, result.stderr
    return result


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (("--grace-period", "2"), {}),
        ((), {"AGENT_SERVER_GRACE_PERIOD": "2"}),
        (("--grace-period", "2"), {"AGENT_SERVER_GRACE_PERIOD": "60"}),  # the flag wins
        (("--drain-timeout", "30"), {}),
        ((), {"AGENT_SERVER_UNREADY_DELAY": "10", "AGENT_SERVER_GRACE_PERIOD": "12"}),
    ],
    ids=["flag", "env", "flag-over-env", "drain-flag", "unready-env"],
)
def test_impossible_budget_exits_2_with_a_clear_message(
    args: tuple[str, ...], env: dict[str, str]
) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("agent-server: invalid settings:"), result.stderr
    assert "shutdown budget does not fit" in result.stderr
    assert "exceeds grace-period" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("args", "env", "expected"),
    [
        (("--grace-period", "abc"), {}, "Invalid value for '--grace-period'"),
        # a bad environment variable is named as the user wrote it, not as its flag
        ((), {"AGENT_SERVER_CANCEL_TIMEOUT": "soon"}, "AGENT_SERVER_CANCEL_TIMEOUT: Input should"),
        (("--cancel-timeout", "-1"), {}, "--cancel-timeout: Input should be greater than"),
    ],
)
def test_malformed_values_exit_2(args: tuple[str, ...], env: dict[str, str], expected: str) -> None:
    result = run_cli(*args, env=env)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr


def _durations() -> list[str]:
    from agent_server.runtime.settings import Settings

    return [
        name
        for name, info in Settings.model_fields.items()
        if "float" in str(info.annotation) and name != "grace_period"
    ]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e17", "31536001"])
@pytest.mark.parametrize("name", ["grace_period", *_durations()])
def test_every_duration_is_finite_and_within_a_year(name: str, value: str) -> None:
    """Section 12, invariant 7: a duration the clock, the watchdog or Redis TTLs cannot take
    is refused at start, naming the flag, for every duration setting there is."""
    from agent_server.runtime.settings import Settings

    with pytest.raises(ValidationError) as refused:
        Settings(**{name: value})  # type: ignore[arg-type]
    assert name in str(refused.value)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (("--sse-heartbeat", "inf"), "--sse-heartbeat"),
        (("--idempotency-ttl", "1e300"), "--idempotency-ttl"),
        (("--lease-ttl", "nan"), "--lease-ttl"),
        (("--max-retained", str(2**40)), "--max-retained"),
    ],
)
def test_an_absurd_value_exits_2_naming_its_flag(args: tuple[str, ...], flag: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2, result.stderr
    assert f"{flag}:" in result.stderr
    assert "Traceback" not in result.stderr


def test_flags_and_env_twins_reach_the_shutdown_plan(server_factory: ServerFactory) -> None:
    """Env twins apply where no flag is given; a flag beats its twin; drain is derived."""
    server = server_factory(
        "tests_app:agent",
        *("--grace-period", "10", "--http-timeout", "0.5"),
        env={
            "AGENT_SERVER_GRACE_PERIOD": "3",  # would not fit; the flag wins
            "AGENT_SERVER_CANCEL_TIMEOUT": "2",
            "AGENT_SERVER_UNREADY_DELAY": "0.5",
        },
    )
    server.signal(signal.SIGTERM)
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    plan = shutdown_report(server)["plan"]
    assert plan == {
        "grace_period": 10.0,
        "unready_delay": 0.5,
        "drain_timeout": 10 - 0.5 - 2 - 0.5 - 1,
        "cancel_timeout": 2.0,
        "http_timeout": 0.5,
        "margin": 1.0,
    }
    # The unready delay holds even an idle server for its length (load balancers catch up).
    assert 0.5 <= elapsed < 0.5 + 1.5, elapsed


@pytest.mark.parametrize(
    "url",
    [
        "redis://:pa#ssw0rd@127.0.0.1:6379/0",
        "redis://:pa?ssw0rd@127.0.0.1:6379/0",
        "redis://:pa/ssw0rd@127.0.0.1:6379/0",
        "rediss://someone:pa/ss#w0rd@127.0.0.1:6379/0",
        "redis://someone:passw0rd@127.0.0.1:passw0rd/0",
        "redis://:passw0rd@[::1/0",
        "redis://:passw0rd@127.0.0.1:6379/passw0rd",
    ],
)
def test_a_malformed_store_url_exits_2_without_any_piece_of_its_password(url: str) -> None:
    """The parsers' own messages quote what they took for the port or the database, which
    with '#', '?' or '/' in a password is a piece of the password: never echoed."""
    result = run_cli("--store", url)
    assert result.returncode == 2, result.stderr
    assert "--store:" in result.stderr
    for piece in ("pa", "ssw0rd", "passw0rd", "w0rd"):
        assert piece not in result.stderr.replace("password", ""), result.stderr
    assert "Traceback" not in result.stderr


def test_the_budget_error_is_word_for_word_what_shutdown_md_shows() -> None:
    """docs/shutdown.md quotes the refusal of `agent-server run --grace-period 5`."""
    page = (ROOT / "docs" / "shutdown.md").read_text()
    quoted = re.search(r"\$ agent-server run --grace-period 5 .*\n(.+)\n", page)
    assert quoted is not None
    result = run_cli("--grace-period", "5")
    assert result.returncode == 2
    assert result.stderr.strip() == quoted.group(1)
