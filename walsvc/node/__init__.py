"""Layer 6, many pchannels: ``Node`` routes vchannels over one WAL per pchannel with a
versioned ``Routing`` stored in the backend, and reads a vchannel across migrations.

Builds on the WAL layer only through its public behaviour. The modules here are private;
``walsvc.open_node``, ``walsvc.Node`` and ``walsvc.Routing`` are public.
"""

__all__: tuple[str, ...] = ()
