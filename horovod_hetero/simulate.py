"""A discrete-event simulator of synchronisation strategies on a heterogeneous cluster.

Before renting a cluster, see what each algorithm would do with your workers' speeds: steps
per worker, compute-time ratio, waiting, synchronisations, bytes, and samples/s.

The simulator runs the library's own strategy objects (``hh.Synchronous()``, ``hh.LocalSGD(8)``,
``hh.ESync()``, ``hh.WAGMA(...)``, ``hh.ElasticBSP(15)``, ``hh.DSSP((3, 15))`` or your own
``Strategy``): one per worker, started with a
``Context`` whose clock is virtual and whose transports are in-process (ESync's state service is
the same ``rules.esync_state.ESyncState`` the real server keeps, queried without a socket). Each step's
duration is drawn from the cluster; the strategy's decisions are carried out as the runtime does:
``AVERAGE`` waits for every worker and costs one ring allreduce, ``GroupAverage`` costs a group
allreduce (wait-avoiding, ideally: a group never waits for a slow member), and the ``RoundResult``
handed to every worker carries every worker's step statistics, as a real round does; ``MEASURE``
rounds carry them alone (a small allreduce; ``MEASURE_OVERLAPPED`` alike, its result handed over at once). A strategy that averages gradients waits for every worker
at every step (one gradient allreduce); one that plans batch sizes (``Balanced``) has each step's time
scaled by its batch over the cluster's ``samples_per_step`` (time proportional to the batch; with
``batch_share`` below 1 only that share of it grows with the batch, the rest is fixed). Nothing here
re-implements a decision.

The communication model: a ring allreduce over k workers of B bytes costs
``2(k-1) latency + 2(k-1)/k B / bandwidth``.

Example:
    >>> from horovod_hetero.strategies import Synchronous
    >>> cluster = Cluster(step_times=[1.0, 1.0, 1.0, 4.0])
    >>> r = simulate(cluster, Synchronous(), duration=40.0)
    >>> r.steps.tolist()
    [10, 10, 10, 10]
"""
from __future__ import annotations

import copy
import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from horovod_hetero.rules.esync_state import ESyncState
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.strategies.base import (
    AVERAGE, MEASURES, Context, Decision, GroupAverage, RoundResult, RoundStats, StepReport, Strategy, check_decision)
