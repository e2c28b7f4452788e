"""URL scheme -> backend, loaded lazily on first use.

Built-in backends live in ``walsvc.backends._<name>``; others come from the
``walsvc.backends`` entry-point group or ``register_backend``. Each backend module exposes
``backend_class``. A scheme registered twice is an error, never a silent override. On
import it teaches ``walsvc.core._ids.unmarshal_message_id`` to find a scheme's id class
here (the id model sits below the backends and cannot import them).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Final

from walsvc.core._errors import InvalidArgument, UnknownBackend
from walsvc.core._ids import resolve_schemes_with

from ._base import Backend

__all__ = ("backend_class", "known_schemes", "register_backend")

ENTRY_POINT_GROUP: Final = "walsvc.backends"

# scheme -> (module path, the extra that installs its dependencies or None)
_BUILTIN: Final[dict[str, tuple[str, str | None]]] = {
    "memory": ("walsvc.backends._memory", None),
    "file": ("walsvc.backends._file", None),
    "kafka": ("walsvc.backends._kafka", "kafka"),
    "pulsar": ("walsvc.backends._pulsar", "pulsar"),
}
_registered: dict[str, str] = {}
_loaded: dict[str, type[Backend]] = {}
_entry_points_read = False


def register_backend(scheme: str, module: str) -> None:
    """Serve ``scheme://`` URLs with the ``backend_class`` of ``module`` (imported on first
    use). Raises ``InvalidArgument`` if the scheme is already taken."""
    _read_entry_points()
    if scheme in _BUILTIN or scheme in _registered:
        raise InvalidArgument(f"backend scheme {scheme!r} is already registered")
    _registered[scheme] = module


def known_schemes() -> list[str]:
    """Every scheme with a backend, built-in or registered."""
    _read_entry_points()
    return sorted({*_BUILTIN, *_registered})


def backend_class(scheme: str) -> type[Backend]:
    """The backend class for ``scheme``, importing its module on first use.

    Raises ``UnknownBackend`` for an unknown scheme, or for a known one whose optional
    dependencies are missing (the message names the ``pip install`` that fixes it).
    """
    cls = _loaded.get(scheme)
    if cls is not None:
        return cls
    _read_entry_points()
    builtin = _BUILTIN.get(scheme)
    module_name, extra = builtin if builtin else (_registered.get(scheme), None)
    if module_name is None:
        raise UnknownBackend(
            f"no walsvc backend for scheme {scheme!r}; known: {', '.join(known_schemes())}"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name == module_name:
            raise UnknownBackend(
                f"the {scheme}:// backend module {module_name} is not installed"
                + (" (it is not part of this walsvc release yet)" if builtin else "")
            ) from exc
        if extra is None:
            raise UnknownBackend(
                f"the {scheme}:// backend module {module_name} cannot be imported:"
                f" {exc.name or exc} is missing"
            ) from exc
        raise UnknownBackend(
            f"the {scheme}:// backend needs the {extra!r} extra ({exc.name} is missing):"
            f" pip install 'walsvc[{extra}]'"
        ) from exc
    cls = getattr(module, "backend_class", None)
    if not (isinstance(cls, type) and issubclass(cls, Backend)) or cls.scheme != scheme:
        raise UnknownBackend(f"{module_name}.backend_class is not a Backend for {scheme!r}")
    _loaded[scheme] = cls
    return cls


def _read_entry_points() -> None:
    global _entry_points_read
    if _entry_points_read:
        return
    _entry_points_read = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _BUILTIN or ep.name in _registered:
            raise InvalidArgument(
                f"entry point {ep.value!r} registers backend scheme {ep.name!r}, which is"
                " already registered"
            )
        _registered[ep.name] = ep.value


resolve_schemes_with(lambda scheme: backend_class(scheme).message_id_class)
