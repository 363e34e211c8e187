"""`agent-server drill APP --next NEXT_APP`: what each resumable reasoner's handed-off work
becomes when NEXT_APP's code claims it (docs/durable.md, "Versions").

Both apps' declarations are read by importing each in a child interpreter
(`python -m agent_server.process.drill.declared`), as `agent-server run` imports APP: two
versions of one module can be compared, and each reads `AGENT_SERVER_VERSION` from its own
environment (`--next-version` sets NEXT_APP's, as its deployment would). The rule applied is
the claim's own (`VersionRule.reads`, claim.lua): same version or `compatible` resumes,
`migrate` resumes with its result; otherwise the work waits for a replica of its
checkpoint's version while a live, admitting one advertises it, then `on_version_change`
restarts or fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent_server.model.versions import VERSION_VARIABLE, OnVersionChange, Rule, shown
from agent_server.model.versions import version_rule as make_rule
from agent_server.process.drill.plan import DrillArgs, DrillError

#: Seconds an app's import may take in its child (as the drill's own child may to listen).
IMPORT_TIMEOUT = 30.0


class Change(enum.Enum):
    """What handed-off work of a reasoner becomes on the next version's code."""

    SAME = "same version"  # resumes
    COMPATIBLE = "compatible"  # resumes: the next version declares it reads this one
    MIGRATE = "migrate"  # resumes with the next version's `migrate` result
    RESTART = "restart"  # from the start: the work done is redone
    FAIL = "fail"  # failed with VersionMismatch: a fault
    GONE = "gone"  # the next version has no such reasoner (or not resumable): a fault


@dataclass(frozen=True)
class Declared:
    """One reasoner as an app declares it (what `declared.py` prints)."""

    resumable: bool
    retry: bool
    version: str | None
    compatible: tuple[str | None, ...]
    migrates: bool
    on_version_change: str

    @classmethod
    def parse(cls, data: Mapping[str, Any]) -> Declared:
        return cls(
            bool(data["resumable"]),
            bool(data["retry"]),
            data["version"],
            tuple(data["compatible"]),
            bool(data["migrates"]),
            str(data["on_version_change"]),
        )


@dataclass(frozen=True)
class NextVersion:
    """One resumable reasoner of APP, met by NEXT_APP's reasoner of the same name."""

    change: Change
    from_version: str | None
    to_version: str | None  # None when gone
    #: Before `change`: it waits for a replica of `from_version` while one is alive and
    #: admitting (the old pods of a rolling update with maxSurge).
    waits: bool
    said: str
    fault: str | None

    def cell(self) -> str:
        """Its table cell."""
        return f"waits, then {self.change.value}" if self.waits else self.change.value

    def as_dict(self) -> dict[str, Any]:
        return {
            "change": self.change.value,
            "from_version": self.from_version,
            "to_version": self.to_version,
            "waits": self.waits,
            "said": self.said,
        }


def compare(name: str, old: Declared, new: Declared | None, next_app: str) -> NextVersion:
    """What a checkpoint of `old`'s version becomes when `new`'s code claims it."""
    if new is None or not (new.resumable or new.retry):
        why = f"has no reasoner {name!r}" if new is None else f"does not resume {name!r}"
        said = f"gone: {next_app} {why}: handed-off work fails when a replica of it claims it"
        return NextVersion(
            Change.GONE, old.version, None, False, said, f"{next_app} {why}: handed-off work fails"
        )
    rule = make_rule(
        None,
        new.version,
        new.compatible,
        (lambda state, version: state) if new.migrates else None,
        new.on_version_change,
    )
    pair = f"{shown(old.version)} -> {shown(new.version)}"
    met = rule.reads(old.version)
    if met is Rule.SAME:
        return NextVersion(
            Change.SAME, old.version, new.version, False,
            f"same version ({shown(new.version)}): resumes", None,
        )  # fmt: skip
    if met is Rule.COMPATIBLE:
        said = f"{pair}: compatible: resumes"
        return NextVersion(Change.COMPATIBLE, old.version, new.version, False, said, None)
    if met is Rule.MIGRATE:
        said = f"{pair}: migrate: resumes with its result (a migration that raises fails it)"
        return NextVersion(Change.MIGRATE, old.version, new.version, False, said, None)
    waits = f"{pair}: waits for a replica of {shown(old.version)} while one runs, then "
    if rule.on_version_change is OnVersionChange.RESTART:
        said = waits + "restart (from the start: the work done is redone)"
        return NextVersion(Change.RESTART, old.version, new.version, True, said, None)
    return NextVersion(
        Change.FAIL, old.version, new.version, True,
        waits + "fail (VersionMismatch)",
        f"handed-off work fails with VersionMismatch on {next_app} ({pair}: neither "
        f"compatible nor migrated) once no replica of {shown(old.version)} runs",
    )  # fmt: skip


class NextReading:
    """Both apps' declarations, each imported in a child of its own (`declared.py`), started
    at once and beside the drill's own child: their imports overlap its start."""

    def __init__(self, args: DrillArgs) -> None:
        assert args.next_app is not None
        self.args = args
        self.next_app = args.next_app
        self._children: list[_Import] = []

    async def start(self) -> None:
        """Both imports begin (`--next-version` in NEXT_APP's environment)."""
        app_dir, version = self.args.settings.app_dir, self.args.next_version
        env = {} if version is None else {VERSION_VARIABLE: version}
        self._children = [
            await _Import.start("APP", self.args.app, app_dir, {}),
            await _Import.start("--next", self.next_app, app_dir, env),
        ]

    async def result(self) -> dict[str, NextVersion]:
        """Per resumable reasoner of APP: what NEXT_APP makes of its handed-off work.
        DrillError (exit 2) when an app cannot be imported."""
        old, new = [await child.result() for child in self._children]
        return {
            name: compare(name, declared, new.get(name), self.next_app)
            for name, declared in old.items()
            if declared.resumable
        }

    async def close(self) -> None:
        for child in self._children:
            await child.close()


class _Import:
    """One app imported in a child that prints its reasoners' declarations."""

    def __init__(self, label: str, proc: asyncio.subprocess.Process) -> None:
        self.label = label
        self.proc = proc

    @classmethod
    async def start(
        cls, role: str, app: str | None, app_dir: str, env: Mapping[str, str]
    ) -> _Import:
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "agent_server.process.drill.declared", app or "", app_dir),
            env={**os.environ, **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        return cls(f"{role} {app!r}" if app is not None else "the demo agent", proc)

    async def close(self) -> None:
        """Ended if it still runs (the drill went wrong before it was read)."""
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()

    async def result(self) -> dict[str, Declared]:
        try:
            out, err = await asyncio.wait_for(self.proc.communicate(), IMPORT_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(f"importing {self.label} took over {IMPORT_TIMEOUT:g} s") from None
        lines = out.decode(errors="replace").strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            why = err.decode(errors="replace").strip() or "its import failed"
            raise DrillError(f"cannot load {self.label}: {why}")
        return {name: Declared.parse(data) for name, data in json.loads(lines[-1]).items()}
