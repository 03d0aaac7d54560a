"""Which strategy for this cluster: advice from the telemetry of a run the user already has.

``measure`` reads what every rank recorded (``runtime.telemetry``: each step's compute seconds,
communication seconds, bytes and samples) and characterises the cluster: each rank's typical step
(the 25th percentile of its compute times, so that a rank delayed in half of its steps is not
called slow), how its steps vary around it, whether slowness is *persistent* (the same ranks slow
in nearly every window of steps: a slower GPU, a busy host) or *transient* (occasional slow steps:
noisy neighbours, the WAGMA paper's random stragglers), and what one synchronising collective
costs (the least any rank spent in it; the others were also waiting). ``predict`` runs the
simulator (``simulate``: the library's own strategy objects on a virtual clock) over every strategy
with those measurements, each step's time drawn from the rank's own measured steps, and ranks the
strategies by predicted samples/s; ``caveat`` says what samples/s does not show.

Samples/s is not accuracy: a strategy that averages models every few local steps converges
differently per sample (``horovod-hetero bench`` measures time to accuracy on a task).

Example:
    >>> recs = {r: [{"rank": r, "step": s, "compute_s": 0.1 * (4 if r == 3 else 1), "comm_s": 0.01,
    ...               "bytes_sent": 1_500_000, "samples": 32} for s in range(1, 41)] for r in range(4)}
    >>> m = measure(recs)
    >>> m.kind, m.slow_ranks, [round(s, 2) for s in m.step_s], m.model_bytes
    ('persistent', [3], [0.1, 0.1, 0.1, 0.4], 1000000.0)
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from horovod_hetero import simulate as sim
from horovod_hetero.runtime.telemetry import rounds_of
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.strategies.base import RoundStats, Strategy

#: steps a rank records before the first one measured (start-up: tracing, the first allreduces)
SKIP_STEPS = 5
#: steps a rank must have recorded after those
MIN_STEPS = 10
#: steps per window when telling persistent slowness from transient
WINDOW = 10
#: a rank is slow where its step is at least this many times the fastest rank's
SLOW_RATIO = 1.5
#: persistent: a slow rank is slow in at least this share of the windows
PERSISTENT_SHARE = 0.8
#: a transient slow step takes at least this many times the rank's typical step
TRANSIENT_FACTOR = 3.0
#: transient: on average over ranks, at least this share of steps are transient slow steps (4 ranks on
#: this 2-core machine under Synchronous: 9-14%; the WAGMA paper's random stragglers, 2 ranks of 4: 50%)
TRANSIENT_SHARE = 0.2


@dataclass(frozen=True)
class Measured:
    """A cluster as its telemetry shows it.

    Attributes:
        step_s: each rank's typical step in seconds (25th percentile of its compute times, at
            ``samples_per_step`` samples).
        factors: each rank's measured steps over its typical step (arrays).
        samples_per_step: the median samples of a step.
        model_bytes: the payload of one synchronising collective (bytes).
        comm_s: median seconds of one synchronising collective (the least any rank spent in it).
        kind: ``"persistent"``, ``"transient"``, ``"both"`` or ``"even"``.
        slow_ranks: the persistently slow ranks.
        transient_share: the mean share of a rank's steps at ``TRANSIENT_FACTOR`` times its typical step or more.
        steps: steps measured per rank (the fewest).
    """

    step_s: list[float]
    factors: list[np.ndarray]
    samples_per_step: float
    model_bytes: float
    comm_s: float
    kind: str
    slow_ranks: list[int]
    transient_share: float
    steps: int

    @property
    def size(self) -> int:
        return len(self.step_s)


def measure(by_rank: Mapping[int, Sequence[Mapping[str, Any]]], skip: int = SKIP_STEPS) -> Measured:
    """Characterise the cluster from ``{rank: [record, ...]}`` (``runtime.telemetry.load``).

    Raises ValueError when fewer than 2 ranks recorded ``MIN_STEPS`` steps after ``skip``."""
    ranks = sorted(by_rank)
    recs = {r: [x for x in by_rank[r] if "compute_s" in x][skip:] for r in ranks}
    if ranks != list(range(len(ranks))) or len(ranks) < 2 or min(len(v) for v in recs.values()) < MIN_STEPS:
        raise ValueError(f"advice needs the telemetry of ranks 0..P-1 (P >= 2), each with at least {MIN_STEPS} steps "
                         f"after the first {skip}; got ranks {ranks} with "
                         f"{[len(recs[r]) for r in ranks]} steps")
    samples = [x["samples"] for r in ranks for x in recs[r] if x.get("samples")]
    per_step = float(np.median(samples)) if samples else 1.0
    times = []
    for r in ranks:             # at the typical batch: a Balanced run's steps differ in samples
        times.append(np.array([x["compute_s"] * (per_step / x["samples"] if x.get("samples") else 1.0)
                               for x in recs[r]]))
    step_s = [max(float(np.percentile(t, 25)), 1e-6) for t in times]
    factors = [np.maximum(t / s, 1e-3) for t, s in zip(times, step_s)]
    steps = min(len(t) for t in times)
    windows = [np.array([np.median(t[w:w + WINDOW]) for w in range(0, steps - WINDOW + 1, WINDOW)]) for t in times]
    fastest = np.min(windows, axis=0)
    slow_ranks = [r for r in ranks if step_s[r] >= SLOW_RATIO * min(step_s)
                  and np.mean(windows[r] >= SLOW_RATIO * fastest) >= PERSISTENT_SHARE]
    transient_share = float(np.mean([np.mean(f >= TRANSIENT_FACTOR) for f in factors]))
    transient = transient_share >= TRANSIENT_SHARE
    kind = {(True, True): "both", (True, False): "persistent", (False, True): "transient",
            (False, False): "even"}[(bool(slow_ranks), transient)]
    rounds = rounds_of(recs)    # {rank: comm_s} of each collective every rank took part in (the telemetry's reading)
    sent = [x["bytes_sent"] for r in ranks for x in recs[r] if x.get("bytes_sent")]
    n = len(ranks)
    comm_s = float(np.median([min(v.values()) for v in rounds])) if rounds else 0.0
    ring = float(np.median(sent)) if rounds and sent else 0.0
    return Measured(step_s, factors, per_step, ring * n / (2 * (n - 1)), comm_s, kind, slow_ranks,
                    transient_share, steps)


def cluster(measured: Measured, seed: int = 0, batch_share: float = 1.0) -> sim.Cluster:
    """The simulator's ``Cluster`` for ``measured``: its typical steps, its measured step factors, and a
    network that moves ``model_bytes`` in ``comm_s`` (all of it bandwidth: no separate latency);
    ``batch_share``: the share of a step's time that grows with its batch (``sim.Cluster``)."""
    n = measured.size
    ring = 2 * (n - 1) / n * measured.model_bytes
    bandwidth = ring / measured.comm_s if ring > 0 and measured.comm_s > 0 else 1e15
    return sim.Cluster(measured.step_s, model_bytes=measured.model_bytes, latency_s=0.0, bandwidth=bandwidth,
                       samples_per_step=max(1, round(measured.samples_per_step)), seed=seed,
                       step_factors=measured.factors, batch_share=batch_share)


