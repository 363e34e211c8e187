"""The state machine of agent_server/model/status.py is the one every part reads: the docs show
its diagram, execution objects refuse moves it does not hold, the scripts name its
statuses, and the client takes its terminal statuses from it without loading the server."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pytest

from agent_server.model import status
from agent_server.model.execution import Execution
from agent_server.model.status import ExecutionStatus, IllegalTransition, Transition
from agent_server.store.redis import scripts

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
        "agent_server.model.counts",  # "1 attempt" in its errors: no import of its own
        "agent_server.client",
    }
    assert light <= loaded
    assert {m for m in loaded - light if not m.startswith("agent_server.client.")} == set()


class Subject:
    """The least a move needs: a status, and fields it holds with their cleared values."""

    CLEARED: ClassVar[Mapping[str, object]] = {"input_request": None, "asking": 0, "claim": ""}

    def __init__(self, status: ExecutionStatus) -> None:
        self.status = status
        self.input_request: object = {"request_id": 1}
        self.asking: object = 1
        self.claim: object = "token"
        self.replica = "A"


def test_python_moves_only_what_the_table_holds_and_clears_what_the_move_declares() -> None:
    """Every transition tried from every status to every status: a move the table holds
    sets the status and clears exactly its declared fields the subject holds (the others,
    and those it lacks, stay); any other raises and changes nothing."""
    legal = 0
    for row in status.TABLE:
        for source in ExecutionStatus:
            for target in ExecutionStatus:
                subject = Subject(source)
                before = dict(vars(subject))
                holds = target in row.targets and (not row.sources or source in row.sources)
                if not holds:
                    with pytest.raises(IllegalTransition):
                        status.move(subject, row.transition, target)
                    assert vars(subject) == before
                    continue
                legal += 1
                status.move(subject, row.transition, target)
                cleared = set(status.clears(row.transition, target)) & set(Subject.CLEARED)
                assert subject.status is target
                for name, value in before.items():
                    if name in cleared:
                        assert getattr(subject, name) == Subject.CLEARED[name], name
                    elif name != "status":
                        assert getattr(subject, name) == value, name
    assert legal == sum(
        len(row.targets) * (len(row.sources) or len(ExecutionStatus)) for row in status.TABLE
    )


def test_every_move_to_queued_clears_the_one_declared_set() -> None:
    to_queued = [row for row in status.TABLE if ExecutionStatus.QUEUED in row.targets]
    assert len(to_queued) >= 5  # hand-off, requeue, answer, expire, enqueue, retry
    for row in to_queued:
        cleared = status.clears(row.transition, ExecutionStatus.QUEUED)
        assert set(status.QUEUED_CLEARS) <= set(cleared), row.transition
        assert len(cleared) == len(set(cleared)), row.transition
    codes = scripts.load("codes")
    for field in status.QUEUED_CLEARS:
        # Generated into every row's `to.queued` (its cleared value after it).
        assert codes.count(f"'{field}', ") >= len(to_queued), field


def test_parked_is_a_waiting_record_with_no_owner_and_no_status_of_its_own() -> None:
    assert status.PARKED not in {s.value for s in ExecutionStatus}  # clients never see it
    for each in ExecutionStatus:
        for owner in ("", "A"):
            parked = each is ExecutionStatus.INPUT_REQUIRED and owner == ""
            assert status.parked(each, owner) is parked
            assert status.unowned(each, owner) is (parked or each is ExecutionStatus.QUEUED)
    execution = Execution("approve", None, "A")
    execution.ask({"request_id": 1})
    assert not execution.owned_by_nobody  # waiting in its task
    execution.leave()
    assert execution.owned_by_nobody and execution.to_json()["status"] == "input_required"


def test_only_moves_lua_writes_a_status() -> None:
    """No script sets `status` but through moves.lua (move, to_queued), and none names a
    local after a function it defines (a shadowed `parked` once broke tick.lua)."""
    lua = ROOT / "agent_server" / "store" / "redis" / "lua"
    moves = (lua / "moves.lua").read_text()
    defined = re.findall(r"^local function (\w+)", moves, re.MULTILINE)
    assert {"move", "to_queued", "created", "parked", "unowned", "held"} <= set(defined)
    for script in lua.glob("*.lua"):
        if script.name == "moves.lua":
            continue
        text = script.read_text()
        write = re.search(r"'HSET',[^)]*'status'", text)
        assert write is None, f"{script.name} writes status outside moves.lua: {write.group(0)}"
        for name in defined:
            shadow = re.search(rf"^\s*local {name}\b", text, re.MULTILINE)
            assert shadow is None, f"{script.name}: {shadow.group(0)} shadows moves.lua's"


#: Where a status's name is a string literal on purpose: another thing of the same name.
NOT_STATUSES = {
    ("agent_server/store/redis/keys.py", "running"): "the Redis key `running` (key layout)",
    ("agent_server/store/redis/keys.py", "queued"): "the Redis channel `queued`",
    ("agent_server/client/models.py", "cancelled"): "a session release's field",
    ("agent_server/http/openapi.py", "cancelled"): "a session release's field",
    ("agent_server/runtime/sessions.py", "cancelled"): "a session release's field",
    ("agent_server/runtime/metric_series.py", "cancelled"): "the shutdown report's outcome",
    ("agent_server/process/drill/report.py", "cancelled"): "a column of the drill's table",
    ("agent_server/process/drill/report.py", "queued"): "a column of the drill's table",
    ("agent_server/process/drill/verdict.py", "lost"): "the drill's outcome of that name",
    ("agent_server/http/mcp_tools.py", "input_required"): "an MCP task's status",
    ("agent_server/http/mcp_tools.py", "failed"): "an MCP task's status",
    ("agent_server/http/mcp_tools.py", "cancelled"): "an MCP task's status",
    ("agent_server/http/mcp_requests.py", "input_required"): "an MCP result's resultType",
}


def test_status_names_are_literals_only_in_the_table() -> None:
    """A status's name written as a string in the package (docstrings aside) outside
    status.py is a second declaration of it; each exception above names what else it is."""
    names = {s.value for s in ExecutionStatus}
    found: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted((ROOT / "agent_server").rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        if module == "agent_server/model/status.py":
            continue
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and node.value in names
                and id(node) not in docstrings
            ):
                if (module, node.value) in NOT_STATUSES:
                    used.add((module, node.value))
                else:
                    found.append(f"{module}:{node.lineno}: {node.value!r}")
    assert found == [], "use agent_server.model.status instead"
    assert used == set(NOT_STATUSES), "an exception above is no longer needed"


def test_only_moves_lua_calls_the_generated_moves() -> None:
    """codes.lua's MOVES writes a status with no check of its own caller: move() (and
    created()'s CREATES) in moves.lua are its only callers, so every script's move goes
    through moves.lua's error for a move the table lacks."""
    lua = ROOT / "agent_server" / "store" / "redis" / "lua"
    assert "MOVES(" in (lua / "moves.lua").read_text()
    for script in lua.glob("*.lua"):
        if script.name != "moves.lua":
            assert "MOVES(" not in script.read_text(), script.name
    codes = scripts.load("codes")
    assert codes.count("redis.call(") == codes.count("redis.call('HSET', rec, 'status', target,")
