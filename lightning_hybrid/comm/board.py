"""Notes the processes of a run leave for each other without a collective, on its rendezvous store.

Every run started through ``torch.distributed`` has a key-value store at ``MASTER_ADDR:MASTER_PORT``
(a TCPStore, served by rank 0's process). A :class:`Board` is a client connection of its own to it,
with a key prefix: it can be read and written from any thread, including while the process's main
thread waits inside a collective, and from processes outside the default group (the parameter
server's side channel joins its group through the same store: :func:`connect_store`). The
watchdog's ranks leave their positions here (:mod:`lightning_hybrid.comm.stall_watch`).
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterable

import torch.distributed as dist


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """A client connection to the run's store at ``host:port`` (its server runs in rank 0's process)."""
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


class Board:
    """Keys under ``prefix`` on the run's store (``host``/``port``: ``MASTER_ADDR``/``MASTER_PORT``
    where not given). Example (inside a run)::

        >>> board = Board("lightning_hybrid/example/")      # doctest: +SKIP
        >>> board.post("rank1", "waiting in all_gather")     # doctest: +SKIP
        >>> board.read("rank1")                              # doctest: +SKIP
        'waiting in all_gather'
    """

    def __init__(self, prefix: str, host: str | None = None, port: int | None = None, timeout_s: float = 30.0) -> None:
        host = host or os.environ["MASTER_ADDR"]
        port = int(port or os.environ["MASTER_PORT"])
        self._store = dist.PrefixStore(prefix, connect_store(host, port, timeout_s))

    def post(self, key: str, value: str) -> None:
        self._store.set(key, value)

    def delete(self, key: str) -> None:
        self._store.delete_key(key)

    def read(self, key: str) -> str | None:
        """The value under ``key``, or None where nobody posted it (no waiting)."""
        if not self._store.check([key]):
            return None
        return self._store.get(key).decode()

    def wait_for(self, keys: Iterable[str], timeout_s: float, poll_s: float = 1.0) -> dict[str, str]:
        """The values of ``keys`` posted within ``timeout_s`` (a key nobody posted by then is left out).
        The store waits for them itself and hands them over in one request: through a long link every
        request is a round trip (polling each key, 20 ms apart, cost a 50 ms link about 0.7 s a sync
        point); ``poll_s`` is how often the deadline is looked at meanwhile."""
        keys = list(keys)
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            try:
                self._store.wait(keys, datetime.timedelta(seconds=max(min(poll_s, remaining), 0.001)))
            except dist.DistStoreError:  # not all posted within this piece of the wait
                if time.monotonic() < deadline:
                    continue
                return {key: value for key in keys if (value := self.read(key)) is not None}
            return {key: value.decode() for key, value in zip(keys, self._store.multi_get(keys))}
