"""The package's modules import one way: no cycle anywhere, TYPE_CHECKING imports included;
no module imports another's private name; and identity's modules are named once.

import-linter (`lint-imports`, pyproject.toml) checks the layers; a cycle between two modules
of one layer is what it lets through, and what this finds."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

import agent_server


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph("agent_server")
    assert len(graph.modules) > 30  # the package was read, not an empty graph
    assert _cycles(graph) == []


def test_the_checker_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]


def _private_imports(root: Path) -> list[str]:
    """`from agent_server... import _name` anywhere under `root`: a private name used by
    another module (each line as `path: module._name`)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(root.name):
                found += [
                    f"{path.relative_to(root.parent)}: {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    return found


def test_no_private_name_is_imported_by_another_module() -> None:
    package = Path(agent_server.__file__).parent
    assert len(list(package.rglob("*.py"))) > 30
    assert _private_imports(package) == []


def test_the_private_import_check_finds_one(tmp_path: Path) -> None:
    root = tmp_path / "agent_server"
    root.mkdir()
    (root / "a.py").write_text("def _hidden() -> None: ...\n")
    (root / "b.py").write_text("from agent_server.a import _hidden\nfrom agent_server import a\n")
    assert _private_imports(root) == ["agent_server/b.py: agent_server.a._hidden"]


#: File names every package may hold.
PACKAGE_FILES = frozenset({"__init__.py", "__main__.py"})


def _names_shared(root: Path, package: str) -> list[str]:
    """The module file names of `root/package` (its subpackages included) that a module
    elsewhere under `root` also has, each as `name: the other paths`. Scoped to one package:
    some names repeat across layers on purpose, one front's module and its service's (such
    as `schedules.py`, `sessions.py`, `executions.py`)."""
    inside = root / package
    own = {path.name for path in inside.rglob("*.py")} - PACKAGE_FILES
    elsewhere: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        if path.name in own and inside not in path.parents:
            elsewhere.setdefault(path.name, []).append(str(path.relative_to(root.parent)))
    return [f"{name}: {', '.join(paths)}" for name, paths in sorted(elsewhere.items())]


def test_no_module_of_identity_shares_its_name_with_another() -> None:
    package = Path(agent_server.__file__).parent
    assert {"principal.py", "tokens_file.py", "jwks.py"} <= {
        path.name for path in (package / "identity").glob("*.py")
    }
    assert _names_shared(package, "identity") == []


def test_the_name_check_finds_one(tmp_path: Path) -> None:
    root = tmp_path / "agent_server"
    for module in (
        "identity/__init__.py",
        "identity/tokens_file.py",
        "identity/jwks.py",
        "http/__init__.py",
        "http/tokens_file.py",
        "model/__init__.py",
    ):
        (root / module).parent.mkdir(parents=True, exist_ok=True)
        (root / module).write_text("")
    assert _names_shared(root, "identity") == ["tokens_file.py: agent_server/http/tokens_file.py"]
