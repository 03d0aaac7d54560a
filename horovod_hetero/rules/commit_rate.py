"""ADSP's online search for the commit rate, its reward, and the workers' commit timers.

Hu, Wang and Wu, "Distributed Machine Learning through Heterogeneous Edge Systems" (AAAI 2020,
``shared/papers/adsp.txt``). Time is cut into check periods of Γ seconds; by each checkpoint every
worker i should have committed C_target times, so with c_i commits it makes ΔC_i = C_target - c_i
commits in the next period, one every Γ/ΔC_i - O_i seconds (Algorithm 2; O_i: its commit
overhead). At the start of every search epoch the scheduler sets C_target = max c_i + 1 and runs
DECIDECOMMITRATE (Algorithm 1): it runs C_target and C_target + 1 for a while each, scores each
with the reward of section 4.2, and climbs while the higher target scores better.

The reward: a trial's (time, loss) samples are fitted with ℓ(t) = 1/(a1² t + a2) + a3, and
r = a1² / (1/(ℓ - a3) - a2), the reciprocal of the time at which the fitted curve reaches a
constant loss ℓ ("setting ℓ to a constant and calculating the reciprocal of corresponding t").
Both trials of a comparison are scored at the same ℓ (the lowest loss either reached), on one
time axis, so a trial that started later (from a lower loss) is not penalised for it.

Where the listing and the text differ, this follows the text: the listing re-runs C_target + 1
when it recurses; the text compares "C_target + 1 and C_target + 2 further", so a trial is run
once and its fit is kept for the next comparison.

Example:
    >>> s = CommitRateSearch(fit_points=3)
    >>> s.rate, s.trial_rounds()
    (1, 3)
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from horovod_hetero.validation import check_float, check_int


def loss_model(t: npt.ArrayLike, a1: float, a2: float, a3: float) -> npt.NDArray[np.float64]:
    """ADSP's loss curve ℓ(t) = 1 / (a1² t + a2) + a3."""
    return 1.0 / (a1 * a1 * np.asarray(t, dtype=float) + a2) + a3


def fit_loss_curve(times: npt.ArrayLike, losses: npt.ArrayLike) -> tuple[float, float, float]:
    """Least-squares fit of ``loss_model`` to (time, loss) samples; returns (a1, a2, a3).

    Example:
        >>> t = np.linspace(0, 10, 50)
        >>> a1, a2, a3 = fit_loss_curve(t, loss_model(t, 0.5, 1.0, 0.2))
        >>> bool(np.allclose(loss_model(t, a1, a2, a3), loss_model(t, 0.5, 1.0, 0.2), atol=1e-6))
        True
    """
    from scipy.optimize import least_squares

    t = np.asarray(times, dtype=float)
    y = np.asarray(losses, dtype=float)
    if t.shape != y.shape or t.ndim != 1 or t.size < 3:
        raise ValueError(f"times and losses must be 1-d of the same length >= 3, got {t.shape} and {y.shape}")
    if not (np.isfinite(t).all() and np.isfinite(y).all()):
        raise ValueError("times and losses must be finite")
    t0 = t - t[0]                                   # fit on the trial's own time axis
    a3 = y.min() - 0.1 * (np.ptp(y) + 1e-12)
    a2 = 1.0 / max(y[0] - a3, 1e-12)
    slope = (1.0 / max(y[-1] - a3, 1e-12) - a2) / max(t0[-1], 1e-12)
    guess = [np.sqrt(max(slope, 1e-12)), a2, a3]
    fit = least_squares(lambda a: loss_model(t0, *a) - y, guess,
                        bounds=([-np.inf, 1e-12, -np.inf], [np.inf, np.inf, np.inf]), x_scale="jac")
    a1, a2, a3 = fit.x
    # report the curve on the callers' time axis: 1/(a1² (t - t_0) + a2) = 1/(a1² t + a2 - a1² t_0)
    return float(a1), float(a2 - a1 * a1 * t[0]), float(a3)


def reward(curve: Sequence[float], loss: float) -> float:
    """The paper's reward r = a1² / (1/(ℓ - a3) - a2): 1 / the time the fitted ``curve`` (a1, a2, a3)
    reaches the constant ``loss`` ℓ. 0 if it never does (ℓ at or below its asymptote a3, or a flat
    curve); infinite if it is there at time 0 already.

    Example:
        >>> reward((0.5, 1.0, 0.2), 0.2 + 1.0 / 3.0)       # 1/(0.25 t + 1) = 1/3 at t = 8
        0.125
    """
    a1, a2, a3 = (float(a) for a in curve)
    loss = check_float("loss", loss)
    if loss <= a3 or a1 == 0.0:
        return 0.0
    t = (1.0 / (loss - a3) - a2) / (a1 * a1)
    return math.inf if t <= 0 else 1.0 / t


def commit_period(gamma: float, delta_commits: int, overhead: float) -> float:
    """A worker's commit timer: Γ/ΔC_i - O_i seconds between commits (0 if overhead exceeds it).

    Example:
        >>> commit_period(60.0, 4, 0.5)
        14.5
    """
    gamma = check_float("gamma", gamma, 0.0, min_exclusive=True)
    delta_commits = check_int("delta_commits", delta_commits, 1)
    overhead = check_float("overhead", overhead, 0.0)
    return max(0.0, gamma / delta_commits - overhead)


#: A trial must beat the best one's reward by this relative margin. Every rank fits the same points,
#: but scipy on different hosts (CPUs, BLAS builds) may differ in the last bits, and rewards that
#: all but tie (fits of a loss at its floor) must not make some ranks climb and others stop: with
#: the margin a split needs a ratio of rewards within ~1e-12 of 1 + 1e-6 instead of the far likelier 1.
IMPROVEMENT = 1e-6


