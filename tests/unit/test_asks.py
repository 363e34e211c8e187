"""A request's identity and the memory store's ledger (agent_server/model/asks.py), and the check
of an answer against its schema on every replica (agent_server/service/answers.py)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agent_server.model.asks import Found, Ledger, Question, identity, label
from agent_server.service import answers
from tests.apps.input_app import EMAIL_PATTERN


def question(number: int, ident: str, after: int = 0) -> Question:
    return Question({"request_id": number}, ident, f"q-{ident}", after)


def test_identity_is_the_key_else_a_digest_of_prompt_and_schema() -> None:
    assert identity("k", {"a": 1}, None) == identity("k", "other", {"type": "string"})
    assert identity(None, {"a": 1, "b": 2}, None) == identity(None, {"b": 2, "a": 1}, None)
    assert identity(None, "x", None) != identity(None, "x", {"type": "string"})
    assert identity(None, "x", None) != identity(None, "y", None)
    assert len(label(None, "z" * 1000)) <= 120


def test_the_ledger_matches_asks_by_identity_in_order() -> None:
    ledger = Ledger()
    for number, ident in ((1, "a"), (2, "a"), (3, "b")):
        assert ledger.find(question(number, ident)) is None  # asked
        ledger.keep(number, f"answer {number}", 10, 1000)
    # From a checkpoint after request 1, asking "a", "a", "b" again from the top: position 2
    # is "a" (its own), then position 3 is "b" while "a" is asked: request 1, not 3's.
    assert ledger.find(question(2, "a")) == question_reply(Found.ANSWERED, 2, "answer 2")
    mismatched = ledger.find(question(3, "a"))
    assert mismatched == question_reply(Found.ANSWERED, 1, "answer 1")
    assert ledger.find(question(3, "a", after=1)) == question_reply(Found.ANSWERED, 2, "answer 2")
    refused = ledger.find(question(3, "c"))
    assert refused is not None and (refused.found, refused.other) == (Found.MISMATCH, "q-b")


def question_reply(found: Found, number: int, value: Any) -> Any:
    from agent_server.model.asks import Reply

    return Reply(found, number, value)


def test_the_ledger_drops_the_oldest_answers_past_its_bound() -> None:
    ledger = Ledger()
    for number in range(1, 6):
        ledger.find(question(number, f"q{number}"))
        ledger.keep(number, "x" * 40, 40, 100)
        assert ledger.answer_bytes <= 100
    assert [n for n, entry in ledger.entries.items() if entry.answered] == [4, 5]
    again = ledger.find(question(5, "q1"))  # matched to request 1, its answer dropped
    assert again is not None and (again.found, again.request_id) == (Found.AGAIN, 1)
    assert ledger.find(question(1, "q1")) is None  # asked again, under its own id


HOSTILE = "a" * 5000 + "!"


@pytest.mark.parametrize(
    ("schema", "refused", "fits"),
    [
        ({"type": "string", "pattern": EMAIL_PATTERN}, HOSTILE, "sam@example.org"),
        (
            {"type": "object", "patternProperties": {EMAIL_PATTERN: {"type": "integer"}}},
            {"sam@example.org": "1"},
            {HOSTILE: "1", "sam@example.org": 1},
        ),
        (
            {
                "type": "object",
                "patternProperties": {EMAIL_PATTERN: {}},
                "additionalProperties": False,
            },
            {HOSTILE: 1},
            {"sam@example.org": 1},
        ),
    ],
)
async def test_a_hostile_pattern_is_checked_in_linear_time(
    schema: dict[str, Any], refused: Any, fits: Any
) -> None:
    """Each would take Python's `re` past the age of the universe."""
    began = time.monotonic()
    assert await asyncio.wait_for(answers.check(schema, refused), 5)
    assert await asyncio.wait_for(answers.check(schema, fits), 5) == []
    assert time.monotonic() - began < 2


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "boolean"}, "true"),
        ({"type": "integer"}, "1"),
        ({"type": "integer"}, True),
        ({"type": "string"}, 1),
    ],
)
async def test_json_types_are_strict(schema: dict[str, Any], value: Any) -> None:
    assert (await answers.check(schema, value))[0]["type"] == "schema_type"