def predict(measured: Measured, strategies: Mapping[str, Strategy], duration: float | None = None,
            batch_share: float = 1.0) -> list[tuple[str, sim.SimResult]]:
    """Simulate ``{name: Strategy}`` (e.g. ``registry.configured(name)``) on ``measured``'s cluster;
    ``[(name, SimResult)]``, the most samples/s first. ``duration``: simulated seconds (default: 300 of the
    slowest rank's typical steps); ``batch_share``: as ``cluster``'s (1: a step's time proportional to its batch)."""
    duration = duration or 300 * max(measured.step_s)
    c = cluster(measured, batch_share=batch_share)
    for s in strategies.values():                 # a planned global batch (Balanced): the ranks' batches, as in the run
        runner_for(s).use_batch(c.samples_per_step, measured.size)
    results = [(name, sim.compare(c, [s], duration)[0]) for name, s in strategies.items()]
    return sorted(results, key=lambda nr: -nr[1].samples_per_s)


#: what predicted samples/s does not show, by strategy name
CAVEATS = {
    "sync": "the baseline: every step at the slowest rank's pace",
    "balanced": "Synchronous per sample (no accuracy cost), if a step's time grows with its batch",
    "wagma": "groups every step, global every few; needs its process sets at hvd.init",
    "auto": "runs the strategy it predicts fastest as the cluster changes (its switches: horovod-hetero telemetry)",
}
#: the caveat of the model-averaging strategies
LOCAL_STEPS = "fast ranks take more local steps: check accuracy with bench; skewed data: aggregate=hh.Normalized()"


