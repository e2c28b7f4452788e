"""Layer 7, the applications: configuration files and the environment
(``walsvc.open_wal_from_config``), and the ``walsvc`` command line (demo, check, flush,
serve, status, tail, inspect).

The top of the library: nothing in walsvc imports it but the ``walsvc`` facade and
``python -m walsvc``. The modules here are private.
"""

__all__: tuple[str, ...] = ()
