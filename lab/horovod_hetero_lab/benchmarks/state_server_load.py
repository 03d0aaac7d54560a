"""Load test of ESync's state server: many simulated workers on loopback, each querying at a fixed rate.

The server (``transports.state_server.StateServer`` for ``--workers`` ranks) runs in this process,
which does nothing else while it measures; the workers run in ``--procs`` client processes, each an
asyncio loop with one TCP connection per worker speaking the real protocol (greeting, HMAC-sealed
QUERY-STATE lines, sealed answers checked). Every worker connects at its first query, then queries
every 1/``--rate`` s from a random phase and waits for its answer before the next (a late answer delays the next query, as a real
worker's would). Reported per run, over the ``--seconds`` after every worker has connected and
queried once: the queries answered per second, the median, p99 and maximum round trip (sent to
answer opened, on the client), and the server process's CPU time over the same wall time (1.0 = one
core). ``--repeats`` runs, each with a fresh server; then the median and range of each figure.

    horovod-hetero benchmark state_server_load --workers 1024 --rate 10    (make bench-state-server)
"""
import argparse
import asyncio
import multiprocessing
import os
import random
import statistics
import sys
import time

import numpy as np

from horovod_hetero.transports.auth import new_key
from horovod_hetero.transports.state_server import GREETING_LEN, StateServer, query_body, worker_channel


async def _worker(host, port, key, rank, rate, start, stop, rtts, errors):
    period, seq = 1.0 / rate, 0
    next_at = time.perf_counter() + random.uniform(0.0, period)
    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    try:                            # connects at its first query, as StateClient does
        reader, writer = await asyncio.open_connection(host, port)
        channel = worker_channel(key, await reader.readexactly(GREETING_LEN))
    except (OSError, asyncio.IncompleteReadError) as e:
        errors.append(f"connect: {e}")
        return
    try:
        while next_at < stop:
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            seq += 1
            sent = time.perf_counter()
            writer.write(channel.seal(query_body(rank, seq, 0.1, 0, seq)) + b"\n")
            line = await reader.readline()
            got = time.perf_counter()
            if channel.open(line[:-1]) is None:
                errors.append("an answer was not authentic")
                return
            if sent >= start:
                rtts.append(got - sent)
            next_at = max(next_at + period, got)        # a late answer delays the next query
    except (OSError, asyncio.IncompleteReadError) as e:
        errors.append(f"query: {e}")
    finally:
        writer.close()


def _client(host, port, key, ranks, rate, start, stop, results):
    """One client process: ``ranks`` workers in one asyncio loop; sends (round trips, errors) back."""
    async def main():
        rtts: list[float] = []
        errors: list[str] = []
        await asyncio.gather(*(_worker(host, port, key, r, rate, start, stop, rtts, errors) for r in ranks))
        return rtts, errors
    results.put(asyncio.run(main()))


def cpu_seconds():
    t = os.times()
    return t.user + t.system


def run_once(workers, rate, procs, seconds, warmup):
    key = new_key()
    server = StateServer(workers, key)
    host, port = server.address[len("tcp://"):].rsplit(":", 1)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    # perf_counter is CLOCK_MONOTONIC on Linux: one time base for every process of this machine
    start = time.perf_counter() + warmup
    stop = start + seconds
    clients = [ctx.Process(target=_client, args=(host, int(port), key, list(range(i, workers, procs)), rate,
                                                 start, stop, results)) for i in range(procs)]
    for c in clients:
        c.start()
    time.sleep(max(0.0, start - time.perf_counter()))
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    time.sleep(max(0.0, stop - time.perf_counter()))
    cpu1, wall1 = cpu_seconds(), time.perf_counter()
    rtts, errors = [], []
    for _ in clients:
        r, e = results.get(timeout=seconds + warmup + 60)
        rtts += r
        errors += e
    for c in clients:
        c.join(timeout=30)
    server.close()
    ms = np.array(rtts) * 1e3
    return {"answered_per_s": len(ms) / seconds, "median_ms": float(np.median(ms)),
            "p99_ms": float(np.percentile(ms, 99)), "max_ms": float(ms.max()),
            "server_cpu": (cpu1 - cpu0) / (wall1 - wall0), "errors": len(errors),
            "first_error": errors[0] if errors else ""}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1024)
    parser.add_argument("--rate", type=float, default=10.0, help="queries per second per worker")
    parser.add_argument("--procs", type=int, default=3, help="client processes")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured time per run")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds to connect and start before measuring")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"state server load: {args.workers} workers x {args.rate:g} queries/s over loopback, "
          f"{args.procs} client processes, {os.cpu_count()} cores, {args.seconds:g} s measured per run")
    runs = []
    for i in range(args.repeats):
        r = run_once(args.workers, args.rate, args.procs, args.seconds, args.warmup)
        runs.append(r)
        print(f"run {i + 1}: {r['answered_per_s']:.0f} answers/s, round trip median {r['median_ms']:.2f} ms, "
              f"p99 {r['p99_ms']:.2f} ms, max {r['max_ms']:.1f} ms; server CPU {r['server_cpu']:.2f} core"
              + (f"; {r['errors']} errors ({r['first_error']})" if r["errors"] else ""), flush=True)
    print("median [range] of the runs:")
    for name, unit in (("answered_per_s", "/s"), ("median_ms", " ms"), ("p99_ms", " ms"), ("server_cpu", " core")):
        values = [r[name] for r in runs]
        print(f"  {name}: {statistics.median(values):.2f}{unit} [{min(values):.2f}, {max(values):.2f}]")
    return 0 if all(r["errors"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
