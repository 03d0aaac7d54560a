"""Per-step telemetry: one JSON-lines file per rank, and a summary across ranks.

Each record is one local optimizer step: ``step``, ``local_steps`` (steps since the last
synchronisation, counted at this step), ``compute_s`` (time outside collectives since the
previous step, simulated slowdown included), ``comm_s`` (time blocked in collectives),
``bytes_sent`` (ring-allreduce estimate, 2(n-1)/n of the payload), ``synced``, and whatever
the user annotated (``loss``, ``samples``). Enable with ``HOROVOD_HETERO_TELEMETRY=dir`` or
the ``telemetry=`` argument of the wrapper/callback.
"""
from __future__ import annotations

import glob
import json
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from horovod_hetero.validation import check_directory, check_int

ENV = "HOROVOD_HETERO_TELEMETRY"


def telemetry_directory(directory: object = None, name: str = "telemetry") -> str | None:
    """The directory step records go to: ``directory``, or for ``None`` ``$HOROVOD_HETERO_TELEMETRY``;
    ``None`` when both are unset (records kept in memory). Checked, nothing created: a ``TypeError``/
    ``ValueError`` names ``name`` or the variable when it is not a path that can be created and written to.

    Example:
        >>> telemetry_directory(5)
        Traceback (most recent call last):
        ...
        TypeError: telemetry must be a directory (a str or os.PathLike) or None, got 5 (int)
    """
    if directory is None:
        return check_directory(ENV, os.environ.get(ENV) or None)
    return check_directory(name, directory)


class Telemetry:
    """Collects this rank's step records and writes them to ``<directory>/rank<r>.jsonl``.

    Args:
        rank: this rank (names the file), an int >= 0.
        directory: where to write (a str or ``os.PathLike``, created if missing); ``None`` reads
            ``HOROVOD_HETERO_TELEMETRY``; if both are unset (or ``""``) records are kept in memory
            only (``records``). A directory that cannot be created or written to is refused here,
            with a ``ValueError`` naming ``telemetry`` or the variable.
        keep: records kept in memory, an int >= 0 (the oldest are dropped).

    Example:
        >>> t = Telemetry(rank=0)
        >>> t.annotate(loss=0.5, samples=32)
        >>> t.record(step=1, local_steps=1, compute_s=0.01, comm_s=0.0, bytes_sent=0, synced=False)
        >>> t.records[0]["loss"]
        0.5
    """

    def __init__(self, rank: int, directory: str | os.PathLike[str] | None = None, keep: int = 1000) -> None:
        self.rank = check_int("rank", rank, 0)
        name = "telemetry" if directory is not None else ENV
        self.directory = telemetry_directory(directory)
        self.records: list[dict[str, Any]] = []
        self._keep = check_int("keep", keep, 0)
        self._pending: dict[str, Any] = {}
        self._file: TextIO | None = None
        if self.directory:
            path = os.path.join(self.directory, f"rank{self.rank}.jsonl")
            try:
                os.makedirs(self.directory, exist_ok=True)
                self._file = open(path, "a", buffering=1)
            except OSError as e:
                raise ValueError(f"{name} must be a directory that can be created and written to; "
                                 f"{path!r}: {e.strerror or e}") from e

    def annotate(self, **fields: Any) -> None:
        """Attach fields (e.g. ``loss=``, ``samples=``) to the next step record."""
        self._pending.update(fields)

    @property
    def pending(self) -> dict[str, Any]:
        """The annotations the next record will carry (``loss`` and ``samples`` also reach the
        strategy's step report and the round's statistics)."""
        return self._pending

    def record(self, **fields: Any) -> None:
        rec = dict(rank=self.rank, time=time.time(), **fields, **self._pending)
        self._pending = {}
        self.records.append(rec)
        if len(self.records) > self._keep:
            del self.records[: len(self.records) - self._keep]
        if self._file is not None:
            self._file.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def load(directory: str | os.PathLike[str]) -> dict[int, list[dict[str, Any]]]:
    """Read every rank's records from a telemetry directory: ``{rank: [record, ...]}``."""
    by_rank = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank*.jsonl"))):
        with open(path) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        if recs:
            by_rank[recs[0]["rank"]] = recs
    return by_rank


