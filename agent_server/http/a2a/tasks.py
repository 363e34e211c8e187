"""An execution as an A2A task, and an A2A message as a reasoner's input or an answer.

The execution record is the one truth: a task is made from it on every read, never kept.
Task id = execution id, context id = session id. States map as docs/protocols.md says:
`queued` is submitted (working once an attempt has run: a hand-off keeps it working),
`running` working, `input_required` input-required (the prompt in the status message, the
request's schema in that message's metadata), `succeeded` completed (the result as a data
artifact), `failed` failed, `cancelled` canceled, `lost` failed with the reason.

A record holds strict JSON, which protobuf does not always carry: what it cannot is mended
as the task is made (`json_value`, `valid_text`), so one record never fails a read or a list.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import InvalidParamsError
from google.protobuf import json_format, struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from google.protobuf.timestamp_pb2 import Timestamp

from agent_server.model import jsoncodec
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner

#: The one artifact a completed task carries: its reasoner's result.
RESULT_ARTIFACT = "result"

STATE: dict[ExecutionStatus, int] = {
    ExecutionStatus.QUEUED: TaskState.TASK_STATE_SUBMITTED,
    ExecutionStatus.RUNNING: TaskState.TASK_STATE_WORKING,
    ExecutionStatus.INPUT_REQUIRED: TaskState.TASK_STATE_INPUT_REQUIRED,
    ExecutionStatus.SUCCEEDED: TaskState.TASK_STATE_COMPLETED,
    ExecutionStatus.FAILED: TaskState.TASK_STATE_FAILED,
    ExecutionStatus.CANCELLED: TaskState.TASK_STATE_CANCELED,
    ExecutionStatus.LOST: TaskState.TASK_STATE_FAILED,
}
if set(STATE) != set(ExecutionStatus):
    raise RuntimeError("STATE must map every execution status to a task state")

#: The execution statuses behind each task state a `ListTasks` may filter by.
STATUSES_OF: dict[int, frozenset[ExecutionStatus]] = {}
for _status, _state in STATE.items():
    STATUSES_OF[_state] = STATUSES_OF.get(_state, frozenset()) | {_status}
# A queued execution past its first attempt (handed off) is working too.
STATUSES_OF[TaskState.TASK_STATE_WORKING] |= {ExecutionStatus.QUEUED}


def task_state(execution: Execution) -> int:
    """The task state of the execution: a handed-off one (queued after an attempt ran: the
    record's next attempt, or this replica's view of the attempt it handed off) stays
    working; `submitted` is only before its first attempt."""
    queued = execution.status is ExecutionStatus.QUEUED
    if queued and (execution.attempt > 1 or execution.moved_away):
        return TaskState.TASK_STATE_WORKING
    return STATE[execution.status]


def _timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    stamp.FromDatetime(datetime.datetime.fromtimestamp(seconds, datetime.UTC))
    return stamp


#: The deepest JSON a task carries as JSON: protobuf holds a level as two messages (a Value
#: and its Struct or ListValue), its runtimes stop at 100 levels in all (parsing, and upb at
#: each copy into an envelope: a response, a stream event), and the envelope takes some.
CARRIED_DEPTH = 32
#: ParseDict's count of levels for a Value CARRIED_DEPTH deep: one past it fails.
_PARSE_DEPTH = 2 * CARRIED_DEPTH + 2
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_text(text: str) -> str:
    """The text as protobuf (UTF-8) carries it: each lone surrogate (a valid JSON escape the
    HTTP API keeps) is U+FFFD."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def json_value(value: Any) -> struct_pb2.Value:
    """The JSON value as protobuf carries it: at once for the usual value; one it refuses
    (a lone surrogate, an integer past a double, nesting past CARRIED_DEPTH) is mended
    first (`_mended`), so a record never fails the task it is shown in."""
    try:
        return ParseDict(value, struct_pb2.Value(), max_recursion_depth=_PARSE_DEPTH)
    except (json_format.Error, ValueError, OverflowError):
        return ParseDict(_mended(value, CARRIED_DEPTH), struct_pb2.Value())


