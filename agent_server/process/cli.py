"""The `agent-server` command: its group, with the client verbs (`call`, `get`, ...:
`cli_client.py`) and the server's `run` and `drill` (`cli_server.py`), the latter imported
only when one of them is invoked or described. A client verb so starts without importing
the server (the app, its HTTP layer, its runtime, uvicorn, pydantic): a shell loop of
`agent-server get` pays for httpx and click alone (bench/RESULTS.md)."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version

import click

from agent_server.process.cli_client import COMMANDS, CONTEXT
from agent_server.process.cli_schedules import schedules
from agent_server.process.cli_store import store

#: The server's commands: name -> attribute of `agent_server.process.cli_server`.
SERVER_COMMANDS = {"run": "run", "drill": "drill_command"}
SERVER_MODULE = "agent_server.process.cli_server"


class AgentServerGroup(click.Group):
    """A group whose server commands are imported on first use (click's documented lazy
    group): listing them in `--help` imports them, running a client verb does not."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *SERVER_COMMANDS])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        attribute = SERVER_COMMANDS.get(cmd_name)
        if attribute is None:
            return super().get_command(ctx, cmd_name)
        command = getattr(importlib.import_module(SERVER_MODULE), attribute)
        assert isinstance(command, click.Command)
        return command


def _version() -> str:
    try:
        return version("agent-server")
    except PackageNotFoundError:
        return "unknown"


@click.group(cls=AgentServerGroup, invoke_without_command=True, context_settings=CONTEXT)
@click.version_option(_version(), "--version", prog_name="agent-server")
@click.pass_context
def main(ctx: click.Context) -> None:
    """agent-server: serve reasoners, and shut down gracefully."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())
        ctx.exit(0)


for _command in [*COMMANDS, schedules, store]:
    main.add_command(_command)
