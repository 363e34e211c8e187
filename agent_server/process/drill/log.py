"""The child's log (`--log-format json`), read once it ended: the shutdown report, the
abandoned and handed-off executions, and the stalls of its loop."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class Stall:
    """One stall of the loop from the child's log: its length and what held the loop."""

    seconds: float
    ended_at: float | None  # Unix time the loop turned again; None: it never did
    reasoner: str | None
    where: str | None  # "function at file:line"

    @property
    def described(self) -> str:
        length = f"{self.seconds:.2f} s"
        if self.ended_at is None:
            length = f"at least {length}"
        said = f"{length} in {self.where}" if self.where else length
        return said if self.ended_at is not None else f"{said}, until the process ended"


@dataclass
class ChildLog:
    """The child's stderr: its JSON lines, and the rest as text."""

    records: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> ChildLog:
        """The log of the whole stderr text."""
        log = cls()
        for line in text.splitlines():
            log.add(line)
        return log

    def add(self, line: str) -> None:
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                self.records.append(record)
                return
        if line.strip():
            self.text.append(line)

    def report(self) -> tuple[dict[str, Any], float] | None:
        """The shutdown report and the Unix time of the first signal, by the child's clock."""
        for record in self.records:
            report = record.get("report")
            if record.get("message") == "shutdown report" and isinstance(report, dict):
                logged = datetime.fromisoformat(str(record["timestamp"])).timestamp()
                return report, logged - float(report.get("duration_seconds", 0.0))
        return None

    def abandoned(self) -> dict[str, bool]:
        """Abandoned execution ids, each with whether it ran in a thread (a `def`)."""
        found = {
            str(record["abandoned_execution"]): bool(record.get("in_thread"))
            for record in self.records
            if "abandoned_execution" in record
        }
        for record in self.records:  # past the first lines, one line names the rest
            threads = set(record.get("in_threads") or ())
            for execution_id in record.get("abandoned_executions") or ():
                found[str(execution_id)] = execution_id in threads
        return found

    def handed_off(self) -> set[str]:
        """Execution ids whose attempt here was handed off at the drain deadline (a queued
        record does not say whether it ran before)."""
        return {
            str(record["execution_id"])
            for record in self.records
            if record.get("handed_off") is True and "execution_id" in record
        }

    def stalls(self, until: float | None = None) -> list[Stall]:
        """Every stall: those that ended (with their length), then any still going when
        the process ended at `until` (a WARNING without its end line)."""
        warned = [r for r in self.records if "blocked_seconds" in r]
        ended = [r for r in self.records if "stall_seconds" in r]
        found = [
            Stall(
                float(r["stall_seconds"]),
                unix_time(r.get("timestamp")),
                r.get("reasoner"),
                _where(r),
            )
            for r in ended
        ]
        for record in warned[len(ended) :]:
            seconds = float(record["blocked_seconds"])
            warned_at = unix_time(record.get("timestamp"))
            if until is not None and warned_at is not None:  # it lasted until the exit
                seconds = max(seconds, until - (warned_at - seconds))
            found.append(Stall(seconds, None, record.get("reasoner"), _where(record)))
        return found

    def lags(self) -> list[tuple[float, float]]:
        """The longest lags the sampler kept, (seconds, Unix time the loop turned again)."""
        for record in self.records:
            kept = record.get("longest_lags")
            if isinstance(kept, list):
                return [(float(seconds), float(at)) for seconds, at in kept]
        return []

    def last_words(self, lines: int = 3) -> str:
        """The last lines a failed start wrote: the one that says why."""
        shown = self.text[-lines:] or [str(r.get("message")) for r in self.records[-lines:]]
        return "\n".join(shown)


def unix_time(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def _where(record: Mapping[str, Any]) -> str | None:
    if "function" not in record:
        return None
    path = str(record.get("file", "?"))
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(path)
        path = path if relative.startswith("..") else relative
    return f"{record['function']} at {path}:{record.get('line', '?')}"