def caveat(name: str, measured: Measured) -> str:
    """What ``name``'s predicted samples/s does not show on ``measured``'s cluster."""
    text = CAVEATS.get(name, LOCAL_STEPS)
    if name == "balanced" and measured.kind in ("transient", "both"):
        text += "; plans from past windows, so transient slow steps still make every rank wait"
    return text


def describe(measured: Measured) -> list[str]:
    """Lines that say what the telemetry shows."""
    times = " ".join(f"{s * 1000:.1f}" for s in measured.step_s)
    fastest = min(measured.step_s)
    slow = ", ".join(f"rank {r} {measured.step_s[r] / fastest:.1f}x the fastest" for r in measured.slow_ranks)
    kinds = {"persistent": f"persistent stragglers ({slow})",
             "transient": "transient stragglers (occasional slow steps on changing ranks)",
             "both": f"persistent ({slow}) and transient stragglers",
             "even": "no straggler: the ranks' steps are within "
                     f"{SLOW_RATIO:g}x of each other"}
    return [f"{measured.size} ranks, {measured.steps} steps each measured, {measured.samples_per_step:g} samples a step",
            f"typical step (ms): {times}",
            f"{kinds[measured.kind]}; {measured.transient_share:.0%} of steps took {TRANSIENT_FACTOR:g}x a rank's typical step or more",
            f"one synchronising collective: {measured.comm_s * 1000:.2f} ms for {measured.model_bytes / 1e6:.2f} MB"]


def format_advice(measured: Measured, results: Sequence[tuple[str, sim.SimResult]]) -> str:
    """The advice as text: what the telemetry shows, then the ranked table."""
    base = next((r.samples_per_s for name, r in results if name == "sync"), None) or results[-1][1].samples_per_s
    lines = describe(measured) + ["", f"{'#':>2} {'strategy':<16} {'samples/s':>10} {'vs Sync':>8} {'compute':>8}  note"]
    for i, (name, r) in enumerate(results, 1):
        lines.append(f"{i:>2} {r.strategy:<16} {r.samples_per_s:>10.1f} {r.samples_per_s / base:>7.2f}x "
                     f"{r.compute_ratio.mean():>8.2f}  {caveat(name, measured)}")
    lines += ["", "predicted by the simulator from these measurements; samples/s is not accuracy: "
                  "horovod-hetero bench measures time to accuracy on a task"]
    return "\n".join(lines)


# --- the choice, shared with hh.Auto -------------------------------------------------------------------

