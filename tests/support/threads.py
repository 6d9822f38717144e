"""torch threads for each process a test starts: this machine's cores shared by the processes of one
test and by the pytest-xdist workers running tests side by side (so that a 16-core machine does not
run 16 threads in each of a dozen processes)."""

import os


def threads_per_process(processes: int) -> int:
    test_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return max(1, (os.cpu_count() or 1) // (processes * test_workers))
