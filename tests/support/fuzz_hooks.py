"""Schemathesis hooks for the fuzz run (loaded through SCHEMATHESIS_HOOKS).

A stateless fuzzer draws the same Idempotency-Key for requests with different bodies; the
server rightly refuses the second one (422: the key was first used for another request),
which the fuzzer would read as a valid request rejected. Each valid key it draws is made
unique per request, so keys are still sent (and malformed ones still refused with 400)
without being reused across requests.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import schemathesis

VALID_KEY = re.compile(r"[ -~]{1,255}")


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    headers = case.headers or {}
    for name in list(headers):
        if name.lower() == "idempotency-key" and VALID_KEY.fullmatch(str(headers[name])):
            headers[name] = uuid.uuid4().hex