#: The order in which strategies predicted equally fast are preferred: Synchronous (every step averaged) and
#: Balanced (Synchronous's gradient, sized batches) first, then the model-averaging strategies by how close
#: their models stay between rounds, those that decide from the rounds alone (ElasticBSP, DSSP) before ESync,
#: which asks its state server at every local step (a round trip the simulator does not count: on the
#: benchmark ESync ran 1,620-1,800 samples/s where both ran 1,870-1,900, predicted alike), ADSP last: at the
#: samples/s of the others it took the longest to an accuracy (``horovod-hetero benchmark auto``,
#: Fashion-MNIST: 1.3x DSSP's time with one rank 4x slower, 1.9x on equal ranks), its fast ranks taking many
#: local steps between commits.
PREFERENCE = ("sync", "balanced", "elasticbsp", "dssp", "esync", "localsgd", "wagma", "adsp")
#: predictions within this share of the best are ties, broken by ``PREFERENCE`` (and by measuring them, in
#: ``hh.Auto``): the simulator's resolution. A strategy's predicted gain moves by some 10 % between measurement
#: windows of one run, and the samples/s measured afterwards differed from the prediction by up to 23 %
#: (``horovod-hetero benchmark auto``, one rank 4x slower: ESync predicted 3.25x Synchronous, ran 2.5x)
TIE = 0.25
#: the least predicted gain over the strategy running that makes ``choose`` move away from it
MIN_GAIN = 0.15
#: how many times the measured noise the predicted gain must also exceed
NOISE_FACTOR = 3.0
#: where no rank is a straggler (``Measured.kind == "even"``), what ``choose`` counts a sample of a strategy
#: that averages models (not every step's gradients) for, against one of a gradient-averaging strategy. There
#: nobody waits for a slow rank: the only gain is fewer collectives, and each sample then moves the averaged
#: model less. Measured (``horovod-hetero benchmark auto``, Fashion-MNIST to 0.89, four equal ranks):
#: LocalSGD(8) ran 1.6-1.7x Synchronous's samples/s and reached the accuracy at 0.88-0.91x its speed. A move
#: from Synchronous to such a strategy then needs ``(1 + MIN_GAIN) / EVEN_WORTH`` (2.09x) its samples/s, and
#: one running already is left for Synchronous where it runs less than ``1 / ((1 + MIN_GAIN) * EVEN_WORTH)``
#: (1.58x) Synchronous's (a straggler that left)
EVEN_WORTH = 0.55


@dataclass(frozen=True)
class Choice:
    """What ``choose`` decided.

    Attributes:
        name: the strategy to run (the registry's name).
        current: the strategy running when it decided.
        gain: ``name``'s predicted samples/s over ``current``'s, each times its ``worth`` (1 where it stays).
        predicted: predicted samples/s by name.
        reason: one line saying why.
        tied: where it switches, the candidates predicted within ``TIE`` of the fastest and over the gain a switch
            needs, in ``PREFERENCE`` order (``name`` first): ``hh.Auto``'s trial runs the first
            ``trial_candidates`` of them in turn and measures them.
        worth: what a sample of each candidate counted for (``worth``), by name; ``gain`` and the ties count
            samples/s times it.
    """

    name: str
    current: str
    gain: float
    predicted: dict[str, float]
    reason: str
    tied: tuple[str, ...] = ()
    worth: dict[str, float] = field(default_factory=dict)

    @property
    def switches(self) -> bool:
        return self.name != self.current


def ordered(names: Iterable[str]) -> list[str]:
    """``names`` in ``PREFERENCE`` order (names it does not hold last, as given): how ties are broken.

    Example:
        >>> ordered(["adsp", "localsgd", "mine", "elasticbsp"])
        ['elasticbsp', 'localsgd', 'adsp', 'mine']
    """
    return sorted(names, key=lambda name: PREFERENCE.index(name) if name in PREFERENCE else len(PREFERENCE))


def worth(strategy: Strategy, kind: str) -> float:
    """What ``choose`` counts a sample of ``strategy`` for on a cluster of ``kind`` (``Measured.kind``):
    ``EVEN_WORTH`` where ``kind`` is ``"even"`` and ``strategy`` averages models rather than every step's
    gradients (its runner's ``steps_together``), else 1.

    Example:
        >>> from horovod_hetero.strategies import LocalSGD, Synchronous
        >>> worth(LocalSGD(8), "even"), worth(LocalSGD(8), "persistent"), worth(Synchronous(), "even")
        (0.55, 1.0, 1.0)
    """
    return EVEN_WORTH if kind == "even" and not runner_for(strategy).steps_together else 1.0


def bar(worths: Mapping[str, float], name: str, left: str) -> float:
    """The samples/s ``name`` must run, as a multiple of ``left``'s, to replace it: ``1 + MIN_GAIN`` times
    ``left``'s worth over ``name``'s (``worths``: ``worth`` by name, 1 where absent).

    Example:
        >>> round(bar({"sync": 1.0, "localsgd": 0.55}, "localsgd", "sync"), 2), bar({}, "esync", "sync")
        (2.09, 1.15)
    """
    return (1.0 + MIN_GAIN) * worths.get(left, 1.0) / worths.get(name, 1.0)


