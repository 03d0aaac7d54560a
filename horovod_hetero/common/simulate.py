"""A discrete-event simulator of synchronisation strategies on a heterogeneous cluster.

Before renting a cluster, see what each algorithm would do with your workers' speeds: steps
per worker, compute-time ratio, waiting, synchronisations, bytes, and samples/s. Strategies
with global rounds (Synchronous, LocalSGD, ESync, ElasticBSP, WAGMA) are simulated a round at
a time, vectorised over workers; DSSP (parameter-server style, no rounds) runs the core's
``DSSPServer`` on an event queue. ElasticBSP runs the core's ``zipline``, DSSP its controller.

The communication model: a ring allreduce over k workers of B bytes costs
``2(k-1) latency + 2(k-1)/k B / bandwidth``; a DSSP push + pull costs ``2 (latency + B / bandwidth)``.

Example:
    >>> cluster = Cluster(step_times=[1.0, 1.0, 1.0, 4.0])
    >>> r = simulate(cluster, Sync(), duration=40.0)
    >>> r.steps.tolist()
    [10, 10, 10, 10]
"""
import heapq
from dataclasses import dataclass, field

import numpy as np

from horovod_hetero.common.dssp import DSSPServer
from horovod_hetero.common.grouping import check_sizes, nearest_group_size
from horovod_hetero.common.validation import check_float, check_int
from horovod_hetero.common.zipline import predict_ends, zipline


@dataclass
class Cluster:
    """Workers' speeds and the network.

    Args:
        step_times: seconds per training step of each worker (its speed).
        jitter: relative standard deviation of each step's time (0: deterministic).
        change_at: simulated time at which step times are multiplied by ``change_factors``.
        change_factors: per-worker factors applied from ``change_at`` on.
        model_bytes: bytes of the model (what an allreduce or a push moves).
        latency_s: per-message latency.
        bandwidth: bytes per second per link.
        samples_per_step: mini-batch size, for samples/s.
        seed: random seed of the jitter.
    """

    step_times: list
    jitter: float = 0.0
    change_at: float = None
    change_factors: list = None
    model_bytes: float = 4e6
    latency_s: float = 50e-6
    bandwidth: float = 1.25e9
    samples_per_step: int = 32
    seed: int = 0
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        self.step_times = np.asarray(self.step_times, dtype=float)
        if self.step_times.ndim != 1 or self.step_times.size == 0 or not (self.step_times > 0).all():
            raise ValueError("step_times must be a non-empty list of positive seconds per step")
        self.jitter = check_float("jitter", self.jitter, 0.0)
        if (self.change_at is None) != (self.change_factors is None):
            raise ValueError("change_at and change_factors go together")
        if self.change_factors is not None:
            self.change_factors = np.asarray(self.change_factors, dtype=float)
            if self.change_factors.shape != self.step_times.shape or not (self.change_factors > 0).all():
                raise ValueError("change_factors must give one positive factor per worker")
        check_float("bandwidth", self.bandwidth, 0.0, min_exclusive=True)
        check_float("latency_s", self.latency_s, 0.0)
        check_float("model_bytes", self.model_bytes, 0.0)
        self.rng = np.random.default_rng(self.seed)
        self._normals = []

    @property
    def n(self):
        return self.step_times.size

    def mean_step_times(self, t):
        """Expected step time of every worker at simulated time t (what a worker would measure)."""
        if self.change_at is not None and t >= self.change_at:
            return self.step_times * self.change_factors
        return self.step_times

    def draw(self, t, k):
        """Durations (n x k) of the next k steps of every worker starting at time t."""
        mean = self.mean_step_times(t)[:, None]
        if not self.jitter:
            return np.repeat(mean, k, axis=1)
        return mean * np.maximum(0.05, 1.0 + self.jitter * self.rng.standard_normal((mean.shape[0], k)))

    def draw_one(self, t, q):
        """Duration of worker q's next step starting at t (scalar path of ``draw`` for event loops)."""
        mean = float(self.mean_step_times(t)[q])
        if not self.jitter:
            return mean
        if not self._normals:
            self._normals = self.rng.standard_normal(65536).tolist()
        return mean * max(0.05, 1.0 + self.jitter * self._normals.pop())

    def allreduce_s(self, k):
        """Seconds of a ring allreduce of the model over k workers."""
        if k <= 1:
            return 0.0
        return 2 * (k - 1) * self.latency_s + 2 * (k - 1) / k * self.model_bytes / self.bandwidth

    def ring_bytes(self, k):
        return 2 * (k - 1) / k * self.model_bytes if k > 1 else 0.0


