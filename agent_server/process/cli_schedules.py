"""`agent-server schedules ...`: the schedules' verbs (docs/schedules.md), client verbs like
the others of cli_client.py, which registers them; no server is imported."""

from __future__ import annotations

import json
from typing import Any

import click

from agent_server.client import AgentClient
from agent_server.model.schedule_fields import (
    DEFAULT_CATCHUP_WINDOW,
    MAX_CATCHUP_WINDOW,
    OVERLAPS,
)
from agent_server.process.cli_client import (
    PATH_NAME,
    CallExit,
    ClientCommand,
    ClientGroup,
    Seconds,
    ServerOptions,
    reach,
    server_options,
)
from agent_server.process.cli_output import print_json


@click.group(name="schedules", cls=ClientGroup)
def schedules() -> None:
    """Schedules: list, show, create, enable, disable, trigger, delete (docs/schedules.md)."""


@schedules.command(name="list", cls=ClientCommand)
@click.option(
    "--limit",
    type=click.IntRange(min=1, max=1000),
    default=100,
    show_default=True,
    help="Schedules a page (the server's bound: 1000).",
)
@click.option(
    "--all", "every", is_flag=True, help="Follow the pages (Link: rel=next) to the last one."
)
@server_options
def schedules_list(limit: int, every: bool, server: ServerOptions) -> None:
    """Print the schedules (the declared ones and the caller's tenant's), by id, as one
    JSON list: one page, or with --all all."""

    def work(client: AgentClient) -> int:
        print_json(list(client.iter_schedules(limit)) if every else client.schedules(limit))
        return CallExit.SUCCEEDED

    reach(server, work)


@schedules.command(name="show", cls=ClientCommand)
@click.argument("schedule_id", metavar="ID", type=PATH_NAME)
@server_options
def schedules_show(schedule_id: str, server: ServerOptions) -> None:
    """Print schedule ID as JSON."""

    def work(client: AgentClient) -> int:
        print_json(client.get_schedule(schedule_id))
        return CallExit.SUCCEEDED

    reach(server, work)


@schedules.command(name="create", cls=ClientCommand)
@click.argument("reasoner", type=PATH_NAME)
@click.argument("cron")
@click.option("--input", "input_json", default=None, help="The reasoner's input (JSON object).")
@click.option("--timezone", default=None, help="An IANA time zone (default UTC).")
@click.option(
    "--overlap",
    type=click.Choice(OVERLAPS),
    default=None,
    help=f"What a firing does while the previous one runs (default {OVERLAPS[0]}).",
)
@click.option(
    "--catchup-window",
    type=Seconds(maximum=MAX_CATCHUP_WINDOW),
    default=None,
    help=f"Seconds back a late firing still starts (default {DEFAULT_CATCHUP_WINDOW:g}).",
)
@click.option("--session", default=None, help="The session its executions start in.")
@server_options
def schedules_create(
    reasoner: str,
    cron: str,
    input_json: str | None,
    timezone: str | None,
    overlap: str | None,
    catchup_window: float | None,
    session: str | None,
    server: ServerOptions,
) -> None:
    """Make a schedule that starts REASONER at the times CRON names (five fields, or six
    with seconds first); print it as JSON."""
    fields: dict[str, Any] = {
        name: value
        for name, value in (
            ("timezone", timezone),
            ("overlap", overlap),
            ("catchup_window", catchup_window),
            ("session_id", session),
        )
        if value is not None
    }
    if input_json is not None:
        try:
            fields["input"] = json.loads(input_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None

    def work(client: AgentClient) -> int:
        print_json(client.create_schedule(reasoner, cron, fields))
        return CallExit.SUCCEEDED

    reach(server, work)


def _switch(name: str, enabled: bool) -> click.Command:
    @click.argument("schedule_id", metavar="ID", type=PATH_NAME)
    @server_options
    def switch(schedule_id: str, server: ServerOptions) -> None:
        def work(client: AgentClient) -> int:
            print_json(client.update_schedule(schedule_id, {"enabled": enabled}))
            return CallExit.SUCCEEDED

        reach(server, work)

    switch.__doc__ = f"{name.capitalize()} schedule ID; print it as JSON."
    return schedules.command(name=name, cls=ClientCommand)(switch)


_switch("enable", True)
_switch("disable", False)


@schedules.command(name="trigger", cls=ClientCommand)
@click.argument("schedule_id", metavar="ID", type=PATH_NAME)
@server_options
def schedules_trigger(schedule_id: str, server: ServerOptions) -> None:
    """Fire schedule ID now; print the execution it started as JSON."""

    def work(client: AgentClient) -> int:
        print_json(client.trigger_schedule(schedule_id).json)
        return CallExit.SUCCEEDED

    reach(server, work)


@schedules.command(name="delete", cls=ClientCommand)
@click.argument("schedule_id", metavar="ID", type=PATH_NAME)
@server_options
def schedules_delete(schedule_id: str, server: ServerOptions) -> None:
    """Delete schedule ID (a declared one cannot be: exit code of a conflict)."""

    def work(client: AgentClient) -> int:
        client.delete_schedule(schedule_id)
        return CallExit.SUCCEEDED

    reach(server, work)
