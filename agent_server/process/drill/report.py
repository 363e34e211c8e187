"""The drill as its user reads it: a table of the verdict, or one JSON object."""

from __future__ import annotations

import asyncio
import json

from agent_server.model.counts import counted
from agent_server.process.drill.plan import DrillArgs
from agent_server.process.drill.run import run_drill
from agent_server.process.drill.verdict import ReasonerVerdict, Verdict, judge

COLUMNS = (
    "reasoner", "started", "finished", "cancelled", "settled in", "abandoned", "handed off",
    "parked", "waiting", "queued", "longest stall", "verdict",
)  # fmt: skip
#: With `--next`: what the next version makes of handed-off work, before the verdict.
NEXT_COLUMN = "next version"


def _row(verdict: ReasonerVerdict, with_next: bool) -> list[str]:
    settle = "-" if verdict.settle_seconds is None else f"{verdict.settle_seconds:.2f} s"
    if verdict.faults:
        said = "FAULT"
    elif verdict.failed:
        said = f"ok ({verdict.failed} failed on its own)"
    else:
        said = "ok"
    return [
        verdict.name,
        str(verdict.started),
        str(verdict.finished),
        str(verdict.cancelled),
        settle,
        str(verdict.abandoned),
        str(verdict.handed_off),
        str(verdict.parked),
        str(verdict.waiting),
        str(verdict.queued),
        f"{verdict.longest_stall:.3f} s",
        *([verdict.next_version.cell() if verdict.next_version else "-"] if with_next else []),
        said,
    ]


def table(verdict: Verdict) -> str:
    """The drill as text: a line saying what ran, a row per reasoner, the shutdown, the
    faults (if any) and the verdict."""
    with_next = verdict.next_app is not None
    columns = [*COLUMNS[:-1], *([NEXT_COLUMN] if with_next else []), COLUMNS[-1]]
    rows = [columns, *(_row(r, with_next) for r in verdict.reasoners)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
    lines = [
        f"drill of {verdict.app!r}: {counted(len(verdict.reasoners), 'reasoner')} x "
        f"{counted(verdict.executions, 'execution')}, "
        f"SIGTERM after {verdict.signal_after:g} s",
        "",
    ]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    if with_next:
        lines += ["", f"next version ({verdict.next_app}), for work handed off to it:"]
        named = [(r.name, r.next_version) for r in verdict.reasoners if r.next_version]
        width = max((len(name) for name, _ in named), default=0)
        lines += [f"  {name.ljust(width)}  {met.said}" for name, met in named]
        if not named:
            lines.append("  (no resumable reasoner drilled: nothing is handed off)")
    lines.append("")
    code = "killed" if verdict.exit_code is None else f"exit code {verdict.exit_code}"
    within = "within" if verdict.within_grace else "NOT within"
    lines.append(
        f"shutdown: {verdict.shutdown_seconds:.2f} s, {within} the grace period "
        f"({verdict.grace_period:g} s); {code}"
    )
    if verdict.faults:
        lines.append("faults:")
        lines += [f"  {fault}" for fault in verdict.faults]
        lines.append("verdict: NOT shutdown-safe")
    else:
        lines.append("verdict: shutdown-safe")
    return "\n".join(lines)


def drill_and_print(args: DrillArgs, *, as_json: bool) -> int:
    """Run the drill, print it, and return its exit code (DrillError is the caller's)."""
    run = asyncio.run(run_drill(args))
    verdict = judge(run, args.executions, args.signal_after)
    if as_json:
        print(json.dumps(verdict.as_dict(), sort_keys=False))
    else:
        print(table(verdict))
    return verdict.code
