"""The names of one agent's keys and channels, and the KEYS each script takes, in one place.

Every name carries the hash tag `{agent-server:<agent>}`, so every key of one agent is in
one Redis Cluster slot and a script may touch any of them (docs/replicas.md#key-layout).
A script is given the keys it touches as KEYS; the keys of an id it learns only inside Lua
(walking an index, a set or the queue) it names from the tagged prefix, KEYS[1] of the
scripts that include records.lua. The order of each tuple here is its script's contract.
"""

from __future__ import annotations

from collections.abc import Iterable


class Keys:
    """Every key and channel of one agent's store is named here."""

    __slots__ = (
        "acked",
        "all",
        "ckeys",
        "ends",
        "events",
        "finished",
        "judged",
        "libraries",
        "parked",
        "prefix",
        "queue",
        "queued",
        "records",
        "renewals",
        "replicas",
        "running",
        "scheduled",
        "script",
        "sizes",
        "states",
        "tag",
        "versions",
        "vqs",
        "webhook_bodies",
        "webhooks",
    )

    def __init__(self, agent_name: str) -> None:
        self.tag = f"{{agent-server:{agent_name}}}"
        self.prefix = self.tag + ":"
        prefix = self.prefix
        self.all = prefix + "all"
        self.running = prefix + "running"
        self.finished = prefix + "finished"
        self.sizes = prefix + "sizes"
        self.queue = prefix + "queue"
        #: Parked executions (waiting for input, owned by nobody), scored by when their
        #: request expires.
        self.parked = prefix + "parked"
        #: Queued executions waiting for a time, scored by when they are due (ms, Redis's
        #: clock): delayed starts and retries after their backoff.
        self.scheduled = prefix + "scheduled"
        #: Concurrency keys with work waiting for a slot, scored by when each last got one
        #: (us); each key's queue is `cq:{key}` and its slots' holders `cslots:{key}`; those
        #: whose work may go on now are `cready` (named from the prefix, records.lua).
        self.ckeys = prefix + "ckeys"
        self.replicas = prefix + "replicas"
        self.renewals = prefix + "renewals"
        #: Each live replica's versions (replica -> versions.py `advert`), written by its
        #: renewal while it admits work; and the version queues holding work that waits for
        #: a replica of its checkpoint's version (`vq:{reasoner}\x1f{version}`) or for one
        #: that serves its reasoner at all (`rq:{reasoner}`), named from the prefix; claim.lua.
        self.versions = prefix + "versions"
        #: Each replica's description of itself for `GET /replicas` (replica -> JSON),
        #: written with its renewal; the reader keeps the live ones' (`replicas`).
        self.states = prefix + "states"
        #: The scripts' function libraries this agent's replicas loaded (name -> when last,
        #: Redis ms), for deleting those of versions gone (libraries.py).
        self.libraries = prefix + "libraries"
        self.vqs = prefix + "vqs"
        #: Webhook deliveries owed (id -> when due, Redis ms) and their bodies (id -> JSON):
        #: written by the script of the move each reports (lua/webhooks.lua).
        self.webhooks = prefix + "webhooks"
        self.webhook_bodies = prefix + "webhook_bodies"
        #: Channels (they take the tag too): ends written, ids with new events, ids queued.
        self.ends = prefix + "ends"
        self.events = prefix + "events"
        self.queued = prefix + "queued"
        #: Published (to nobody) before each `WAIT` of a told write under Sentinel: the
        #: connection's last write is then the newest, and a replica that has it has all.
        self.acked = prefix + "acked"
        #: KEYS[1..6] of every script that includes records.lua.
        self.records: tuple[str, ...] = (
            prefix,
            self.all,
            self.running,
            self.finished,
            self.sizes,
            self.queue,
        )
        #: KEYS[1..8] of every script that includes judge.lua.
        self.judged: tuple[str, ...] = (*self.records, self.replicas, self.renewals)

        # -- one key each ----------------------------------------------------------------------

        #: The KEYS of each script, in its contract's order.
        self.script = ScriptKeys(self)

    def record(self, execution_id: str) -> str:
        return f"{self.prefix}x:{execution_id}"

    def stream(self, execution_id: str) -> str:
        """An execution's events."""
        return f"{self.prefix}ev:{execution_id}"

    def session(self, name: str) -> str:
        """A session's index; `name` is the session id scoped to its tenant (names.py)."""
        return f"{self.prefix}session:{name}"

    def tenant(self, tenant: str) -> str:
        """A tenant's index of its executions, as `all` is everyone's (records.lua)."""
        return f"{self.prefix}tenant:{tenant}"

    def owned(self, replica: str) -> str:
        return f"{self.prefix}owned:{replica}"

    def releasing(self, session_id: str) -> str:
        return f"{self.prefix}releasing:{session_id}"

    def released(self, release_id: str) -> str:
        return f"{self.prefix}released:{release_id}"

    def idempotency(self, key: str) -> str:
        return f"{self.prefix}idem:{key}"

    def void(self, execution_id: str, take: str) -> str:
        """One create given up on (settle.lua): its id and its take's token."""
        return f"{self.prefix}void:{execution_id}:{take}"

    def cancel(self, replica: str) -> str:
        """The channel of cancel requests for one replica."""
        return f"{self.prefix}cancel:{replica}"

    # -- the KEYS of each script (lua/NAME.lua) --------------------------------------------


