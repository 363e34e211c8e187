"""An enumeration's value that names none of its values is refused, naming the allowed ones.

The SDK reads v1.0 params with protobuf's `ignore_unknown_fields`, which also turns an
enumeration's unknown name into its zero value (`..._UNSPECIFIED`): `ListTasks` with a
`status` that names no state would list every task, a message with an unknown `role`
would be told the role is missing. Each enumeration field of the request is checked here,
against the method's request type, before the SDK reads it: -32602 naming the field, the
value (bounded) and the names allowed.
"""

from __future__ import annotations

from typing import Any, cast

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from agent_server.model.echoes import one_of, shown

#: The message types whose JSON is not a plain object of their fields (no enumeration
#: inside them is the request's).
_OPAQUE = frozenset(
    {
        "google.protobuf.Struct",
        "google.protobuf.Value",
        "google.protobuf.ListValue",
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
        "google.protobuf.Any",
        "google.protobuf.FieldMask",
    }
)


def unknown_enum(params: dict[str, Any], request_type: type[Message]) -> str | None:
    """Why a value of an enumeration field in `params` (the JSON of a `request_type`) is
    refused, None when every one names a value (or the zero value, which means unset)."""
    top = cast(Descriptor, request_type.DESCRIPTOR)
    pending: list[tuple[Any, Descriptor, str]] = [(params, top, "")]
    while pending:
        value, descriptor, path = pending.pop()
        if not isinstance(value, dict) or descriptor.full_name in _OPAQUE:
            continue
        for key, item in value.items():
            field = _field(descriptor, key)
            if field is None or item is None:
                continue
            where = f"{path}.{key}" if path else key
            items = item if _repeated(field) and isinstance(item, list) else [item]
            if field.enum_type is not None:
                for each in items:
                    problem = _enum_problem(each, field.enum_type, where)
                    if problem is not None:
                        return problem
            elif field.message_type is not None and not _is_map(field):
                pending.extend((each, field.message_type, where) for each in items)
    return None


def _field(descriptor: Descriptor, key: str) -> FieldDescriptor | None:
    """The field a JSON key names: its JSON name (camelCase) or its own (as protobuf's
    parser reads both)."""
    for field in descriptor.fields:
        if key in (field.json_name, field.name):
            return field
    return None


def _repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated)


def _is_map(field: FieldDescriptor) -> bool:
    options = field.message_type.GetOptions() if field.message_type is not None else None
    return bool(options is not None and options.map_entry)


def _enum_problem(value: Any, enum: EnumDescriptor, where: str) -> str | None:
    """None when `value` names one of the enumeration's values (by name, or by number as
    protobuf's JSON allows), else why not."""
    if isinstance(value, str) and value in enum.values_by_name:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value in enum.values_by_number:
        return None
    allowed = one_of(v.name for v in enum.values if v.number != 0)
    return f"{where}: {shown(value)} is not a {enum.name}: one of {allowed}"
