"""The faults the network fault schedules strike a node and its clients with, through a
``TcpProxy`` in front of a ``RestartableNode``: ``cut`` (every connection reset),
``lose-answers`` (answers held back, then the connections reset: the calls landed, their
answers are lost), ``half-open`` (both directions held past the clients' heartbeat),
``unreachable`` (connections reset and new ones refused for a while) and ``kill`` (the
node killed with SIGKILL, a new one started on the same log behind the same address)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from _node_process import RestartableNode
from _tcp_proxy import TcpProxy


async def strike_until(
    stop: asyncio.Event,
    rng: random.Random,
    tcp: TcpProxy,
    node: RestartableNode,
    faults: Sequence[str],
    *,
    pause: tuple[float, float],
    outage: tuple[float, float],
    after_kill: str,
) -> list[str]:
    """Until ``stop``, wait a while (``pause``: seconds, at random between the two) and
    strike one of ``faults`` chosen with ``rng``; return what was struck. The node is
    killed once at most: later draws of "kill" strike ``after_kill`` instead. An
    ``unreachable`` node stays so for ``outage`` seconds."""
    done: list[str] = []
    killed = False
    while not stop.is_set():
        await asyncio.sleep(rng.uniform(*pause))
        fault = rng.choice(faults)
        if fault == "kill" and killed:
            fault = after_kill
        killed = killed or fault == "kill"
        await _strike(fault, rng, tcp, node, outage)
        done.append(fault)
    return done


async def _strike(
    fault: str,
    rng: random.Random,
    tcp: TcpProxy,
    node: RestartableNode,
    outage: tuple[float, float],
) -> None:
    if fault == "cut":
        tcp.cut()
    elif fault == "lose-answers":
        tcp.hold("down")
        await asyncio.sleep(rng.uniform(0.01, 0.1))
        tcp.cut()
    elif fault == "half-open":
        tcp.hold("up", "down")
        await asyncio.sleep(rng.uniform(0.3, 0.6))  # past the clients' heartbeat (0.1 s)
        tcp.release()
    elif fault == "unreachable":
        tcp.refusing = True
        tcp.cut()
        await asyncio.sleep(rng.uniform(*outage))
        tcp.refusing = False
    elif fault == "kill":
        tcp.hold("down")
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        tcp.refusing = True
        url = await asyncio.to_thread(node.kill_and_restart)
        tcp.cut()
        tcp.retarget(url)
        tcp.refusing = False
    else:
        raise ValueError(f"unknown fault {fault!r}")
