"""What the replica running an execution holds beside its record: waiters, clocks, its event
log. Never stored: a copy read from a store starts with these at their initial values."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import TypeAdapter

from agent_server.identity.principal import Principal
from agent_server.model import asks
from agent_server.model.events import EventLog
from agent_server.model.status import CancelReason
from agent_server.model.versions import Rule

#: Each slot of the live state and its value in a new execution (a Python expression, in
#: `Execution.__init__`'s namespace); `restore` sets the clocks and `cancel_reason` itself.
INITIAL: dict[str, str] = {
    "cancel_reason": "None",
    "started_monotonic": "monotonic()",
    "finished_monotonic": "None",
    "answer_waiter": "None",
    "input_adapter": "None",
    "asking": "0",
    "ledger": "None",
    "resumable": "False",
    "session_policy": "None",
    "displaced": "()",
    "moved_away": "False",
    "events": "None",
    "_done": "None",
    "recorded": "None",
    "principal": "None",
    "version_rule": "NO_RULE",
    "take": "''",
    "moves": "None",
}


class LiveState:
    """The live attempt's slots: a base of `Execution`, which adds the record's and the
    methods that move both."""

    __slots__ = tuple(INITIAL)

    #: Why a cancel was asked for (the record's `status_reason` once it ends so).
    cancel_reason: CancelReason | None
    #: The clock readings its duration is measured with while it runs here.
    started_monotonic: float
    finished_monotonic: float | None
    #: While `input_required`, on the replica whose task waits in `ctx.ask`: the future its
    #: answer completes and the type the answer is validated against (None: any JSON).
    answer_waiter: asyncio.Future[Any] | None
    input_adapter: TypeAdapter[Any] | None
    #: The id of the request `ctx.ask` waits for here (0: none), set before the store
    #: records it: an answer may come back before the store's reply does.
    asking: int
    #: The memory store's record of its requests (identity, kept answer), None until it
    #: first asks and once it ends; a shared store keeps them in the record instead.
    ledger: asks.Ledger | None
    #: The memory store's history of its moves (status.py `KEPT_MOVES`, `kept_move`), None
    #: until its first; a shared store keeps it in the record instead (Redis's `moves`
    #: field, Postgres's `moves` column), written where the store moves it.
    moves: list[list[Any]] | None
    #: Resumable: its body and checkpoints are kept, and a later attempt may run it.
    resumable: bool
    #: Its start's session policy when not `parallel` (agent_server.model.scheduling), and
    #: the earlier executions of its session the store found it must interrupt.
    session_policy: str | None
    displaced: tuple[str, ...]
    #: Queued where another replica may take it (handed off, or retried through a shared
    #: store): this object no longer follows it, and its waiters read the store.
    moved_away: bool
    #: Its live events (agent_server.model.events), made when first needed.
    events: EventLog | None
    _done: asyncio.Event | None
    #: With a shared store, done once its end is written there (True) or refused (False):
    #: a client is told a terminal status only once it is recorded.
    recorded: asyncio.Future[bool] | None
    #: The principal whose request started it, on the replica that admitted it (scopes and
    #: claims included); a later attempt elsewhere knows only the record's owner and tenant.
    principal: Principal | None
    #: How the claim that took it met its checkpoint's version (NONE: no checkpoint, or not
    #: claimed): the taker migrates or fails it by it (docs/durable.md, "Versions").
    version_rule: Rule
    #: The token of the claim that took it here ('' for none): its begin mark is fenced by it.
    take: str