@dataclass
class SimResult:
    """What one strategy did: per-worker arrays and totals."""

    strategy: str
    duration: float
    steps: np.ndarray
    compute_s: np.ndarray
    wait_s: np.ndarray
    comm_s: np.ndarray
    syncs: np.ndarray
    bytes_sent: np.ndarray
    samples_per_step: int

    @property
    def compute_ratio(self):
        return self.compute_s / self.duration

    @property
    def samples_per_s(self):
        return float(self.steps.sum() * self.samples_per_step / self.duration)

    def summary(self):
        return {"strategy": self.strategy, "samples_per_s": self.samples_per_s,
                "compute_ratio_mean": float(self.compute_ratio.mean()),
                "compute_ratio_min": float(self.compute_ratio.min()),
                "wait_share_mean": float((self.wait_s / self.duration).mean()),
                "syncs_per_worker": float(self.syncs.mean()),
                "mb_per_worker": float(self.bytes_sent.mean() / 1e6),
                "steps_min": int(self.steps.min()), "steps_max": int(self.steps.max())}


class _Rounds:
    """A strategy with global rounds: each worker runs some steps, then all synchronise."""

    name = "?"

    def max_steps(self, caps):
        raise NotImplementedError

    def plan(self, t0, caps, durations):
        """Steps each worker runs this round, given their drawn step durations (n x K)."""
        raise NotImplementedError

    def extra_comm(self, cluster):
        """(seconds, bytes, syncs) of per-round communication besides the global allreduce."""
        return 0.0, 0.0, 0


@dataclass
class Sync(_Rounds):
    """Synchronous SGD: one step, then an allreduce; everyone runs at the slowest pace."""

    name = "Synchronous"

    def max_steps(self, caps):
        return 1

    def plan(self, t0, caps, durations):
        return np.ones(durations.shape[0], dtype=np.int64)


@dataclass
class LocalSGD(_Rounds):
    """Local SGD: ``period`` local steps per worker, then model averaging."""

    period: int = 8

    def __post_init__(self):
        check_int("period", self.period, 1)

    @property
    def name(self):
        return f"LocalSGD({self.period})"

    def max_steps(self, caps):
        return self.period

    def plan(self, t0, caps, durations):
        return np.full(durations.shape[0], self.period, dtype=np.int64)


@dataclass
class ESync(_Rounds):
    """ESync: each worker steps until the state server's QUERY-STATE says ready.

    The vectorised form of ``esync.ESyncState.query`` with perfect capabilities (each worker's
    expected step time; ``query_rtt_s`` is added to it, as the paper's non-blocking variant
    does): worker i is ready after k >= 1 steps when it is the slowest, or the slowest has
    finished its step, or ``capability_i + epsilon`` exceeds the slowest's remaining time.
    """

    epsilon: float = 0.0
    query_rtt_s: float = 0.0
    name = "ESync"

    def max_steps(self, caps):
        return int(np.ceil(caps.max() / caps.min())) + 2

    def plan(self, t0, caps, durations):
        caps = caps + self.query_rtt_s
        ends = t0 + np.cumsum(durations + self.query_rtt_s, axis=1)
        slowest = int(np.argmax(caps))
        slowest_done = ends[slowest, 0]
        rest = t0 + caps[slowest] - ends
        ready = (ends >= slowest_done) | (caps[:, None] + self.epsilon > rest)
        ready[slowest, 0] = True
        ready[:, -1] = True
        return ready.argmax(axis=1) + 1


@dataclass
class ElasticBSP(_Rounds):
    """ElasticBSP: ZipLine picks, from the next R predicted iterations, the barrier with least waiting."""

    R: int = 15

    def __post_init__(self):
        check_int("R", self.R, 1)

    @property
    def name(self):
        return f"ElasticBSP(R={self.R})"

    def max_steps(self, caps):
        return self.R

    def plan(self, t0, caps, durations):
        return zipline(predict_ends(np.full(caps.size, t0), caps, self.R)).steps


@dataclass
class WAGMA(_Rounds):
    """WAGMA-SGD: group averaging (size S, wait-avoiding) after every step, global every ``period``.

    Wait-avoidance is modelled ideally: a group average never waits for a slow member (it uses
    that member's latest model), so only the global average every ``period`` steps is a barrier.
    """

    group_size: int = None
    period: int = 10

    def __post_init__(self):
        check_int("period", self.period, 1)

    @property
    def name(self):
        return f"WAGMA(S={self.group_size or 'auto'},{self.period})"

    def _size(self, n):
        size = self.group_size or nearest_group_size(n)
        check_sizes(n, size)
        return size

    def max_steps(self, caps):
        return self.period

    def plan(self, t0, caps, durations):
        return np.full(durations.shape[0], self.period, dtype=np.int64)

    def extra_comm(self, cluster):
        size = self._size(cluster.n)
        return self.period * cluster.allreduce_s(size), self.period * cluster.ring_bytes(size), self.period


