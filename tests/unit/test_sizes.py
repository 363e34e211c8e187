"""The package stays readable in pieces: no module over MODULE_LINES lines, no function over
FUNCTION_LINES, no class with more than PUBLIC_METHODS public methods of its own. A part
that outgrows one is split by what it does (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import agent_server

MODULE_LINES = 600
FUNCTION_LINES = 80
PUBLIC_METHODS = 30


def oversized(root: Path) -> list[str]:
    """Each module, function and class under `root` past its bound, named with its size."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        where = path.relative_to(root.parent)
        if (lines := len(text.splitlines())) > MODULE_LINES:
            found.append(f"{where}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(where))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > FUNCTION_LINES:
                    found.append(f"{where}: {node.name} is {length} lines")
            elif isinstance(node, ast.ClassDef):
                public = [
                    each.name
                    for each in node.body
                    if isinstance(each, ast.FunctionDef | ast.AsyncFunctionDef)
                    and not each.name.startswith("_")
                ]
                if len(public) > PUBLIC_METHODS:
                    found.append(f"{where}: {node.name} has {len(public)} public methods")
    return found


def test_no_module_function_or_class_is_past_its_bound() -> None:
    package = Path(agent_server.__file__).parent
    assert len(list(package.rglob("*.py"))) > 30
    assert oversized(package) == []


def test_the_size_check_finds_each_kind(tmp_path: Path) -> None:
    root = tmp_path / "agent_server"
    root.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(FUNCTION_LINES))
    methods = "\n".join(f"    def m{i}(self) -> None: ..." for i in range(PUBLIC_METHODS + 1))
    (root / "long.py").write_text(f"def f() -> None:\n{body}\n" + "\n" * MODULE_LINES)
    (root / "wide.py").write_text(f"class C:\n{methods}\n")
    assert oversized(root) == [
        f"agent_server/long.py: {FUNCTION_LINES + 1 + MODULE_LINES} lines",
        f"agent_server/long.py: f is {FUNCTION_LINES + 1} lines",
        f"agent_server/wide.py: C has {PUBLIC_METHODS + 1} public methods",
    ]
