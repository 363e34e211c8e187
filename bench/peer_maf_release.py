"""The agent-framework-core peer for item 4: `BackgroundAgentsProvider.release_session(session,
timeout=...)` of a session whose one background task is a real `Agent` run on a chat client
that, when cancelled, cleans up for `cleanup` seconds and then re-raises.

The task is started the way the parent model would start it: through the provider's own
`background_agents_start_task` tool, handed out by `before_run`. Runs in its own virtual
environment (`agent-framework-core` from PyPI). Prints one JSON object.

Usage: MAF_PYTHON bench/peer_maf_release.py [--repeat 20] [--timeout 0.03] [--cleanup 0.35]
                                            [--interruptible]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.metadata
import json
import time
from typing import Any

from agent_framework import (
    Agent,
    AgentSession,
    BackgroundAgentsProvider,
    BaseChatClient,
    ChatResponse,
    Message,
    SessionContext,
)


class DeferredCleanupChatClient(BaseChatClient):  # type: ignore[misc]
    """A model call that never answers; cancelled, it cleans up for `cleanup` seconds.

    `robust`: the cleanup completes even if cancelled again meanwhile; otherwise a second
    cancellation interrupts it. The same code as bench/bench_app.py's `deferred_cleanup`.
    """

    def __init__(self, cleanup: float, robust: bool) -> None:
        super().__init__()
        self.cleanup = cleanup
        self.robust = robust
        self.started = asyncio.Event()

    async def _inner_get_response(
        self, *, messages: Any, stream: bool, options: Any, **kw: Any
    ) -> Any:
        self.started.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            await finish_cleanup(self.cleanup, self.robust)
            raise
        return ChatResponse(messages=[Message(role="assistant", contents=["not reached"])])


async def finish_cleanup(seconds: float, robust: bool) -> None:
    """Clean up for `seconds`; with `robust`, further cancellations wait for it to finish."""
    cleanup = asyncio.ensure_future(asyncio.sleep(seconds))
    if not robust:
        await asyncio.shield(cleanup)
        return
    while not cleanup.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(cleanup)


async def release_once(timeout: float, cleanup: float, robust: bool) -> float:
    client = DeferredCleanupChatClient(cleanup, robust)
    worker = Agent(client=client, name="worker")
    provider = BackgroundAgentsProvider([worker])
    session = AgentSession()
    context = SessionContext(session_id=session.session_id, input_messages=[])
    await provider.before_run(agent=None, session=session, context=context, state={})
    start = next(t for t in context.tools if t.name == "background_agents_start_task")
    answer = start(agent_name="worker", input="work", description="deferred cleanup")
    if not str(answer).startswith("Background task"):
        raise RuntimeError(f"start tool answered {answer!r}")
    await asyncio.wait_for(client.started.wait(), timeout=10)
    began = time.perf_counter()
    await provider.release_session(session, timeout=timeout)
    elapsed = time.perf_counter() - began
    # Let the abandoned cleanup end before the next round (bounded).
    await asyncio.sleep(cleanup + 0.05)
    return elapsed


async def main_async(repeat: int, timeout: float, cleanup: float, robust: bool) -> dict[str, Any]:
    elapsed = [await release_once(timeout, cleanup, robust) for _ in range(repeat)]
    return {
        "peer": "agent-framework-core",
        "version": importlib.metadata.version("agent-framework-core"),
        "api": "BackgroundAgentsProvider.release_session(session, cancel_running=True, timeout=T)",
        "timeout": timeout,
        "cleanup": cleanup,
        "robust": robust,
        "elapsed": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.03)
    parser.add_argument("--cleanup", type=float, default=0.35)
    parser.add_argument("--interruptible", action="store_true", help="cleanup not robust")
    args = parser.parse_args()
    outcome = main_async(args.repeat, args.timeout, args.cleanup, not args.interruptible)
    print(json.dumps(asyncio.run(outcome)))


if __name__ == "__main__":
    main()