@dataclass
class DSSP:
    """DSSP: parameter-server training with a staleness bound in [s_lower, s_upper], per push."""

    s_lower: int = 3
    s_upper: int = 15

    @property
    def name(self):
        return f"DSSP({self.s_lower},{self.s_upper})"


def simulate(cluster, strategy, duration):
    """Simulate ``strategy`` on ``cluster`` for ``duration`` seconds; return a ``SimResult``."""
    duration = check_float("duration", duration, 0.0, min_exclusive=True)
    if isinstance(strategy, DSSP):
        return _simulate_dssp(cluster, strategy, duration)
    if not isinstance(strategy, _Rounds):
        raise TypeError(f"strategy must be one of {', '.join(sorted(SIMULATED))}, got {strategy!r}")
    n = cluster.n
    steps, compute, wait, comm, syncs, sent = (np.zeros(n) for _ in range(6))
    extra_s, extra_bytes, extra_syncs = strategy.extra_comm(cluster)
    t = 0.0
    while t < duration:
        caps = cluster.mean_step_times(t)
        durations = cluster.draw(t, strategy.max_steps(caps))
        k = strategy.plan(t, caps, durations)
        mask = np.arange(durations.shape[1]) < k[:, None]
        busy = (durations * mask).sum(axis=1)
        finish = busy + extra_s
        end = finish.max()
        round_comm = cluster.allreduce_s(n)
        steps += k
        compute += busy
        wait += end - finish
        comm += extra_s + round_comm
        syncs += 1 + extra_syncs
        sent += cluster.ring_bytes(n) + extra_bytes
        t += end + round_comm
    return SimResult(strategy.name, t, steps.astype(np.int64), compute, wait, comm, syncs.astype(np.int64),
                     sent, cluster.samples_per_step)


def _simulate_dssp(cluster, strategy, duration):
    n = cluster.n
    server = DSSPServer(n, strategy.s_lower, strategy.s_upper)
    push_s = 2 * (cluster.latency_s + cluster.model_bytes / cluster.bandwidth)
    steps, compute, wait, comm = (np.zeros(n) for _ in range(4))
    running = cluster.draw(0.0, 1)[:, 0]                      # duration of each worker's current step
    events = [(float(running[p]), p) for p in range(n)]       # (time the worker pushes, worker)
    heapq.heapify(events)
    blocked_since = {}
    while events and events[0][0] < duration:
        t, p = heapq.heappop(events)
        steps[p] += 1
        compute[p] += running[p]
        released = server.push(p, t)
        if p not in released:
            blocked_since[p] = t
        for q in released:
            wait[q] += t - blocked_since.pop(q, t)
            running[q] = cluster.draw_one(t, q)
            comm[q] += push_s
            heapq.heappush(events, (t + push_s + running[q], q))
    for q, since in blocked_since.items():
        wait[q] += duration - since
    syncs = steps.astype(np.int64)
    return SimResult(strategy.name, duration, syncs, compute, wait, comm, syncs,
                     syncs * 2 * cluster.model_bytes, cluster.samples_per_step)


SIMULATED = {"sync": Sync, "localsgd": LocalSGD, "esync": ESync, "elasticbsp": ElasticBSP,
             "dssp": DSSP, "wagma": WAGMA}


def compare(cluster, strategies, duration):
    """Simulate each strategy on the same cluster (fresh jitter stream each); list of SimResults."""
    out = []
    for s in strategies:
        cluster.rng, cluster._normals = np.random.default_rng(cluster.seed), []
        out.append(simulate(cluster, s, duration))
    return out


def format_table(results):
    """A comparison table, samples/s relative to the first row."""
    base = results[0].samples_per_s or 1.0
    head = (f"{'strategy':<22} {'samples/s':>10} {'vs first':>9} {'compute':>8} {'min comp':>9} "
            f"{'wait':>6} {'syncs/w':>8} {'MB/w':>9} {'steps min-max':>15}")
    rows = [head]
    for r in results:
        s = r.summary()
        rows.append(f"{s['strategy']:<22} {s['samples_per_s']:>10.1f} {s['samples_per_s'] / base:>8.2f}x "
                    f"{s['compute_ratio_mean']:>8.2f} {s['compute_ratio_min']:>9.2f} {s['wait_share_mean']:>6.2f} "
                    f"{s['syncs_per_worker']:>8.1f} {s['mb_per_worker']:>9.1f} "
                    f"{s['steps_min']:>7}-{s['steps_max']:<7}")
    return "\n".join(rows)
