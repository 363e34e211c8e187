"""Server-sent events from text as it arrives (the WHATWG event-stream rules), so that the
core reads a stream the same way whichever front fed it the text."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A line ends at `\r\n`, `\r` or `\n`, and nowhere else (not at str.splitlines' others).
_NEWLINE = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class Message:
    """One dispatched event: `event` is `message` when the stream named none; `id` is the
    stream's last event id, which persists from one event to the next."""

    event: str
    data: str
    id: str
    retry: int | None


class Parser:
    """One connection's stream: fed text in any pieces, it returns the events completed."""

    def __init__(self) -> None:
        #: The unterminated end of the text so far; a final `\r` is kept, as a `\n` may
        #: follow it in the next piece.
        self._pending = ""
        self._event = ""
        self._data: list[str] = []
        self._id = ""
        self._retry: int | None = None

    def feed(self, text: str) -> list[Message]:
        text = self._pending + text
        held = ""
        if text.endswith("\r"):
            text, held = text[:-1], "\r"
        *lines, rest = _NEWLINE.split(text)
        self._pending = rest + held
        return [message for line in lines if (message := self._line(line)) is not None]

    def end(self) -> list[Message]:
        """The stream closed: its last line ends there, even unterminated."""
        rest, self._pending = self._pending, ""
        if not rest:
            return []
        message = self._line(rest.removesuffix("\r"))
        return [] if message is None else [message]

    def _line(self, line: str) -> Message | None:
        if not line:
            if not (self._event or self._data or self._id or self._retry is not None):
                return None
            message = Message(
                self._event or "message", "\n".join(self._data), self._id, self._retry
            )
            self._event, self._data, self._retry = "", [], None
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)
        return None
