"""Layer 1, the model: messages, ids, errors, filters, deliver policies, the envelope
codec, the hybrid clock, the per-loop read budget and the interceptor protocols.

Pure: no file, socket, thread or broker import, and nothing above it (checked by the
import-linter contracts in pyproject.toml). Its names are public through ``walsvc`` and
``walsvc.abc``; the modules here are private.
"""

__all__: tuple[str, ...] = ()
