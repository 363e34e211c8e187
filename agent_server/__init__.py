"""agent-server: an ASGI server for AI agents that shuts down gracefully."""

from agent_server.agent import Agent
from agent_server.execution import Execution, ExecutionContext, ExecutionStatus
from agent_server.registry import InFlightRegistry
from agent_server.settings import Settings

__all__ = [
    "Agent",
    "Execution",
    "ExecutionContext",
    "ExecutionStatus",
    "InFlightRegistry",
    "Settings",
]
