"""What the SDK's JSON-RPC layer logs, kept to what an operator needs: its lines about a
client's mistakes (a body that is not JSON-RPC, bad params, an unknown method, a version
mismatch, each with a traceback or the request's body) and about the API's refusals are
dropped, since they are answered to the client and any client could fill the log with them
(the request body, at debug level, can hold a push config's token); what remains (the SDK's
own errors) has its text arguments quoted and bounded, at most 10 lines a second a logger."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException

from agent_server.model import redaction

#: The SDK's loggers that write what a client sent.
SDK_LOGGERS = (
    "a2a.server.routes.jsonrpc_dispatcher",
    "a2a.compat.v0_3.jsonrpc_adapter",
    "a2a.utils.version_validator",
)
#: How the lines about a client's mistake begin.
CLIENT_MISTAKES = (
    "Request body: ",
    "Failed to validate base JSON-RPC request",
    "Failed to parse request params",
    "Version mismatch",
)
#: JSON-RPC's internal error: the one error answer that may be a bug here.
INTERNAL_ERROR = -32603
#: Characters of a text argument a kept line shows.
SHOWN = 200


class ClientMistakes(logging.Filter):
    """Drops the SDK's lines about what a client got wrong, and about the API's refusals
    (an HTTP error such as a 429 or 503, answered as such)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        if message.startswith(CLIENT_MISTAKES):
            return False
        if message.startswith("Request Error") and isinstance(record.args, tuple):
            return len(record.args) > 1 and record.args[1] == INTERNAL_ERROR
        return not (record.exc_info and isinstance(record.exc_info[1], HTTPException))


def quiet_sdk_logs() -> None:
    """Install the filters on the SDK's loggers (once each, whatever calls it again)."""
    for name in SDK_LOGGERS:
        logger = logging.getLogger(name)
        redaction.install(logger, ClientMistakes())
        redaction.install(logger, redaction.QuoteArgs(SHOWN))
