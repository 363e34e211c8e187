"""The state machine of agent_server/model/status.py is the one every part reads: the docs show
its diagram, execution objects refuse moves it does not hold, the scripts name its
statuses, and the client takes its terminal statuses from it without loading the server."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agent_server.model import status
from agent_server.model.execution import Execution
from agent_server.model.status import ExecutionStatus, IllegalTransition, Transition

ROOT = Path(__file__).resolve().parents[2]


def test_the_architecture_page_shows_the_tables_diagram() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert f"```mermaid\n{status.diagram()}\n```" in page
    for row in status.TABLE:
        assert f"| `{row.transition.value}` |" in page


def test_terminal_statuses_are_those_no_move_leaves_and_all_are_reachable() -> None:
    assert {
        ExecutionStatus.SUCCEEDED,
        ExecutionStatus.FAILED,
        ExecutionStatus.CANCELLED,
        ExecutionStatus.LOST,
    } == status.TERMINAL
    reached = {ExecutionStatus.RUNNING}
    for _ in status.TABLE:  # a fixed point within as many rounds as there are rows
        reached |= {t for row in status.TABLE if row.sources & reached for t in row.targets}
    assert reached == set(ExecutionStatus)


def test_an_execution_refuses_a_move_the_table_does_not_hold() -> None:
    execution = Execution("echo", None, "A")
    execution.finish(ExecutionStatus.SUCCEEDED, result=1)
    with pytest.raises(IllegalTransition):
        execution.finish(ExecutionStatus.FAILED)
    with pytest.raises(IllegalTransition):
        execution.mark_queued()
    handed = Execution("steps", None, "A")
    handed.mark_queued()
    handed.finish(ExecutionStatus.CANCELLED)  # a late end of a handed-off attempt
    with pytest.raises(IllegalTransition):
        status.step(ExecutionStatus.QUEUED, Transition.LATE_END, ExecutionStatus.LOST)


def test_the_scripts_name_statuses_through_the_table() -> None:
    lua = ROOT / "agent_server" / "store" / "redis" / "lua"
    names = "|".join(s.value for s in ExecutionStatus)
    for script in lua.glob("*.lua"):
        # A status written as a literal (not the key or channel of that name after P ..).
        literal = re.search(rf"(?<!P \.\. )'({names})'", script.read_text())
        assert literal is None, f"{script.name} writes {literal.group(0)}: use STATUS_*"


def test_the_client_reads_the_table_and_loads_none_of_the_server() -> None:
    """Of agent_server, only the lazy package, the model's package (a docstring), the state
    table and the client's own modules; none of the server's libraries."""
    code = (
        "import sys, agent_server.client as c; "
        "print(sorted(c.TERMINAL)); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('uvicorn', 'starlette', "
        "'redis', 'prometheus_client', 'pydantic', 'pydantic_settings', 'orjson'))); "
        "print(sorted(m for m in sys.modules if m.startswith('agent_server')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out[0] == str(sorted(s.value for s in status.TERMINAL))
    assert out[1] == "[]"
    loaded = set(ast.literal_eval(out[2]))
    light = {
        "agent_server",
        "agent_server.model",
        "agent_server.model.status",
        "agent_server.model.record",
        "agent_server.client",
    }
    assert light <= loaded
    assert {m for m in loaded - light if not m.startswith("agent_server.client.")} == set()
