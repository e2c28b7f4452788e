"""``file://``: the durable local log (see ``_backend`` for the URL and options, and
``_format`` for the on-disk layout)."""

from ._backend import FileBackend
from ._ids import FileMessageId

backend_class = FileBackend

__all__ = ("FileBackend", "FileMessageId", "backend_class")
