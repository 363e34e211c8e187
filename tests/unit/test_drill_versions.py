"""`agent-server drill --next`'s comparison (drill/versions.py `compare`) applies the claim's
rule to two declarations: unversioned is a version of its own, `compatible=(None,)` reads
it, a reasoner's own version is compared as given, and a next version that does not resume
the reasoner fails its handed-off work like one that lacks it."""

from __future__ import annotations

import pytest

from agent_server.process.drill.versions import Change, Declared, compare


def declared(
    version: str | None,
    compatible: tuple[str | None, ...] = (),
    migrates: bool = False,
    on_version_change: str = "fail",
    resumable: bool = True,
    retry: bool = False,
) -> Declared:
    return Declared(resumable, retry, version, compatible, migrates, on_version_change)


@pytest.mark.parametrize(
    ("old", "new", "change", "waits"),
    [
        (declared(None), declared(None), Change.SAME, False),
        (declared("v1"), declared("v1"), Change.SAME, False),
        (declared(None), declared("v2"), Change.FAIL, True),  # unversioned: its own version
        (declared(None), declared("v2", compatible=(None,)), Change.COMPATIBLE, False),
        (declared("v1"), declared(None, compatible=("v1",)), Change.COMPATIBLE, False),
        (declared("v2"), declared("v1", migrates=True), Change.MIGRATE, False),  # a rollback
        (declared("v1"), declared("v2", compatible=("v0",), migrates=True), Change.MIGRATE, False),
        (declared("v1"), declared("v2", on_version_change="restart"), Change.RESTART, True),
        (declared("v1"), declared("v2", compatible=("v10",)), Change.FAIL, True),  # unordered
        (declared("v1"), declared("v1", resumable=False), Change.GONE, False),
        # As the taker: a later attempt of a reasoner with a RetryPolicy is not refused.
        (declared("v1"), declared("v1", resumable=False, retry=True), Change.SAME, False),
    ],
)
def test_each_pair_meets_the_claims_rule(
    old: Declared, new: Declared, change: Change, waits: bool
) -> None:
    met = compare("job", old, new, "next:agent")
    assert (met.change, met.waits) == (change, waits)
    assert (met.fault is not None) == (change in (Change.FAIL, Change.GONE))


def test_a_missing_reasoner_is_gone_and_a_fault() -> None:
    met = compare("job", declared("v1"), None, "next:agent")
    assert (met.change, met.to_version) == (Change.GONE, None)
    assert met.fault == "next:agent has no reasoner 'job': handed-off work fails"


def test_the_line_names_both_versions_and_the_version_waited_for() -> None:
    met = compare("job", declared(None), declared("v2"), "next:agent")
    assert met.said == (
        "(unversioned) -> 'v2': waits for a replica of (unversioned) while one runs, then "
        "fail (VersionMismatch)"
    )
    assert met.cell() == "waits, then fail"