class CommitRateSearch:
    """ADSP Algorithm 1 (DECIDECOMMITRATE), online, fed one round at a time.

    ``rate`` is the commit rate ΔC_target (commits per check period) being run: a trial's candidate
    while ``searching``, the chosen one afterwards. Where every worker commits in every round (a
    collective), all c_i are equal and C_target = max c_i + 1 gives ΔC_target = 1: the search starts
    at ``start`` (1) and tries 1, 2, ... while the reward improves.

    A trial of rate C runs whole check periods (C rounds each): one, or as many as give its fit
    ``fit_points`` samples (one per round: the round's time and global loss). ``add(t, loss)``
    feeds one round; when a trial ends it is fitted and compared with the best so far at the same
    loss level: a higher reward moves on to C + 1; otherwise the search stops at the best. A trial
    with too few finite losses, or a fit that fails, stops the search at the rate that runs
    (``stalled``). ``add``'s ``max_rate`` (the largest rate the slowest worker can keep now, or None) stops it
    before a rate beyond it. ``restart()`` begins a new search (a new epoch).

    Args:
        start: the first rate tried, an int >= 1.
        fit_points: samples a trial's fit needs, an int >= 3 (the curve has three parameters).

    Example:
        >>> s = CommitRateSearch(fit_points=3)
        >>> speed = {1: 1.0, 2: 1.5, 3: 1.2}           # rate 2 makes the loss fall fastest
        >>> t = progress = 0.0
        >>> while s.searching:                        # one round a second
        ...     t, progress = t + 1.0, progress + speed[s.rate]
        ...     _ = s.add(t, float(loss_model(progress, 0.3, 1.0, 0.1)))
        >>> s.rate, [h["candidate"] for h in s.history]
        (2, [1, 2, 3])
    """

    def __init__(self, start: int = 1, fit_points: int = 4) -> None:
        self.start = check_int("start", start, 1)
        self.fit_points = check_int("fit_points", fit_points, 3)
        self.restart()
        self.history: list[dict[str, Any]] = []              # one dict per finished trial (telemetry)

    def restart(self) -> None:
        """A new search from ``start`` (the paper's new epoch: C_target = max c_i + 1)."""
        self.rate = self.start
        self.searching = True
        self.stalled = False
        self.best: tuple[int, Sequence[float], float] | None = None    # (rate, curve, lowest loss of its trial)
        self._points: list[tuple[float, float]] = []                   # (t, loss) of the running trial
        self._rounds = 0               # rounds of the running trial

    def trial_rounds(self) -> int:
        """Rounds the running trial lasts: whole check periods of ``rate`` rounds, enough for the fit."""
        return self.rate * -(-self.fit_points // self.rate)

    def add(self, t: float, loss: float, max_rate: int | None = None) -> dict[str, Any] | None:
        """One round ended at time ``t`` with global training loss ``loss`` (NaN/inf: skipped).

        Returns the finished trial's record (a dict: ``candidate``, ``a1``, ``a2``, ``a3``,
        ``reward``, ``best_reward``, ``level``, ``rate``, ``searching``), or None mid-trial.
        """
        if not self.searching:
            return None
        self._rounds += 1
        if math.isfinite(loss):
            self._points.append((float(t), float(loss)))
        if self._rounds < self.trial_rounds():
            return None
        points, candidate = self._points, self.rate
        self._points, self._rounds = [], 0
        record: dict[str, Any] = {"candidate": candidate, "points": len(points)}
        try:
            curve = fit_loss_curve(*zip(*points)) if len(points) >= self.fit_points else None
        except ValueError:
            curve = None
        if curve is None or not all(map(math.isfinite, curve)):
            self.searching, self.stalled = False, True        # too few points to fit: keep the rate
            record.update(rate=self.rate, searching=False, stalled=True)
            self.history.append(record)
            return record
        lowest = min(loss for _, loss in points)
        level = lowest if self.best is None else min(lowest, self.best[2])
        r = reward(curve, level)
        record.update(a1=curve[0], a2=curve[1], a3=curve[2], reward=r, level=level)
        if self.best is not None:
            record["best_reward"] = best = reward(self.best[1], level)
            better = r > best * (1.0 + IMPROVEMENT)
        else:
            better = True
        if better:
            self.best = (candidate, curve, lowest)
            if max_rate is not None and candidate + 1 > max_rate:
                self.searching = False                        # no worker could keep a higher rate
            else:
                self.rate = candidate + 1
        else:
            assert self.best is not None                      # not better: there was a best to compare with
            self.rate, self.searching = self.best[0], False
        record.update(rate=self.rate, searching=self.searching)
        self.history.append(record)
        return record

    def state_dict(self) -> dict[str, Any]:
        best = None if self.best is None else [self.best[0], list(self.best[1]), self.best[2]]
        return {"rate": self.rate,
                "searching": self.searching, "stalled": self.stalled, "best": best,
                "points": [list(p) for p in self._points], "rounds": self._rounds, "history": list(self.history)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.rate = check_int("state['rate']", state["rate"], 1)
        self.searching, self.stalled = bool(state["searching"]), bool(state["stalled"])
        best = state["best"]
        self.best = None if best is None else (int(best[0]), tuple(best[1]), float(best[2]))
        self._points = [tuple(p) for p in state["points"]]
        self._rounds = check_int("state['rounds']", state["rounds"], 0)
        self.history = list(state["history"])
