"""The ``writer`` note of a ``file://`` pchannel: the term of its newest read-write open
and who opened it (``_identity.this_writer``), so that a fenced writer's ``WALFenced``
names the process that fenced it. Best effort: the note is a hint for people, never read
for correctness (the head holds the term), and failing to write or read it is ignored."""

from __future__ import annotations

import os

__all__ = ("read_writer_note", "write_writer_note")

_NAME = "writer"


def write_writer_note(pchannel_path: str, term: int, writer: str) -> None:
    """Record that ``writer`` opened ``pchannel_path`` with ``term`` (replaced whole by a
    rename; blocking, call it where the open already blocks)."""
    path = os.path.join(pchannel_path, _NAME)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as file:
            file.write(f"{term}\n{writer}\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def read_writer_note(pchannel_path: str, term: int) -> str | None:
    """Who opened ``pchannel_path`` with ``term``, if the note says so."""
    try:
        with open(os.path.join(pchannel_path, _NAME), encoding="utf-8") as file:
            noted, _, writer = file.read(4096).partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    writer = writer.strip()
    return writer if noted.strip() == str(term) and writer else None