from horovod_hetero.validation import check_float


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
        batch_share: the share of a step's time that grows with its batch, in [0, 1], for strategies
            that plan batch sizes: a step of b samples takes ``step_time x (1 - batch_share +
            batch_share x b / samples_per_step)`` (1: proportional to the batch; 0: the same whatever
            the batch, as a GPU below saturation or ``bench --slowdown padded``).
        seed: random seed of the jitter.
        step_factors: per worker, measured step times over its typical step (``advise`` takes them
            from telemetry): each step's time is ``step_times[q]`` times a factor drawn from worker
            q's list (instead of ``jitter``; e.g. a transient straggler's occasional 4x steps).
        replay: with ``step_factors``, take each worker's factors in turn instead of drawing them: a run's
            measured steps replayed in order (``bench``). A worker that runs out of them goes on with the newer
            half of its list, in turn: the cluster as the run left it (a straggler that appeared mid-run stays),
            not as it began.
        staleness: the synthetic training loss every step reports (what ``ADSP`` searches on):
            ``1 / (1 + progress / 1000) + 0.05``, where every step adds ``1 / (1 + k / staleness)``
            to the cluster's progress, k being the worker's local steps since its last round (a
            stale replica's step helps less), a number > 0.
    """

    # step_times, change_factors, step_factors: sequences as given, arrays (a list of arrays) after __post_init__
    step_times: Any
    jitter: float = 0.0
    change_at: float | None = None
    change_factors: Any = None
    model_bytes: float = 4e6
    latency_s: float = 50e-6
    bandwidth: float = 1.25e9
    samples_per_step: int = 32
    seed: int = 0
    staleness: float = 16.0
    step_factors: Any = None
    batch_share: float = 1.0
    replay: bool = False
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
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
        check_float("staleness", self.staleness, 0.0, min_exclusive=True)
        self.batch_share = check_float("batch_share", self.batch_share, 0.0, 1.0)
        if self.step_factors is not None:
            self.step_factors = [np.asarray(f, dtype=float) for f in self.step_factors]
            if len(self.step_factors) != self.n or not all(f.ndim == 1 and f.size and (f > 0).all()
                                                           for f in self.step_factors):
                raise ValueError("step_factors must give every worker a non-empty list of positive factors")
            if self.jitter:
                raise ValueError("give jitter or step_factors, not both")
        self.rng = np.random.default_rng(self.seed)
        self._normals: list[float] = []
        self._replayed = [0] * self.n           # factors taken so far per worker (``replay``)

    @property
    def n(self) -> int:
        return self.step_times.size

    def step_scale(self, batch: float) -> float:
        """A step of ``batch`` samples' time over a step of ``samples_per_step`` samples."""
        return 1.0 - self.batch_share + self.batch_share * batch / self.samples_per_step

    def mean_step_times(self, t: float) -> npt.NDArray[np.float64]:
        """Expected step time of every worker at simulated time t (what a worker would measure)."""
        if self.change_at is not None and t >= self.change_at:
            return self.step_times * self.change_factors
        return self.step_times

    def draw(self, t: float, k: int) -> npt.NDArray[np.float64]:
        """Durations (n x k) of the next k steps of every worker starting at time t."""
        mean = self.mean_step_times(t)[:, None]
        if self.step_factors is not None:
            return mean * np.stack([self._factors(q, k) for q in range(self.n)])
        if not self.jitter:
            return np.repeat(mean, k, axis=1)
        return mean * np.maximum(0.05, 1.0 + self.jitter * self.rng.standard_normal((mean.shape[0], k)))

    def draw_one(self, t: float, q: int) -> float:
        """Duration of worker q's next step starting at t (scalar path of ``draw`` for event loops)."""
        mean = float(self.mean_step_times(t)[q])
        if self.step_factors is not None:
            return mean * float(self._factors(q, 1)[0])
        if not self.jitter:
            return mean
        if not self._normals:
            self._normals = self.rng.standard_normal(65536).tolist()
        return mean * max(0.05, 1.0 + self.jitter * self._normals.pop())

    def _factors(self, q: int, k: int) -> npt.NDArray[np.float64]:
        """The next ``k`` step factors of worker ``q``: drawn from its ``step_factors``, or in turn (``replay``;
        past the last, the newer half again)."""
        factors = self.step_factors[q]
        if not self.replay:
            return self.rng.choice(factors, k)
        taken = self._replayed[q]
        self._replayed[q] = taken + k
        index = taken + np.arange(k)
        tail = max(1, factors.size // 2)                # past the end: the newest ``tail`` factors, in turn
        past = index >= factors.size
        index[past] = factors.size - tail + (index[past] - factors.size) % tail
        return factors[index]

    def loss(self, progress: float) -> float:
        """The synthetic training loss after ``progress`` (see ``staleness``)."""
        return 1.0 / (1.0 + progress / 1000.0) + 0.05

    def allreduce_s(self, k: int) -> float:
        """Seconds of a ring allreduce of the model over k workers."""
        if k <= 1:
            return 0.0
        return 2 * (k - 1) * self.latency_s + 2 * (k - 1) / k * self.model_bytes / self.bandwidth

    def ring_bytes(self, k: int) -> float:
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
    round_steps: list[np.ndarray] = field(default_factory=list, repr=False)   # per round: each worker's local steps
    # per worker (default: steps x samples_per_step)
    samples: np.ndarray = None  # type: ignore[assignment]  # None only until __post_init__ fills it in

    def __post_init__(self) -> None:
        if self.samples is None:
            self.samples = self.steps * self.samples_per_step

    @property
    def compute_ratio(self) -> np.ndarray:
        return self.compute_s / self.duration

    @property
    def samples_per_s(self) -> float:
        return float(self.samples.sum() / self.duration)

    def summary(self) -> dict[str, Any]:
        return {"strategy": self.strategy, "samples_per_s": self.samples_per_s,
                "compute_ratio_mean": float(self.compute_ratio.mean()),
                "compute_ratio_min": float(self.compute_ratio.min()),
                "wait_share_mean": float((self.wait_s / self.duration).mean()),
                "syncs_per_worker": float(self.syncs.mean()),
                "mb_per_worker": float(self.bytes_sent.mean() / 1e6),
                "steps_min": int(self.steps.min()), "steps_max": int(self.steps.max())}


class _SimClient:
    """ESync's state-server client inside the simulator: queries reach the shared ``ESyncState`` at once."""

    last_rtt: float | None = 0.0

    def __init__(self, state: ESyncState, rank: int) -> None:
        self._state, self.rank = state, rank
        self.slowest = False
        self._answers: list[dict[str, Any]] = []
        self._seq = 0

    def query(self, k: int, capability: float | None, round: int) -> bool:
        ready, self.slowest = self._state.answer(self.rank, k, capability, round)
        return ready

    def send_query(self, k: int, capability: float | None, round: int) -> int:
        self._seq += 1
        ready = self.query(k, capability, round)
        self._answers.append({"seq": self._seq, "ready": ready, "round": round, "slowest": self.slowest})
        return self._seq

    def poll(self, wait_s: float = 0.0) -> list[dict[str, Any]]:
        out, self._answers = self._answers, []
        return out

    def reset(self, round: int) -> None:
        self._state.reset(self.rank, round, self._state.clock())

    def leave(self) -> None:
        self._state.leave(self.rank)

    def enter(self, round: int) -> None:
        self._state.enter(self.rank, round)


class _SimTransports:
    """The transports a strategy opens, inside the simulator: no sockets, no threads."""

    def __init__(self, world: _World, rank: int) -> None:
        self._world, self._rank = world, rank

    def state_service(self, *, epsilon: float, overshoot: float, timeout: float,
                      address: str | None = None) -> _SimClient:
        world = self._world
        if world.esync is None:                      # rank 0's server: one state for every worker
            world.esync = ESyncState(world.size, epsilon=epsilon, overshoot=overshoot, clock=world.clock)
        return _SimClient(world.esync, self._rank)

    def open_groups(self, rank_lists: Sequence[Sequence[int]], init_call: str, *, wait_avoiding: bool,
                    patience: float, timeout: float) -> None:
        """Group averages are carried out (costed) by the simulation itself."""

    def groups_available(self, rank_lists: Sequence[Sequence[int]]) -> bool:
        """Every group can be averaged over in a simulation."""
        return True


class _World:
    """What the simulated workers share: the virtual clock and the state server's state."""

    esync: ESyncState | None

    def __init__(self, size: int) -> None:
        self.size, self.now, self.esync = size, 0.0, None

    def clock(self) -> float:
        return self.now


def label(strategy: Strategy) -> str:
    """The name a strategy has in tables (``LocalSGD(8)``)."""
    return strategy.label


def simulate(cluster: Cluster, strategy: Strategy, duration: float) -> SimResult:
    """Simulate ``strategy`` on ``cluster`` for ``duration`` seconds; return a ``SimResult``.

    ``strategy`` is a ``Strategy``; a fresh copy runs on every worker. The simulation ends with the first round that ends at or after
    ``duration`` (or, for a strategy that never averages, once every worker has passed it).
    """
    duration = check_float("duration", duration, 0.0, min_exclusive=True)
    if not isinstance(strategy, Strategy):
        raise TypeError(f"strategy must be a Strategy (e.g. hh.LocalSGD(8)), got {strategy!r}")
    n = cluster.n
    world = _World(n)
    workers = [copy.deepcopy(strategy) for _ in range(n)]
    runners = [runner_for(worker) for worker in workers]        # how the strategy's kind runs (it checks the kind)

    def start_all() -> None:
        world.esync = None                                       # a new state server for every start
        for rank, worker in enumerate(workers):
            worker.start(Context(rank, n, _SimTransports(world, rank), None, world.clock))

    start_all()
    steps, compute, wait, comm, syncs, sent, samples = (np.zeros(n) for _ in range(7))
    since, since_s = np.zeros(n, dtype=np.int64), np.zeros(n)      # this round's steps and compute
    since_min, since_sq = np.full(n, np.inf), np.zeros(n)          # this round's shortest step, squared steps
    since_comm, round_t = np.zeros(n), 0.0                         # this round's collectives' seconds; its start
    since_loss, progress = np.zeros(n), 0.0                         # the synthetic loss (Cluster.staleness)
    since_samples = np.zeros(n, dtype=np.int64)
    running, batch = np.zeros(n), np.full(n, cluster.samples_per_step)   # each worker's step: seconds, samples
    barrier: dict[int, tuple[float, Decision]]
    past: set[int]
    events: list[tuple[float, int]]
    round_steps: list[np.ndarray]
    barrier, past, events, rounds, end, round_steps = {}, set(), [], 0, 0.0, []
    together = [runners[0].steps_together]                  # an allreduce after every step (the kind may change)

    def begin(q: int, t: float) -> None:
        sizes = runners[q].batch_sizes(workers[q].step + 1, n)
        batch[q] = sizes[q] if sizes is not None else cluster.samples_per_step
        running[q] = cluster.draw_one(t, q) * cluster.step_scale(batch[q])
        heapq.heappush(events, (t + running[q], q))

    for q in range(n):
        begin(q, 0.0)
    while events:
        t, q = heapq.heappop(events)
        world.now = end = t
        steps[q] += 1
        compute[q] += running[q]
        since[q] += 1
        since_s[q] += running[q]
        since_min[q] = min(since_min[q], running[q])
        since_sq[q] += running[q] ** 2
        samples[q] += batch[q]
        since_samples[q] += batch[q]
        progress += 1.0 / (1.0 + since[q] / cluster.staleness)
        loss = cluster.loss(progress)
        since_loss[q] += loss
        decision = check_decision(workers[q], workers[q].after_step(StepReport(float(running[q]), loss, int(batch[q]))))
        if t >= duration:
            past.add(q)
        # a gradient allreduce after every step (the runner's steps_together), a round when the strategy says so
        if together[0] or decision is AVERAGE or decision in MEASURES:
            barrier[q] = (t, decision)
            if len(barrier) < n:
                continue
            arrived = np.array([barrier[r][0] for r in range(n)])
            decisions = [barrier[r][1] for r in range(n)]
            averaged = together[0] or AVERAGE in decisions
            cost = cluster.allreduce_s(n) if averaged else 2 * (n - 1) * cluster.latency_s
            world.now = end = arrived.max() + cost
            wait += arrived.max() - arrived
            comm += cost
            since_comm += arrived.max() - arrived + cost
            syncs += 1
            sent += cluster.ring_bytes(n) if averaged else 0.0
            if AVERAGE in decisions or any(d in MEASURES for d in decisions):
                rounds += 1
                with np.errstate(invalid="ignore", divide="ignore"):
                    stats = RoundStats(local_steps=since.copy(), step_s=since_s / since, loss=since_loss / since,
                                       samples=since_samples.copy(), done=np.zeros(n, dtype=bool),
                                       step_min=np.where(since > 0, since_min, np.nan), step_mean=since_s / since,
                                       step_sq=since_sq / since,
                                       comm_s=since_comm / since, wall_s=np.full(n, end - round_t))
                result = RoundResult(rounds, 1.0, float(n), 0, stats)
                round_steps.append(stats.local_steps)
                for worker in workers:
                    worker.after_round(result)
                since[:], since_s[:], since_loss[:], since_samples[:] = 0, 0.0, 0.0, 0
                since_min[:], since_sq[:], since_comm[:], round_t = np.inf, 0.0, 0.0, end
                successors = [worker.handover() for worker in workers]   # every worker alike: the same statistics
                if any(s is not None for s in successors):
                    for q, successor in enumerate(successors):
                        if successor is not None:
                            successor.take_over(workers[q].step)
                            workers[q], runners[q] = successor, runner_for(successor)
                    together[0] = runners[0].steps_together
                    start_all()
            barrier.clear()
            if end >= duration:
                break
            for r in range(n):
                begin(r, end)
        elif isinstance(decision, GroupAverage):
            k = len(decision.group)
            comm[q] += cluster.allreduce_s(k)
            syncs[q] += 1
            sent[q] += cluster.ring_bytes(k)
            begin(q, t + cluster.allreduce_s(k))
        elif not barrier and len(past) == n:       # never averages: stop once everyone passed duration
            break
        else:
            begin(q, t)
    return SimResult(label(strategy), end, steps.astype(np.int64), compute, wait, comm, syncs.astype(np.int64),
                     sent, cluster.samples_per_step, round_steps, samples)


def compare(cluster: Cluster, strategies: Iterable[Strategy], duration: float) -> list[SimResult]:
    """Simulate each strategy on the same cluster (fresh jitter stream each); list of SimResults."""
    out = []
    for s in strategies:
        cluster.rng, cluster._normals = np.random.default_rng(cluster.seed), []
        out.append(simulate(cluster, s, duration))
    return out


def format_table(results: Sequence[SimResult]) -> str:
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
