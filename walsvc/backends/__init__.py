"""The backend interface, for writing a backend of one's own.

A third-party backend is a module exposing ``backend_class`` (a ``Backend`` subclass),
registered under its URL scheme with ``walsvc.register_backend`` or through the
``walsvc.backends`` entry-point group.
"""

from ._base import Backend, BackendScanner

__all__ = ("Backend", "BackendScanner")
