"""Layer 6, the walsvc node: serves one backend's pchannels to client processes over the
protocol of ``walsvc.remote`` (``walsvc.serve``; ``walsvc serve`` on the command line).

Beside ``walsvc.spark`` and ``walsvc.testing`` (independent of them); uses ``walsvc.wal``
(one WAL per pchannel, the node its single writer) and ``walsvc.remote``'s protocol.
``_server`` accepts connections and runs their handshake; ``_session`` serves a
connection's requests, ``_appends`` its appends and ``_streams`` its streams, each fed
by its pump (``_pump``); ``_txns`` holds the node's transactions (one table for the
node, not per connection); ``_subscriptions`` applies clients' acks.
The modules here are private; ``walsvc.serve`` is public.
"""

__all__: tuple[str, ...] = ()
