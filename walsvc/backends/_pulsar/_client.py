"""The pulsar-client boundary: options, the client, and exception translation.

pulsar-client runs its own C++ threads; every result comes back to the event loop through
``loop.call_soon_threadsafe`` (here and in ``pulsar.asyncio``). Nothing above this
package sees a pulsar exception: ``translate`` turns them into walsvc errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, NoReturn, TypeVar, final

import pulsar
import pulsar.asyncio as pulsar_asyncio
from pulsar import _pulsar

from walsvc.core._errors import (
    BackendUnavailable,
    CorruptRecord,
    InvalidArgument,
    MessageTooLarge,
    WALClosed,
    WALError,
    WALFenced,
)

from .._process_threads import ProcessThreads
from ._creations import Creations
from ._ids import PulsarMessageId

__all__ = (
    "LOG_ENV",
    "LOG_LEVEL_ENV",
    "PULSAR_ERRORS",
    "Client",
    "Options",
    "call_async",
    "call_in_thread",
    "client_logger",
    "parse_options",
    "pulsar_id",
    "release_callbacks",
    "result_name",
    "result_of",
    "service_url",
    "translate",
    "translate_result",
)

_T = TypeVar("_T")

#: Every exception pulsar-client raises (its C++ errors and the asyncio wrapper's).
PULSAR_ERRORS: Final = (_pulsar.PulsarException, pulsar_asyncio.PulsarException)

#: The variable that turns pulsar-client's own (C++) log on: ``console`` (the process's
#: stdout) or a file path (appended to). Unset or empty: the log is off.
LOG_ENV: Final = "WALSVC_PULSAR_LOG"
#: The level of that log once it is on: ``debug``, ``info`` (default), ``warn`` or ``error``.
LOG_LEVEL_ENV: Final = "WALSVC_PULSAR_LOG_LEVEL"
_LEVELS: Final = {
    "debug": pulsar.LoggerLevel.Debug,
    "info": pulsar.LoggerLevel.Info,
    "warn": pulsar.LoggerLevel.Warn,
    "warning": pulsar.LoggerLevel.Warn,
    "error": pulsar.LoggerLevel.Error,
}


def client_logger(
    environ: Mapping[str, str] = os.environ,
) -> pulsar.FileLogger | pulsar.ConsoleLogger:
    """The logger of walsvc's pulsar-client clients: by default the client's C++ log goes
    to ``os.devnull``; ``WALSVC_PULSAR_LOG`` (and ``WALSVC_PULSAR_LOG_LEVEL``) turn it on.

    Why off: the C++ client logs every fault it meets, at ERROR, on the process's stdout,
    including those walsvc handles: a refused connection is one ERROR line per retry
    (eight over the default 10 s ``connect_timeout``) before walsvc's own error, and Pulsar
    Lite's ``UnknownError`` for the last id of an empty topic (which ``last_entry`` reads
    as "empty") is an ERROR line on the first read of every subscription. walsvc turns
    every fault that reaches it into one typed error that names the broker, so the
    client's lines only repeat it (or report what walsvc recovered from); they are for
    debugging the client itself. The C++ client has no level above ERROR and no filter,
    hence a file logger on ``os.devnull``.

    Never a Python ``logging.Logger`` (which would let walsvc filter the lines): the
    client's I/O threads would call it holding a producer's mutex, while ``flush_async``
    (whose binding keeps the GIL) waits on that mutex from the event loop: a deadlock of
    the whole process (seen with pulsar-client 3.13 under load).

    The C++ client keeps the logger of the first client created in the process, for
    every client (walsvc's and any other's): set the variables before the first one.
    ``InvalidArgument`` for an unknown level or a log file that cannot be opened.
    """
    target = environ.get(LOG_ENV, "")
    if not target:
        return pulsar.FileLogger(pulsar.LoggerLevel.Error, os.devnull)
    name = environ.get(LOG_LEVEL_ENV, "") or "info"
    level = _LEVELS.get(name.lower())
    if level is None:
        raise InvalidArgument(
            f"{LOG_LEVEL_ENV} must be one of debug, info, warn, error, not {name!r}"
        )
    if target == "console":
        return pulsar.ConsoleLogger(level)
    try:  # the C++ logger drops its lines silently if it cannot open the file
        with open(target, "a"):
            pass
    except OSError as exc:
        raise InvalidArgument(f"{LOG_ENV}: cannot open {target!r} for appending: {exc}") from exc
    return pulsar.FileLogger(level, target)


_DEFAULT_PREFIX: Final = "persistent://public/default/walsvc."
_KNOWN: Final = frozenset(
    {
        "topic_prefix",
        "connect_timeout",
        "operation_timeout",
        "close_timeout",
        "batching_max_messages",
        "batching_max_publish_delay_ms",
    }
)


@final
class Options(NamedTuple):
    """The ``pulsar://`` backend's keyword options of ``walsvc.open_wal``."""

    topic_prefix: str = _DEFAULT_PREFIX
    connect_timeout: float = 10.0
    operation_timeout: float = 30.0
    batching_max_messages: int = 1000
    batching_max_publish_delay_ms: int = 10
    close_timeout: float = 5.0


