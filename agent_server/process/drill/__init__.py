"""`agent-server drill [APP]`: rehearse a shutdown before deploying.

The modules, in the order a drill runs: `plan` (the arguments, the reasoners and their
inputs), `run` (the child, through the package's launcher), `follow` (the starts, and each
execution read on through the shutdown), `log` (the child's JSON log), `verdict` (each
execution's outcome, each reasoner's faults) and `report` (the table or the JSON). With
`--next NEXT_APP`, `versions` reads both apps' version declarations while the child starts
(each imported in a child of its own, `declared`) and says what the next version makes of
each resumable reasoner's handed-off work (docs/durable.md, "Versions").

APP runs as a real `agent-server run` child on a free loopback port with the shutdown flags
given; background executions of its reasoners are started; SIGTERM follows; the child's exit
is awaited (bounded by its grace period and a margin); then each reasoner is judged: did its
work finish in the drain, settle once cancelled, swallow the cancellation (abandoned), or
block the event loop?

How the outcome of each execution is learnt. With the memory store the records die with
the child, so they are read while it shuts down: every execution is long-polled (`GET
/executions/{id}?wait=`) from before the signal; the listener stays open until the report,
so each long-poll answers with the record as it ended, the moment it ends. What a record
cannot say is read from the child's log (`--log-format json`): the shutdown report (when
the cancellation came, the phases), the `abandoned` WARNING lines (an abandoned execution
reads `cancelled` like a settled one) and the loop-stall lines (what held the loop). Both
sources are ones the server keeps anyway, for its clients and its operators; nothing is
added to the server for the drill but fields on lines it already logs. Scraping `/metrics`
instead would race the listener's close, and its counters are not per execution.

Every status of `ExecutionStatus` is followed and judged by an exhaustive match (a new
status is a type error in `follow_by` and `outcome`, never a guess): `queued` and `running`
are long-polled (the server waits through them); `input_required` is answered by the
long-poll at once, so its event stream is read instead, which ends with the record as it
ended; a request that brings no change ends the following, and MAX_FOLLOW_REQUESTS bounds
it whatever the server answers. Where the last record stood is judged by the store's kind:
with the memory store queued work ends cancelled unrun at the shutdown and a wait for input
is running work (drained, then cancelled); with a shared store queued work is left for
another replica, and a resumable wait is parked.
"""

from agent_server.process.drill.follow import (
    MAX_FOLLOW_REQUESTS,
    START_TIMEOUT,
    Follow,
    Started,
    follow_by,
    follow_one,
    status_of,
)
from agent_server.process.drill.log import ChildLog, Stall
from agent_server.process.drill.plan import (
    SHUTDOWN_FIELDS,
    DrillArgs,
    DrillError,
    choose,
    example_input,
    parse_input,
)
from agent_server.process.drill.report import drill_and_print, table
from agent_server.process.drill.run import EXIT_MARGIN, STARTUP_TIMEOUT, Child, Run, run_drill
from agent_server.process.drill.verdict import (
    STALL_FAULT,
    Outcome,
    ReasonerVerdict,
    Verdict,
    judge,
    outcome,
)

__all__ = [
    "EXIT_MARGIN",
    "MAX_FOLLOW_REQUESTS",
    "SHUTDOWN_FIELDS",
    "STALL_FAULT",
    "STARTUP_TIMEOUT",
    "START_TIMEOUT",
    "Child",
    "ChildLog",
    "DrillArgs",
    "DrillError",
    "Follow",
    "Outcome",
    "ReasonerVerdict",
    "Run",
    "Stall",
    "Started",
    "Verdict",
    "choose",
    "drill_and_print",
    "example_input",
    "follow_by",
    "follow_one",
    "judge",
    "outcome",
    "parse_input",
    "run_drill",
    "status_of",
    "table",
]
