"""``horovod-hetero report DIR``: tables and the papers' plots from a ``bench`` results directory.

Per group of jobs (framework, task, split, profile), one row per strategy (and aggregation), medians over
the repeats with their range: time to the target (and the speedup over Synchronous, the median of the
per-repeat ratios against the Synchronous job of the same repeat), final quality, the final accuracy on
the slowest worker's classes (where a profile has a slowest worker and it holds most of some classes),
the quality at equal steps, samples/s (and its ratio to Synchronous's), the simulator's prediction, the
share of the bound the strategy would reach with free communication, bytes sent per second, each worker's
compute-time ratio, and the mean wait per round. Plots (matplotlib): quality against wall time (ESync
Fig. 3), throughput and traffic (Fig. 4), compute-time ratio per worker (Fig. 5), quality against rank
0's local steps (WAGMA's ablation), and the accuracy on the slowest worker's classes against wall time
(where the bias of plain averaging shows).
"""
import base64
import html
import json
import math
import pathlib
import shlex
from typing import Any

import numpy as np

from horovod_hetero_lab.bench import FORMAT, RESULTS, STRATEGIES, median_range, quality_at, read_curve
from horovod_hetero_lab.data import TASKS

COLUMNS = ["strategy", "time to target s", "speedup", "final", "slow classes", "at equal steps", "samples/s", "vs sync",
           "simulated", "share of bound", "MB/s", "compute ratio per worker", "wait/round ms"]


class ReportError(Exception):
    """The directory is not a bench results directory (the message says why)."""


def load_results(directory):
    """The ``results.json`` of a bench directory; a ``ReportError`` for a missing or foreign one."""
    directory = pathlib.Path(directory)
    if not directory.is_dir():
        raise ReportError(f"{directory}: no such directory")
    path = directory / RESULTS
    if not path.exists():
        raise ReportError(f"{directory} is not a horovod-hetero bench directory: it has no {RESULTS} "
                          f"(make one with horovod-hetero bench --out {directory})")
    try:
        results = json.loads(path.read_text())
    except ValueError as e:
        raise ReportError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(results, dict) or results.get("format") != FORMAT:
        raise ReportError(f"{path} was not written by horovod-hetero bench (format {FORMAT!r} expected)")
    return results


def groups(results):
    """``{(framework, task, split, profile): {strategy label: [finished job entries]}}``, in plan order."""
    out: dict[tuple[str, str, str, str], dict[str, list[dict[str, Any]]]] = {}
    for entry in results["jobs"]:
        g = out.setdefault((entry["framework"], entry["task"], entry["split"], entry["profile"]), {})
        g.setdefault(entry["label"], [])
        if entry["status"] == "done":
            g[entry["label"]].append(entry)
    return out


def unfinished(results):
    """The jobs that did not finish: ``[(id, status)]``."""
    return [(e["id"], e["status"]) for e in results["jobs"] if e["status"] != "done"]


def _fmt(value, spec, scale=1.0):
    return "-" if value is None else format(value * scale, spec)


def _cell(values, spec, scale=1.0, unit="", missing="-"):
    """``median (low-high)`` of the values, or ``missing`` when there are none."""
    med, lo, hi = median_range(values)
    if med is None:
        return missing
    if lo == hi:
        return _fmt(med, spec, scale) + unit
    return f"{_fmt(med, spec, scale)}{unit} ({_fmt(lo, spec, scale)}-{_fmt(hi, spec, scale)})"


