"""What a drill is asked to do: the command line's arguments, and the reasoners to drill,
each with its input (given, or built from its schema's examples and defaults, else plain
values of its types)."""

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
    #: `--next`: the next version's app, whose reasoners meet APP's checkpoints
    #: (drill/versions.py); `--next-version`: the AGENT_SERVER_VERSION it is imported with.
    next_app: str | None = None
    next_version: str | None = None


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
    """An input from the schema's examples and defaults; a required field with neither gets
    the plainest value of its type (`_plain`: "example", the smallest number allowed, false,
    an empty list...), so an app written without examples (the README's) can be drilled. A
    required field no such value fits (a pattern, a format) is a DrillError naming it."""
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
            value = _plain(prop, schema.get("$defs") or {}, depth=0)
            if value is _NONE:
                raise DrillError(
                    f"reasoner {reasoner!r}: input field {name!r} is required and its schema "
                    f"gives neither an example nor a default, nor a type a plain value fits; "
                    f"give one with --input {reasoner}='{{\"{name}\": ...}}'"
                )
            body[name] = value
    return body


#: No plain value fits the schema.
_NONE: Any = object()


def _plain(prop: Mapping[str, Any], defs: Mapping[str, Any], depth: int) -> Any:
    """The plainest JSON value a field's schema accepts, or _NONE when unsure."""
    if depth > 8:
        return _NONE
    ref = prop.get("$ref")
    if isinstance(ref, str):
        target = defs.get(ref.rsplit("/", 1)[-1])
        return _plain(target, defs, depth + 1) if isinstance(target, dict) else _NONE
    if "const" in prop:
        return prop["const"]
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return prop["enum"][0]
    for key in ("anyOf", "oneOf"):
        for option in prop.get(key) or ():
            if isinstance(option, dict) and (value := _plain(option, defs, depth + 1)) is not _NONE:
                return value
    kind = prop.get("type")
    if kind == "string":
        if "pattern" in prop or "format" in prop:
            return _NONE
        text = "example" * (1 + int(prop.get("minLength", 0)) // 7)
        return text[: prop["maxLength"]] if "maxLength" in prop else text
    if kind in ("integer", "number"):
        low = prop.get("minimum", prop.get("exclusiveMinimum", 0))
        value = max(0, low) if "maximum" not in prop else min(max(0, low), prop["maximum"])
        if "exclusiveMinimum" in prop and value <= prop["exclusiveMinimum"]:
            value = prop["exclusiveMinimum"] + 1
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    if kind == "array":
        return [] if not prop.get("minItems") else _NONE
    if kind == "object":
        body: dict[str, Any] = {}
        for name in prop.get("required") or ():
            field = (prop.get("properties") or {}).get(name)
            value = _plain(field, defs, depth + 1) if isinstance(field, dict) else _NONE
            if value is _NONE:
                return _NONE
            body[name] = value
        return body
    return _NONE


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
