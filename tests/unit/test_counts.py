"""Counted nouns in log lines are singular for one."""

from __future__ import annotations

from agent_server.model.counts import counted


def test_one_is_singular_and_others_plural() -> None:
    assert counted(1, "execution") == "1 execution"
    assert [counted(n, "execution") for n in (0, 2)] == ["0 executions", "2 executions"]
    assert counted(1, "delivery", "deliveries") == "1 delivery"
    assert counted(3, "delivery", "deliveries") == "3 deliveries"
