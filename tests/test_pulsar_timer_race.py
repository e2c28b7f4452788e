"""pulsar-client's cross-thread timer race, made certain, does not take walsvc down.

pulsar-client 3.12 arms and cancels some timers of a reader, consumer or producer both on
the thread that calls it and on its I/O thread, without a lock; asio's timers are not
safe for that. When a cancel meets an arming, the timer's wait stays queued in the I/O
thread's reactor while the timer believes it has none; freed with its object, the wait
is a dangling entry, and the reactor crashes when it comes due (SIGSEGV in
``epoll_reactor::run``: the crash seen in CI now and then, under broker faults).
walsvc keeps what it closes alive until any such wait has come due
(``_clients.retire``).

The race is rare by nature (one run in tens of the fault test files). Here a preloaded
shim (``tests/_timer_race_shim.c``, built by the test) makes it certain for a reader's
creation timer: the thread creating the reader is held until the topic's metadata is
answered, so that ``HandlerBase::start`` arms the timer on it, and then held inside
``schedule_timer`` between the flag and the reactor's lock while the I/O thread connects
the reader and cancels the timer. With ``retire`` made a no-op this test failed 3 runs
of 3 (SIGSEGV about when the first creation timer came due); with it, it passed 7 of 7.
A longer script of the same kind crashed 10 runs of 10 without the retirement (the code
before it: 14 of 15, the 15th hanging) and none of 15 with it.

The offsets the shim needs are found in the installed libpulsar (``nm``, ``objdump``);
if the binary no longer has the code they point at, the test fails, naming what it did
not find: it never passes without the injection having happened.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from _pulsar_lite import HANG, PulsarLite, broker, pchannel

import walsvc

__all__ = ("broker",)

_SHIM_SOURCE = Path(__file__).with_name("_timer_race_shim.c")

#: epoll_reactor::schedule_timer for steady_clock timers (mangled).
_SCHEDULE_TIMER = (
    "_ZN4asio6detail13epoll_reactor14schedule_timerINS0_18chrono_time_traits"
    "INSt6chrono3_V212steady_clock"
)
_CREATE_READER = "_ZN6pulsar10ClientImpl17createReaderAsync"


def _libpulsar() -> Path:
    import pulsar

    libs = sorted(
        Path(pulsar.__file__).resolve().parent.parent.glob("pulsar_client.libs/libpulsar*.so*")
    )
    assert len(libs) == 1, f"expected one bundled libpulsar, found {libs}"
    return libs[0]


def _symbols(library: Path) -> list[tuple[int, int, str, str]]:
    """(address, size, type, mangled name) of the library's sized symbols."""
    listing = subprocess.run(
        ["nm", "-S", "--defined-only", str(library)], capture_output=True, text=True, check=True
    ).stdout
    found = []
    for line in listing.splitlines():
        parts = line.split()
        if len(parts) == 4:
            found.append((int(parts[0], 16), int(parts[1], 16), parts[2], parts[3]))
    return found


