"""agent-server: an ASGI server for AI agents that shuts down gracefully.

What a reasoner's author uses is here. Each name is imported on first use (PEP 562), so
`import agent_server.client` loads the client alone, not the server under it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_server.agent import Agent
    from agent_server.execution import (
        AskMismatch,
        CancelReason,
        CheckpointTooLarge,
        Execution,
        ExecutionContext,
        InputTimeout,
        StaleAttempt,
    )
    from agent_server.scheduling import ExecutionTimeout, RetryPolicy
    from agent_server.settings import Settings
    from agent_server.status import ExecutionStatus

#: Each public name and the module that defines it.
_HOMES = {
    "Agent": "agent_server.agent",
    "AskMismatch": "agent_server.execution",
    "CancelReason": "agent_server.execution",
    "CheckpointTooLarge": "agent_server.execution",
    "Execution": "agent_server.execution",
    "ExecutionContext": "agent_server.execution",
    "ExecutionStatus": "agent_server.status",
    "ExecutionTimeout": "agent_server.scheduling",
    "InputTimeout": "agent_server.execution",
    "RetryPolicy": "agent_server.scheduling",
    "Settings": "agent_server.settings",
    "StaleAttempt": "agent_server.execution",
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
    "RetryPolicy",
    "Settings",
    "StaleAttempt",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'agent_server' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value
