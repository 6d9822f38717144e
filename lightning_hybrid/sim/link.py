"""A real bandwidth-limited link on one machine: ranks in a network namespace whose loopback is shaped.

The processes of a run started inside a network namespace (``ip netns exec``) reach each other, and
the rendezvous store, over that namespace's loopback; the kernel's token-bucket filter (``tc qdisc ...
tbf``) on it limits the bytes per second every packet between them may use. So a run on one machine
moves its collectives through a link of a given rate, as ranks on two hosts would, measured, not
slept (the kernel here has no ``netem``, so added latency stays with the sleep simulator,
``sim.collective_latency_s``). Needs root (``ip netns add``) and ``tc``; :func:`why_not_shaped`
says what is missing.

The loopback gets an Ethernet MTU (1500 bytes instead of 64 KiB: a 64 KiB packet takes 52 ms at
10 Mbit/s) and a queue that holds ``queue_s`` seconds of traffic at the rate, so that TCP meets a slow
link rather than losses (with tbf's usual 50 ms queue, a 10 Mbit/s run lost packets until gloo's
connections timed out). :attr:`ShapedLink.bytes_sent` reads the loopback's transmitted bytes: every
byte the run's processes sent each other, payloads and protocol alike.

Shared memory bypasses any link: the command runs with :data:`LINK_ENV` set, and the parameter
server's ``transport="auto"`` then moves gradients through its side channel (network) instead.

Example (as root)::

    >>> with ShapedLink("100mbit") as link:                                           # doctest: +SKIP
    ...     subprocess.run(link.wrap(["lightning-hybrid", "strategy=ddp", "trainer.devices=2"]))
    ...     print(link.bytes_sent)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid

#: Set (to the rate) in the environment of commands run inside a shaped link.
LINK_ENV = "LIGHTNING_HYBRID_LINK"
_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bits_per_s(rate: str) -> float:
    """``"100mbit"`` -> 1e8 (tc's units: bit, kbit, mbit, gbit)."""
    match = re.fullmatch(r"([\d.]+)\s*(bit|kbit|mbit|gbit)", rate.strip().lower())
    if not match:
        raise ValueError(f"a link rate is a number and one of {sorted(_UNITS)}, e.g. 100mbit; got {rate!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def why_not_shaped() -> str | None:
    """Why a shaped link cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "a network namespace needs root (ip netns add)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine (Debian: apt-get install iproute2)"
    probe = f"lh-probe-{uuid.uuid4().hex[:8]}"
    try:
        for command in (["ip", "netns", "add", probe], ["ip", "-n", probe, "link", "set", "lo", "up"],
                        ["tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "10mbit", "burst",
                         "32kb", "latency", "50ms"]):
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                return f"`{' '.join(command)}` failed: {done.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class ShapedLink:
    """A network namespace whose loopback carries at most ``rate`` (``None``: unshaped, the namespace
    alone: the ceiling a shaped run is compared with). A context manager; it removes the namespace at exit.

    Args:
        rate: tc's rate, e.g. ``"1gbit"``, ``"100mbit"``, ``"10mbit"``; None for no shaping.
        queue_s: seconds of traffic at ``rate`` the link's queue holds before it drops.
        mtu: the loopback's MTU in the namespace.
    """

    def __init__(self, rate: str | None, queue_s: float = 2.0, mtu: int = 1500) -> None:
        self.rate, self.queue_s, self.mtu = rate, queue_s, mtu
        if rate is not None:
            rate_bits_per_s(rate)  # a bad rate is an error now
        self.name = f"lh-link-{uuid.uuid4().hex[:8]}"

    def __enter__(self) -> ShapedLink:
        self._run("ip", "netns", "add", self.name)
        try:
            self._run("ip", "-n", self.name, "link", "set", "lo", "mtu", str(self.mtu), "up")
            if self.rate is not None:
                limit = max(int(rate_bits_per_s(self.rate) / 8 * self.queue_s), 64 * 1024)
                self._run("tc", "-n", self.name, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.rate,
                          "burst", str(max(4 * self.mtu, 16 * 1024)), "limit", str(limit))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    @staticmethod
    def _run(*command: str) -> None:
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()}")

    def wrap(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace, with :data:`LINK_ENV` set."""
        return ["ip", "netns", "exec", self.name, "env", f"{LINK_ENV}={self.rate or 'unshaped'}", *argv]

    @property
    def bytes_sent(self) -> int:
        """Bytes the namespace's loopback has transmitted so far."""
        done = subprocess.run(["ip", "netns", "exec", self.name, "cat", "/sys/class/net/lo/statistics/tx_bytes"],
                              capture_output=True, text=True, check=True)
        return int(done.stdout.strip())


def in_shaped_link() -> str | None:
    """The rate of the shaped link this process runs in (``"unshaped"`` for a plain namespace), or None."""
    return os.environ.get(LINK_ENV)
