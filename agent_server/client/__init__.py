"""A Python client for an agent-server: `AgentClient` (blocking) and `AsyncAgentClient`.

Both ride rollouts (docs/client.md):

- 429 and 503 refusals (nothing was started) are retried after their `Retry-After`, and
  connection errors and gateway errors (502, 504) after a short backoff, for at most
  `retry_for` seconds of consecutive failures (the last wait is cut to what is left of it,
  and one last try made at its end); then `Busy` (429) or `Unavailable`.
- Every start carries one `Idempotency-Key`, the caller's own or one chosen per logical start
  (a UUID 4), so a start retried after a connection error gets the execution the first
  attempt started, never a second run. Reads, cancels and session releases are retried as
  they are.
- A synchronous run that a shutdown handed off (503 + `Location`) is followed to its end
  with long-polls (`GET /executions/{id}?wait=`); one whose connection broke is found again
  by its key through the background route and followed the same way.
- A write answered in doubt (503 + `Location`, `"in_doubt": true`: taken, on no Redis
  replica yet) is sent again as it was (the same `Idempotency-Key`, the same `request_id`)
  within the same budget; then `InDoubt` (an `Unavailable`) names the execution to read.

Every call is written once, without I/O, in core.py (its steps in steps.py, an event
stream's reader in event_reader.py); sync.py and aio.py only take its steps.
"""

# A name outside `__all__` is imported as itself: importable from here, as when the client
# was one module.
from agent_server.client.aio import AsyncAgentClient, AsyncExecutionHandle
from agent_server.client.core import DEFAULT_URL as DEFAULT_URL
from agent_server.client.core import MAX_WAIT as MAX_WAIT
from agent_server.client.event_reader import STREAM_SILENCE as STREAM_SILENCE
from agent_server.client.event_reader import UNNUMBERED as UNNUMBERED
from agent_server.client.models import TERMINAL as TERMINAL
from agent_server.client.models import (
    AgentServerError,
    Busy,
    Conflict,
    Event,
    Execution,
    ExecutionCancelled,
    ExecutionError,
    ExecutionFailed,
    ExecutionLost,
    Forbidden,
    InDoubt,
    InputRequired,
    InvalidInput,
    NotFound,
    ReasonerInfo,
    SessionRelease,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from agent_server.client.models import Executions as Executions
from agent_server.client.models import Reasoners as Reasoners
from agent_server.client.models import Statuses as Statuses
from agent_server.client.models import error_from_response as error_from_response
from agent_server.client.retries import BACKOFF_FIRST as BACKOFF_FIRST
from agent_server.client.retries import BACKOFF_MAX as BACKOFF_MAX
from agent_server.client.retries import RETRY_AFTER_MAX as RETRY_AFTER_MAX
from agent_server.client.sync import AgentClient, ExecutionHandle

__all__ = [
    "AgentClient",
    "AgentServerError",
    "AsyncAgentClient",
    "AsyncExecutionHandle",
    "Busy",
    "Conflict",
    "Event",
    "Execution",
    "ExecutionCancelled",
    "ExecutionError",
    "ExecutionFailed",
    "ExecutionHandle",
    "ExecutionLost",
    "Forbidden",
    "InDoubt",
    "InputRequired",
    "InvalidInput",
    "NotFound",
    "ReasonerInfo",
    "SessionRelease",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]