def _offsets(library: Path) -> dict[str, str]:
    """The shim's offsets into ``library`` (see ``_timer_race_shim.c``)."""
    symbols = _symbols(library)
    schedule = {
        (a, s) for a, s, kind, name in symbols if name.startswith(_SCHEDULE_TIMER) and kind in "WT"
    }
    assert len(schedule) == 1, f"expected one out-of-line schedule_timer, found {schedule}"
    create = [
        (a, s) for a, s, kind, name in symbols if name.startswith(_CREATE_READER) and kind == "T"
    ]
    assert len(create) == 1, f"expected one ClientImpl::createReaderAsync, found {create}"
    start, size = create[0]
    code = subprocess.run(
        [
            "objdump",
            "-d",
            f"--start-address={start:#x}",
            f"--stop-address={start + size:#x}",
            str(library),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    instructions = [
        (int(match.group(1), 16), match.group(2))
        for match in re.finditer(r"^\s*([0-9a-f]+):\t[^\t]*\t(.*)$", code, re.MULTILINE)
    ]
    # The last operator new before the addListener on the metadata lookup's future: it
    # runs after the lookup was sent and before the listener is attached.
    listen = next(i for i, (_, text) in enumerate(instructions) if "addListener" in text)
    news = [i for i, (_, text) in enumerate(instructions[:listen]) if "<_Znwm@plt>" in text]
    assert news, "no operator new between createReaderAsync's lookup and its addListener"
    (schedule_start, schedule_size) = next(iter(schedule))
    return {
        "SHIM_READER_NEW_RETURN": hex(instructions[news[-1] + 1][0]),
        "SHIM_SCHEDULE_TIMER_START": hex(schedule_start),
        "SHIM_SCHEDULE_TIMER_SIZE": hex(schedule_size),
    }


def _build_shim(directory: Path) -> Path:
    shim = directory / "timer_race_shim.so"
    compiler = (sysconfig.get_config_var("CC") or "cc").split()
    subprocess.run(
        [*compiler, "-O2", "-shared", "-fPIC", "-o", str(shim), str(_SHIM_SOURCE), "-ldl"],
        check=True,
        capture_output=True,
    )
    return shim


_SCRIPT = """
    import asyncio, ctypes, sys
    import pulsar  # maps libpulsar
    import walsvc
    from walsvc import DeliverPolicy, Message

    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and "libpulsar" in fields[5] and fields[2] == "00000000":
            base = int(fields[0].split("-")[0], 16)
            break
    shim = ctypes.CDLL(None)
    shim.walsvc_shim_set_base(ctypes.c_size_t(base))
    shim.walsvc_shim_marks.restype = shim.walsvc_shim_delays.restype = ctypes.c_long
    OPERATION_TIMEOUT = 2.0

    async def main():
        url, pch = sys.argv[1], sys.argv[2]
        async with await walsvc.open_wal(url, pch, operation_timeout=OPERATION_TIMEOUT) as wal:
            for i in range(3):
                await wal.append(Message(payload=b"x%d" % i, vchannel="v"))
            for _ in range(6):  # each read makes a reader, and closes it
                async with wal.read(DeliverPolicy.all()) as scanner:
                    seen = 0
                    async for _ in scanner:
                        seen += 1
                        if seen == 3:
                            break
                churn = [bytearray(64) for _ in range(2000)]  # reuse freed memory
                del churn
        # The creation timers come due within the operation timeout of their start.
        for _ in range(int(OPERATION_TIMEOUT) + 3):
            await asyncio.sleep(1)
            churn = [bytearray(64) for _ in range(2000)]
        print("marks", shim.walsvc_shim_marks(), "delays", shim.walsvc_shim_delays(), flush=True)
        print("done", flush=True)

    asyncio.run(main())
"""


def test_readers_created_across_the_timer_race_do_not_crash_the_process(
    broker: PulsarLite, tmp_path: Path
) -> None:
    library = _libpulsar()
    env = {
        "PYTHONPATH": str(Path(walsvc.__file__).resolve().parent.parent),
        "PATH": "/usr/bin:/bin",
        "LD_PRELOAD": str(_build_shim(tmp_path)),
        **_offsets(library),
    }
    result = subprocess.run(
        [
            sys.executable,
            "-X",
            "faulthandler",
            "-c",
            textwrap.dedent(_SCRIPT),
            broker.url,
            pchannel(),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=2 * HANG,
        check=False,
    )
    outcome = f"exit status {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.returncode == 0, outcome
    counts = re.search(r"^marks (\d+) delays (\d+)$", result.stdout, re.MULTILINE)
    assert counts is not None, outcome
    # The injection happened: readers were made on the calling thread, held in the window.
    assert int(counts.group(1)) >= 6, outcome
    assert int(counts.group(2)) >= 6, outcome
    assert result.stdout.endswith("done\n"), outcome
