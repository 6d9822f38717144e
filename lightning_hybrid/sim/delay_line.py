"""A delay line between two TUN devices: every IP packet read from one is written into the other a fixed
one-way latency later (and, with a rate, no sooner than the bytes before it have crossed at that rate).

This kernel has no ``netem``; a TUN device hands its process every packet the kernel routes through it,
and a packet the process writes into a TUN device arrives as if received on it. So two network namespaces,
each holding one end, exchange real TCP (the backends' own connections, windows, acknowledgements and slow
start) through a line whose latency is as set: :class:`lightning_hybrid.sim.link.DelayedLink` builds them
and runs this module as a process of its own (``python -m lightning_hybrid.sim.delay_line``: it creates the
two devices, prints ``ready``, and forwards until it reads a line on stdin or is terminated; then it prints
its statistics as one JSON line).

What keeps the delay honest, learnt by trying: ``select``'s timeout is as fine as the clock (a ``poll`` or
``epoll`` timeout rounds up to a whole millisecond, a bias of up to 1 ms on every packet); the read buffer
exceeds the MTU (a shorter read truncates the packet); the devices' queues (``txqueuelen``) are long enough
that a burst the line is slow to take is not dropped (the default 500 packets overflow); the line runs at a
real-time priority, ahead of the ranks it connects (on 2 cores beside 2 ranks it otherwise wrote 6 % of
the packets more than 1 ms late, the worst 9 ms); and it watches itself: :class:`LineStats` counts packets
written later than their due time by more than :data:`LATE_S`, and the worst lateness, so that a run whose
line fell behind says so.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import errno
import fcntl
import json
import os
import select
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
#: A packet written later than its due time by more than this counts as late.
LATE_S = 0.001
#: Bytes a read asks for: more than any packet a TUN device of an Ethernet MTU hands over.
READ_BYTES = 65536
#: The line's SCHED_FIFO priority (as root): it runs the moment a packet arrives or falls due, ahead of
#: the ranks' processes, which on a machine of few cores would otherwise hold it back (packets late by
#: up to 9 ms at 2 ranks on 2 cores).
REALTIME_PRIORITY = 10


def open_tun(name: str) -> int:
    """A new TUN device ``name`` (IP packets, no packet-information header); its file descriptor, non-blocking.
    The device exists while the descriptor is open."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    try:
        fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except OSError:
        os.close(fd)
        raise
    return fd


@dataclasses.dataclass
class LineStats:
    """What the line did: packets and bytes forwarded, packets it dropped (its rate's queue full), packets
    written late (more than :data:`LATE_S` after their due time) and the worst lateness, in seconds."""

    packets: int = 0
    bytes: int = 0
    dropped: int = 0
    late: int = 0
    worst_late_s: float = 0.0


class Direction:
    """One way of the line: packets in arrival order, each with its due time (arrival + latency, or later
    when ``rate`` serialises them); at most ``queue_bytes`` waiting to be serialised (the rest dropped, as
    a router's full queue would)."""

    def __init__(self, latency_s: float, rate_bytes_per_s: float | None = None, queue_bytes: int = 1 << 24) -> None:
        self.latency_s, self.rate, self.queue_bytes = latency_s, rate_bytes_per_s, queue_bytes
        self.waiting: collections.deque[tuple[float, bytes]] = collections.deque()
        self._free_at = 0.0  # when the line's transmitter finishes the bytes before

    def take(self, packet: bytes, now: float, stats: LineStats) -> None:
        """A packet read at ``now``: due after the latency (and its serialisation at the rate)."""
        sent = now
        if self.rate is not None:
            start = max(now, self._free_at)
            if (start - now) * self.rate > self.queue_bytes:
                stats.dropped += 1
                return
            sent = self._free_at = start + len(packet) / self.rate
        self.waiting.append((sent + self.latency_s, packet))

    def due_in(self, now: float) -> float | None:
        """Seconds until the first waiting packet is due (None: nothing waits)."""
        return max(self.waiting[0][0] - now, 0.0) if self.waiting else None

    def release(self, fd: int, now: float, stats: LineStats) -> None:
        """Write every packet due by ``now`` into ``fd`` (the far end's device)."""
        while self.waiting and self.waiting[0][0] <= now:
            due, packet = self.waiting.popleft()
            try:
                os.write(fd, packet)
            except BlockingIOError:  # the far device's queue is full: the kernel would drop it too
                stats.dropped += 1
                continue
            except OSError as error:  # EIO: the far device is not up yet (set-up) or any more
                if error.errno != errno.EIO:
                    raise
                stats.dropped += 1
                continue
            stats.packets += 1
            stats.bytes += len(packet)
            late = time.monotonic() - due
            if late > LATE_S:
                stats.late += 1
            stats.worst_late_s = max(stats.worst_late_s, late)


def forward(fds: tuple[int, int], directions: tuple[Direction, Direction], stop_fd: int | None = None) -> LineStats:
    """Forward packets between the two devices (``directions[0]``: from ``fds[0]`` to ``fds[1]``) until
    ``stop_fd`` is readable; the statistics."""
    stats = LineStats()
    watched = [*fds, *([stop_fd] if stop_fd is not None else [])]
    while True:
        now = time.monotonic()
        dues = [d for d in (directions[0].due_in(now), directions[1].due_in(now)) if d is not None]
        readable, _, _ = select.select(watched, [], [], min(dues) if dues else None)
        now = time.monotonic()
        if stop_fd is not None and stop_fd in readable:
            return stats
        for side, fd in enumerate(fds):
            if fd in readable:
                while True:
                    try:
                        packet = os.read(fd, READ_BYTES)
                    except BlockingIOError:
                        break
                    directions[side].take(packet, now, stats)
        now = time.monotonic()
        directions[0].release(fds[1], now, stats)
        directions[1].release(fds[0], now, stats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Forward IP packets between two new TUN devices, each a fixed "
                                                 "latency late (see the module docstring).")
    parser.add_argument("devices", nargs=2, help="the two TUN devices' names")
    parser.add_argument("--latency-s", type=float, required=True, help="one-way latency, seconds")
    parser.add_argument("--rate-bytes-per-s", type=float, default=None, help="the line's rate (default: unlimited)")
    args = parser.parse_args(argv)
    try:  # the line must not wait for a core behind the ranks it connects: real-time, it preempts them
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
    except (PermissionError, OSError):
        pass  # the statistics say how late it was
    fds = (open_tun(args.devices[0]), open_tun(args.devices[1]))
    directions = (Direction(args.latency_s, args.rate_bytes_per_s), Direction(args.latency_s, args.rate_bytes_per_s))
    print("ready", flush=True)
    stats = forward(fds, directions, stop_fd=sys.stdin.fileno())
    print(json.dumps(dataclasses.asdict(stats)), flush=True)


if __name__ == "__main__":
    main()
