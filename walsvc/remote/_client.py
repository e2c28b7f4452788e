"""The WAL of a walsvc node: ``RemoteWAL`` has the methods, semantics and errors of a WAL
in this process; the node runs each append through its interceptor chain (it allocates
the timeticks) and filters each stream by header before it sends. Transactions are
the node's (``_txn``: a ``walsvc.Txn`` whose messages go to the node's handle), and so
are durable subscriptions (``_scanner``: the node's scanner holds the claim and writes
the checkpoints the client acknowledges).

An append's per-message work (checks, producer key, encoding; on the answer, the ids
and ``AppendResult``s) runs compiled where it can (``_cclient.c``, ``compiled``): it
writes the bytes the Python path here writes, and declines what it does not take, which
then goes the Python way. The Python path is the fallback and the definition.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
from collections.abc import Iterable
from typing import Final, final

from walsvc.backends._subscriptions import check_checkpoint_interval, check_subscription_name
from walsvc.core._deliver import DeliverPolicy
from walsvc.core._errors import (
    InvalidArgument,
    InvalidMessage,
    WALClosed,
    WALError,
    WALReadOnly,
)
from walsvc.core._filter import Filter
from walsvc.core._ids import MessageId, SequenceMessageId, unmarshal_message_id
from walsvc.core._message import (
    SYSTEM_TYPES,
    AppendResult,
    ImmutableMessage,
    Message,
    MessageType,
    TxnContext,
)
from walsvc.wal._api import DEFAULT_TXN_BUFFER_BYTES, WAL
from walsvc.write._txn import Txn

from ._connection import DEFAULT_HEARTBEAT, DEFAULT_RECONNECT_TIMEOUT, Connection
from ._dial import node_address
from ._protocol import (
    MAX_CREDIT,
    NODE_VERSIONS,
    PRODUCER_KEY_PREFIX,
    Append,
    Appended,
    AppendMany,
    CloseWal,
    DeleteSubscription,
    LatestId,
    LatestIdIs,
    Opened,
    OpenWal,
    Read,
    Truncate,
    WireDelivered,
    WireMessage,
    WireResult,
)
from ._scanner import RemoteScanner, claim_subscription
from ._txn import begin_remote_txn, resume_remote_txn

try:
    from . import _cclient
except ImportError:  # built without a C compiler: the Python path below
    _cclient = None  # type: ignore[assignment]

__all__ = (
    "DEFAULT_WINDOW_BYTES",
    "DEFAULT_WINDOW_MESSAGES",
    "RemoteWAL",
    "open_remote_wal",
)

_FROM_THE_START: Final = DeliverPolicy.all()
#: Default credit of a stream: messages and payload bytes the node may send unread.
DEFAULT_WINDOW_MESSAGES: Final = 4096
DEFAULT_WINDOW_BYTES: Final = 8 * 1024 * 1024
_TYPES: Final = {int(t): t for t in MessageType}


@final
class _Ids:
    """Parses marshalled ids, finding each scheme's id class once. The classes whose
    ids are plain sequence numbers go into ``sequences`` too (shared by a WAL's
    parsers), where the compiled ``results_of`` finds them."""

    __slots__ = ("_classes", "_last", "_last_text", "sequences")

    def __init__(self, sequences: dict[str, type[SequenceMessageId]]) -> None:
        self._classes: dict[str, type[MessageId]] = {}
        #: The schemes whose ids ``SequenceMessageId.from_position`` parses: scheme ->
        #: class.
        self.sequences = sequences
        # The last id parsed: results and messages repeat the same last-confirmed id
        # (_cclient.c reads and moves these two slots as __call__ does).
        self._last_text = ""
        self._last: MessageId | None = None

    def __call__(self, text: str) -> MessageId:
        if text == self._last_text and self._last is not None:
            return self._last
        parsed = self._parse(text)
        self._last_text, self._last = text, parsed
        return parsed

    def _parse(self, text: str) -> MessageId:
        scheme, _, position = text.partition(":")
        cls = self._classes.get(scheme)
        if cls is None:
            parsed = unmarshal_message_id(text)
            self._classes[scheme] = type(parsed)
            if isinstance(parsed, SequenceMessageId) and _numbered(type(parsed)):
                self.sequences[scheme] = type(parsed)
            return parsed
        return cls.from_position(position)


def _numbered(cls: type[SequenceMessageId]) -> bool:
    """Whether ``cls`` parses its ids as ``SequenceMessageId`` does (the class called
    with the position's number), as the compiled ``results_of`` does."""
    return getattr(cls.from_position, "__func__", None) is getattr(
        SequenceMessageId.from_position, "__func__", None
    )


def _wire(message: Message, key: str | None) -> WireMessage:
    return WireMessage(
        message.payload,
        message.vchannel,
        int(message.type),
        dict(message.properties),
        key,
    )


@final
class _ProducerKeys:
    """Gives each message appended without an idempotency key a producer key: this
    producer's random id and a sequence number (``~<id>.<n>``), so that a resend after
    a lost connection lands once. A key of the user's passes unchanged."""

    __slots__ = ("_next", "_prefix")

    def __init__(self, producer: str) -> None:
        self._prefix = f"{PRODUCER_KEY_PREFIX}{producer}."
        self._next = 0

    def __call__(self, message: Message) -> str:
        key = message.idempotency_key
        if key is None:
            self._next += 1
            return f"{self._prefix}{self._next:x}"
        if key.startswith(PRODUCER_KEY_PREFIX):
            raise InvalidMessage(
                f"idempotency keys beginning with {PRODUCER_KEY_PREFIX!r} are walsvc's"
                f" producer keys over walsvc://, not {key!r}"
            )
        return key


def _new_producer() -> str:
    """A producer id: 16 random URL-safe characters."""
    return secrets.token_urlsafe(12)


def _check_user_message(message: Message) -> None:
    if not isinstance(message, Message):
        raise TypeError(f"append takes walsvc.Message, not {type(message).__name__}")
    if message.type in SYSTEM_TYPES:
        raise InvalidMessage(
            f"{message.type.name} messages are written by the WAL itself"
            " (transactions: use WAL.begin_txn)"
        )
    if message.txn is not None:
        raise InvalidMessage("transaction messages are appended through WAL.begin_txn")


#: Whether appends are encoded, and their answers read, by the compiled client
#: (``_cclient.c``: the checks, producer keys and ``_wire`` of each message and the msgspec
#: encoding of the request in one call, ``_result`` of each answer in another). False:
#: walsvc was built without it, or the classes' fields are not the slots it reads.
compiled: Final = _cclient is not None and _cclient.bind(
    Message, WireResult, AppendResult, _Ids, SYSTEM_TYPES, PRODUCER_KEY_PREFIX
)
#: Whether a scanner's deliveries become messages in the compiled client too
#: (``_cclient.delivered_of``: ``RemoteWAL._message`` of a Delivered's messages in one call).
compiled_deliveries: Final = compiled and _cclient.bind_delivered(
    WireDelivered, ImmutableMessage, _TYPES
)


@final
class RemoteWAL(WAL):
    """A WAL whose writer is a walsvc node (``walsvc.open_wal("walsvc://host:port",
    pchannel)``): the same methods, semantics and errors as a WAL in this process, for
    what this protocol version serves (see the module docstring)."""

    __slots__ = (
        "_closed",
        "_conn",
        "_handle",
        "_ids",
        "_keys",
        "_lc_ids",
        "_opens",
        "_pchannel",
        "_producer",
        "_read_only",
        "_scanners",
        "_scheme",
        "_sequences",
        "_term",
        "_window",
    )

    def __init__(
        self,
        conn: Connection,
        opened: Opened,
        pchannel: str,
        window: tuple[int, int],
        *,
        exactly_once: bool = True,
        producer: str | None = None,
    ) -> None:
        self._conn = conn
        self._handle = opened.wal
        self._term = opened.term
        self._read_only = opened.read_only
        self._scheme = opened.scheme
        self._pchannel = pchannel
        self._closed = False
        self._sequences: dict[str, type[SequenceMessageId]] = {}
        self._ids = _Ids(self._sequences)
        self._lc_ids = _Ids(self._sequences)  # its own one-entry cache: lc ids repeat
        self._scanners: set[RemoteScanner] = set()
        self._window = window
        #: Who appends through this WAL (a random id; None if read-only), and how many
        #: times it was opened: the node fences the handle of an earlier opening.
        self._producer = producer
        self._opens = 1
        self._keys = _ProducerKeys(producer or _new_producer()) if exactly_once else None
        conn.saw_tick(opened.timetick)
        conn.on_reconnect(self._reopen)

    async def _reopen(self, conn: Connection) -> int:
        """Open this WAL again on a new socket of ``conn``; return its new handle."""
        request = conn.next_id()
        self._opens += 1
        opened: Opened = await conn.direct(
            OpenWal(request, self._pchannel, self._read_only, self._producer, self._opens),
            request,
        )
        self._handle = opened.wal
        self._term = opened.term
        conn.saw_tick(opened.timetick)
        return opened.wal

    @property
    def pchannel(self) -> str:
        """The physical channel this WAL writes and reads."""
        return self._pchannel

    @property
    def read_only(self) -> bool:
        """True if the WAL was opened read-only."""
        return self._read_only

    @property
    def closed(self) -> bool:
        """True once ``aclose`` was called."""
        return self._closed

    @property
    def term(self) -> int:
        """The node's writer term (0 when read-only)."""
        return 0 if self._read_only else self._term

    @property
    def connection(self) -> Connection:
        """The connection to the node (for tools and tests)."""
        return self._conn

    @property
    def url(self) -> str:
        """The node's URL (``walsvc://host:port``)."""
        return self._conn.where

    def _check_open(self) -> None:
        if self._closed:
            raise WALClosed(f"WAL {self._pchannel!r} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self._read_only:
            raise WALReadOnly(f"WAL {self._pchannel!r} was opened read-only")

    def _result(self, wire: WireResult) -> AppendResult:
        lc = wire.last_confirmed_id
        return AppendResult(
            self._ids(wire.message_id), wire.timetick, None if lc is None else self._lc_ids(lc)
        )

    async def wait_ready(self) -> None:
        """The node's writer starts before it serves an append: nothing to wait for."""
        self._check_open()

    async def append(self, message: Message) -> AppendResult:
        """Append one message through the node's interceptor chain; return its id,
        timetick and last-confirmed id once it is durable."""
        self._check_writable()
        conn = self._conn
        if conn.full:
            _check_user_message(message)  # what is refused is refused before waiting
            await conn.room()
        keys = self._keys
        if compiled and keys is not None:
            # Compiled: the checks, the producer key and the bytes in one call, which
            # declines (None) what the Python path below must see; its request id then
            # goes unused.
            request = conn.next_id()
            encoded = _cclient.encode_append(
                request, self._handle, message, keys._prefix, keys._next
            )
            if encoded is not None:
                data, keys._next = encoded
                pending = conn.request(data, request, append=True, resend=True)
                answer: Appended = await pending.future
                results = _cclient.results_of(answer.results, self._sequences, self._lc_ids)
                return self._result(answer.results[0]) if results is None else results[0]
        if type(message) is not Message or message.type in SYSTEM_TYPES or message.txn is not None:
            _check_user_message(message)
        request = conn.next_id()
        key = message.idempotency_key if keys is None else keys(message)
        item = Append(request, self._handle, _wire(message, key))
        pending = conn.request(item, request, append=True, resend=key is not None)
        answer = await pending.future
        return self._result(answer.results[0])

    async def append_many(self, messages: Iterable[Message]) -> list[AppendResult]:
        """Append messages in order, as one request; return their results once all are
        durable (``WAL.append_many``'s semantics, on the node)."""
        self._check_writable()
        batch = list(messages)
        conn = self._conn
        if conn.full and batch:
            for message in batch:  # what is refused is refused before waiting
                _check_user_message(message)
            await conn.room()
        keys = self._keys
        if compiled and keys is not None and batch:
            # Compiled, as in append: checks, keys and bytes in one call, the results in
            # one more. Declined (None): the Python path below.
            request = conn.next_id()
            encoded = _cclient.encode_append_many(
                request, self._handle, batch, keys._prefix, keys._next
            )
            if encoded is not None:
                data, keys._next = encoded
                pending = conn.request(data, request, append=True, resend=True)
                answer: Appended = await pending.future
                results = _cclient.results_of(answer.results, self._sequences, self._lc_ids)
                return [self._result(r) for r in answer.results] if results is None else results
        for message in batch:
            _check_user_message(message)
        if not batch:
            return []
        request = conn.next_id()
        wires = [_wire(m, m.idempotency_key if keys is None else keys(m)) for m in batch]
        resend = all(wire.idempotency_key is not None for wire in wires)
        item = AppendMany(request, self._handle, wires)
        pending = conn.request(item, request, append=True, resend=resend)
        answer = await pending.future
        return [self._result(r) for r in answer.results]

    async def begin_txn(
        self, vchannel: str, *, keepalive: float = 10.0, idempotency_key: str | None = None
    ) -> Txn:
        """``WAL.begin_txn`` on the node: append the BeginTxn of a transaction on
        ``vchannel`` and return its handle (or the replay of a committed one with
        ``idempotency_key``). The transaction is the node's: closing this WAL or losing
        its connection does not end it (it expires by its keepalive, unless taken up
        again with ``resume_txn``)."""
        return await begin_remote_txn(self, vchannel, keepalive, idempotency_key)

    async def resume_txn(self, txn_id: int) -> Txn:
        """A handle of the node's open transaction ``txn_id`` (``Txn.txn_id``) on this
        pchannel, begun through this node by this or an earlier connection, e.g. before
        a reconnect: go on appending, commit or roll back. Its keepalive runs meanwhile.
        Raises ``UnknownTxn`` if the node has no such transaction (never begun there, or
        long ended), and the error that ended it if a call did (``TxnExpired``,
        ``TxnAborted``; ``TxnNotActive`` once committed or rolled back)."""
        return await resume_remote_txn(self, txn_id)

    def read(
        self,
        deliver: DeliverPolicy = _FROM_THE_START,
        filters: Iterable[Filter] = (),
        *,
        raw: bool = False,
        timeticks: bool = False,
        use_cache: bool = True,
        subscription: str | None = None,
        txn_buffer_bytes: int = DEFAULT_TXN_BUFFER_BYTES,
        checkpoint_interval: float = 1.0,
    ) -> RemoteScanner:
        """A scanner fed by the node (``WAL.read``'s semantics; the node filters by
        header before it sends, and sends no more than the stream's credit).
        ``use_cache`` is the node's choice (it reads its tail cache when it can). A
        ``subscription`` is the node's: one reader per name across all its clients (a
        second one in this process is refused here, one elsewhere at its first read)."""
        self._check_open()
        if not isinstance(deliver, DeliverPolicy):
            raise TypeError(f"deliver must be a walsvc.DeliverPolicy, not {deliver!r}")
        if type(txn_buffer_bytes) is not int or txn_buffer_bytes < 0:
            raise InvalidArgument(f"txn_buffer_bytes must be an int >= 0, not {txn_buffer_bytes!r}")
        position = deliver.message_id
        if position is not None and position.scheme != self._scheme:
            raise InvalidArgument(f"{position!r} is not a {self._scheme}:// message id")
        selected = Filter.combine(filters)
        conn = self._conn
        claim = None
        if subscription is not None:
            check_checkpoint_interval(checkpoint_interval)
            check_subscription_name(subscription)
            claim = claim_subscription(conn.where, self._pchannel, subscription)
        window_messages, window_bytes = self._window
        read = Read(
            conn.next_id(),
            self._handle,
            deliver.kind,
            None if position is None else position.marshal(),
            deliver.after_timetick,
            None if selected.vchannels is None else sorted(selected.vchannels),
            None if selected.types is None else sorted(selected.types),
            selected.min_timetick,
            bool(timeticks),
            bool(raw),
            txn_buffer_bytes,
            window_messages,
            window_bytes,
            subscription,
            float(checkpoint_interval),
        )
        scanner = RemoteScanner(self, read, claim)
        conn.open_stream(scanner, read)
        self._scanners.add(scanner)
        return scanner

    async def delete_subscription(self, name: str) -> None:
        """Forget the node's durable subscription ``name`` (its checkpoint and scope), so
        that the next scanner of that name starts from its ``deliver`` policy, with its
        own filter. Raises ``SubscriptionBusy`` while a scanner of any client reads it;
        deleting a name that has no checkpoint does nothing."""
        self._check_open()
        check_subscription_name(name)
        conn = self._conn
        request = conn.next_id()
        await conn.request(DeleteSubscription(request, self._handle, name), request).future

    async def latest_message_id(self) -> MessageId | None:
        """The id of the newest durable message ever appended (even if since truncated),
        or None if nothing was ever appended."""
        self._check_open()
        conn = self._conn
        request = conn.next_id()
        pending = conn.request(LatestId(request, self._handle), request, resend=True)
        answer: LatestIdIs = await pending.future
        return None if answer.message_id is None else self._ids(answer.message_id)

    async def truncate(self, message_id: MessageId) -> None:
        """Drop every message up to and including ``message_id`` (on the node: every
        client's reads see it)."""
        self._check_writable()
        if not isinstance(message_id, MessageId) or message_id.scheme != self._scheme:
            raise InvalidArgument(f"{message_id!r} is not a {self._scheme}:// message id")
        conn = self._conn
        request = conn.next_id()
        await conn.request(Truncate(request, self._handle, message_id.marshal()), request).future

    async def aclose(self) -> None:
        """Close every scanner (their reads raise ``WALClosed``), release the node's
        handle and close the connection. Idempotent. The node's writer stays open for
        its other clients."""
        if self._closed:
            return
        self._closed = True
        scanners, self._scanners = self._scanners, set()
        for scanner in scanners:
            scanner._close_for_wal()
        conn = self._conn
        try:
            request = conn.next_id()
            pending = conn.request(CloseWal(request, self._handle), request)
            async with asyncio.timeout(5.0):
                await pending.future
        except (WALError, TimeoutError):
            pass  # the node releases a connection's handles when it closes anyway
        await conn.aclose()

    def _forget_scanner(self, scanner: RemoteScanner) -> None:
        self._scanners.discard(scanner)

    def _messages(self, wires: list[WireDelivered]) -> list[ImmutableMessage]:
        """``_message`` of each of ``wires`` (a Delivered's), compiled where it can be."""
        if compiled_deliveries:
            made = _cclient.delivered_of(wires, self._sequences, self._lc_ids)
            if made is not None:
                return made
        return [self._message(wire) for wire in wires]

    def _message(self, wire: WireDelivered) -> ImmutableMessage:
        ids = self._ids
        lc = wire.last_confirmed_id
        txn = wire.txn
        type_ = _TYPES.get(wire.type)
        return ImmutableMessage(
            ids(wire.message_id),
            wire.timetick,
            wire.vchannel,
            MessageType(wire.type) if type_ is None else type_,
            wire.payload,
            wire.properties,
            None if lc is None else self._lc_ids(lc),
            None if txn is None else TxnContext(*txn),
            wire.idempotency_key,
            wire.term,
            wire.persisted,
            tuple(self._message(inner) for inner in wire.body) if wire.body else (),
            wire.durable_tick,
        )

    def __repr__(self) -> str:
        mode = "ro" if self._read_only else f"rw term={self._term}"
        state = " closed" if self._closed else ""
        return f"<walsvc.WAL {self._conn.where} {self._pchannel} {mode}{state}>"


async def open_remote_wal(
    url: str,
    pchannel: str,
    *,
    read_only: bool = False,
    token: str | None = None,
    versions: tuple[int, int] = NODE_VERSIONS,
    window_messages: int = DEFAULT_WINDOW_MESSAGES,
    window_bytes: int = DEFAULT_WINDOW_BYTES,
    connect_timeout: float = 10.0,
    tls: ssl.SSLContext | None = None,
    reconnect_timeout: float = DEFAULT_RECONNECT_TIMEOUT,
    heartbeat: float = DEFAULT_HEARTBEAT,
    exactly_once: bool = True,
) -> RemoteWAL:
    """Open ``pchannel`` on the node at ``url`` (``walsvc://host:port``) over a new
    connection (see ``walsvc.open_wal``)."""
    host, port = node_address(url)
    for name, value in (("window_messages", window_messages), ("window_bytes", window_bytes)):
        if type(value) is not int or not 1 <= value <= MAX_CREDIT:
            raise InvalidArgument(f"{name} must be an int in 1..{MAX_CREDIT}, not {value!r}")
    for name, number in (("reconnect_timeout", reconnect_timeout), ("heartbeat", heartbeat)):
        if not isinstance(number, int | float) or not number >= 0:
            raise InvalidArgument(f"{name} must be a number of seconds >= 0, not {number!r}")
    conn = await Connection.connect(
        host,
        port,
        token=token,
        versions=versions,
        connect_timeout=connect_timeout,
        tls=tls,
        reconnect_timeout=float(reconnect_timeout),
        heartbeat=float(heartbeat),
    )
    producer = None if read_only else _new_producer()
    try:
        request = conn.next_id()
        opening = OpenWal(request, pchannel, read_only, producer, 1)
        opened: Opened = await conn.request(opening, request).future
    except BaseException:
        await conn.aclose()
        raise
    return RemoteWAL(
        conn,
        opened,
        pchannel,
        (window_messages, window_bytes),
        exactly_once=exactly_once,
        producer=producer,
    )
