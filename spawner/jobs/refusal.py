"""BadJob: a job or schedule request refused, with the message and HTTP status its user sees."""

from __future__ import annotations

from typing import Any

# The longest path (a workdir, a notebook) a request may name.
MAX_PATH = 1024


class BadJob(ValueError):
    """A submission refused; str() is the message for the user, `status` the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def shown(value: Any) -> str:
    """A short printable excerpt of hostile input, for messages."""
    return "".join(ch for ch in str(value)[:40] if ch.isprintable())
