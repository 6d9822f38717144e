"""The shaped link: ranks in a network namespace whose loopback the kernel limits to a rate. Tests skip,
saying why, where a namespace cannot be made (not root, no `ip`/`tc`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import SUPPORT, clean_env
from lightning_hybrid.sim.link import ShapedLink, rate_bits_per_s, why_not_shaped

REASON = why_not_shaped()
needs_a_link = pytest.mark.skipif(REASON is not None, reason=f"no shaped link here: {REASON}")

TRANSFER = textwrap.dedent("""
    import socket, sys, threading
    size = int(sys.argv[1])
    server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen(1)
    def receive():
        conn, _ = server.accept(); got = 0
        while got < size:
            got += len(conn.recv(1 << 20))
    reader = threading.Thread(target=receive); reader.start()
    client = socket.create_connection(server.getsockname()); client.sendall(b"x" * size); reader.join()
""")


def test_rates_in_tc_s_units():
    assert rate_bits_per_s("100mbit") == 1e8 and rate_bits_per_s("1gbit") == 1e9 and rate_bits_per_s("10 kbit") == 1e4
    with pytest.raises(ValueError, match="100mbit"):
        rate_bits_per_s("fast")


@needs_a_link
def test_a_transfer_through_the_link_takes_its_rate_and_is_counted():
    size = 2_500_000  # 2 Mbit/s on the wire at 10 Mbit/s: 2 s; without the link a few milliseconds
    with ShapedLink("10mbit") as link:
        before, started = link.bytes_sent, time.monotonic()
        subprocess.run(link.wrap([sys.executable, "-c", TRANSFER, str(size)]), check=True, timeout=60)
        took, sent = time.monotonic() - started, link.bytes_sent - before
    assert took > 0.8 * size * 8 / 1e7, f"{size} bytes in {took:.2f} s: faster than 10 Mbit/s"
    assert size <= sent < 1.2 * size, f"the link counted {sent} bytes for {size} of payload"
    assert not Path(f"/var/run/netns/{link.name}").exists(), "the namespace is removed at exit"


@needs_a_link
@pytest.mark.multiprocess
def test_parameter_server_workers_use_the_network_inside_a_link(tmp_path):
    """Shared memory would bypass the link: inside one, transport="auto" takes the side channel."""
    with ShapedLink(None) as link:
        command = [sys.executable, str(SUPPORT / "train_script.py"), str(tmp_path), "--strategy", "ssp", "--epochs", "1",
                   "--fork-ranks"]
        done = subprocess.run(link.wrap(command), capture_output=True, text=True, timeout=180, env=clean_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert [(tmp_path / f"transport_rank{r}.txt").read_text() for r in (0, 1)] == ["channel", "channel"]
