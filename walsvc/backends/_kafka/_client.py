"""Starting and stopping aiokafka clients with deadlines, errors translated.

Every client start is retried until ``connect_timeout`` (a broker that is down or
paused when the WAL opens may come back within it); every client stop is bounded by
``STOP_WITHIN`` seconds, after which its connections are aborted (a broker that does
not answer would otherwise hold a graceful stop for a request timeout or more).
aiokafka's exceptions become ``BackendUnavailable`` here.

aiokafka's own log lines for the connection faults walsvc retries and reports are
demoted to DEBUG, and those its fetcher and sender repeat through an outage pass once
a minute (see ``HandledFaults``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.client import AIOKafkaClient
from aiokafka.errors import KafkaError

from walsvc.core._errors import BackendUnavailable

from ._opened import OpenedConnections, opened_connections
from ._options import KafkaOptions

__all__ = (
    "HANDLED_FAULTS",
    "REPEATED_FAULTS",
    "STOP_WITHIN",
    "HandledFaults",
    "caller_cancelled",
    "ms",
    "new_admin",
    "new_consumer",
    "new_producer",
    "start_client",
    "stop_quietly",
)

#: The logger ``aiokafka.client`` logs to (the package's, not the module's), and the
#: consumer's fetcher's.
_AIOKAFKA_CLIENT_LOG: Final = "aiokafka"
_AIOKAFKA_FETCHER_LOG: Final = "aiokafka.consumer.fetcher"
_AIOKAFKA_SENDER_LOG: Final = "aiokafka.producer.sender"

#: aiokafka's messages (their format strings, logged by ``aiokafka.client``) for a broker it
#: cannot connect to or get metadata from: what ``start_client`` retries until
#: ``connect_timeout`` and then reports as one ``BackendUnavailable`` naming the servers
#: and the last fault, and what an outage of a WAL in use produces until a call of it
#: fails or the broker is back.
HANDLED_FAULTS: Final = frozenset(
    {
        'Unable connect to "%s:%s": %s',
        'Unable to request metadata from "%s:%s": %s',
        "Unable to request metadata from node with id %s: %r",
        "Unable to update metadata from %s",
        "Unable connect to node with id %s: %s",
    }
)
#: The messages aiokafka repeats through an outage, every few milliseconds: the fetcher's
#: (ERROR) for a broker it cannot fetch from, while walsvc's reader waits for the broker
#: to come back; the producer's sender's (WARNING) for a batch it retries, while the
#: append waits within its caller's deadline. The first of an outage says what is wrong.
REPEATED_FAULTS: Final = frozenset(
    {
        "Failed fetch messages from %s: %s",
        "Failed fetch offsets from %s: %s",
        "Got error produce response: %s",  # the producer's sender, a WARNING each retry
    }
)
#: Seconds during which a repeated fault passes once (per logger and message).
REPEAT_EVERY: Final = 60.0


class HandledFaults(logging.Filter):
    """A filter of aiokafka's loggers that demotes the records of ``HANDLED_FAULTS``
    (ERROR and WARNING in ``aiokafka.client``: one per attempt, a dozen within a
    ``connect_timeout`` of 10 s before walsvc's own error) to DEBUG, and the records of
    ``REPEATED_FAULTS`` (hundreds a second through an outage) to DEBUG after the first
    within ``REPEAT_EVERY`` seconds, and that first to WARNING (walsvc waits for the
    broker, within the caller's deadline). A demoted record is dropped unless
    its logger is enabled for DEBUG: an application that logs aiokafka at DEBUG still
    sees them, one that does not sees walsvc's error, or one line a minute per fault
    through an outage.

    It matches the format string, not the text, so it only touches those messages;
    every other aiokafka record passes as it is. Installed once, when the ``kafka://``
    backend is first imported; like any logger filter it applies to every aiokafka
    client of the process. walsvc never configures handlers or the root logger.
    """

    def __init__(self) -> None:
        super().__init__()
        #: When a repeated fault last passed, by logger and format string.
        self._passed: dict[tuple[str, str], float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg
        if record.levelno <= logging.DEBUG or not isinstance(msg, str):
            return True
        if msg in REPEATED_FAULTS:
            if not self._repeated(record):
                record.levelno, record.levelname = logging.WARNING, "WARNING"  # waited out
                return True
        elif msg not in HANDLED_FAULTS:
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)

    def _repeated(self, record: logging.LogRecord) -> bool:
        """Whether ``record`` repeats a fault (its logger, its message) that passed
        within ``REPEAT_EVERY`` seconds (if not, it passes now)."""
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last = self._passed.get(key)
        if last is not None and now - last < REPEAT_EVERY:
            return True
        self._passed[key] = now
        return False


def _install_filter() -> None:
    for name in (_AIOKAFKA_CLIENT_LOG, _AIOKAFKA_FETCHER_LOG, _AIOKAFKA_SENDER_LOG):
        logger = logging.getLogger(name)
        if not any(isinstance(f, HandledFaults) for f in logger.filters):
            logger.addFilter(HandledFaults())


_install_filter()

#: Seconds a client's graceful stop may take before its connections are aborted.
STOP_WITHIN: Final = 1.0
_RETRY_PAUSE: Final = 0.2
_MAX_RETRY_PAUSE: Final = 1.0


def caller_cancelled() -> bool:
    """Whether the running task is being cancelled (so a ``CancelledError`` it sees is
    its own and must propagate), as opposed to one a library let escape from a task it
    cancelled itself (aiokafka 0.14's ``Fetcher.close`` does)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def start_client(
    make: Callable[[], Any],
    what: str,
    servers: list[str],
    options: KafkaOptions,
    start: Callable[[Any], Awaitable[None]] | None = None,
) -> Any:
    """A client made by ``make`` and started (``start(client)``, default its ``start``
    method), retried with a fresh client until ``connect_timeout``: a refused connection
    or a bootstrap request that timed out fails one attempt, not the open. Raises
    ``BackendUnavailable`` naming that bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + options.connect_timeout
    pause = _RETRY_PAUSE
    attempts = 0
    while True:
        client = make()
        attempts += 1
        with opened_connections() as opened:
            try:
                async with asyncio.timeout_at(deadline):
                    await (client.start() if start is None else start(client))
                return client
            except (TimeoutError, KafkaError, OSError) as exc:
                await _stop_attempt(client, opened)
                if isinstance(exc, TimeoutError) or loop.time() + pause >= deadline:
                    raise BackendUnavailable(
                        f"cannot reach Kafka at {','.join(servers)} ({what}) within"
                        f" {options.connect_timeout} s (connect_timeout; {attempts}"
                        f" attempt{'s' if attempts > 1 else ''}): {exc!r}"
                    ) from exc
            except BaseException:  # cancelled: the client of this attempt is not leaked
                await _stop_attempt(client, opened)
                raise
        await asyncio.sleep(pause)
        pause = min(pause * 2, _MAX_RETRY_PAUSE)


async def _stop_attempt(client: Any, opened: OpenedConnections) -> None:
    """Stop a client whose start failed or was cancelled, and close every connection
    its start opened: aiokafka's bootstrap loses track of one it is asking for metadata
    when a cancellation reaches it there (see ``_opened``)."""
    try:
        await stop_quietly(client)
    finally:
        opened.close_all()


def _inner(client: Any) -> Any:
    """The ``AIOKafkaClient`` under a producer, consumer or admin client (or itself)."""
    if isinstance(client, AIOKafkaProducer):
        return client.client
    if isinstance(client, AIOKafkaConsumer | AIOKafkaAdminClient):
        return client._client
    return client


def _abort(client: Any) -> None:
    """Cut what a graceful stop left running: background tasks cancelled, connections
    aborted (their pending requests fail at once)."""
    if isinstance(client, AIOKafkaProducer):
        sender = client._sender
        if sender is not None and sender.sender_task is not None:
            sender.sender_task.cancel()
    elif isinstance(client, AIOKafkaConsumer):
        fetcher = client._fetcher
        if fetcher is not None:
            fetcher._fetch_task.cancel()
            for task in fetcher._pending_tasks:
                task.cancel()
    inner = _inner(client)
    if not isinstance(inner, AIOKafkaClient):
        return
    if inner._sync_task is not None:
        inner._sync_task.cancel()
    update = inner._md_update_fut
    if update is not None and not update.done():
        update.cancel()
    for conn in list(inner._conns.values()):
        writer = conn._writer
        if writer is not None:
            writer.transport.abort()
        with contextlib.suppress(Exception):
            conn.close()
    inner._conns.clear()


async def stop_quietly(client: Any, seconds: float = STOP_WITHIN) -> None:
    """Stop an aiokafka client (producer, consumer, admin, or a bare ``AIOKafkaClient``)
    within about ``seconds``: a stop that has not finished by then (a broker that does not
    answer) is cut short by aborting its connections. Never raises, except for the
    caller's own cancellation."""
    if isinstance(client, AIOKafkaProducer):
        _drop_batches(client._message_accumulator)
    stop = client.stop if isinstance(client, AIOKafkaProducer | AIOKafkaConsumer) else client.close
    try:
        async with asyncio.timeout(seconds):
            await stop()
        return
    except (TimeoutError, KafkaError, OSError):
        pass
    except asyncio.CancelledError:
        if caller_cancelled():
            _abort(client)
            raise
    _abort(client)


def _drop_batches(accumulator: Any) -> None:
    """Fail the batches a producer still holds: the writer gave them up already, so a
    graceful stop need not wait for the broker to take them. Every future of theirs
    (the batch's, each message's, the drain waiter) is retrieved: an append cancelled
    by its caller's deadline no longer awaits its message's, and asyncio would report
    each as an exception never retrieved.

    A batch put back in the queue for a retry still has the done callback of its first
    send, which removes it from the in-flight set it has left: failed there, it would
    raise ``KeyError`` in that callback (an asyncio ERROR; aiokafka's own stop has the
    same fault, aio-libs/aiokafka#831). It is counted in flight again first. And a batch
    whose send failed and that the sender puts back after its backoff, during the stop,
    is not: it was failed here and has left the in-flight set (the ``KeyError`` would
    end the sender, and the stop would raise it)."""
    queued = [batch for batches in accumulator._batches.values() for batch in batches]
    accumulator._pending_batches.update(batch for batch in queued if batch.retry_count > 0)
    held = set(queued) | accumulator._pending_batches
    futures = [batch.future for batch in held]
    futures += [future for batch in held for future, _ in batch._msg_futures]
    futures += [batch._drain_waiter for batch in held]
    accumulator.fail_all(KafkaError("the producer is stopping"))
    accumulator.reenqueue = _put_back_nothing
    for future in futures:
        if future.done() and not future.cancelled():
            future.exception()  # retrieved: nobody else waits for it


def _put_back_nothing(batch: Any) -> None:
    """``MessageAccumulator.reenqueue`` of a stopping producer: it sends nothing again."""


def ms(seconds: float) -> int:
    """``seconds`` as the whole milliseconds aiokafka takes (at least 1)."""
    return max(1, int(seconds * 1000))


async def new_admin(servers: list[str], options: KafkaOptions) -> Any:
    """A started admin client."""
    return await start_client(
        lambda: AIOKafkaAdminClient(
            bootstrap_servers=servers, request_timeout_ms=ms(options.request_timeout)
        ),
        "admin",
        servers,
        options,
    )


async def new_producer(servers: list[str], options: KafkaOptions, max_bytes: int) -> Any:
    """A started producer: acks from every in-sync replica, no idempotence (Tansu has no
    InitProducerId), batches sent as built (``send_batch``)."""
    return await start_client(
        lambda: AIOKafkaProducer(
            bootstrap_servers=servers,
            acks="all",
            enable_idempotence=False,
            linger_ms=0,
            max_request_size=max_bytes,
            request_timeout_ms=ms(options.request_timeout),
        ),
        "producer",
        servers,
        options,
    )


async def new_consumer(servers: list[str], options: KafkaOptions, *, max_wait: float) -> Any:
    """A started consumer without a group (assign + seek only)."""
    return await start_client(
        lambda: AIOKafkaConsumer(
            bootstrap_servers=servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="none",
            fetch_max_wait_ms=ms(max_wait),
            request_timeout_ms=ms(options.request_timeout),
            max_partition_fetch_bytes=max(options.max_batch_bytes, 1024 * 1024) * 2,
        ),
        "consumer",
        servers,
        options,
    )
