"""Counted nouns in log lines: "1 execution", "2 executions", never "1 executions"."""

from __future__ import annotations


def counted(number: int, noun: str, plural: str | None = None) -> str:
    """`number` and `noun`, plural (`plural`, else an `s` added) unless `number` is 1."""
    if number == 1:
        return f"{number} {noun}"
    return f"{number} {plural if plural is not None else noun + 's'}"
