"""A link's latency and throughput, measured over TCP between its two ends before a run is timed through it.

``ping-pong``: a 64-byte message sent and echoed ``rounds`` times on one connection (Nagle off): the median
round trip. ``bulk``: ``megabytes`` sent on a fresh connection with the kernel's default socket buffers, the
receiver acknowledging the last byte: bytes a second from the first byte sent (slow start included, as a
collective's first bytes meet it). The server runs at one end (``python -m lightning_hybrid.sim.link_probe
serve PORT``), the client at the other (``... probe HOST PORT``: prints one JSON line).
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time

MESSAGE = 64


def _exactly(conn: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = conn.recv(min(size - len(data), 1 << 20))
        if not chunk:
            raise ConnectionError("the other end closed the connection")
        data += chunk
    return bytes(data)


def serve(port: int, connections: int = 2) -> None:
    """Echo a ping-pong connection, then take a bulk transfer (its length first, 8 bytes) and acknowledge it."""
    with socket.create_server(("0.0.0.0", port)) as server:
        for _ in range(connections):
            conn, _ = server.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                kind = _exactly(conn, 1)
                if kind == b"p":
                    while True:
                        try:
                            conn.sendall(_exactly(conn, MESSAGE))
                        except ConnectionError:  # the prober's last round
                            break
                else:
                    size = int.from_bytes(_exactly(conn, 8), "big")
                    received = 0
                    while received < size:
                        chunk = conn.recv(1 << 20)
                        if not chunk:
                            break
                        received += len(chunk)
                    conn.sendall(b"k")


def probe(host: str, port: int, rounds: int = 20, megabytes: float = 16.0, connect_timeout_s: float = 30.0) -> dict:
    """Round trip (median, min, max of ``rounds``) and bulk throughput against :func:`serve` at ``host:port``."""
    deadline = time.monotonic() + connect_timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=connect_timeout_s)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.sendall(b"p")
        trips = []
        for _ in range(rounds):
            start = time.perf_counter()
            conn.sendall(b"x" * MESSAGE)
            _exactly(conn, MESSAGE)
            trips.append(time.perf_counter() - start)
    size = int(megabytes * 1e6)
    with socket.create_connection((host, port), timeout=connect_timeout_s) as conn:
        conn.sendall(b"b" + size.to_bytes(8, "big"))
        payload = b"\0" * (1 << 20)
        start = time.perf_counter()
        sent = 0
        while sent < size:
            sent += conn.send(payload[: min(len(payload), size - sent)])
        _exactly(conn, 1)
        seconds = time.perf_counter() - start
    return {"rtt_s": statistics.median(trips), "rtt_min_s": min(trips), "rtt_max_s": max(trips),
            "bulk_bytes_per_s": size / seconds, "bulk_bytes": size}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("serve")
    server.add_argument("port", type=int)
    client = sub.add_parser("probe")
    client.add_argument("host")
    client.add_argument("port", type=int)
    client.add_argument("--rounds", type=int, default=20)
    client.add_argument("--megabytes", type=float, default=16.0)
    args = parser.parse_args(argv)
    if args.role == "serve":
        serve(args.port)
    else:
        print(json.dumps(probe(args.host, args.port, args.rounds, args.megabytes)), flush=True)


if __name__ == "__main__":
    main()
