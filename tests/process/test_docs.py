"""The documentation holds together: every relative link of README.md and docs/*.md leads to
a file that exists (and, with a `#fragment`, to a heading of that file), and the README
keeps its two set-up commands verbatim (`.ci/run` runs the second one); docs/settings.md's
table names every flag, docs/metrics.md's every metric a server serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SET_UP = (
    "pip install -e . && agent-server run",
    'pip install -e ".[test]" && python -m pytest -q',
)
#: `[text](target)`, outside code: fenced blocks and inline code are removed first.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for heading in re.findall(r"^#+ +(.+?) *$", FENCE.sub("", page.read_text()), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_ci_runs_the_readme_test_command_in_a_fresh_venv() -> None:
    """CI proves the README's test command on a venv resolved from scratch: a machine's own
    packages can hide a dependency range the suite does not pass on."""
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [line for line in ci.splitlines() if line and not line.startswith("#")]
    assert lines[-1] == SET_UP[-1], lines[-1]
    made = ci.index('python3 -m venv "$venv"')
    assert ci.index('rm -rf "$venv"') < made < ci.index('source "$venv/bin/activate"')
    assert made < ci.index("ruff check") < ci.index(SET_UP[-1])


def test_the_pages_exist() -> None:
    assert (ROOT / "docs" / "architecture.md") in PAGES
    assert len(PAGES) > 2


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(f"{target}: no heading #{fragment}")
    assert not broken, broken


def test_the_readme_keeps_its_set_up_commands_verbatim() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in SET_UP:
        assert f"```sh\n{command}\n```" in readme, command


def test_every_flag_of_run_is_named_in_the_settings_table() -> None:
    """docs/settings.md names every flag `agent-server run` takes (a flag left out of it
    was found twice: `--max-retained-bytes`, `--metrics-open`)."""
    from agent_server.process.cli_server import flag_name
    from agent_server.runtime.settings import Settings

    table = "\n".join(
        line
        for line in (ROOT / "docs" / "settings.md").read_text().splitlines()
        if line.startswith("|")
    )
    missing = [
        flag_name(field)
        for field in Settings.model_fields
        if f"`{flag_name(field)}`" not in table and f"`{flag_name(field)}` /" not in table
    ]
    assert missing == []


def test_every_metric_served_is_in_the_metrics_table(server_factory: Any) -> None:
    """docs/metrics.md's table names every family `/metrics` serves (read from a real
    server's TYPE lines): `agent_server_version_rules_total` was served and named nowhere."""
    server = server_factory("tests_app:agent")
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    assert "agent_server_executions_started_total" in served, text[:500]
    documented = set(
        re.findall(r"^\| `(agent_server_\w+)`", (ROOT / "docs" / "metrics.md").read_text(), re.M)
    )
    assert sorted(served - documented) == []
