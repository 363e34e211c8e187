"""The memory store's indexes: each session's ids (under its tenant's name for it) and each
tenant's ids in creation order, kept with the records, so a session's release and a
tenant's list walk their own records only, however many others the store holds."""

from __future__ import annotations

from agent_server.model.execution import Execution


class Indexes:
    """Ids by session name (names.py `scoped`) and by tenant."""

    __slots__ = ("sessions", "tenants")

    def __init__(self) -> None:
        self.sessions: dict[str, set[str]] = {}
        #: A dict as an ordered set: its ids oldest first.
        self.tenants: dict[str, dict[str, None]] = {}

    def add(self, execution: Execution) -> None:
        execution_id, name = execution.execution_id, execution.session_name
        if name is not None:
            self.sessions.setdefault(name, set()).add(execution_id)
        if execution.tenant is not None:
            self.tenants.setdefault(execution.tenant, {})[execution_id] = None

    def drop(self, execution: Execution) -> None:
        execution_id, name = execution.execution_id, execution.session_name
        held = None if name is None else self.sessions.get(name)
        if name is not None and held is not None:
            held.discard(execution_id)
            if not held:
                del self.sessions[name]
        ids = None if execution.tenant is None else self.tenants.get(execution.tenant)
        if execution.tenant is not None and ids is not None:
            ids.pop(execution_id, None)
            if not ids:
                del self.tenants[execution.tenant]
