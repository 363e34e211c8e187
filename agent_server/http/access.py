"""The application layer's access rule (service/access.py), asked of an HTTP request: the
principal is the one authentication put in the request's scope."""

from __future__ import annotations

from typing import Any

from starlette.types import Scope

from agent_server.http.auth import principal_of
from agent_server.http.routing import ApiError
from agent_server.identity.principal import Principal
from agent_server.model.execution import Execution
from agent_server.service.access import UNKNOWN_EXECUTION, Access, ListScope


class RequestAccess(Access):
    """`Access` with the request's scope standing for its principal."""

    @staticmethod
    def principal(scope: Scope) -> Principal | None:
        return principal_of(scope)

    def visible(self, scope: Scope, execution: Execution | None) -> Execution:
        """The execution when the request's principal sees it, else the 404 of an unknown
        id (the same bytes)."""
        if execution is None or not self.sees(principal_of(scope), execution):
            raise ApiError(404, UNKNOWN_EXECUTION)
        return execution

    async def check(self, scope: Scope, action: str, resource: dict[str, Any]) -> None:
        """`check_for` the request's principal (403 when `@agent.authorize` denies)."""
        await self.check_for(principal_of(scope), action, resource)

    async def allowed(self, scope: Scope, action: str, execution: Execution) -> Execution:
        """The execution, found visible, once the action on it is allowed."""
        self.visible(scope, execution)
        return await self.allowed_for(principal_of(scope), action, execution)

    async def list_scope(self, scope: Scope, resource: dict[str, Any]) -> ListScope:
        """`list_scope_for` the request's principal."""
        return await self.list_scope_for(principal_of(scope), resource)
