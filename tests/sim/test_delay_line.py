"""The delay line (lightning_hybrid.sim.delay_line) and the long link built on it (sim.link.DelayedLink):
packets held their latency, serialised at a rate, dropped past the queue; and, as root, a real round
trip between two namespaces within 10 % of the one set, measured by TCP, and TCP's slow start after idle set
in the link's namespaces as asked."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time

import pytest

from lightning_hybrid.sim.delay_line import Direction, LineStats, forward
from lightning_hybrid.sim.link import DelayedLink, measure, why_not_delayed


def test_a_packet_is_due_its_latency_after_it_arrived():
    line, stats = Direction(0.025), LineStats()
    line.take(b"x" * 100, now=10.0, stats=stats)
    line.take(b"y" * 100, now=10.001, stats=stats)
    assert line.due_in(10.0) == pytest.approx(0.025)
    assert [due for due, _ in line.waiting] == pytest.approx([10.025, 10.026])


def test_a_rate_serialises_packets_and_a_full_queue_drops():
    line, stats = Direction(0.01, rate_bytes_per_s=1000.0, queue_bytes=1500), LineStats()
    for _ in range(3):
        line.take(b"x" * 1000, now=0.0, stats=stats)  # one a second at 1000 B/s
    assert [due for due, _ in line.waiting] == pytest.approx([1.01, 2.01])  # the third waited 2 s: 2000 B queued
    assert stats.dropped == 1


def test_the_line_forwards_each_way_in_order_its_latency_late():
    """Datagram socket pairs stand in for the TUN devices: the line reads a packet from one end of each and
    writes the other device's packets into it, as it does with a TUN device's file descriptor."""
    (a_line, a_kernel), (b_line, b_kernel) = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM), \
        socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    for end in (a_line, b_line):
        end.setblocking(False)
    stop_r, stop_w = os.pipe()
    result: list[LineStats] = []
    runner = threading.Thread(target=lambda: result.append(forward((a_line.fileno(), b_line.fileno()),
                                                                   (Direction(0.02), Direction(0.02)), stop_fd=stop_r)),
                              daemon=True)
    runner.start()
    start = time.monotonic()
    a_kernel.send(b"first")
    a_kernel.send(b"second")
    b_kernel.send(b"back")
    b_kernel.settimeout(2)
    a_kernel.settimeout(2)
    arrived = [b_kernel.recv(100), b_kernel.recv(100), a_kernel.recv(100)]
    took = time.monotonic() - start
    os.write(stop_w, b"x")
    runner.join(timeout=5)
    assert arrived == [b"first", b"second", b"back"]
    assert 0.02 <= took < 0.05, took
    assert result and result[0].packets == 3 and result[0].bytes == 15 and result[0].worst_late_s < 0.02, result


@pytest.mark.skipif(why_not_delayed() is not None, reason=f"no delay line here: {why_not_delayed()}")
@pytest.mark.timeout(120)
def test_a_delayed_link_holds_its_round_trip_within_ten_percent():
    with DelayedLink(0.02) as link:  # 20 ms each way
        measured = measure(link, rounds=10, megabytes=1.0)
    assert 0.040 <= measured["rtt_s"] <= 0.044, measured  # the set 40 ms round trip, within 10 %
    assert measured["bulk_bytes_per_s"] > 1e6, measured
    assert link.stats is not None and link.stats["packets"] > 100 and link.stats["queue_dropped"] == 0, link.stats


@pytest.mark.skipif(why_not_delayed() is not None, reason=f"no delay line here: {why_not_delayed()}")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("restart", [True, False])
def test_a_delayed_link_sets_tcp_s_slow_start_after_idle_in_its_namespaces_only(restart):
    def setting(*prefix: str) -> str:
        return subprocess.run([*prefix, "sysctl", "-n", "net.ipv4.tcp_slow_start_after_idle"], capture_output=True,
                              text=True, check=True).stdout.strip()

    host = setting()
    with DelayedLink(0.001, slow_start_after_idle=restart) as link:
        inside = [setting("ip", "netns", "exec", namespace) for namespace in link.namespaces]
    assert inside == [str(int(restart))] * 2 and setting() == host
