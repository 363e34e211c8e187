"""What a drill is asked to do: the command line's arguments, and the reasoners to drill,
each with its input (given, or built from its schema's examples and defaults)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent_server.runtime.settings import Settings
from agent_server.runtime.shutdown import ShutdownPlan

#: The flags of `run` the drill passes on: the terms of the shutdown budget, derived from
#: the plan's fields that are settings (all but the fixed margin).
SHUTDOWN_FIELDS: tuple[str, ...] = tuple(
    item.name for item in dataclasses.fields(ShutdownPlan) if item.name in Settings.model_fields
)
#: Seconds the child may take to listen (importing an app can be slow).


class DrillError(Exception):
    """Arguments that cannot be drilled, found once the app is known: exit 2, one line."""


@dataclass(frozen=True)
class DrillArgs:
    """What the command line asked for; `settings` validated (the child reads the same)."""

    app: str | None
    reasoners: tuple[str, ...]
    inputs: Mapping[str, Any]
    executions: int
    signal_after: float
    flags: Mapping[str, Any]
    settings: Settings


def parse_input(text: str) -> tuple[str, Any]:
    """`NAME=JSON` of `--input`; ValueError says what is wrong."""
    from agent_server.model import jsoncodec

    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{text!r} is not NAME=JSON")
    try:
        value = jsoncodec.loads(raw.encode())
        jsoncodec.check(value, "the input")
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the input of {name!r} is not valid JSON: {exc}") from None
    return name, value


def example_input(reasoner: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """An input from the schema's examples and defaults; a required field with neither is
    a DrillError naming it."""
    examples = schema.get("examples")
    if isinstance(examples, list) and examples and isinstance(examples[0], dict):
        return dict(examples[0])
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    body: dict[str, Any] = {}
    for name, prop in properties.items():
        prop = prop if isinstance(prop, dict) else {}
        if isinstance(prop.get("examples"), list) and prop["examples"]:
            body[name] = prop["examples"][0]
        elif "example" in prop:
            body[name] = prop["example"]
        elif "default" in prop:
            body[name] = prop["default"]
        elif name in required:
            raise DrillError(
                f"reasoner {reasoner!r}: input field {name!r} is required and its schema gives "
                f"neither an example nor a default; give one with "
                f"--input {reasoner}='{{\"{name}\": ...}}'"
            )
    return body


def choose(
    described: Sequence[Mapping[str, Any]],
    wanted: Sequence[str],
    inputs: Mapping[str, Any],
) -> dict[str, Any]:
    """The reasoners to drill, in the app's order, each with its input."""
    schemas = {str(item["name"]): item.get("input_schema") or {} for item in described}
    if not schemas:
        raise DrillError("the app has no reasoners to drill")
    known = ", ".join(schemas)
    for name in [*wanted, *inputs]:
        if name not in schemas:
            raise DrillError(f"unknown reasoner {name!r} (the app has: {known})")
    names = [name for name in schemas if not wanted or name in wanted]
    for name in inputs:
        if name not in names:
            raise DrillError(f"--input names {name!r}, which --reasoner leaves out")
    return {
        name: inputs[name] if name in inputs else example_input(name, schemas[name])
        for name in names
    }