def ttt_cell(times, budget):
    """``median (low-high)`` of the times to the target, a miss (``None``) counting as more than the
    budget: printed ``>B``, in the median too (a median over misses is a miss).

    ``budget``: one for every time, or a list of each time's own (``bench --cap``); a miss then
    prints the least budget among the misses (the median, the low end), or the most (the high end).

    Example:
        >>> ttt_cell([2.0, None, 4.0], 7), ttt_cell([2.0, None, None], 7), ttt_cell([None], 7)
        ('4.0 (2.0->7) [2/3 reached]', '>7 (2.0->7) [1/3 reached]', '>7 [0/1 reached]')
        >>> ttt_cell([2.0, None, None], [9, 6, 12])
        '>6 (2.0->12) [1/3 reached]'
    """
    values = [math.inf if t is None else float(t) for t in times]
    if not values:
        return "-"
    budgets = list(budget) if isinstance(budget, (list, tuple)) else [budget] * len(values)
    missed = [b for t, b in zip(times, budgets) if t is None] or [budgets[0]]
    med, lo, hi = float(np.median(values)), min(values), max(values)
    fmt = lambda v, b: f">{b:g}" if math.isinf(v) else f"{v:.1f}"      # noqa: E731
    least, most = min(missed), max(missed)
    cell = fmt(med, least) if lo == hi else f"{fmt(med, least)} ({fmt(lo, least)}-{fmt(hi, most)})"
    reached = sum(t is not None for t in times)
    return cell + ("" if reached == len(times) else f" [{reached}/{len(times)} reached]")


def speedup_cell(pairs, budget):
    """The median over repeats of Synchronous's time to the target over the strategy's, from
    ``(sync's time, the strategy's time[, the strategy's budget])`` (``None``: missed within the budget;
    the strategy's own budget where ``bench --cap`` shortened it). A miss counts as
    the budget: where Synchronous missed, the ratio is a lower bound, where the strategy missed, an upper
    bound (where both missed, the repeat says nothing). The median is marked ``>=`` (``<=``) when lower
    (upper) bounds entered it, ``~`` when both did.

    Example:
        >>> speedup_cell([(4.0, 1.0), (None, 2.0), (6.0, 2.0)], 8)
        '>=4.00x (3.00-4.00)'
        >>> speedup_cell([(4.0, 1.0), (4.0, 2.0)], 8), speedup_cell([(None, None)], 8)
        ('3.00x (2.00-4.00)', '-')
        >>> speedup_cell([(4.0, None, 12.0)], 100)
        '<=0.33x'
    """
    ratios, kinds = [], set()
    for base, t, *own in pairs:
        if base is None and t is None:
            continue
        if base is None:
            kinds.add(">=")
        elif t is None:
            kinds.add("<=")
        ratios.append((budget if base is None else base) / ((own[0] if own else budget) if t is None else t))
    mark = "~" if len(kinds) == 2 else "".join(kinds)
    cell = _cell(ratios, ".2f", unit="x")
    return cell if cell == "-" else mark + cell


def equal_steps(group, curves):
    """The most local steps of rank 0 every finished job of the group reached (the "at equal steps" column)."""
    ends = [curves[e["id"]][-1]["step"] for entries in group.values() for e in entries if curves.get(e["id"])]
    return min(ends) if ends else None


def rows(group, curves=None, budget=None):
    """The table rows of one group (see the module's docstring): a list of lists of strings.
    ``curves``: job id -> its curve points (for the quality at equal steps); ``budget``: the seconds per
    job (a miss of the target counts as more than that). Speedups and ratios are against the group's
    Synchronous jobs of the same repeat (``-`` without them). Columns from the telemetry read ``n/a``
    for jobs that wrote none."""
    curves = curves or {}
    budget = math.inf if budget is None else budget
    steps = equal_steps(group, curves)
    base = {e["repeat"]: e["summary"] for e in group.get(STRATEGIES["sync"][0], [])}
    out = []
    for label, entries in group.items():
        s = [e["summary"] for e in entries]
        if not s:
            out.append([label] + ["not finished"] + ["-"] * (len(COLUMNS) - 2))
            continue
        pairs, sps_ratio = [], []
        for e in entries:
            b = base.get(e["repeat"])
            if b is not None:
                sps_ratio.append(e["summary"]["samples_per_s"] / b["samples_per_s"])
                if e["summary"]["target"] is not None:
                    pairs.append((b["time_to_target_s"], e["summary"]["time_to_target_s"],
                                  e["summary"].get("budget_s", budget)))
        ratios = [x["compute_ratio"] for x in s if x["compute_ratio"] is not None]
        per_worker = "/".join(f"{np.median(col):.2f}" for col in zip(*ratios)) if ratios else "n/a"
        metric = TASKS[entries[0]["task"]].metric
        at_steps = [quality_at(curves.get(e["id"]), metric, steps) for e in entries] if steps else []
        ttt = ("-" if all(x["target"] is None for x in s)
               else ttt_cell([x["time_to_target_s"] for x in s if x["target"] is not None],
                             [x.get("budget_s", budget) for x in s if x["target"] is not None]))
        out.append([label, ttt, speedup_cell(pairs, budget),
                    _cell([x["final"] for x in s], ".3f"), _cell([x.get("slow_final") for x in s], ".3f"),
                    _cell(at_steps, ".3f"),
                    _cell([x["samples_per_s"] for x in s], ".0f"),
                    _cell(sps_ratio, ".2f", unit="x"),
                    _cell([x["predicted_samples_per_s"] for x in s], ".0f", missing="n/a"),
                    _cell([x["share_of_bound"] for x in s], ".2f", missing="n/a"),
                    _cell([x["bytes_per_s"] for x in s], ".2f", 1e-6, missing="n/a"), per_worker,
                    _cell([x["wait_per_round_s"] for x in s], ".1f", 1e3, missing="n/a")])
    return out


