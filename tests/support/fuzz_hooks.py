"""Schemathesis hooks for the fuzz run (loaded through SCHEMATHESIS_HOOKS).

A stateless fuzzer draws the same Idempotency-Key for requests with different bodies; the
server rightly refuses the second one (422: the key was first used for another request),
which the fuzzer would read as a valid request rejected. Each valid key it draws is made
unique per request, so keys are still sent (and malformed ones still refused with 400)
without being reused across requests.

A long-poll (`GET /executions/{id}?wait=S`) rightly waits up to a minute for an execution
that is not ending (a start the fuzzer delayed by days with `?delay=`), past the fuzzer's
own request timeout: a drawn `wait` is bounded to WAIT_BOUND seconds (values outside the
schema are still sent as drawn, and still refused).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

VALID_KEY = re.compile(r"[ -~]{1,255}")
#: Well under the fuzzer's --request-timeout (10 s).
WAIT_BOUND = 2.0


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "idempotency-key" and VALID_KEY.fullmatch(str(headers[name])):
            headers[name] = uuid.uuid4().hex
    query = case.query or {}
    wait = query.get("wait")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > WAIT_BOUND:
        query["wait"] = WAIT_BOUND
