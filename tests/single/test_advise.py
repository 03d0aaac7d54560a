"""horovod-hetero advise: the cluster read from telemetry, the strategies ranked by the simulator."""
import json

import numpy as np
import pytest
from click.testing import CliRunner

from horovod_hetero import advise
from horovod_hetero.cli import cli
from horovod_hetero.simulate import Cluster
from horovod_hetero.strategies.registry import configured


def records(step_s, steps=60, comm=(0.01, 0.03), ring_bytes=1_500_000, samples=32, delayed=None):
    """``{rank: [record]}``: rank r steps ``step_s[r]`` (times 4 where ``delayed(step)`` names r); rank 0
    spends ``comm[0]`` in each step's collective and the others ``comm[1]``."""
    out = {}
    for r, t in enumerate(step_s):
        out[r] = [{"rank": r, "step": s, "compute_s": t * (4 if delayed and r in delayed(s) else 1),
                   "comm_s": comm[0] if r == 0 else comm[1], "bytes_sent": ring_bytes, "samples": samples}
                  for s in range(1, steps + 1)]
    return out


def test_persistent_stragglers_their_ratio_and_the_collectives_cost():
    m = advise.measure(records([0.1, 0.1, 0.1, 0.4]))
    assert (m.kind, m.slow_ranks, m.transient_share) == ("persistent", [3], 0.0)
    assert np.allclose(m.step_s, [0.1, 0.1, 0.1, 0.4]) and m.steps == 60 - advise.SKIP_STEPS
    assert (m.comm_s, m.model_bytes, m.samples_per_step) == (0.01, 1_000_000.0, 32.0)   # least wait; ring * 4 / 6
    assert all(np.allclose(f, 1.0) for f in m.factors)


def test_transient_stragglers_are_not_called_slow_and_even_ranks_are_even():
    m = advise.measure(records([0.1] * 4, delayed=lambda s: {s % 4, (s + 1) % 4}))   # 2 of 4 each step, 4x
    assert (m.kind, m.slow_ranks, m.transient_share) == ("transient", [], 0.5)
    assert np.allclose(m.step_s, 0.1) and sorted(set(np.round(m.factors[0], 6))) == [1.0, 4.0]
    assert advise.measure(records([0.1, 0.12, 0.1, 0.11])).kind == "even"
    both = advise.measure(records([0.1, 0.1, 0.1, 0.4], delayed=lambda s: {s % 4, (s + 1) % 4}))
    assert (both.kind, both.slow_ranks) == ("both", [3])


def test_a_balanced_runs_steps_count_at_the_typical_batch():
    recs = records([0.1] * 4)
    for r, batch in enumerate([48, 48, 16, 16]):          # time proportional to the batch: equal speeds per sample
        for x in recs[r]:
            x["samples"], x["compute_s"] = batch, 0.1 * batch / 32
    m = advise.measure(recs)
    assert m.samples_per_step == 32.0 and np.allclose(m.step_s, 0.1) and m.kind == "even"


def test_too_little_telemetry_fails_naming_what_is_needed():
    with pytest.raises(ValueError, match=r"at least 10 steps after the first 5; got ranks \[0, 1\] with \[4, 4\]"):
        advise.measure(records([0.1, 0.1], steps=9))
    with pytest.raises(ValueError, match=r"ranks 0..P-1 \(P >= 2\).*got ranks \[0\]"):
        advise.measure(records([0.1]))
    with pytest.raises(ValueError, match=r"got ranks \[0, 2\]"):
        advise.measure({k: v for k, v in records([0.1] * 3).items() if k != 1})


def test_prediction_ranks_by_samples_per_s_and_the_baseline_is_synchronous():
    m = advise.measure(records([0.1, 0.1, 0.1, 0.4]))
    results = advise.predict(m, {n: configured(n) for n in ("sync", "localsgd", "elasticbsp", "balanced")})
    rates = {name: r.samples_per_s for name, r in results}
    assert [name for name, _ in results][-1] == "sync"
    assert [r.samples_per_s for _, r in results] == sorted(rates.values(), reverse=True)
    sync_step = 0.4 + 0.01                          # the slowest step, then the collective
    assert rates["sync"] == pytest.approx(4 * 32 / sync_step, rel=0.02)
    assert rates["elasticbsp"] > 2.5 * rates["sync"] and rates["balanced"] > 2.0 * rates["sync"]
    text = advise.format_advice(m, results)
    assert "persistent stragglers (rank 3 4.0x the fastest)" in text and " 1.00x " in text
    assert text.splitlines()[-3].startswith(" 4 Synchronous")


