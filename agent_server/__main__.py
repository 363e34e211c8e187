"""`python -m agent_server run ...` is `agent-server run ...`."""

from agent_server.process.cli import main

main()
