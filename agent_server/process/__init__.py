"""The process: `agent-server run` and the CLI.

The command line (`cli`) and its client verbs (`cli_client`), the uvicorn runner
(`runner`), and the shutdown rehearsal (`drill`).
"""