def test_cluster_draws_each_workers_steps_from_its_measured_factors():
    c = Cluster([0.1, 0.2], step_factors=[[1.0, 3.0], [1.0]], seed=1)
    first = {round(c.draw_one(0.0, 0), 9) for _ in range(200)}
    assert first == {0.1, 0.3} and {round(c.draw_one(0.0, 1), 9) for _ in range(20)} == {0.2}
    assert set(np.round(c.draw(0.0, 50)[0], 9)) == {0.1, 0.3}
    with pytest.raises(ValueError, match="step_factors must give every worker"):
        Cluster([0.1, 0.2], step_factors=[[1.0]])
    with pytest.raises(ValueError, match="jitter or step_factors"):
        Cluster([0.1], jitter=0.1, step_factors=[[1.0]])


def test_the_command_reads_a_run_or_a_bench_jobs_directory(tmp_path):
    job = tmp_path / "job"
    (job / "telemetry").mkdir(parents=True)
    for r, recs in records([0.05, 0.05, 0.05, 0.2]).items():
        (job / "telemetry" / f"rank{r}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    runner = CliRunner()
    out = runner.invoke(cli, ["advise", str(job), "--strategy", "sync,esync,balanced"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0] == "4 ranks, 55 steps each measured, 32 samples a step"
    assert lines[1] == "typical step (ms): 50.0 50.0 50.0 200.0"
    assert sum(line[3:].startswith(("Synchronous", "ESync", "Balanced")) for line in lines) == 3
    assert lines[-2].startswith("hh.Auto, started as Synchronous on this cluster, would run elasticbsp: "), lines
    assert lines[-1] == ("  (it would measure elasticbsp for a few rounds and keep it where it ran 1.15x "
                         "Synchronous's samples/s, else go back to Synchronous)")
    bad = runner.invoke(cli, ["advise", str(job), "--strategy", "sync,fast"])
    assert bad.exit_code == 2 and "unknown fast; choose from all, sync" in bad.output
    empty = runner.invoke(cli, ["advise", str(tmp_path)])
    assert empty.exit_code == 1 and "no rank*.jsonl files" in empty.output


@pytest.mark.parametrize("rates, current, name, tied", [
    # more than 15 % over the one running; those within 25 % of the fastest tie, in PREFERENCE order
    ({"sync": 100.0, "esync": 125.0, "dssp": 150.0, "adsp": 160.0, "localsgd": 110.0}, "sync", "dssp",
     ("dssp", "esync", "adsp")),
    ({"sync": 100.0, "localsgd": 120.0}, "sync", "localsgd", ("localsgd",)),     # 1.2x: a switch
    ({"sync": 100.0, "localsgd": 114.0}, "sync", "sync", ()),                    # 1.14x: none
    ({"sync": 100.0, "esync": 110.0, "adsp": 130.0}, "sync", "adsp", ("adsp",)),  # ESync is tied, but not 1.15x
    ({"sync": 300.0, "esync": 320.0, "dssp": 330.0}, "esync", "esync", ()),      # the one running: no gain
])
def test_choose_moves_for_15_percent_and_ties_the_candidates_within_25_percent_of_the_fastest(
        monkeypatch, rates, current, name, tied):
    from types import SimpleNamespace
    monkeypatch.setattr(advise, "predict", lambda *args, **kwargs: [(n, SimpleNamespace(samples_per_s=r))
                                                                     for n, r in rates.items()])
    choice = advise.choose(advise.measure(records([0.1, 0.1, 0.1, 0.4])), {n: configured(n) for n in rates}, current)
    assert (choice.name, choice.tied) == (name, tied), choice.reason
    assert choice.switches == (name != current)