def _mended(value: Any, room: int) -> Any:
    """The value with each lone surrogate U+FFFD (in keys as in strings; two keys that become
    one keep the later's value), an integer past a double's range as its digits, and a
    container more than `room` levels down as its JSON text (escaped, nothing lost)."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, bool) or not isinstance(value, int | dict | list):
        return value
    if isinstance(value, int):
        try:
            float(value)
        except OverflowError:
            return str(value)
        return value
    if room == 0:
        return jsoncodec.dumps(value).decode()
    if isinstance(value, dict):
        return {valid_text(key): _mended(item, room - 1) for key, item in value.items()}
    return [_mended(item, room - 1) for item in value]


def data_part(value: Any) -> Part:
    """A data part holding the JSON value (as protobuf carries it)."""
    return Part(data=json_value(value))


def _status_message(execution: Execution) -> Message | None:
    """What the agent says in the status: the prompt of a pending request (its schema and
    request id in the message's metadata), or why it failed, was cancelled or was lost."""
    parts: list[Part] = []
    metadata: dict[str, Any] = {}
    pending = execution.input_request
    if execution.status is ExecutionStatus.INPUT_REQUIRED and pending is not None:
        prompt = pending.get("prompt")
        shown = Part(text=valid_text(prompt)) if isinstance(prompt, str) else data_part(prompt)
        parts.append(shown)
        metadata["request_id"] = pending.get("request_id")
        if pending.get("schema") is not None:
            metadata["schema"] = pending["schema"]
        message_id = f"{execution.execution_id}-ask-{pending.get('request_id')}"
    elif execution.status in (ExecutionStatus.FAILED, ExecutionStatus.LOST) and execution.error:
        error = execution.error
        text = error.get("message") or error.get("type") or execution.status.value
        if execution.status is ExecutionStatus.LOST:
            text = f"lost: {text}"
        parts.append(Part(text=valid_text(str(text))))
        metadata["error"] = dict(error)
        message_id = f"{execution.execution_id}-error"
    elif execution.status is ExecutionStatus.CANCELLED and execution.status_reason is not None:
        parts.append(Part(text=f"cancelled: {execution.status_reason.value}"))
        metadata["reason"] = execution.status_reason.value
        message_id = f"{execution.execution_id}-cancelled"
    else:
        return None
    message = Message(
        message_id=message_id,
        role=Role.ROLE_AGENT,
        task_id=execution.execution_id,
        context_id=execution.session_id or "",
        parts=parts,
    )
    message.metadata.CopyFrom(json_value(metadata).struct_value)
    return message


def result_artifact(execution: Execution) -> Artifact:
    """The result as a data part: an object as it is, any other value as `{"result": v}`."""
    value = execution.result
    data = value if isinstance(value, dict) else {"result": value}
    return Artifact(artifact_id=RESULT_ARTIFACT, name=RESULT_ARTIFACT, parts=[data_part(data)])


def status_time(execution: Execution) -> Timestamp:
    """When the task's status was last set, as its `status.timestamp` says."""
    stamp = execution.finished_at if execution.finished_at is not None else execution.created_at
    return _timestamp(stamp)


def task_of(execution: Execution) -> Task:
    """The A2A task the execution is, now."""
    status = TaskStatus(state=task_state(execution), timestamp=status_time(execution))  # type: ignore[arg-type]
    said = _status_message(execution)
    if said is not None:
        status.message.CopyFrom(said)
    task = Task(id=execution.execution_id, context_id=execution.session_id or "", status=status)
    if execution.status is ExecutionStatus.SUCCEEDED:
        task.artifacts.append(result_artifact(execution))
    task.metadata.update(
        {
            "reasoner": execution.reasoner,
            "status": execution.status.value,
            "attempt": execution.attempt,
        }
    )
    return task


def accepted_task(execution: Execution) -> Task:
    """A new task as a caller that may start it but not read it is answered: its id, its
    context and `submitted` (accepted), nothing of the record (docs/security.md)."""
    status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
    return Task(id=execution.execution_id, context_id=execution.session_id or "", status=status)


def _integral(value: Any) -> Any:
    """JSON as it was sent: protobuf's Value holds every number as a double, so `5` arrives
    as `5.0`; an integral double is an integer again (a float field takes it all the same)."""
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def _parts(message: Message) -> tuple[list[Any], list[str]]:
    """The message's data values and texts; a file part is refused (no reasoner takes one)."""
    data: list[Any] = []
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            data.append(_integral(MessageToDict(part.data)))
        elif kind == "text":
            texts.append(part.text)
        else:
            raise InvalidParamsError(
                message=f"a {kind} part is not taken here: send a data part (the input as "
                "JSON) or a text part"
            )
    return data, texts


def string_field(reasoner: Reasoner) -> str | None:
    """The one parameter of a reasoner that takes one string, else None: such a reasoner
    takes a text part as that string."""
    fields = reasoner.input_model.model_fields
    if len(fields) != 1:
        return None
    name, field = next(iter(fields.items()))
    return name if field.annotation is str else None


def input_of(message: Message, reasoner: Reasoner) -> Any:
    """The reasoner's input (the JSON body `POST /reasoners/{name}` would take): a data part
    is the input; a text part the string of a reasoner taking one (the SDK's check has
    refused a message without a part)."""
    data, texts = _parts(message)
    if len(data) + len(texts) > 1:
        raise InvalidParamsError(message="send one part: a data part (the input) or a text part")
    if data:
        return data[0]
    if texts:
        field = string_field(reasoner)
        if field is None:
            raise InvalidParamsError(
                message=f"skill {reasoner.name!r} takes a data part (its input as JSON, "
                "the schema in the card's skill-schemas extension), not text"
            )
        return {field: texts[0]}
    return None


def answer_of(message: Message, pending: dict[str, Any]) -> Any:
    """The answer a message on an input-required task carries, read as every version of
    A2A can send it (v0.3's data part holds only an object):

    - a text part is the string where the request's schema takes a string (or says
      nothing), else the JSON it holds, read by the schema: "true", "42", "null";
    - a data part `{"value": v}` is `v` where the schema takes no object (MCP's wrapping of
      such a schema), any other data part the value as it is.

    The value is then checked against the schema as any answer is."""
    data, texts = _parts(message)
    if len(data) + len(texts) != 1:
        raise InvalidParamsError(message="answer with one part: a data part or a text part")
    schema = pending.get("schema")
    if data:
        value = data[0]
        wrapped = isinstance(value, dict) and set(value) == {"value"}
        return value["value"] if wrapped and not _admits(schema, "object") else value
    if schema is None or _admits(schema, "string"):
        return texts[0]
    try:
        return jsoncodec.loads(texts[0].encode("utf-8", "surrogatepass"))
    except (ValueError, RecursionError):
        raise InvalidParamsError(
            message="the pending request's schema (the status message's metadata) takes no "
            'string: answer with a data part (`{"value": ...}` from v0.3), or a text part '
            "holding the value as JSON (true, 42, ...)"
        ) from None


def _admits(schema: Any, kind: str) -> bool:
    """Whether a JSON schema may take a value of JSON type `kind` ("string", "object"):
    by its `type`, or any branch of its `anyOf`/`oneOf`; a schema that names no type (a
    `$ref`, an `enum`, `{}`) is taken as admitting it."""
    if not isinstance(schema, dict):
        return True
    if "type" in schema:
        declared = schema["type"]
        return kind == declared or (isinstance(declared, list) and kind in declared)
    branches = [*schema.get("anyOf", ()), *schema.get("oneOf", ())]
    if branches:
        return any(_admits(branch, kind) for branch in branches)
    return True