def summarize(by_rank: Mapping[int, Sequence[Mapping[str, Any]]]) -> dict[int, dict[str, Any]]:
    """Per-rank figures from step records.

    Returns ``{rank: {...}}`` with ``steps``, ``syncs``, ``samples``, ``wall_s`` (compute +
    communication), ``samples_per_s``, ``compute_ratio`` (compute / wall), ``wait_share``
    (communication / wall), ``mean_local_steps`` (local steps per synchronisation),
    ``bytes_sent``, ``last_loss`` and ``median_rtt_s`` (state-server round trip, ESync).
    """
    out: dict[int, dict[str, Any]] = {}
    for rank, recs in sorted(by_rank.items()):
        compute = sum(r.get("compute_s", 0.0) for r in recs)
        comm = sum(r.get("comm_s", 0.0) for r in recs)
        wall = compute + comm
        samples = sum(r.get("samples", 0) for r in recs)
        syncs = sum(1 for r in recs if r.get("synced"))
        losses = [r["loss"] for r in recs if "loss" in r]
        rtts = [r["rtt_s"] for r in recs if r.get("rtt_s") is not None]
        out[rank] = {
            "steps": len(recs),
            "syncs": syncs,
            "samples": samples,
            "wall_s": wall,
            "samples_per_s": samples / wall if wall > 0 else 0.0,
            "compute_ratio": compute / wall if wall > 0 else 0.0,
            "wait_share": comm / wall if wall > 0 else 0.0,
            "mean_local_steps": len(recs) / syncs if syncs else float(len(recs)),
            "bytes_sent": sum(r.get("bytes_sent", 0) for r in recs),
            "last_loss": losses[-1] if losses else None,
            "median_rtt_s": statistics.median_high(rtts) if rtts else None,
        }
    return out


def rounds_of(by_rank: Mapping[int, Sequence[Mapping[str, Any]]],
              every_step: bool = False) -> list[dict[int, float]]:
    """``{key: {rank: comm_s}}`` of the collective events every rank took part in: global rounds
    (records with ``round``), or, with no round at all or ``every_step`` (gradients averaged every step;
    ``Balanced``'s statistics rounds are not the cost), every step."""
    events: dict[Any, dict[int, float]] = {}
    with_rounds = not every_step and any("round" in r for recs in by_rank.values() for r in recs)
    for rank, recs in by_rank.items():
        for r in recs:
            if with_rounds and "round" in r:
                events.setdefault(r["round"], {})[rank] = r["comm_s"]
            elif not with_rounds and r.get("bytes_sent", 0) > 0:
                events.setdefault(r["step"], {})[rank] = r["comm_s"]
    full = [v for v in events.values() if len(v) == len(by_rank)]
    return full[1:]                  # the first waits for every process to start


def round_cost_and_wait(by_rank: Mapping[int, Sequence[Mapping[str, Any]]],
                        every_step: bool = False) -> tuple[float | None, float | None]:
    """``(cost, wait)``: the mean seconds of one global round for the rank that arrived last (it
    waits for nobody: pure communication), and every rank's mean time waiting for others in a round
    (its time in the round minus that).

    Example:
        >>> recs = {0: [{"round": i, "comm_s": 0.3} for i in range(3)], 1: [{"round": i, "comm_s": 0.1} for i in range(3)]}
        >>> [round(v, 3) for v in round_cost_and_wait(recs)]
        [0.1, 0.1]
    """
    full = rounds_of(by_rank, every_step)
    if not full:
        return None, None
    cost = statistics.fmean(min(v.values()) for v in full)
    waits = [c - min(v.values()) for v in full for c in v.values()]
    return cost, statistics.fmean(waits)


def switches(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The strategy switches a rank's records report (``hh.Auto``'s ``switch`` field), in order.

    Example:
        >>> recs = [{"step": 1, "auto": "sync"}, {"step": 20, "auto": "sync", "switch": {"from": "sync", "to": "esync",
        ...         "round": 4, "step": 20, "why": "esync is predicted 3.25x sync's samples/s"}}]
        >>> format_switches(switches(recs))
        "step 20 (round 4): sync -> esync: esync is predicted 3.25x sync's samples/s"
    """
    return [dict(r["switch"]) for r in records if isinstance(r.get("switch"), Mapping)]


def format_switches(found: Sequence[Mapping[str, Any]]) -> str:
    """One line per switch (``switches``)."""
    return "\n".join(f"step {s.get('step')} (round {s.get('round')}): {s.get('from')} -> {s.get('to')}: {s.get('why')}"
                     for s in found)


def format_summary(summary: Mapping[int, Mapping[str, Any]]) -> str:
    """The summary as a text table, one row per rank."""
    head = (f"{'rank':>4} {'steps':>6} {'syncs':>6} {'samples/s':>10} {'compute':>8} {'wait':>6} {'MB sent':>8}"
            f" {'RTT ms':>7}")
    rows = [head]
    for rank, s in summary.items():
        rtt = f"{s['median_rtt_s'] * 1000:.2f}" if s["median_rtt_s"] is not None else "-"
        rows.append(f"{rank:>4} {s['steps']:>6} {s['syncs']:>6} {s['samples_per_s']:>10.1f} "
                    f"{s['compute_ratio']:>8.2f} {s['wait_share']:>6.2f} {s['bytes_sent'] / 1e6:>8.2f} {rtt:>7}")
    return "\n".join(rows)
