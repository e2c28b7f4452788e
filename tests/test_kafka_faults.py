"""The seeded fault schedule on ``kafka://`` (Tansu; see _broker_faults.py for what it
does and checks). Tansu keeps its data in memory only, so the schedule pauses and resumes
the broker but never restarts it."""

from __future__ import annotations

import random
from typing import Any

from _broker_faults import BrokerControl, FaultSchedule
from _tansu import fresh, paused_broker

__all__ = ("paused_broker",)


async def test_the_fault_schedule(paused_broker: Any, seed: random.Random) -> None:
    broker = BrokerControl(paused_broker.url, paused_broker.pause, paused_broker.resume)
    schedule = FaultSchedule(
        broker,
        fresh(),
        seed,
        {"request_timeout": 1.5, "connect_timeout": 20.0, "close_timeout": 2.0},
        seconds=8.0,
    )
    await schedule.run()
    print(await schedule.verify())
