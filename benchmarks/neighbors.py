"""How much CPU other processes used while the benchmark was timing: the machine's busy time (/proc/stat,
including the hypervisor's steal time) minus this process's own CPU time, per second of wall time. A row
whose every sample was slowed down (e.g. each call of a multi-threaded op waiting out a neighbor's scheduler
tick) has a small spread and a min as slow as its median; only this tells that the machine was shared.
Linux only; elsewhere the meter reads None."""

from __future__ import annotations

import os
import resource
import time

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal (guest time is inside user).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def _machine_busy_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()[1:]
        ticks = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError):
        return None
    return sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / ticks


def _own_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process
    return u.ru_utime + u.ru_stime


class NeighborMeter:
    """`with NeighborMeter() as m: ...`, then m.cpus: the CPUs other processes used on average meanwhile."""

    cpus: float | None = None

    def __enter__(self):
        self._busy, self._own, self._wall = _machine_busy_s(), _own_cpu_s(), time.perf_counter()
        return self

    def __exit__(self, *exc):
        busy, wall = _machine_busy_s(), time.perf_counter() - self._wall
        if busy is not None and self._busy is not None and wall > 0:
            others = (busy - self._busy) - (_own_cpu_s() - self._own)
            self.cpus = max(0.0, others / wall)
        return False