def choose(measured: Measured, strategies: Mapping[str, Strategy], current: str, noise: float = 0.0,
           duration: float | None = None, batch_share: float | None = None,
           predicted: Mapping[str, float] | None = None) -> Choice:
    """The strategy to run on ``measured``'s cluster: ``hh.Auto``'s decision at a round, and ``advise``'s
    advice from a finished run's telemetry (the same function, so the advice is what ``Auto`` would have
    done). Every candidate of ``strategies`` (names of the registry) is simulated on the measured cluster
    (``predict``). A candidate may replace ``current`` only if its predicted gain over it exceeds ``MIN_GAIN``
    and ``NOISE_FACTOR`` times ``noise`` (how much the gain itself moves between halves of the measurements:
    ``gain_noise``), so that noise never makes the choice flap; on an even cluster, a strategy that averages
    models has its samples/s counted at ``EVEN_WORTH`` (``worth``) here. Of those, the ones predicted within
    ``TIE`` of the fastest are ties (``Choice.tied``), and the first in ``PREFERENCE`` wins. ``batch_share``: the
    share of a step's time that grows with its batch, where measured; unknown (``None``) it is taken as 0,
    Balanced's worst case (it then gains nothing here). ``predicted``: samples/s by name from an earlier
    ``choose`` on the same measurements (its ``Choice.predicted``), taken instead of simulating again
    (``hh.Auto`` decides twice: without and with the noise).

    Example:
        >>> from horovod_hetero.strategies import ESync, LocalSGD, Synchronous
        >>> steps = {r: [{"rank": r, "step": s, "compute_s": 0.1 * (4 if r == 3 else 1), "comm_s": 0.01,
        ...               "bytes_sent": 1_500_000, "samples": 32} for s in range(1, 41)] for r in range(4)}
        >>> c = choose(measure(steps), {"sync": Synchronous(), "esync": ESync(), "localsgd": LocalSGD(8)}, "sync")
        >>> c.name, round(c.gain, 1)
        ('esync', 3.3)
    """
    if current not in strategies:
        raise ValueError(f"current={current!r} is not among the candidates {', '.join(strategies)}")
    if predicted is not None:
        if set(predicted) != set(strategies):
            raise ValueError(f"predicted= holds {sorted(predicted)}, not the candidates {sorted(strategies)}")
        rates = dict(predicted)
    else:
        results = predict(measured, strategies, duration, 0.0 if batch_share is None else batch_share)
        rates = {name: r.samples_per_s for name, r in results}
    worths = {name: worth(strategy, measured.kind) for name, strategy in strategies.items()}
    value = {name: rate * worths[name] for name, rate in rates.items()}     # samples/s, as progress
    top, base = max(value.values()), value[current]
    needed = max(MIN_GAIN, NOISE_FACTOR * noise)
    gain = {name: v / base if base > 0 else float("inf") for name, v in value.items()}
    tied = tuple(ordered(name for name in value if name != current and value[name] >= top * (1 - TIE)
                         and gain[name] > 1.0 + needed))

    def predicted_as(name: str) -> str:
        said = f"{name} is predicted {rates[name] / rates[current] if rates[current] > 0 else float('inf'):.2f}x " \
               f"{current}'s samples/s"
        if worths[name] != worths[current]:
            said += f", {gain[name]:.2f}x counted as progress (a sample of model averaging as {EVEN_WORTH:g})"
        return said

    if not tied:
        fastest = max((name for name in value if name != current), key=value.__getitem__, default=current)
        if value[fastest] <= base:
            counted = "" if len(set(worths.values())) == 1 else \
                f", a sample of model averaging counted as {EVEN_WORTH:g} ({measured.kind})"
            return Choice(current, current, 1.0, rates, f"{current} is predicted the fastest{counted}", worth=worths)
        return Choice(current, current, 1.0, rates, f"{predicted_as(fastest)}, within the {1 + needed:.2f}x a "
                                                    f"switch needs ({measured.kind})", worth=worths)
    best = tied[0]
    return Choice(best, current, gain[best], rates,
                  f"{predicted_as(best)} ({measured.kind}; needed {1 + needed:.2f}x)", tied, worths)