class ScriptKeys:
    """The KEYS each script takes, named from one agent's `Keys`: the order of each tuple is
    its script's contract (the opening of its file under lua/ says what each is)."""

    __slots__ = ("keys",)

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    def for_create(
        self, execution_id: str, session: str, owner: str, key: str, tenant: str, take: str
    ) -> tuple[str, ...]:
        """`session` and `key` are its tenant's names (names.py `scoped`); `tenant` '' for
        none; `take` the create's token."""
        return (
            *self.keys.judged,
            self.keys.record(execution_id),
            self.keys.void(execution_id, take),
            self.keys.idempotency(key),
            self.keys.session(session),
            self.keys.owned(owner),
            self.keys.releasing(session),
            self.keys.tenant(tenant),
        )

    def for_end(self, execution_id: str, owner: str) -> tuple[str, str, str]:
        """One end's keys; a run of ends written together follows `records` with each's."""
        return (
            self.keys.record(execution_id),
            self.keys.stream(execution_id),
            self.keys.owned(owner),
        )

    def for_ids(self, ids: Iterable[str]) -> list[str]:
        """`get`: each record and its stream."""
        keys = list(self.keys.judged)
        for execution_id in ids:
            keys.extend((self.keys.record(execution_id), self.keys.stream(execution_id)))
        return keys

    def for_settle(self, takes: Iterable[tuple[str, str]]) -> list[str]:
        """Per create (its id and its take's token): its record, stream and void."""
        keys = list(self.keys.judged)
        for execution_id, take in takes:
            keys.extend(
                (
                    self.keys.record(execution_id),
                    self.keys.stream(execution_id),
                    self.keys.void(execution_id, take),
                )
            )
        return keys

    def for_forget(self, execution_id: str) -> tuple[str, ...]:
        return *self.keys.judged, self.keys.record(execution_id), self.keys.stream(execution_id)

    def for_cancel_queued(self, execution_id: str) -> tuple[str, ...]:
        return (
            *self.keys.records,
            self.keys.record(execution_id),
            self.keys.stream(execution_id),
            self.keys.parked,
        )

    def for_tick(self) -> tuple[str, ...]:
        return *self.keys.judged, self.keys.parked, self.keys.versions, self.keys.vqs

    def for_claim(self, replica: str) -> tuple[str, ...]:
        return (
            *self.keys.records,
            self.keys.replicas,
            self.keys.owned(replica),
            self.keys.scheduled,
            self.keys.ckeys,
            self.keys.versions,
            self.keys.vqs,
        )

    def for_enqueue(
        self, execution_id: str, session: str, key: str, tenant: str
    ) -> tuple[str, ...]:
        return (
            *self.keys.judged,
            self.keys.record(execution_id),
            self.keys.idempotency(key),
            self.keys.session(session),
            self.keys.releasing(session),
            self.keys.scheduled,
            self.keys.ckeys,
            self.keys.tenant(tenant),
        )

    def for_list(self, index: str) -> tuple[str, ...]:
        return *self.keys.judged, index

    def for_owned(self, replica: str) -> tuple[str, ...]:
        return *self.keys.judged, self.keys.owned(replica)

    def for_checkpoint(self, execution_id: str) -> tuple[str]:
        return (self.keys.record(execution_id),)

    def for_begin(self, execution_id: str) -> tuple[str]:
        return (self.keys.record(execution_id),)

    def for_emit(self, execution_id: str) -> tuple[str, str]:
        return self.keys.record(execution_id), self.keys.stream(execution_id)

    def for_handoff(self, execution_id: str, owner: str) -> tuple[str, ...]:
        """Where the next attempt goes: the queue (a hand-off), or `scheduled` (a retry)."""
        return (
            self.keys.record(execution_id),
            self.keys.running,
            self.keys.owned(owner),
            self.keys.queue,
            self.keys.scheduled,
        )

    def for_cancel(self, execution_id: str) -> tuple[str, str]:
        """The record, and the prefix: its owner's `cancels:{owner}` and channel are named
        from it."""
        return self.keys.record(execution_id), self.keys.prefix

    def for_unclaim(self, execution_id: str, owner: str) -> tuple[str, ...]:
        """An execution taken here whose body never started, back to the queue."""
        return (
            self.keys.record(execution_id),
            self.keys.running,
            self.keys.owned(owner),
            self.keys.queue,
            self.keys.queued,
        )

    def for_ask(self, execution_id: str, owner: str) -> tuple[str, ...]:
        """The record, the `ends` channel (waiters that return at input_required), what
        parking it changes, and the webhook deliveries."""
        return (
            self.keys.record(execution_id),
            self.keys.ends,
            self.keys.running,
            self.keys.owned(owner),
            self.keys.parked,
            self.keys.webhooks,
            self.keys.webhook_bodies,
        )

    def for_webhooks(self) -> tuple[str, str]:
        """`webhook_claim` and `webhook_settle`."""
        return self.keys.webhooks, self.keys.webhook_bodies

    def for_answer(self, execution_id: str) -> tuple[str, ...]:
        """The record, the prefix (the owner's channel is named once it is read), and
        where a parked execution goes once answered."""
        return (
            self.keys.record(execution_id),
            self.keys.prefix,
            self.keys.queue,
            self.keys.parked,
            self.keys.queued,
        )

    def for_expire(self, execution_id: str) -> tuple[str]:
        return (self.keys.record(execution_id),)

    def for_end_release(self, session_id: str, release_id: str) -> tuple[str, str]:
        return self.keys.releasing(session_id), self.keys.released(release_id)
