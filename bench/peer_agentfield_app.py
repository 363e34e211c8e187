"""The AgentField peer: the same echo reasoner served by AgentField's own server.

Runs in its own virtual environment (`agentfield` from PyPI), never in agent-server's.
`Agent.serve()` starts uvicorn itself; with no control plane listening it keeps serving in
"local mode" and retries the (loopback) control plane in the background.

Usage: PEER_PYTHON bench/peer_agentfield_app.py PORT
"""

from __future__ import annotations

import os
import sys

# Keep every call on loopback and off the network: no public-IP probe, no model price list.
os.environ.setdefault("AGENTFIELD_DISABLE_IP_DETECTION", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("AGENTFIELD_SERVER", "http://127.0.0.1:9")

from agentfield import Agent

PORT = int(sys.argv[1])
os.environ.setdefault("AGENT_CALLBACK_URL", f"http://127.0.0.1:{PORT}")

app = Agent(node_id="bench-echo", enable_did=False, vc_enabled=False)


@app.reasoner()
async def echo(text: str) -> dict[str, str]:
    """Returns its input: the smallest round trip."""
    return {"text": text}


if __name__ == "__main__":
    app.serve(port=PORT, host="127.0.0.1", access_log=False, log_level="warning")