def parse_options(options: Mapping[str, Any]) -> Options:
    """Validate the keyword options: unknown ones raise ``TypeError``, bad values
    ``InvalidArgument``."""
    unknown = set(options) - _KNOWN
    if unknown:
        raise TypeError(f"unknown option(s) for pulsar:// WALs: {', '.join(sorted(unknown))}")
    parsed = Options()._replace(**options)
    if not isinstance(parsed.topic_prefix, str) or "://" not in parsed.topic_prefix:
        raise InvalidArgument(
            f"topic_prefix must be a str like 'persistent://tenant/namespace/prefix.', not"
            f" {parsed.topic_prefix!r}"
        )
    for name in ("connect_timeout", "operation_timeout", "close_timeout"):
        value = getattr(parsed, name)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InvalidArgument(f"{name} must be a positive number of seconds, not {value!r}")
    for name, low in (("batching_max_messages", 1), ("batching_max_publish_delay_ms", 0)):
        value = getattr(parsed, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InvalidArgument(f"{name} must be an int >= {low}, not {value!r}")
    return parsed._replace(
        connect_timeout=float(parsed.connect_timeout),
        operation_timeout=float(parsed.operation_timeout),
        close_timeout=float(parsed.close_timeout),
    )


def service_url(location: str) -> str:
    """``pulsar://host:port`` from the URL's location; ``InvalidArgument`` if malformed."""
    host, sep, port = location.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() or "/" in location:
        raise InvalidArgument(f"pulsar:// URL needs host:port, not {location!r}")
    return f"pulsar://{location}"


@final
class Client:
    """A WAL's lease of the process's client of one Pulsar service (``_clients``): the
    shared pulsar.asyncio client (``pulsar``) and this WAL's creations in flight on it
    (``creations``). Every reader, consumer and producer the WAL makes goes through
    ``creations.make``, and the WAL awaits ``creations.aclose`` and closes what it made
    before it stops using the client (see ``_creations``: a shutdown of the client that
    overtakes a creation leaks it, with native threads)."""

    __slots__ = ("creations", "pulsar")

    def __init__(self, client: pulsar_asyncio.Client, url: str, options: Options) -> None:
        self.pulsar = client
        self.creations = Creations(f"the Pulsar client of {url}", creation_bound(options))

    @property
    def raw(self) -> Any:
        """The C++ client (``_pulsar.Client``), for the callback-style ``*_async`` calls
        (see ``call_async``)."""
        return self.pulsar._client


def creation_bound(options: Options) -> float:
    """Seconds a caller waits for a reader, consumer or producer at most (see
    ``Creations``): a creation looks the topic up (within the operation timeout),
    connects to its broker (the connect timeout), then subscribes or registers (the
    operation timeout again); pulsar-client bounds each step, this bounds a call of it
    that never returns."""
    return options.connect_timeout + 2 * options.operation_timeout


#: The callbacks of ``call_async`` that pulsar-client may still hold, weakly: each leaves
#: this set once freed (pulsar-client holds a callback until the object it announced
#: goes, or until a creation it outlived its client's shutdown with ends).
_held_callbacks: Final[set[weakref.ref[Callable[..., None]]]] = set()
#: Seconds the exit hook waits for pulsar-client to let go of them.
EXIT_WAIT: Final = 2.0


def release_callbacks() -> None:
    """Free the pulsar-client objects that only reference cycles still hold, then wait
    (``EXIT_WAIT`` at most) until pulsar-client has let go of every callback of
    ``call_async``. Run at interpreter exit, before its teardown (``_clients``' exit
    hook), with no event loop running.

    Why: pulsar-client's threads go on after the teardown began, and what they do then
    with a Python object takes the process down: SIGSEGV, or SIGABRT after "terminate
    called without an active exception" (a thread that needs the GIL then exits
    through C++ code that must not be unwound).
    - A closed WAL's client and producer stay in its cycles until the cyclic collector
      runs, which would be during the teardown. Measured with Pulsar Lite and two busy
      processes beside it: a script that opened a WAL, appended and closed it exited so
      in 4 of 40 runs; with the cycles collected here, 0 of 60 (and a subscription
      read's, 0 of 80 once ``call_async`` no longer kept readers alive).
    - A WAL left open when ``asyncio.run`` ended has calls in flight (a reader being
      created, a look at the log's tail), and pulsar-client frees each call's callback
      when the broker answers it, or when what it announced goes. A script that left a
      WAL open just after starting a read aborted in 9 runs of 12: ``pulsar.asyncio``'s
      callbacks raised on the closed loop (now ``_calls`` makes the calls), and with
      that fixed alone, in 10 of 12: the callbacks were freed after the teardown began.
      With this wait too, in 0 of 40, the wait taking 5 ms (one run of the 40 waited
      the whole 2 s). Shutting such a client down instead of the wait took 10 s in half
      the runs then (a client per WAL, readers made through the asynchronous calls);
      since the clients are the process's (``_clients``), they are shut down just
      before this wait, and six such processes exit in 2.6-3.3 s together
      (``test_pulsar_exit``).
    """
    gc.collect()
    deadline = time.monotonic() + EXIT_WAIT
    while _held_callbacks and time.monotonic() < deadline:
        time.sleep(0.005)  # the GIL is free for pulsar-client's threads meanwhile
    gc.collect()


def pulsar_id(message_id: PulsarMessageId) -> pulsar.MessageId:
    """The client library's id for ``message_id``."""
    return pulsar.MessageId(
        message_id.partition, message_id.ledger, message_id.entry, message_id.batch
    )


#: The C++ client's result codes (``pulsar/Result.h`` of the libpulsar pulsar-client 3.13
#: bundles) that the Python enum ``pulsar.Result`` does not name: a result with such a code
#: shows as ``Result.???``.
_UNNAMED_RESULTS: Final = {-1: "Retryable", 46: "Disconnected"}

#: Result names -> the walsvc error for them. Every code the client can give is here; a
#: test holds this table to ``pulsar.Result``'s members.
_ERRORS: Final[dict[str, type[WALError]]] = {
    # transient: the broker, the connection or a limit; nothing was done, try again
    **dict.fromkeys(
        (
            "Retryable",
            "UnknownError",  # also Pulsar Lite's answer for the last id of an empty topic
            "Timeout",
            "LookupError",
            "ConnectError",
            "ReadError",
            "BrokerMetadataError",
            "BrokerPersistenceError",
            "ConsumerBusy",
            "NotConnected",
            "ConsumerNotInitialized",
            "ProducerNotInitialized",
            "TooManyLookupRequestException",
            "ServiceUnitNotReady",
            "ProducerBlockedQuotaExceededError",
            "ProducerBlockedQuotaExceededException",
            "ProducerQueueIsFull",
            "TopicNotFound",
            "SubscriptionNotFound",
            "ConsumerNotFound",
            "ConsumerAssignError",
            "MemoryBufferIsFull",
            "Interrupted",
            "Disconnected",
        ),
        BackendUnavailable,
    ),
    "ProducerFenced": WALFenced,
    "ProducerBusy": WALFenced,  # another exclusive producer holds the topic
    "AlreadyClosed": WALClosed,
    "MessageTooBig": MessageTooLarge,
    "ChecksumError": CorruptRecord,
    "CryptoError": CorruptRecord,
    "InvalidConfiguration": InvalidArgument,
    "InvalidTopicName": InvalidArgument,
    "InvalidUrl": InvalidArgument,
    "IncompatibleSchema": InvalidArgument,
    "CumulativeAcknowledgementNotAllowedError": InvalidArgument,
    # refused for good: retrying the same call cannot succeed
    **dict.fromkeys(
        (
            "AuthenticationError",
            "AuthorizationError",
            "ErrorGettingAuthenticationData",
            "InvalidMessage",
            "OperationNotSupported",
            "UnsupportedVersionError",
            "TopicTerminated",
            "TransactionCoordinatorNotFoundError",
            "InvalidTxnStatusError",
            "NotAllowedError",
            "TransactionConflict",
            "TransactionNotFound",
        ),
        WALError,
    ),
}


def result_name(result: Any) -> str:
    """The name of a pulsar-client result (``pulsar.Result``, or its code as an int),
    also for the codes the Python enum does not name; ``"Result<N>"`` for a code this
    client version does not know."""
    code = int(result)
    name = _UNNAMED_RESULTS.get(code)
    if name is not None:
        return name
    try:
        named: str = pulsar.Result(code).name
    except ValueError:
        return f"Result<{code}>"
    return named if named.isidentifier() else f"Result<{code}>"


def result_of(exc: BaseException) -> Any:
    """The pulsar-client result a pulsar exception carries: an asynchronous call's holds
    it, a synchronous call's class is named for it (UnknownError if not)."""
    if isinstance(exc, pulsar_asyncio.PulsarException):
        return exc.error()
    result = getattr(pulsar.Result, type(exc).__name__, None)
    return pulsar.Result.UnknownError if result is None else result


def translate_result(result: Any, what: str) -> WALError:
    """The walsvc error for a failed pulsar-client ``result`` of doing ``what``: see
    ``_ERRORS``; an unknown code is a ``BackendUnavailable`` naming it."""
    name = result_name(result)
    error = _ERRORS.get(name)
    text = f"{what}: Pulsar result {name} ({int(result)})"
    if error is None:
        return BackendUnavailable(f"{text}, which this walsvc does not know")
    return error(text)


def translate(exc: BaseException, what: str) -> WALError:
    """The walsvc error for a pulsar-client exception raised while doing ``what``."""
    if isinstance(exc, pulsar_asyncio.PulsarException):
        return translate_result(exc.error(), what)
    if isinstance(exc, _pulsar.PulsarException):
        return translate_result(result_of(exc), f"{what} ({exc})")
    return BackendUnavailable(f"{what}: {exc!r}")


def raise_translated(exc: BaseException, what: str) -> NoReturn:
    """Raise ``translate(exc, what)`` from ``exc``."""
    raise translate(exc, what) from exc


def call_async(
    start: Callable[[Callable[..., None]], None],
) -> asyncio.Future[Any]:
    """Run a callback-style ``*_async`` call of the C++ client; the future resolves on
    the event loop (never on a client thread) with the callback's value, or with the
    pulsar exception of a failed result. A result that arrives after the loop closed is
    dropped.

    The callback lets go of the future once called: the C++ client may keep a callback
    as long as the object it made (a reader keeps the one that announced it), and a
    callback holding the future would keep that object alive through the future's
    result, a cycle through C++ that no collector sees. Each reader made through
    ``pulsar.asyncio`` leaked so, with its client's I/O threads (one more native thread
    per WAL opened and closed)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    waiting = [future]

    def callback(result: Any, value: Any = None) -> None:
        if not waiting:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
            loop.call_soon_threadsafe(_settle, waiting.pop(), result, value)

    _held_callbacks.add(weakref.ref(callback, _held_callbacks.discard))
    start(callback)
    return future


#: Threads for ``call_in_thread``: how many synchronous calls of the C++ client may wait
#: for their answers at once (more queue for a thread).
CALL_THREADS: Final = 16

_call_threads: Final = ProcessThreads(CALL_THREADS, "walsvc-pulsar-call")


def call_in_thread(call: Callable[..., _T], *args: Any) -> asyncio.Future[_T]:
    """Run a synchronous call of the C++ client, ``call(*args)``, in one of the
    process's ``CALL_THREADS`` threads; the future resolves on the event loop with its
    value or its pulsar exception. A result that arrives after the loop closed is
    dropped. The call runs to its end even if the awaiting task is cancelled (the
    caller sees it through: ``Creations``).

    Readers are created, asked and closed so, never through their ``*_async`` calls:
    with those, churning readers corrupted pulsar-client's heap (ARCHITECTURE.md, "The
    Pulsar read path"). At exit the interpreter waits for a call in flight, which ends
    within the client's operation timeout (``ProcessThreads``)."""
    return asyncio.get_running_loop().run_in_executor(_call_threads.executor(), call, *args)


def _settle(future: asyncio.Future[Any], result: Any, value: Any) -> None:
    if future.done():
        return
    if result == _pulsar.Result.Ok:
        future.set_result(value)
    else:
        future.set_exception(pulsar_asyncio.PulsarException(result))


class GroupAcks:
    """Collects the send callbacks of one group on the client's threads and wakes the
    event loop once, when the last one arrived."""

    __slots__ = ("_future", "_left", "_lock", "_loop", "results")

    def __init__(self, count: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._future: asyncio.Future[None] = self._loop.create_future()
        self._lock = threading.Lock()
        self._left = count
        self.results: list[tuple[Any, Any]] = [(None, None)] * count

    def callback(self, index: int) -> Callable[[Any, Any], None]:
        """The send callback of the ``index``-th message."""

        def done(result: Any, message_id: Any) -> None:
            self.results[index] = (result, message_id)
            with self._lock:
                self._left -= 1
                last = self._left == 0
            if last:
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._wake)

        return done

    def _wake(self) -> None:
        if not self._future.done():
            self._future.set_result(None)

    def pending(self) -> int:
        """How many messages of the group have no result yet."""
        with self._lock:
            return self._left

    def wait(self) -> asyncio.Future[None]:
        """Resolves once every message of the group has its result."""
        return self._future