def group_title(key, results, group=None):
    """``torch, Fashion-MNIST CNN, split skew, profile 1,1,1,4 (target: ...)``; with the group's entries, a
    ``sync`` target shows the median of Synchronous's final quality, and the slowest worker's classes."""
    framework, task, split, profile = key
    target = results["settings"]["targets"][task]
    t = TASKS[task]
    summaries = [e["summary"] for entries in (group or {}).values() for e in entries]
    if target == "sync":
        reached = [x["target"] for x in summaries if x["target"] is not None]
        aim = (f"Synchronous's final {t.metric}" +
               (f", median {np.median(reached):.3f}" if reached else "") + ", per repeat")
    else:
        aim = f"{t.metric} {target:g}"
    slow = sorted({c for x in summaries for c in (x.get("slow_classes") or [])})
    slowest = f"; slowest worker's classes {', '.join(map(str, slow))}" if slow else ""
    return f"{framework}, {t.description}, split {split}, profile {profile} (target {aim}{slowest})"


def load_curves(directory, results):
    """Job id -> its curve points, for every finished job."""
    return {e["id"]: read_curve(pathlib.Path(directory) / "jobs" / e["id"] / "curve.jsonl")
            for e in results["jobs"] if e["status"] == "done"}


def markdown(results, curves=None):
    """Every group's table, in Markdown, and the jobs that did not finish."""
    s = results["settings"]
    budget = f"budget {s['budget']:g} s per job"
    if s.get("cap") is not None:
        budget += f", each strategy's at most {s['cap']:g}x Synchronous's time to the target"
    if s.get("stop_at_target"):
        budget += ", every job stopped at the target"
    lines = [f"{s['np']} workers, base step {s['base_step'] * 1000:g} ms, {budget}; "
             f"medians over repeats (range in brackets)", ""]
    for key, group in groups(results).items():
        steps = equal_steps(group, curves or {})
        lines += [f"### {group_title(key, results, group)}", ""]
        if steps:
            lines += [f"At equal steps: the quality at rank 0's local step {steps} (the most every job reached).", ""]
        lines += ["| " + " | ".join(COLUMNS) + " |", "| --- |" + " ---: |" * (len(COLUMNS) - 1)]
        lines += ["| " + " | ".join(r) + " |" for r in rows(group, curves, s["budget"])]
        lines.append("")
    missing = unfinished(results)
    if missing:
        lines.append(f"Not finished ({len(missing)} of {len(results['jobs'])} jobs): "
                     + ", ".join(f"{i} ({status})" for i, status in missing))
    return "\n".join(lines)


# -- plots --

def _colors(labels):
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(labels)}


