"""What `agent-server drill` sends each reasoner: `--input`, else its schema's examples and
defaults; and what it refuses before anything runs (exit 2)."""

from __future__ import annotations

import pytest

from agent_server.process.drill import (
    SHUTDOWN_FIELDS,
    DrillError,
    choose,
    example_input,
    parse_input,
)


def test_the_shutdown_flags_are_the_budgets_terms() -> None:
    assert SHUTDOWN_FIELDS == (
        "unready_delay", "drain_timeout", "cancel_timeout", "http_timeout", "grace_period",
    )  # fmt: skip


def test_an_input_is_built_from_examples_then_defaults() -> None:
    schema = {
        "properties": {
            "text": {"type": "string", "examples": ["hi", "ho"]},
            "seconds": {"type": "number", "default": 1.5},
            "note": {"type": "string"},  # optional, neither: left to the reasoner
        },
        "required": ["text"],
    }
    assert example_input("r", schema) == {"text": "hi", "seconds": 1.5}
    assert example_input("r", {"examples": [{"whole": 1}], "properties": {}}) == {"whole": 1}


def test_a_required_field_with_neither_gets_the_plainest_value_of_its_type() -> None:
    """The README's agent has no examples: `echo(text: str)`, `sleep(seconds: float)` and a
    model parameter are drilled with plain values of their types."""
    schema = {
        "properties": {
            "text": {"type": "string"},
            "seconds": {"type": "number"},
            "count": {"type": "integer", "exclusiveMinimum": 0},
            "small": {"type": "integer", "minimum": -5, "maximum": -2},
            "flag": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "mode": {"enum": ["fast", "slow"]},
            "maybe": {"anyOf": [{"type": "string", "pattern": "^x$"}, {"type": "null"}]},
            "inner": {"$ref": "#/$defs/Inner"},
            "long": {"type": "string", "minLength": 10},
        },
        "required": [
            "text", "seconds", "count", "small", "flag", "tags", "mode", "maybe", "inner", "long"
        ],
        "$defs": {
            "Inner": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
        },
    }  # fmt: skip
    assert example_input("r", schema) == {
        "text": "example",
        "seconds": 0.0,
        "count": 1,
        "small": -2,
        "flag": False,
        "tags": [],
        "mode": "fast",
        "maybe": None,
        "inner": {"q": "example"},
        "long": "exampleexample",
    }


def test_a_required_field_no_plain_value_fits_is_named() -> None:
    schema = {"properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}},
              "required": ["code"]}  # fmt: skip
    with pytest.raises(DrillError, match="reasoner 'r': input field 'code' is required"):
        example_input("r", schema)


def test_choose_keeps_the_apps_order_and_refuses_unknown_names() -> None:
    described = [
        {"name": "b", "input_schema": {"properties": {}}},
        {"name": "a", "input_schema": {"properties": {"x": {"default": 1}}}},
    ]
    assert choose(described, (), {}) == {"b": {}, "a": {"x": 1}}
    assert choose(described, ("a",), {"a": {"x": 2}}) == {"a": {"x": 2}}
    with pytest.raises(DrillError, match="unknown reasoner 'c' \\(the app has: b, a\\)"):
        choose(described, ("c",), {})
    with pytest.raises(DrillError, match="which --reasoner leaves out"):
        choose(described, ("a",), {"b": {}})
    with pytest.raises(DrillError, match="no reasoners"):
        choose([], (), {})


def test_parse_input_is_strict_json() -> None:
    assert parse_input('r={"a": [1, 2]}') == ("r", {"a": [1, 2]})
    assert parse_input("r=3") == ("r", 3)
    for bad in ("r", "=1", "r={a: 1}", "r=NaN"):
        with pytest.raises(ValueError):
            parse_input(bad)
