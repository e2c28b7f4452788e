"""``Creations``: a creation on a Pulsar client runs to its end whatever happens to its
caller, what a cancelled caller never receives is disposed of, and the WAL's close
waits for what is in flight (the close of a real client overtaking a real creation is
in ``test_pulsar_exit``)."""

from __future__ import annotations

import asyncio
import gc
import warnings

import pytest

from walsvc import BackendUnavailable, WALClosed
from walsvc.backends._pulsar import _creations
from walsvc.backends._pulsar._creations import Creations

HANG = 10.0  # a guard against hangs, never a timing assertion


class Made:
    """What a creation makes: it knows whether it was disposed of."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.disposed = 0


async def dispose(made: Made) -> None:
    made.disposed += 1


class Gate:
    """A creation that ends when the test lets it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release: asyncio.Future[Made] = asyncio.get_running_loop().create_future()

    async def create(self) -> Made:
        self.started.set()
        return await self.release


async def test_a_creation_hands_over_what_it_made() -> None:
    creations = Creations("client", HANG)
    gate = Gate()
    asking = asyncio.ensure_future(creations.make(gate.create(), dispose))
    await gate.started.wait()
    assert creations.in_flight == 1
    made = Made("reader")
    gate.release.set_result(made)
    assert await asyncio.wait_for(asking, HANG) is made
    assert (made.disposed, creations.in_flight) == (0, 0)


async def test_a_failed_creation_raises_to_its_caller() -> None:
    creations = Creations("client", HANG)

    async def fail() -> Made:
        raise ValueError("refused")

    with pytest.raises(ValueError, match="refused"):
        await creations.make(fail(), dispose)
    assert creations.in_flight == 0


@pytest.mark.parametrize("how", ["cancelled", "timed out"])
async def test_what_a_cancelled_caller_never_receives_is_disposed_of(how: str) -> None:
    creations = Creations("client", HANG)
    gate = Gate()
    if how == "cancelled":
        asking = asyncio.ensure_future(creations.make(gate.create(), dispose))
        await gate.started.wait()
        asking.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asking
    else:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await creations.make(gate.create(), dispose)
    assert gate.started.is_set()
    assert creations.in_flight == 2  # the creation goes on, and its disposal waits for it
    made = Made("reader")
    gate.release.set_result(made)
    await asyncio.wait_for(creations.aclose(HANG), HANG)
    assert (made.disposed, creations.in_flight) == (1, 0)


async def test_a_caller_cancelled_as_its_creation_ends_still_has_it_disposed_of() -> None:
    """The creation has ended but its caller was cancelled before it resumed: the
    result is the caller's no more, so it is disposed of."""
    creations = Creations("client", HANG)
    gate = Gate()
    asking = asyncio.ensure_future(creations.make(gate.create(), dispose))
    await gate.started.wait()
    made = Made("reader")
    gate.release.set_result(made)
    await asyncio.sleep(0)  # the creation ends; its caller has yet to resume
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    await asyncio.wait_for(creations.aclose(HANG), HANG)
    assert made.disposed == 1


async def test_a_creation_that_fails_after_its_caller_left_disposes_of_nothing() -> None:
    creations = Creations("client", HANG)
    gate = Gate()
    asking = asyncio.ensure_future(creations.make(gate.create(), dispose))
    await gate.started.wait()
    asking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asking
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gate.release.set_exception(ValueError("refused"))
        await asyncio.wait_for(creations.aclose(HANG), HANG)
        gc.collect()  # an exception never retrieved would be reported now
    assert creations.in_flight == 0


async def test_after_the_close_no_creation_starts() -> None:
    creations = Creations("the Pulsar client of pulsar://h:1", HANG)
    await creations.aclose(HANG)
    gate = Gate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine was never awaited" would be one
        with pytest.raises(WALClosed, match=r"the Pulsar client of pulsar://h:1 is closed"):
            await creations.make(gate.create(), dispose)
        gc.collect()
    assert not gate.started.is_set()


async def test_the_close_waits_for_what_is_in_flight_at_most_its_bound() -> None:
    """A creation that never ends holds the close for ``within`` seconds, no longer."""
    creations = Creations("client", HANG)
    gate = Gate()
    asking = asyncio.ensure_future(creations.make(gate.create(), dispose))
    await gate.started.wait()
    await asyncio.wait_for(creations.aclose(0.05), HANG)
    assert creations.in_flight == 1
    asking.cancel()
    gate.release.cancel()
    await asyncio.gather(asking, return_exceptions=True)


async def test_a_disposal_that_fails_or_hangs_ends_quietly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_creations, "DISPOSE_WITHIN", 0.05)
    creations = Creations("client", HANG)

    async def failing(made: Made) -> None:
        raise RuntimeError("the broker went away")

    async def hanging(made: Made) -> None:
        await asyncio.Event().wait()

    for disposal in (failing, hanging):
        gate = Gate()
        asking = asyncio.ensure_future(creations.make(gate.create(), disposal))
        await gate.started.wait()
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        gate.release.set_result(Made("reader"))
    await asyncio.wait_for(creations.aclose(HANG), HANG)
    assert creations.in_flight == 0


async def test_a_creation_that_outlasts_its_bound_raises_and_is_disposed_of() -> None:
    """A creation that has not ended within the bound fails its caller with
    ``BackendUnavailable`` (pulsar-client's ``create_reader`` was seen never to return);
    it goes on, and what it makes at last is disposed of."""
    creations = Creations("the Pulsar client of pulsar://h:1", 0.05)
    gate = Gate()
    with pytest.raises(
        BackendUnavailable,
        match=r"the Pulsar client of pulsar://h:1 did not finish creating .* within 0.05 s",
    ):
        await asyncio.wait_for(creations.make(gate.create(), dispose), HANG)
    assert creations.in_flight == 2
    made = Made("reader")
    gate.release.set_result(made)
    await asyncio.wait_for(creations.aclose(HANG), HANG)
    assert (made.disposed, creations.in_flight) == (1, 0)


async def test_a_creation_that_fails_within_its_bound_raises_its_own_error() -> None:
    """An error of the creation itself, even a ``TimeoutError``, is not taken for the
    bound."""
    creations = Creations("client", HANG)

    async def times_out() -> Made:
        raise TimeoutError("the broker's own timeout")

    with pytest.raises(TimeoutError, match="the broker's own timeout"):
        await creations.make(times_out(), dispose)
    assert creations.in_flight == 0
