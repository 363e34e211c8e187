"""An execution's live events as A2A stream events (docs/protocols.md, "Events"):

- each `yield` of a generator reasoner (an `output` event) is a chunk of the task's `output`
  artifact: a `TaskArtifactUpdateEvent` whose one data part is the value, `append` after the
  first chunk this stream sent, as A2A streams a growing artifact;
- every other event (`ctx.emit(data, event=name)`) is a `TaskStatusUpdateEvent` (working)
  whose status message is the agent's, one data part the event's data, the event's name and
  number in that message's metadata (and the update's): what A2A clients show as progress.

Both carry `{"event": name, "eventId": n}` in their metadata, the number SSE gives as `id:`.
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Role,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf.timestamp_pb2 import Timestamp

from agent_server.http.a2a.tasks import data_part, json_value
from agent_server.model import jsoncodec
from agent_server.model.context import OUTPUT_EVENT
from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus

#: The artifact a generator reasoner's yields stream into, a chunk per value.
OUTPUT_ARTIFACT = "output"


class EventUpdates:
    """The A2A events of one stream for one task, in the order its events came."""

    __slots__ = ("_chunks", "context_id", "task_id")

    def __init__(self, execution: Execution) -> None:
        self.task_id = execution.execution_id
        self.context_id = execution.session_id or ""
        self._chunks = 0

    @staticmethod
    def carries(event: Event) -> bool:
        """Whether the event is sent as one of its own: a `ctx.ask`'s `input_required` event
        is the input-required status update that follows it."""
        return event.event != ExecutionStatus.INPUT_REQUIRED.value

    def update(self, event: Event) -> TaskArtifactUpdateEvent | TaskStatusUpdateEvent:
        value = jsoncodec.loads(event.data.encode("utf-8", "surrogatepass"))
        about = json_value({"event": event.event, "eventId": event.id}).struct_value
        if event.event == OUTPUT_EVENT:
            artifact = Artifact(
                artifact_id=OUTPUT_ARTIFACT, name=OUTPUT_ARTIFACT, parts=[data_part(value)]
            )
            artifact.metadata.CopyFrom(about)
            chunk = TaskArtifactUpdateEvent(
                task_id=self.task_id,
                context_id=self.context_id,
                artifact=artifact,
                append=self._chunks > 0,
                last_chunk=False,
            )
            chunk.metadata.CopyFrom(about)
            self._chunks += 1
            return chunk
        said = Message(
            message_id=f"{self.task_id}-event-{event.id}",
            role=Role.ROLE_AGENT,
            task_id=self.task_id,
            context_id=self.context_id,
            parts=[data_part(value)],
        )
        said.metadata.CopyFrom(about)
        stamp = Timestamp()
        stamp.GetCurrentTime()
        status = TaskStatus(state=TaskState.TASK_STATE_WORKING, message=said, timestamp=stamp)
        note = TaskStatusUpdateEvent(
            task_id=self.task_id, context_id=self.context_id, status=status
        )
        note.metadata.CopyFrom(about)
        return note
