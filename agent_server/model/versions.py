"""Which code may resume a checkpoint: a reasoner's version and what it declares it reads.

A rollout moves executions from old code to new (a hand-off, a retry after a death). New
code never silently resumes a checkpoint it cannot read: the claimer compares the version
that wrote the checkpoint with its own (docs/durable.md, "Versions"). Versions are opaque
strings, unordered; unversioned (None) is a version of its own.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

#: `migrate(state, from_version) -> state`: a checkpoint another version wrote, read anew.
#: Where an Agent without `version=` reads its version.
VERSION_VARIABLE = "AGENT_SERVER_VERSION"

Migrate = Callable[[Any, "str | None"], Any]


class OnVersionChange(enum.Enum):
    """What a checkpoint no replica of its version is left to resume becomes."""

    #: From the start, checkpoint set aside, attempt + 1.
    RESTART = "restart"
    #: `failed` with `VersionMismatch`, naming both versions (the default).
    FAIL = "fail"


class Rule(enum.Enum):
    """How a claimed attempt met its checkpoint's version: the label of
    `agent_server_version_rules_total`, and what claim.lua answers (`rule`)."""

    #: No checkpoint (a first run, a delayed start, a hand-off before the first one): it has
    #: nothing to misread and runs on any version. Not counted.
    NONE = ""
    SAME = "same"
    COMPATIBLE = "compatible"
    MIGRATE = "migrate"
    #: The migration raised: the execution failed with its exception.
    MIGRATE_FAILED = "migrate_failed"
    #: Left queued for a live replica of its checkpoint's version (claim.lua).
    WAIT = "wait"
    RESTART = "restart"
    FAIL = "fail"


class VersionMismatch(Exception):
    """A checkpoint written by a version this code does not read, and no replica of that
    version left to resume it (`on_version_change="fail"`)."""

    def __init__(self, reasoner: str, checkpoint_version: str | None, version: str | None):
        self.checkpoint_version = checkpoint_version
        self.version = version
        super().__init__(
            f"reasoner {reasoner!r}: the checkpoint was written by version "
            f"{shown(checkpoint_version)}, which version {shown(version)} does not declare "
            "it can read (compatible= or migrate=), and no replica of that version is left"
        )


def shown(version: str | None) -> str:
    return "(unversioned)" if version is None else repr(version)


@dataclass(frozen=True)
class VersionRule:
    """A reasoner's version on this replica and what it resumes besides its own."""

    version: str | None
    compatible: frozenset[str | None] = frozenset()
    migrate: Migrate | None = None
    on_version_change: OnVersionChange = OnVersionChange.FAIL

    def reads(self, checkpoint_version: str | None) -> Rule:
        """Same or compatible resumes; a migration resumes with its result; else WAIT (the
        store decides between waiting and `on_version_change`, knowing who is alive)."""
        if checkpoint_version == self.version:
            return Rule.SAME
        if checkpoint_version in self.compatible:
            return Rule.COMPATIBLE
        if self.migrate is not None:
            return Rule.MIGRATE
        return Rule.WAIT


def advert(rules: dict[str, VersionRule]) -> str:
    """What a replica tells the store (claim.lua reads it): per reasoner its version ('' for
    unversioned), the versions it reads ('' for unversioned), whether it migrates, and
    what it does when none of its checkpoint's version is left."""
    return json.dumps(
        {
            name: [
                _text(rule.version),
                sorted(_text(v) for v in rule.compatible),
                1 if rule.migrate is not None else 0,
                rule.on_version_change.value,
            ]
            for name, rule in sorted(rules.items())
        },
        separators=(",", ":"),
    )


def _text(version: str | None) -> str:
    return "" if version is None else version


def version_rule(
    agent_version: str | None,
    version: str | None,
    compatible: Iterable[str | None],
    migrate: Migrate | None,
    on_version_change: str | OnVersionChange,
) -> VersionRule:
    """The reasoner's own `version=` wins over the agent's. Raises ValueError for a
    declaration that cannot mean anything (an empty version, a rule that is not one)."""
    for value in (agent_version, version, *compatible):
        if value is not None and (not isinstance(value, str) or not value or len(value) > 200):
            raise ValueError(
                f"a version is a non-empty string of at most 200 characters: {value!r}"
            )
    if migrate is not None and not callable(migrate):
        raise ValueError("migrate= takes a function (state, from_version) -> state")
    try:
        change = OnVersionChange(on_version_change)
    except ValueError:
        raise ValueError('on_version_change is "restart" or "fail"') from None
    mine = version if version is not None else agent_version
    return VersionRule(mine, frozenset(compatible) - {mine}, migrate, change)