def _grid(n, plt, width=5.2, height=3.6):
    cols = min(n, 2)
    rows_ = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows_, cols, figsize=(width * cols, height * rows_), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def median_curve(curves, metric, key):
    """``(grid, median)``: the median over ``curves`` of their quality at each grid point of ``key``
    (each curve holding its last value; a grid up to the shortest curve's end).

    Example:
        >>> a = [{"t": 0.0, "accuracy": 0.2}, {"t": 1.0, "accuracy": 0.6}]
        >>> b = [{"t": 0.0, "accuracy": 0.4}, {"t": 2.0, "accuracy": 1.0}]
        >>> grid, med = median_curve([a, b], "accuracy", "t")
        >>> float(grid[-1]), float(med[0]), float(med[-1])
        (1.0, 0.30000000000000004, 0.5)
    """
    end = min(c[-1][key] for c in curves)
    grid = np.linspace(min(c[0][key] for c in curves), end, 200)
    values = []
    for c in curves:
        xs = np.array([p[key] for p in c], dtype=float)
        idx = np.clip(np.searchsorted(xs, grid, side="right") - 1, 0, len(c) - 1)
        values.append(np.array([c[i][metric] for i in idx]))
    return grid, np.median(values, axis=0)


def group_target(results, gkey, group):
    """The group's target for the plots: the setting, or for ``sync`` the median of the jobs' targets
    (``None`` if none is known)."""
    target = results["settings"]["targets"][gkey[1]]
    if target != "sync":
        return target
    reached = [e["summary"]["target"] for entries in group.values() for e in entries
               if e["summary"]["target"] is not None]
    return float(np.median(reached)) if reached else None


def y_limits(target, ends, higher_is_better, metric="accuracy"):
    """The quality axis of the curve plots: around the target, widened so that every curve's last point
    (``ends``) shows (a non-iid run ending well below the target is not clipped). Bits per character:
    from just below the best end to well above the target (the curves start near 6).

    Example:
        >>> y_limits(0.95, [0.97, 0.62], True), y_limits(0.95, [0.97], True)
        ((0.57, 1.0), (0.8, 1.0))
        >>> y_limits(0.05, [0.01, 0.5], False), y_limits(3.4, [2.9, 3.4], False, "bpc")
        ((0.0, 0.55), (2.7, 4.4))
    """
    if target is None:
        target = (min(ends) if higher_is_better else max(ends)) if ends else (1.0 if higher_is_better else 0.2)
    if metric == "bpc":
        return round(max(0.0, min(ends + [target]) - 0.2), 6), round(max(ends + [target]) + 1.0, 6)
    if higher_is_better:
        return round(max(0.0, min([target - 0.15] + [v - 0.05 for v in ends])), 6), 1.0
    return 0.0, round(max([0.2, 4 * target] + [v + 0.05 for v in ends]), 6)


def switch_points(job_dir, curve, key):
    """``[(x, strategy)]``: where on ``curve`` (its ``key``: ``t`` or ``step``) rank 0's telemetry says ``hh.Auto``
    switched to ``strategy`` (the curve's time at the switch's step, interpolated); empty for a job without."""
    from horovod_hetero.runtime.telemetry import load, switches

    by_rank = load(pathlib.Path(job_dir) / "telemetry") if (pathlib.Path(job_dir) / "telemetry").is_dir() else {}
    found = switches(by_rank.get(0, []))
    if not found or not curve:
        return []
    steps, xs = [p["step"] for p in curve], [p[key] for p in curve]
    return [(float(np.interp(s.get("step", 0), steps, xs)), str(s.get("to"))) for s in found]


