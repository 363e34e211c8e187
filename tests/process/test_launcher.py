"""The one launcher of real server processes (agent_server/process/launcher.py): its log read
while the child writes loses nothing, a server that ends before it listens is told with its
exit code, and every wait for an exit is bounded (the child killed past it)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from agent_server.process.launcher import Launched, LaunchError, run_command
from tests.support.process import APPS_DIR

LINES = 20_000
#: A child that writes many lines on stderr as fast as it can.
WRITER = f"import sys\nfor n in range({LINES}): sys.stderr.write(f'line {{n}}\\n')"
#: A child that ignores SIGTERM and says so once it does.
STUBBORN = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "sys.stderr.write('ignoring\\n')\n"
    "time.sleep(60)"
)


@pytest.mark.parametrize("named", [False, True], ids=["anonymous", "named"])
def test_reading_the_log_while_the_child_writes_loses_nothing(tmp_path: Path, named: bool) -> None:
    """Every read happens while the child writes into the same file: none may move the
    offset the child writes at (which would overwrite or scatter its lines)."""
    launched = Launched([sys.executable, "-c", WRITER], log=tmp_path / "log" if named else None)
    try:
        reads = 0
        while launched.proc.poll() is None:
            launched.log_text()
            reads += 1
        code, _ = launched.wait_exit(10)
        assert code == 0
        assert reads > 0
        assert launched.log_text().splitlines() == [f"line {n}" for n in range(LINES)]
    finally:
        launched.close()
    if named:  # a named log outlives the process and the launcher
        assert launched.log_text().count("\n") == LINES


def test_a_server_that_exits_before_listening_is_told_with_its_code(tmp_path: Path) -> None:
    launched = Launched(run_command("nowhere_to_be_found:agent"), cwd=APPS_DIR)
    try:
        with pytest.raises(LaunchError) as raised:
            launched.listening_port(30)
        assert raised.value.code == 2
        assert "nowhere_to_be_found" in launched.log_text()
    finally:
        launched.close()


def test_a_server_listens_on_the_port_its_log_names_and_exits_on_sigterm() -> None:
    launched = Launched(run_command("tests_app:agent"), cwd=APPS_DIR)
    try:
        port = launched.listening_port(30)
        assert f"127.0.0.1:{port}" in launched.log_text()
        launched.signal(signal.SIGTERM)
        code, seconds = launched.wait_exit(30)
        assert code == 0 and 0 <= seconds < 30
    finally:
        launched.close()


@pytest.mark.parametrize("waiting", ["wait_exit", "exited"])
def test_a_wait_for_an_exit_is_bounded_and_kills_past_its_bound(waiting: str) -> None:
    launched = Launched([sys.executable, "-c", STUBBORN])
    try:
        deadline = time.monotonic() + 10
        while "ignoring" not in launched.log_text():
            assert time.monotonic() < deadline and launched.proc.poll() is None
            time.sleep(0.01)
        launched.signal(signal.SIGTERM)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            if waiting == "exited":
                asyncio.run(launched.exited(0.5))
            else:
                launched.wait_exit(0.5)
        assert time.monotonic() - began < 5
        assert launched.proc.returncode == -signal.SIGKILL
    finally:
        launched.close()
