"""Counted nouns in log lines: "1 execution", "2 executions", never "1 executions"."""

from __future__ import annotations


def counted(number: int, noun: str) -> str:
    """`number` and `noun`, plural (an `s`) unless `number` is 1."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"