def _curves(directory, results, key, path, xlabel, title):
    import matplotlib.pyplot as plt

    gs = groups(results)
    fig, axes = _grid(len(gs), plt, width=6.6)
    for ax, (gkey, group) in zip(axes, gs.items()):
        colors = _colors(list(group))
        task = TASKS[gkey[1]]
        ends = []
        for label, entries in group.items():
            curves = [c for c in (read_curve(pathlib.Path(directory) / "jobs" / e["id"] / "curve.jsonl")
                                  for e in entries) if c]
            ends += [c[-1][task.metric] for c in curves]
            for c in curves:
                ax.plot([p[key] for p in c], [p[task.metric] for p in c], color=colors[label], alpha=0.25, lw=0.8)
            for entry, c in zip(entries, curves):           # hh.Auto: the strategy it ran, over time
                for at, to in switch_points(pathlib.Path(directory) / "jobs" / entry["id"], c, key):
                    ax.axvline(at, color=colors[label], ls=":", lw=0.8, alpha=0.6)
                    ax.annotate(to, (at, ax.get_ylim()[0]), rotation=90, fontsize=6, color=colors[label],
                                xytext=(2, 4), textcoords="offset points", va="bottom")
            if curves:
                grid, med = median_curve(curves, task.metric, key)
                ax.plot(grid, med, color=colors[label], lw=1.8, label=label)
        target = group_target(results, gkey, group)
        if target is not None:
            ax.axhline(target, color="grey", ls="--", lw=0.8, label="target")
        ax.set_ylim(*y_limits(target, ends, task.higher_is_better, task.metric))
        ax.set_title(", ".join(gkey), fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"test {task.metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _bars(results, path):
    import matplotlib.pyplot as plt

    gs = groups(results)
    fig, axes = plt.subplots(len(gs), 2, figsize=(11, 3.2 * len(gs)), squeeze=False)
    for (a, b), (gkey, group) in zip(axes, gs.items()):
        labels = [label for label, entries in group.items() if entries]
        x = np.arange(len(labels))
        for ax, field, scale, ylabel in ((a, "samples_per_s", 1.0, "samples/s"), (b, "bytes_per_s", 1e-6, "MB/s sent")):
            meds: list[float] = []
            errs: list[list[float]] = [[], []]
            for i, label in enumerate(labels):
                med, lo, hi = median_range([e["summary"][field] for e in group[label]])
                if med is None:       # not measured (no telemetry): no bar, "n/a"
                    ax.text(i, 0.02, "n/a", ha="center", va="bottom", fontsize=9, transform=ax.get_xaxis_transform())
                    med = lo = hi = float("nan")
                meds.append(med * scale)
                errs[0].append((med - lo) * scale)
                errs[1].append((hi - med) * scale)
            ax.bar(x, meds, yerr=errs, capsize=3, color=[_colors(list(group))[lab] for lab in labels])
            if field == "samples_per_s":
                bounds = [median_range([e["summary"]["bound_samples_per_s"] for e in group[lab]])[0] for lab in labels]
                ax.scatter([i for i, v in zip(x, bounds) if v], [v for v in bounds if v], marker="_", s=300,
                           color="black", label="bound (free communication)", zorder=3)
                if any(bounds):
                    ax.legend(fontsize=7, loc="upper left")
                ax.set_ylim(0, 1.3 * np.nanmax([v for v in bounds if v] + [m + e for m, e in zip(meds, errs[1])]))
            ax.set_xticks(x, labels, rotation=25, ha="right", fontsize=8)
            ax.set_xlim(-0.6, len(labels) - 0.4)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{', '.join(gkey)}: {ylabel}", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
    fig.suptitle("throughput and traffic (ESync Fig. 4); medians, bars: range over repeats", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _compute_ratio(results, path):
    import matplotlib.pyplot as plt

    gs = groups(results)
    fig, axes = _grid(len(gs), plt)
    for ax, (gkey, group) in zip(axes, gs.items()):
        measured = {lab: [e["summary"]["compute_ratio"] for e in es if e["summary"]["compute_ratio"]]
                    for lab, es in group.items()}
        labels = [lab for lab in group if measured[lab]]
        if not labels:
            ax.set_visible(False)
            continue
        n = max(len(r) for lab in labels for r in measured[lab])
        width = 0.8 / n
        for w in range(n):
            vals = [float(np.median([r[w] for r in measured[lab] if w < len(r)])) for lab in labels]
            ax.bar(np.arange(len(labels)) + (w - (n - 1) / 2) * width, vals, width, label=f"worker {w}")
        ax.set_xticks(np.arange(len(labels)), labels, rotation=25, ha="right", fontsize=8)
        ax.set_ylim(0, 1.25)
        ax.set_yticks(np.arange(0, 1.01, 0.2))
        ax.set_ylabel("compute / wall")
        ax.set_title(", ".join(gkey), fontsize=10)
        ax.legend(fontsize=7, ncol=n, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("compute-time ratio per worker (ESync Fig. 5), medians over repeats", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def slow_points(curve, slow):
    """The curve's points as ``{"t", "step", "slow"}``: the mean accuracy on the classes ``slow``."""
    return [{"t": p["t"], "step": p["step"], "slow": float(np.mean([p["classes"][c] for c in slow]))}
            for p in curve if p.get("classes")]


def _slow_classes(directory, results, path):
    """The accuracy on the slowest worker's classes against wall time, per group that has them; ``False``
    if no group has."""
    import matplotlib.pyplot as plt

    gs = {k: g for k, g in groups(results).items()
          if any(e["summary"].get("slow_classes") for entries in g.values() for e in entries)}
    if not gs:
        return False
    fig, axes = _grid(len(gs), plt, width=6.6)
    for ax, (gkey, group) in zip(axes, gs.items()):
        colors = _colors(list(group))
        for label, entries in group.items():
            curves = [slow_points(read_curve(pathlib.Path(directory) / "jobs" / e["id"] / "curve.jsonl"),
                                  e["summary"]["slow_classes"]) for e in entries if e["summary"].get("slow_classes")]
            curves = [c for c in curves if c]
            for c in curves:
                ax.plot([p["t"] for p in c], [p["slow"] for p in c], color=colors[label], alpha=0.25, lw=0.8)
            if curves:
                grid, med = median_curve(curves, "slow", "t")
                ax.plot(grid, med, color=colors[label], lw=1.8, label=label)
        ax.set_ylim(0.0, 1.0)
        ax.set_title(", ".join(gkey), fontsize=10)
        ax.set_xlabel("seconds of training")
        ax.set_ylabel("accuracy on the slowest worker's classes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("accuracy on the slowest worker's classes (where plain averaging's bias shows)",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return True


def plots(directory, results, out=None, prefix="bench-"):
    """Draw the figures into ``out`` (default: ``directory``); return their paths."""
    import matplotlib

    matplotlib.use("Agg")
    out = pathlib.Path(out or directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{prefix}{name}.png" for name in ("accuracy-time", "throughput", "compute-ratio", "accuracy-steps")]
    if not any(groups(results)[k][lab] for k in groups(results) for lab in groups(results)[k]):
        return []
    _curves(directory, results, "t", paths[0], "seconds of training",
            "test quality vs wall time (ESync Fig. 3): median over repeats, each repeat faint")
    _bars(results, paths[1])
    _compute_ratio(results, paths[2])
    _curves(directory, results, "step", paths[3], "rank 0's local steps",
            "test quality vs steps (WAGMA's ablation): median over repeats, each repeat faint")
    slow = out / f"{prefix}slow-classes.png"
    if _slow_classes(directory, results, slow):
        paths.append(slow)
    return paths


def html_page(results, table_md, pngs):
    """One self-contained HTML page: the tables and the plots (embedded)."""
    body = [f"<h1>horovod-hetero bench</h1><p>{html.escape(shlex.join(results['command']))}</p>",
            f"<p>{html.escape(json.dumps(results['versions']))}</p>"]
    in_table = False
    for line in table_md.splitlines():
        if line.startswith("| ---"):
            continue
        if line.startswith("|"):
            cells = [html.escape(c.strip()) for c in line.strip("|").split("|")]
            tag = "th" if not in_table else "td"
            body.append(("<table border=1 cellspacing=0 cellpadding=3>" if not in_table else "")
                        + "<tr>" + "".join(f"<{tag}>{c}</{tag}>" for c in cells) + "</tr>")
            in_table = True
            continue
        if in_table:
            body.append("</table>")
            in_table = False
        if line.startswith("### "):
            body.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line:
            body.append(f"<p>{html.escape(line)}</p>")
    if in_table:
        body.append("</table>")
    for p in pngs:
        data = base64.b64encode(pathlib.Path(p).read_bytes()).decode()
        body.append(f'<p><img src="data:image/png;base64,{data}" alt="{html.escape(pathlib.Path(p).name)}"></p>')
    return "<!doctype html><html><head><meta charset='utf-8'><title>horovod-hetero bench</title></head><body>" \
           + "\n".join(body) + "</body></html>"