#: points per measured step in a rank's distribution of step factors (``measure_rounds``)
POINTS_PER_STEP = 5


def measure_rounds(rounds: Sequence[RoundStats], samples_per_step: float = 1.0) -> Measured:
    """Characterise the cluster from rounds' statistics (``RoundStats``, identical on every rank: what ``hh.Auto``
    sees), as ``measure`` does from telemetry: each rank's typical step (its shortest over the rounds, its
    undelayed step: a round may hold a single step, delayed or not), its steps' spread (each round's steps as
    a rank's two-point mix of undelayed and delayed steps that has the round's shortest step, mean and mean
    square; a round whose shortest step is already delayed counts all its steps delayed), the collective's
    cost (the least any rank spent in collectives per step: the others were also waiting), persistent and
    transient stragglers. The rounds
    must carry every rank's step statistics (``step_min``, ``step_mean``, ``step_sq``); rounds where a rank took
    no step are left out. A ``ValueError`` where none is left.

    Example:
        >>> import numpy as np
        >>> def stats(mins, means, sqs):
        ...     n = len(mins)
        ...     return RoundStats(np.full(n, 10), np.array(means), np.full(n, np.nan), np.zeros(n, int), np.zeros(n, bool),
        ...                       np.array(mins), np.array(means), np.array(sqs), np.full(n, 0.01), np.full(n, 1.0))
        >>> m = measure_rounds([stats([0.1, 0.1, 0.1, 0.4], [0.1, 0.1, 0.1, 0.4], [0.01, 0.01, 0.01, 0.16])] * 3)
        >>> m.kind, m.slow_ranks, [round(s, 2) for s in m.step_s]
        ('persistent', [3], [0.1, 0.1, 0.1, 0.4])
    """
    usable = [r for r in rounds if np.isfinite(r.step_min).all() and np.isfinite(r.step_mean).all()
              and np.isfinite(r.step_sq).all() and (r.local_steps > 0).all()]
    if not usable:
        raise ValueError("no round carried every rank's step statistics yet")
    mins = np.array([r.step_min for r in usable])                  # rounds x ranks
    means = np.maximum(np.array([r.step_mean for r in usable]), mins)
    sqs = np.maximum(np.array([r.step_sq for r in usable]), means ** 2)
    typical = np.maximum(np.min(mins, axis=0), 1e-6)
    n = typical.size
    # each round as a two-point mix: undelayed steps at its shortest, delayed ones at ``low + reach`` with
    # probability ``share``, matching the round's mean and mean square
    excess = means - mins
    variance = sqs - means ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        reach = np.where(excess > 1e-12, (variance + excess ** 2) / excess, 0.0)
        share = np.where(reach > 0, excess / reach, 0.0)
    steps = np.array([r.local_steps for r in usable], dtype=float)            # rounds x ranks
    factors = []
    for q in range(n):
        values = []
        for low, high, p, k in zip(mins[:, q], mins[:, q] + reach[:, q], np.clip(share[:, q], 0.0, 1.0), steps[:, q]):
            points = POINTS_PER_STEP * int(k)           # a round weighs as many steps as it holds
            slow = int(round(p * points))
            values += [high / typical[q]] * slow + [low / typical[q]] * (points - slow)
        factors.append(np.maximum(np.array(values), 1e-3))
    fastest = mins.min(axis=1, keepdims=True)
    slow_ranks = [q for q in range(n) if typical[q] >= SLOW_RATIO * typical.min()
                  and np.mean(mins[:, q] >= SLOW_RATIO * fastest[:, 0]) >= PERSISTENT_SHARE]
    late = TRANSIENT_FACTOR * typical          # a round's steps delayed: all where its shortest is, else its mix's
    delayed = np.where(mins >= late, 1.0, np.where(mins + reach >= late, share, 0.0))
    transient_share = float(np.mean(delayed))
    transient = transient_share >= TRANSIENT_SHARE
    kind = {(True, True): "both", (True, False): "persistent", (False, True): "transient",
            (False, False): "even"}[(bool(slow_ranks), transient)]
    comms = np.array([r.comm_s for r in usable])
    comm_s = float(np.median(np.nanmin(comms, axis=1))) if np.isfinite(comms).any() else 0.0
    return Measured([float(t) for t in typical], factors, float(samples_per_step), 1e6, max(comm_s, 0.0), kind,
                    slow_ranks, transient_share, int(min(r.local_steps.min() for r in usable) * len(usable)))


