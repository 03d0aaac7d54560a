"""What a process has open: listening sockets, Python threads, OS threads (lifecycle tests)."""
import threading
import time

import psutil


def opened():
    process = psutil.Process()
    listening = sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in process.net_connections(kind="inet")
                       if c.status == psutil.CONN_LISTEN)
    sockets = len(process.net_connections(kind="inet"))
    return {"listening": listening, "sockets": sockets, "threads": sorted(t.name for t in threading.enumerate()),
            "os_threads": process.num_threads()}


def settled(before, timeout=5.0):
    """What is open once it matches ``before`` (closing threads take a moment), or after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    now = opened()
    while now != before and time.monotonic() < deadline:
        time.sleep(0.05)
        now = opened()
    return now
