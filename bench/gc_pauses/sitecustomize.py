"""Put on PYTHONPATH of a benchmarked server by `bench.scale --gc-log`: one stderr line per
garbage collection that pauses the process for more than 10 ms, as
`GC_PAUSE <generation> <monotonic start> <seconds>` (CLOCK_MONOTONIC is system-wide, so the
benchmark can line the pauses up with the moment it sent SIGTERM)."""

from __future__ import annotations

import gc
import os
import time
from typing import Any

_started = [0.0]


def _log(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[0] = time.monotonic()
        return
    took = time.monotonic() - _started[0]
    if took > 0.01:
        line = f"GC_PAUSE {info['generation']} {_started[0]:.6f} {took:.6f}\n"
        os.write(2, line.encode())


gc.callbacks.append(_log)
