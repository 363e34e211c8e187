"""What a request for input is, beyond its number: its identity, and the answers kept for it.

Requests number on from the last checkpoint, but a number alone does not say which
question it is: a resumed attempt whose code asks something else (changed code, or code that
asks again from the top) would be handed another question's answer. So every request keeps
its identity (`ctx.ask(..., key=)`, else a digest of its prompt and schema), and a replayed
ask is matched by it (section 13). The redis store applies the same rule in `ask.lua` and
`answer.lua`; the memory store keeps a `Ledger` on the live execution.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any

#: Bytes of answers (as JSON) an execution keeps by default (`--max-answer-bytes`).
MAX_ANSWER_BYTES = 16 * 1024 * 1024
#: Characters a `key=` may have.
MAX_KEY = 256
#: Characters of a question's label (its key, or its prompt's JSON) kept to name it.
LABEL_CHARS = 120

_CANONICAL = json.JSONEncoder(
    ensure_ascii=True, allow_nan=False, sort_keys=True, separators=(",", ":")
)


def identity(key: str | None, prompt: Any, schema: dict[str, Any] | None) -> str:
    """`key:` and the key when one is given, else a digest of the prompt and the schema
    (as canonical JSON: the order of an object's keys does not change it)."""
    if key is not None:
        return "key:" + key
    text = _CANONICAL.encode([prompt, schema])
    return "sha256:" + hashlib.sha256(text.encode("ascii")).hexdigest()[:32]


def label(key: str | None, prompt: Any) -> str:
    """How an error names the question: its key, else the start of its prompt's JSON."""
    if key is not None:
        return f"key {key[:LABEL_CHARS]!r}"
    text = _CANONICAL.encode(prompt)
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 3] + "..."


def check_key(key: object) -> str | None:
    """A `key=` as given; ValueError unless a string of 1 to MAX_KEY characters."""
    if key is None:
        return None
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY:
        raise ValueError(f"key must be a string of 1 to {MAX_KEY} characters")
    return key


@dataclasses.dataclass(slots=True)
class Question:
    """One `ctx.ask` as the store sees it: the request (`input_request`, numbered at the
    position the attempt has reached), its identity and label, and `after`: the last request
    of this identity matched out of order by this attempt (0 for none), so that asks of one
    identity get the earlier requests in order."""

    request: dict[str, Any]
    identity: str
    label: str
    after: int = 0

    @property
    def request_id(self) -> int:
        return int(self.request["request_id"])


class Found(enum.Enum):
    """What the store found for a question."""

    #: Not answered before: it waits (asked now, in the attempt's task).
    WAIT = "wait"
    #: Asked now and parked: nobody owns the execution until the answer queues it.
    PARKED = "parked"
    #: Answered before: the kept answer.
    ANSWERED = "answered"
    #: Timed out before: InputTimeout, at once.
    TIMED_OUT = "timed_out"
    #: Answered before, but its answer was dropped (the answers' byte bound): ask it again,
    #: as the request it was.
    AGAIN = "again"
    #: The numbered request is another question, and no earlier one is this one.
    MISMATCH = "mismatch"


@dataclasses.dataclass(slots=True, frozen=True)
class Reply:
    """The store's reply to a question: what it found, for which request (the numbered
    one, or the earlier one of the same identity), the kept answer (ANSWERED), and the label
    of the numbered request (MISMATCH)."""

    found: Found
    request_id: int
    value: Any = None
    other: str = ""


@dataclasses.dataclass(slots=True)
class Entry:
    """A request the memory store keeps until the execution ends."""

    identity: str
    label: str
    answered: bool = False
    value: Any = None
    size: int = 0
    expired: bool = False


class Ledger:
    """The requests of one execution in the memory store: identity, kept answer and
    whether it timed out, by request id; the answers bounded in bytes (the oldest dropped
    first). `ask.lua` and `answer.lua` do the same with the record's fields."""

    __slots__ = ("answer_bytes", "entries", "kept_from", "top")

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self.answer_bytes = 0
        #: No answer is kept below this request id; the highest id asked.
        self.kept_from = 1
        self.top = 0

    def find(self, question: Question) -> Reply | None:
        """What an earlier attempt left for the question; None when it is to be asked (it
        is then recorded under its number)."""
        number = question.request_id
        entry = self.entries.get(number)
        if entry is not None and entry.identity != question.identity:
            for earlier in range(question.after + 1, number):
                match = self.entries.get(earlier)
                if match is not None and match.identity == question.identity:
                    return self._kept(earlier, match) or Reply(Found.AGAIN, earlier)
            return Reply(Found.MISMATCH, number, other=entry.label)
        if entry is not None:
            kept = self._kept(number, entry)
            if kept is not None:
                return kept
        self.entries[number] = Entry(question.identity, question.label)
        self.top = max(self.top, number)
        return None

    @staticmethod
    def _kept(number: int, entry: Entry) -> Reply | None:
        if entry.answered:
            return Reply(Found.ANSWERED, number, entry.value)
        if entry.expired:
            return Reply(Found.TIMED_OUT, number)
        return None

    def keep(self, number: int, value: Any, size: int, bound: int) -> None:
        """The answer taken for request `number` (`size` bytes of JSON): kept, the oldest
        others dropped while the answers exceed `bound` bytes."""
        entry = self.entries.get(number)
        if entry is None:
            return
        entry.answered, entry.value, entry.size = True, value, size
        self.answer_bytes += size
        self.kept_from = min(self.kept_from, number)
        if self.answer_bytes <= bound:
            return
        other = self.kept_from
        while self.answer_bytes > bound and other <= self.top:
            dropped = self.entries.get(other)
            if other != number and dropped is not None and dropped.answered:
                self.answer_bytes -= dropped.size
                dropped.answered, dropped.value, dropped.size = False, None, 0
            other += 1
        self.kept_from = number if self.kept_from <= number < other else other

    def expire(self, number: int) -> None:
        entry = self.entries.get(number)
        if entry is not None:
            entry.expired = True