#: a round whose wall time exceeds this many times the rounds' median is a pause (an evaluation, a checkpoint on
#: one rank), not the strategy's pace: ``samples_per_s`` leaves it out
PAUSE = 3.0


def samples_per_s(rounds: Sequence[RoundStats]) -> float:
    """The samples per second the job ran at over ``rounds`` (``RoundStats``: the same on every rank): every rank's
    samples (its steps where it reported none) over the rounds' wall time. A round's wall time is the median of
    the ranks' (each rank's runs from the start of its previous round to the start of this one: the round's
    collective included); rounds longer than ``PAUSE`` times the median are left out. A round that reports no
    samples counts its steps instead. NaN where no round measured its wall time.

    Example:
        >>> import numpy as np
        >>> def stats(wall):
        ...     return RoundStats(np.full(4, 2), np.full(4, 0.1), np.full(4, np.nan), np.full(4, 64), np.zeros(4, bool),
        ...                       wall_s=np.array([wall, wall, wall, wall / 2]))
        >>> round(samples_per_s([stats(0.2)] * 3 + [stats(5.0)]), 6)    # 256 samples a 0.2 s round; a pause
        1280.0
    """
    walls = np.array([np.nanmedian(r.wall_s) if np.isfinite(r.wall_s).any() else np.nan for r in rounds])
    usable = np.isfinite(walls) & (walls > 0)
    if not usable.any():
        return float("nan")
    usable &= walls <= PAUSE * float(np.median(walls[usable]))
    done = np.array([samples_in(r) for r in rounds], dtype=float)
    return float(done[usable].sum() / walls[usable].sum())


def samples_in(stats: RoundStats) -> float:
    """Every rank's samples in one round (``RoundStats``), or its steps where the ranks reported no samples.

    Example:
        >>> import numpy as np
        >>> ones = RoundStats(np.full(4, 2), np.full(4, 0.1), np.full(4, np.nan), np.full(4, 64), np.zeros(4, bool))
        >>> samples_in(ones)
        256.0
    """
    samples = float(np.sum(stats.samples))
    return samples if samples > 0 else float(np.sum(stats.local_steps))


def gain_noise(rounds: Sequence[RoundStats], best: Strategy, current: Strategy, duration: float | None = None) -> float:
    """How much ``best``'s predicted gain over ``current`` moves between the older and the newer half of
    ``rounds`` (each half measured and simulated alone): half the difference of the two gains over their mean,
    0 with fewer than four rounds. What a decision's gain must outgrow (``choose``'s ``noise``): the spread of
    the measurement, not of the steps themselves (a transient straggler's slow steps are the cluster, and the
    prediction accounts for them)."""
    if len(rounds) < 4:
        return 0.0
    half = len(rounds) // 2
    gains = []
    for part in (rounds[:half], rounds[half:]):
        try:
            measured = measure_rounds(part)
        except ValueError:
            return 0.0
        rates = dict((name, r.samples_per_s) for name, r in predict(measured, {"best": best, "current": current},
                                                                       duration, 0.0))
        gains.append(rates["best"] / rates["current"] if rates["current"] > 0 else 0.0)
    mean = (gains[0] + gains[1]) / 2
    return abs(gains[0] - gains[1]) / (2 * mean) if mean > 0 else 0.0
