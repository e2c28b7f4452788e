"""The seeded fault schedule on ``pulsar://`` (Pulsar Lite; see _broker_faults.py for
what it does and checks): the broker is paused and resumed, and also restarted on the
same port and data directory."""

from __future__ import annotations

import random

from _broker_faults import BrokerControl, FaultSchedule
from _pulsar_lite import PulsarLite, own_broker, pchannel

__all__ = ("own_broker",)


async def test_the_fault_schedule(own_broker: PulsarLite, seed: random.Random) -> None:
    broker = BrokerControl(own_broker.url, own_broker.pause, own_broker.resume, own_broker.restart)
    schedule = FaultSchedule(
        broker,
        pchannel(),
        seed,
        {"operation_timeout": 2.0, "connect_timeout": 20.0, "close_timeout": 2.0},
        seconds=8.0,
    )
    await schedule.run()
    print(await schedule.verify())
