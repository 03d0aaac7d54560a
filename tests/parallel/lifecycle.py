"""What a process has open: listening sockets, Python threads, OS threads (lifecycle tests)."""
import gc
import threading
import time

import psutil

from horovod_hetero.common.failures import GIL_GUARD_THREAD


#: Not a strategy's: the watchdog that process sets start once per process (``common.failures.guard_gil``: this
#: Python thread and faulthandler's C thread), which lives, as Horovod's own threads do, until Horovod shuts down.
GUARD = GIL_GUARD_THREAD


def opened():
    process = psutil.Process()
    listening = sorted(f"{c.laddr.ip}:{c.laddr.port}" for c in process.net_connections(kind="inet")
                       if c.status == psutil.CONN_LISTEN)
    sockets = len(process.net_connections(kind="inet"))
    names = [t.name for t in threading.enumerate()]
    return {"listening": listening, "sockets": sockets, "threads": sorted(n for n in names if n != GUARD),
            "os_threads": process.num_threads() - (2 if GUARD in names else 0)}


def settled(before, timeout=5.0):
    """What is open once it matches ``before`` (closing threads take a moment), or after ``timeout`` s.
    Garbage is collected first: a tf.data iterator left in the middle of an epoch (a rank that ended
    its share of it) holds native threads until the reference cycle it sits in is collected."""
    deadline = time.monotonic() + timeout
    gc.collect()
    now = opened()
    while now != before and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
        now = opened()
    return now
