"""agent-server: an ASGI server for AI agents that shuts down gracefully.

What a reasoner's author uses is here. Each name is imported on first use (PEP 562), so
`import agent_server.client` loads the client alone, not the server under it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_server.app.agent import Agent
    from agent_server.identity.principal import Principal, Unauthorized
    from agent_server.model.context import (
        AskMismatch,
        CheckpointTooLarge,
        ExecutionContext,
        InputTimeout,
        StaleAttempt,
    )
    from agent_server.model.execution import CancelReason, Execution
    from agent_server.model.schedules import Schedule
    from agent_server.model.scheduling import ExecutionTimeout, RetryPolicy
    from agent_server.model.status import ExecutionStatus
    from agent_server.runtime.settings import Settings

#: Each public name and the module that defines it.
_HOMES = {
    "Agent": "agent_server.app.agent",
    "AskMismatch": "agent_server.model.context",
    "CancelReason": "agent_server.model.execution",
    "CheckpointTooLarge": "agent_server.model.context",
    "Execution": "agent_server.model.execution",
    "ExecutionContext": "agent_server.model.context",
    "ExecutionStatus": "agent_server.model.status",
    "ExecutionTimeout": "agent_server.model.scheduling",
    "InputTimeout": "agent_server.model.context",
    "Principal": "agent_server.identity.principal",
    "RetryPolicy": "agent_server.model.scheduling",
    "Schedule": "agent_server.model.schedules",
    "Settings": "agent_server.runtime.settings",
    "StaleAttempt": "agent_server.model.context",
    "Unauthorized": "agent_server.identity.principal",
}

__all__ = [
    "Agent",
    "AskMismatch",
    "CancelReason",
    "CheckpointTooLarge",
    "Execution",
    "ExecutionContext",
    "ExecutionStatus",
    "ExecutionTimeout",
    "InputTimeout",
    "Principal",
    "RetryPolicy",
    "Schedule",
    "Settings",
    "StaleAttempt",
    "Unauthorized",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agent_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value
