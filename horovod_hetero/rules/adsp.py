"""ADSP's online search for the commit rate, and the workers' commit timers.

Hu, Wang and Wu, "Distributed Machine Learning through Heterogeneous Edge Systems" (ADSP,
Algorithm 1), as summarised in this project's issue (the paper text shipped in
``shared/papers/adsp.txt`` is empty). Every check period Γ each worker i should reach the
same commit count C_target; with c_i commits so far it makes ΔC_i = C_target - c_i commits in
the next period, one every Γ/ΔC_i - O_i seconds (O_i: its commit overhead). C_target starts at
max c_i + 1; the search compares C_target with C_target + 1 by the *reward* of each trial
(the loss decrease per second of the curve ℓ(t) = 1/(a1²·t + a2) + a3 fitted to the trial's
(time, loss) samples) and moves up while the reward improves.
"""
import numpy as np

from horovod_hetero.validation import check_float, check_int


def loss_model(t, a1, a2, a3):
    """ADSP's loss curve ℓ(t) = 1 / (a1² t + a2) + a3."""
    return 1.0 / (a1 * a1 * np.asarray(t, dtype=float) + a2) + a3


def fit_loss_curve(times, losses):
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


def reward(times, losses):
    """Loss decrease per second over the trial window, read off the fitted curve (higher is better)."""
    a1, a2, a3 = fit_loss_curve(times, losses)
    t0, t1 = float(times[0]), float(times[-1])
    if t1 <= t0:
        raise ValueError("times must span a positive interval")
    return float((loss_model(t0, a1, a2, a3) - loss_model(t1, a1, a2, a3)) / (t1 - t0))


def commit_period(gamma, delta_commits, overhead):
    """A worker's commit timer: Γ/ΔC_i - O_i seconds between commits (0 if overhead exceeds it).

    Example:
        >>> commit_period(60.0, 4, 0.5)
        14.5
    """
    gamma = check_float("gamma", gamma, 0.0, min_exclusive=True)
    delta_commits = check_int("delta_commits", delta_commits, 1)
    overhead = check_float("overhead", overhead, 0.0)
    return max(0.0, gamma / delta_commits - overhead)


class CommitRateSearch:
    """ADSP Algorithm 1: online search of the target commit count C_target.

    Run each trial for one check period with ``deltas(commits)`` commits per worker, then
    ``report(times, losses)``; the search moves to C_target + 1 while the reward improves and
    stops at the best C_target (``done``).

    Args:
        commits: the workers' commit counts c_i when the search starts.

    Example:
        >>> s = CommitRateSearch([3, 5, 4])
        >>> s.target, s.deltas([3, 5, 4])
        (6, [3, 1, 2])
    """

    def __init__(self, commits):
        commits = [check_int("commits[i]", c, 0) for c in commits]
        if not commits:
            raise ValueError("commits must list at least one worker's commit count")
        self.target = max(commits) + 1
        self.best = None                 # (target, reward)
        self.history = []                # (target, reward) per trial
        self.done = False

    def deltas(self, commits):
        """ΔC_i = C_target - c_i for each worker (at least 1)."""
        return [max(1, self.target - check_int("commits[i]", c, 0)) for c in commits]

    def report(self, times, losses):
        """Record the finished trial of ``target``; choose the next target; return ``done``."""
        if self.done:
            return True
        r = reward(times, losses)
        self.history.append((self.target, r))
        if self.best is None or r > self.best[1]:
            self.best = (self.target, r)
            self.target += 1
        else:
            self.target = self.best[0]
            self.done = True
        return self.done

    def state_dict(self):
        return {"target": self.target, "best": self.best, "history": list(self.history), "done": self.done}

    def load_state_dict(self, state):
        self.target, self.done = state["target"], state["done"]
        self.best = tuple(state["best"]) if state["best"] is not None else None
        self.history = [tuple(h) for h in state["history"]]
