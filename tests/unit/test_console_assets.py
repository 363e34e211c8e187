"""The console's files (agent_server/http/console_assets/) are what the route serves, all of
them and nothing else, shipped as package data; none writes markup from data or runs inline
(the browser tests, tests/process/test_console.py, check what the page does)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from agent_server.http.console_page import ASSETS, PAGE, ROOT

REPO = Path(__file__).resolve().parents[2]


def test_every_file_is_served_and_shipped() -> None:
    files = {path.name for path in ROOT.iterdir()}
    assert files == {*ASSETS, PAGE}
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    shipped = data["tool"]["setuptools"]["package-data"]["agent_server.http"]
    assert "console_assets/*" in shipped


def test_no_file_writes_markup_or_runs_inline() -> None:
    for name in ASSETS:
        text = (ROOT / name).read_text()
        for risky in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert risky not in text, (name, risky)
        assert "localStorage.set" not in text and "document.cookie" not in text, name
    page = (ROOT / PAGE).read_text()
    assert re.findall(r"<script(?![^>]*\bsrc=)", page) == []  # every script from a file
    assert "<style" not in page and " style=" not in page
    assert re.findall(r"\son[a-z]+\s*=", page) == []  # no inline handler
