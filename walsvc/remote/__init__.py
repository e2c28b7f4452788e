"""Layer 4b, the client of a walsvc node: the wire protocol (``_protocol``, specified in
docs/protocol.md: its messages by direction in ``_client_messages`` and
``_node_messages``), frames over asyncio streams (``_frames``), one connection to a node
(``_connection``, which dials with ``_dial``, keeps its requests in the book of
``_pending`` and replaces lost sockets with ``_reconnect``), the WAL and scanners of a
node (``_client``, ``_scanner``), its
transactions (``_txn``), the ``open_wal`` users call, which sends ``walsvc://`` URLs to
a node and every other scheme to ``walsvc.wal`` (``_open``), and a node's status
(``_node_status``, fetched by ``_status``).

Above ``walsvc.wal`` (its abstract ``WAL`` and the local ``open_wal``), below
``walsvc.node`` (which opens its pchannels through the dispatching ``open_wal``). The
modules here are private; ``walsvc.open_wal`` is public.
"""

__all__: tuple[str, ...] = ()
