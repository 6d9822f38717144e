"""Real links on one machine: a bandwidth-limited one (:class:`ShapedLink`) and a long one
(:class:`DelayedLink`).

:class:`ShapedLink`: the processes of a run started inside a network namespace (``ip netns exec``) reach
each other, and the rendezvous store, over that namespace's loopback; the kernel's token-bucket filter
(``tc qdisc ... tbf``) on it limits the bytes per second every packet between them may use. So a run on
one machine moves its collectives through a link of a given rate, as ranks on two hosts would, measured,
not slept. The loopback gets an Ethernet MTU (1500 bytes instead of 64 KiB: a 64 KiB packet takes 52 ms
at 10 Mbit/s) and a queue that holds ``queue_s`` seconds of traffic at the rate, so that TCP meets a slow
link rather than losses (with tbf's usual 50 ms queue, a 10 Mbit/s run lost packets until gloo's
connections timed out). :attr:`ShapedLink.bytes_sent` reads the loopback's transmitted bytes: every byte
the run's processes sent each other, payloads and protocol alike.

:class:`DelayedLink`: the kernel here has no ``netem`` to add latency, so two namespaces, a rank in each,
are joined through TUN devices by a process that holds every packet a one-way latency
(:mod:`~lightning_hybrid.sim.delay_line`): the backends' own TCP meets a real round trip. :func:`measure`
times its round trip and bulk throughput before a run. The sleep simulator
(:class:`~lightning_hybrid.sim.latency.CollectiveLatency`) is checked against it by
``benchmarks/long_link.py``. Both need root (``ip netns add``; ``tc`` for the first, ``/dev/net/tun`` for
the second); :func:`why_not_shaped` and :func:`why_not_delayed` say what is missing.

Shared memory bypasses any link: the command runs with :data:`LINK_ENV` set, and the parameter
server's ``transport="auto"`` then moves gradients through its side channel (network) instead.

Example (as root)::

    >>> with ShapedLink("100mbit") as link:                                           # doctest: +SKIP
    ...     subprocess.run(link.wrap(["lightning-hybrid", "strategy=ddp", "trainer.devices=2"]))
    ...     print(link.bytes_sent)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

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


def why_not_delayed() -> str | None:
    """Why a :class:`DelayedLink` cannot be made here (None: it can)."""
    if os.geteuid() != 0:
        return "a network namespace and TUN devices need root"
    if shutil.which("ip") is None:
        return "no `ip` on this machine (Debian: apt-get install iproute2)"
    try:
        os.close(os.open("/dev/net/tun", os.O_RDWR))
    except OSError as error:
        return f"/dev/net/tun cannot be opened ({error.strerror}): the kernel lacks TUN devices, or this container hides them"
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
        _run("ip", "netns", "add", self.name)
        try:
            _run("ip", "-n", self.name, "link", "set", "lo", "mtu", str(self.mtu), "up")
            if self.rate is not None:
                limit = max(int(rate_bits_per_s(self.rate) / 8 * self.queue_s), 64 * 1024)
                _run("tc", "-n", self.name, "qdisc", "add", "dev", "lo", "root", "tbf", "rate", self.rate,
                     "burst", str(max(4 * self.mtu, 16 * 1024)), "limit", str(limit))
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

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


class DelayedLink:
    """Two ranks' hosts joined by a long link: two network namespaces, each with one end of a TUN device
    pair, and a :mod:`~lightning_hybrid.sim.delay_line` process between them holding every packet
    ``latency_s`` (one way; a round trip takes twice that) before passing it on, optionally at ``rate``.
    Real TCP crosses it: the backends' connections, windows, acknowledgements and slow start all meet the
    latency. A context manager; at exit the line's statistics are in :attr:`stats` (packets it forwarded,
    dropped or wrote late) with the devices' own queue drops (``queue_dropped``).

    A command for rank ``r`` (:meth:`wrap`) runs in namespace ``r`` as node ``r`` of a run of one process per
    node: ``MASTER_ADDR`` is rank 0's end, ``GLOO_SOCKET_IFNAME`` its own device (gloo otherwise binds to
    the address the host name resolves to).

    Args:
        latency_s: one-way latency, seconds.
        rate: the line's rate (tc's units, e.g. ``"1gbit"``); None: as fast as the line's process forwards.
        mtu: the devices' MTU (Ethernet's).
        queue_packets: the devices' queue length (``txqueuelen``): long enough for a burst the line is
            slow to take (the default 500 packets overflowed at 50 ms).
        slow_start_after_idle: TCP's slow start after idle in both namespaces
            (``net.ipv4.tcp_slow_start_after_idle``): True, Linux's default, checks a connection's congestion
            window after it idles, or leaves it unfilled, for a retransmission timeout (RFC 2861); False does
            not. The delayed all-reduce at ``delay=4`` through 50 ms stepped in 56-71 ms with it and 38-40 ms
            without (``benchmarks/idle_restart.py``).
    """

    ends = 2

    def __init__(self, latency_s: float, rate: str | None = None, mtu: int = 1500, queue_packets: int = 10000,
                 slow_start_after_idle: bool = True) -> None:
        if not latency_s >= 0:
            raise ValueError(f"a link's latency is non-negative seconds, got {latency_s}")
        self.latency_s, self.rate, self.mtu, self.queue_packets = float(latency_s), rate, mtu, queue_packets
        self.slow_start_after_idle = bool(slow_start_after_idle)
        if rate is not None:
            rate_bits_per_s(rate)
        tag = uuid.uuid4().hex[:8]
        self.namespaces = [f"lh-dl-{tag}-{end}" for end in range(self.ends)]
        self.devices = [f"lhd{tag}{'ab'[end]}" for end in range(self.ends)]
        subnet = int(tag[:2], 16)
        self.addresses = [f"10.233.{subnet}.{end + 1}" for end in range(self.ends)]
        self.port = 29500 + int(tag[2:5], 16) % 20000
        self.stats: dict | None = None
        self._line: subprocess.Popen | None = None

    def __enter__(self) -> DelayedLink:
        command = [sys.executable, "-m", "lightning_hybrid.sim.delay_line", *self.devices, "--latency-s",
                   str(self.latency_s)]
        if self.rate is not None:
            command += ["--rate-bytes-per-s", str(rate_bits_per_s(self.rate) / 8)]
        self._line = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=Path(__file__).resolve().parents[2])
        try:
            ready = self._line.stdout.readline().strip()
            if ready != "ready":
                raise RuntimeError(f"the delay line did not start: {ready or self._line.stderr.read().strip()}")
            for end, (namespace, device) in enumerate(zip(self.namespaces, self.devices)):
                peer = self.addresses[1 - end]
                _run("ip", "netns", "add", namespace)
                _run("ip", "link", "set", device, "netns", namespace)
                _run("ip", "-n", namespace, "link", "set", "lo", "up")
                _run("ip", "-n", namespace, "addr", "add", self.addresses[end], "peer", peer, "dev", device)
                _run("ip", "-n", namespace, "link", "set", device, "mtu", str(self.mtu), "txqueuelen",
                     str(self.queue_packets), "up")
                _run("ip", "netns", "exec", namespace, "sysctl", "-qw",
                     f"net.ipv4.tcp_slow_start_after_idle={int(self.slow_start_after_idle)}")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the line (its statistics into :attr:`stats`) and remove the namespaces."""
        if self._line is not None and self._line.poll() is None:
            dropped = sum(self._queue_dropped(end) for end in range(self.ends))
            try:
                out, _ = self._line.communicate("stop\n", timeout=10)
                self.stats = {**json.loads(out.strip().splitlines()[-1]), "queue_dropped": dropped}
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                self._line.kill()
        self._line = None
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)

    def _queue_dropped(self, end: int) -> int:
        done = subprocess.run(["ip", "netns", "exec", self.namespaces[end], "cat",
                               f"/sys/class/net/{self.devices[end]}/statistics/tx_dropped"], capture_output=True, text=True)
        return int(done.stdout.strip() or 0)

    def environment(self, end: int) -> dict[str, str]:
        """The variables a rank at ``end`` runs with (one process per node; node ``end``)."""
        return {"GLOO_SOCKET_IFNAME": self.devices[end], "MASTER_ADDR": self.addresses[0],
                "MASTER_PORT": str(self.port), "NODE_RANK": str(end), LINK_ENV: f"delay{self.latency_s:g}s"}

    def wrap(self, argv: list[str], end: int) -> list[str]:
        """``argv`` run at ``end`` of the link (namespace ``end``, :meth:`environment` set)."""
        variables = [f"{key}={value}" for key, value in self.environment(end).items()]
        return ["ip", "netns", "exec", self.namespaces[end], "env", *variables, *argv]


def _run(*command: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr.strip()}")


def measure(link: DelayedLink, rounds: int = 20, megabytes: float = 16.0) -> dict:
    """The link's round trip and bulk throughput over TCP between its two ends
    (:mod:`~lightning_hybrid.sim.link_probe`), measured now."""
    module = [sys.executable, "-m", "lightning_hybrid.sim.link_probe"]
    cwd = Path(__file__).resolve().parents[2]
    server = subprocess.Popen(link.wrap([*module, "serve", str(link.port)], 1), cwd=cwd, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        done = subprocess.run(link.wrap([*module, "probe", link.addresses[1], str(link.port), "--rounds", str(rounds),
                                         "--megabytes", str(megabytes)], 0), cwd=cwd, capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"probing the link failed: {done.stderr.strip()[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
