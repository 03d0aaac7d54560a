"""``hh.Auto``: starts as Synchronous, measures from the rounds, switches at a round by the shared decision
(``advise.choose``), guards with the training loss; all in the simulator (the library's own objects on a virtual
clock) and against injected rounds."""
import copy
import logging

import numpy as np
import pytest

from horovod_hetero import advise
from horovod_hetero import simulate as sim
from horovod_hetero.auto import BANNED_ROUNDS, CHANGE_STEPS, DEFAULT, HISTORY, STARTUP_ROUNDS, TRIED, Auto, undelayed
from horovod_hetero.runtime.runner import GradientRunner, ModelAveragingRunner, runner_for
from horovod_hetero.strategies.base import MEASURE_OVERLAPPED, Context, RoundResult, RoundStats, StepReport
from horovod_hetero.strategies.registry import configured, rebuild

CANDIDATES = ["sync", "esync", "elasticbsp", "dssp", "localsgd"]


def run(cluster, strategy, duration=30.0):
    cluster.rng, cluster._normals = np.random.default_rng(cluster.seed), []
    return sim.simulate(cluster, strategy, duration)


def test_a_persistent_straggler_is_left_behind_within_a_second_and_auto_runs_near_the_best():
    cluster = sim.Cluster([0.05, 0.05, 0.05, 0.2], seed=1)
    auto = Auto(candidates=CANDIDATES)
    result = run(cluster, auto)
    best = max(run(cluster, configured(name)).samples_per_s for name in CANDIDATES)
    assert result.samples_per_s >= 0.9 * best, (result.samples_per_s, best)
    assert result.samples_per_s >= 2.5 * run(cluster, configured("sync")).samples_per_s


def test_steady_equal_ranks_keep_synchronous_and_its_speed():
    cluster = sim.Cluster([0.05] * 4, seed=1)
    auto = Auto(candidates=CANDIDATES)
    result = run(cluster, auto)
    assert result.samples_per_s >= 0.95 * run(cluster, configured("sync")).samples_per_s


def test_a_straggler_that_appears_mid_run_is_answered_after_it_appears():
    cluster = sim.Cluster([0.05] * 4, change_at=10.0, change_factors=[1, 1, 1, 4], seed=1)
    result = run(cluster, Auto(candidates=CANDIDATES), duration=30.0)
    sync = run(cluster, configured("sync"), duration=30.0)
    esync = run(cluster, configured("esync"), duration=30.0)
    assert result.samples_per_s >= 1.5 * sync.samples_per_s and result.samples_per_s >= 0.8 * esync.samples_per_s


def test_random_stragglers_leave_synchronous_and_read_as_no_change(caplog):
    """Each step of each rank 4x with even odds (``bench --profile random``): a round may hold a single step, so
    a rank's shortest step of the latest round flips between 0.05 and 0.2 s; pooled over its newest
    ``CHANGE_STEPS`` steps it stays put: no change is read. Auto leaves Synchronous for ESync (predicted 1.5x),
    whose trial measures 1.04x Synchronous (under the 1.15x it asks): back, then once more on twelve rounds
    without ESync, LocalSGD (predicted 1.52x, measured 1.33x), kept at its own speed. (Before, it stayed on
    Synchronous after the trial.)"""
    cluster = sim.Cluster([0.05] * 4, step_factors=[[1.0, 4.0]] * 4, seed=0)
    caplog.set_level(logging.INFO, logger="horovod_hetero")
    result = run(cluster, Auto(), duration=60.0)
    switches = [m.split(":")[0].split() for m in caplog.messages if m.startswith("Auto switches")]
    assert [(s[3], s[5]) for s in switches] == [("sync", "esync"), ("esync", "sync"), ("sync", "localsgd")], switches
    assert result.samples_per_s >= 0.95 * run(cluster, configured("localsgd"), duration=60.0).samples_per_s
    assert result.samples_per_s >= 1.2 * run(cluster, configured("sync"), duration=60.0).samples_per_s
    assert not [m for m in caplog.messages if "decides again" in m]


def test_a_straggler_that_appears_during_a_trial_is_answered_after_it(caplog):
    """Equal ranks whose collective costs 2.4x a step: LocalSGD at the sixth step (predicted 2.26x Synchronous,
    over the 2x an even cluster asks), then ADSP (listed) tried; rank 3 slows 4x at 7 s, inside that trial. Its
    steps read after the trial are compared with those the decision measured, and the change is answered before
    the guard's settling rounds (the loss before the switch says nothing of the cluster now)."""
    cluster = sim.Cluster([0.05] * 4, change_at=7.0, change_factors=[1, 1, 1, 4], bandwidth=7e7, seed=0)
    caplog.set_level(logging.INFO, logger="horovod_hetero")
    result = run(cluster, Auto(candidates=[*DEFAULT, "adsp"], trial_candidates=2), duration=40.0)
    switches = [m.split(":")[0].split() for m in caplog.messages if m.startswith("Auto switches")]
    assert [(s[5], int(s[8])) for s in switches[:4]] == [("localsgd", 6), ("adsp", 16), ("localsgd", 26),
                                                         ("elasticbsp", 30)], switches   # 30: 2 start-up, 2 of 8 steps
    assert "Auto decides again: rank 3's undelayed step moved from 0.05 s to 0.2 s" in caplog.messages
    assert result.samples_per_s >= 1.5 * run(cluster, configured("localsgd"), duration=40.0).samples_per_s


def statistics(step_s, loss=np.nan, wall=1.0, steps=5, spread=0.0):
    """One round's statistics: every rank ``steps`` steps of ``step_s`` (a list, per rank) on average, their
    standard deviation ``spread`` times that, the shortest ``1 - spread`` times it."""
    step_s = np.asarray(step_s, dtype=float)
    n = step_s.size
    return RoundStats(np.full(n, steps), step_s, np.full(n, loss), np.full(n, 32 * steps), np.zeros(n, bool),
                      step_min=step_s * (1 - spread), step_mean=step_s, step_sq=step_s ** 2 * (1 + spread ** 2),
                      comm_s=np.full(n, 0.001), wall_s=np.full(n, wall))


def feed(auto, rounds, start=1):
    for i, stats in enumerate(rounds, start):
        auto.after_round(RoundResult(i, 1.0, float(stats.local_steps.size), 0, stats))


def rounds_of(auto, steps):
    """What ``auto`` answers over ``steps`` steps, a round run after each MEASURE (as the controller does)."""
    said = []
    for _ in range(steps):
        said.append(auto.after_step(StepReport(0.1)))
        if said[-1] is MEASURE_OVERLAPPED:
            auto.after_round(RoundResult(len(said), 1.0, 4.0, 0, None))
    return [str(d) for d in said]


def test_it_adds_rounds_of_statistics_while_synchronous_runs_and_decides_alike_on_every_rank():
    auto = Auto(candidates=CANDIDATES, measure_every=3)
    assert rounds_of(auto, 3) == ["MEASURE_OVERLAPPED"] * 3                   # every step until it has decided
    decided = copy.deepcopy(auto)
    feed(decided, [statistics([0.05] * 4) for _ in range(6)])       # equal ranks: it decides to stay, on 4 rounds
    assert decided.handover() is None and rounds_of(decided, 3) == ["MEASURE_OVERLAPPED"] * 3   # and decides again on HISTORY
    feed(decided, [statistics([0.05] * 4) for _ in range(HISTORY)], start=10)
    assert decided.handover() is None and rounds_of(decided, 6) == ["CONTINUE", "CONTINUE", "MEASURE_OVERLAPPED"] * 2
    assert type(runner_for(auto)) is GradientRunner and auto.runs is auto.current
    ranks = [copy.deepcopy(auto) for _ in range(4)]
    rounds = [statistics([0.05, 0.05, 0.05, 0.2], loss=2.0 - 0.1 * i) for i in range(6)]
    for rank in ranks:
        feed(rank, rounds)
    switched = [rank.handover() for rank in ranks]
    assert all(s is rank for s, rank in zip(switched, ranks))                 # itself, running another
    assert {rank.current_name for rank in ranks} == {"elasticbsp"} and all(r.switches == ranks[0].switches for r in ranks)
    assert type(runner_for(ranks[0])) is ModelAveragingRunner
    assert ranks[0].switches[0]["from"] == "sync" and "persistent" in ranks[0].switches[0]["why"]
    assert ranks[0].handover() is None                                        # once


def test_the_guard_goes_back_where_the_loss_falls_slower_and_bans_the_strategy_for_a_while():
    auto = Auto(candidates=CANDIDATES, guard=0.5, settle_rounds=3, trial_rounds=0)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=2.0 - 0.2 * i) for i in range(6)])
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=1.0 + 0.01 * i) for i in range(5)], start=7)   # no progress
    assert switched(auto) is auto and auto.current_name == "sync"
    assert auto.switches[-1]["to"] == "sync" and "the guard" in auto.switches[-1]["why"]
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=1.0 - 0.1 * i) for i in range(5)], start=12)
    assert auto.current_name == "sync" or auto.switches[-1]["to"] != "elasticbsp"   # banned for a while


@pytest.mark.parametrize("changed", [False, True])
def test_the_guard_does_not_judge_the_switch_that_answers_a_change(changed):
    """The loss falls fast on equal ranks, and on after rank 3 slows 4x; Auto reads the change and moves to
    ElasticBSP, whose loss then falls no more: the fall before was on another cluster or on the few rounds
    since the change, and the guard stays out. Where rank 3 was slow from the start, the same rounds make the
    guard go back to Synchronous."""
    auto = Auto(candidates=["sync", "elasticbsp"], trial_rounds=0, settle_rounds=5)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    first = [0.05, 0.05, 0.05, 0.2 if not changed else 0.05]
    feed(auto, [statistics(first, loss=3.0 - 0.1 * i, steps=4) for i in range(STARTUP_ROUNDS + HISTORY)])
    flat = [statistics([0.05, 0.05, 0.05, 0.2], loss=1.6 + 0.001 * (i % 2), steps=4) for i in range(9)]
    if changed:
        assert switched(auto) is None                                        # equal ranks: Synchronous stays
        slowed = [statistics([0.05, 0.05, 0.05, 0.2], loss=1.6 - 0.1 * i, steps=4) for i in range(9)]
        feed(auto, slowed, start=STARTUP_ROUNDS + HISTORY + 1)
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    assert ("rank 3's undelayed step moved" in auto.switches[-1]["why"]) == changed
    feed(auto, flat[:STARTUP_ROUNDS + 5], start=40)
    assert switched(auto) is (None if changed else auto)
    assert auto.current_name == ("elasticbsp" if changed else "sync"), auto.switches


@pytest.mark.parametrize("steps, after", [(8, 2), (1, 12), (12, 1), (5, 3)])
def test_a_rank_that_slows_is_answered_on_the_rounds_since_it_slowed(steps, after):
    """Rank 3 turns 4x slower. The change is read once its newest 12 steps are all slow, and the rounds whose
    every step of it was slow are kept and decided on at once. Rounds of 8 steps (a model-averaging
    strategy's): read and decided at the second, on 16 steps of each rank. Rounds of one step: at the 12th, on
    12 rounds (not ``min_rounds`` more). Rounds of 12 steps (Synchronous's rounds of statistics, by default):
    at the first, on its 12 steps. Rounds of 5: at the third, on 15."""
    auto = Auto(candidates=["sync", "elasticbsp"], trial_rounds=0)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, [statistics([0.05] * 4, steps=steps) for _ in range(STARTUP_ROUNDS + HISTORY)])
    assert switched(auto) is None and auto._final
    for i in range(1, 20):
        feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], steps=steps)], start=20 + i)
        if switched(auto) is not None:
            break
    assert (i, auto.current_name) == (after, "elasticbsp"), auto.switches


def test_a_rank_slowed_a_little_is_read_at_its_new_pace_once(caplog):
    """Rank 3 moves from 0.05 to 0.07 s a step (1.4x, more than ``CHANGE``): the rounds kept for the decision
    are those nearer its new step than its old one, so the decision reads 0.07 and the change is read once."""
    caplog.set_level(logging.INFO, logger="horovod_hetero")
    auto = Auto(candidates=["sync", "elasticbsp"], trial_rounds=0)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, [statistics([0.05] * 4) for _ in range(STARTUP_ROUNDS + HISTORY)])
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.07]) for _ in range(20)], start=20)
    assert len([m for m in caplog.messages if "decides again" in m]) == 1, caplog.messages
    assert auto._decided_at is not None and auto._decided_at[3] == pytest.approx(0.07)


def test_adsp_runs_only_where_listed():
    assert "adsp" not in Auto().candidates and "adsp" in Auto(candidates=["sync", "adsp"]).candidates


def paced(samples_per_s, n=1, steps=1):
    """``n`` rounds with a persistent straggler whose wall time makes the job run at ``samples_per_s``."""
    rounds = [statistics([0.05, 0.05, 0.05, 0.2], steps=steps) for _ in range(n)]
    for r in rounds:
        r.wall_s[:] = r.samples.sum() / samples_per_s
    return rounds


#: candidates that open no transport (a ``Context`` without any)
UNSERVED = ["sync", "elasticbsp", "dssp", "adsp", "localsgd"]


def switched(auto):
    """``auto.handover()``, and the strategy it then runs started as the controller starts it (rank 0 of 4)."""
    handed = auto.handover()
    if handed is not None:
        auto.start(Context(0, 4, None, None, lambda: 0.0))
    return handed


def test_a_decision_runs_the_two_first_of_its_tied_candidates_and_keeps_the_one_measured_fastest():
    """ElasticBSP, DSSP and ADSP are predicted within 25 % of each other: ElasticBSP runs ``trial_rounds`` rounds
    (after the start-up rounds), then DSSP, and Auto goes back to ElasticBSP, which ran more samples/s; ADSP is not
    run."""
    auto = Auto(candidates=UNSERVED, trial_rounds=3, trial_candidates=2)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))                              # Synchronous: 100 samples/s
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(330.0, 2), start=7)         # start-up rounds: not measured
    assert switched(auto) is None                                            # a round short of the trial
    feed(auto, paced(330.0), start=11)
    assert switched(auto) is auto and auto.current_name == "dssp"
    assert "sync 100, elasticbsp 330; tries dssp" in auto.switches[-1]["why"], auto.switches[-1]
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(300.0, 3), start=12)
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    last = auto.switches[-1]
    assert "elasticbsp 330, dssp 300; keeps the fastest" in last["why"] and last["gain"] == 3.3, last
    assert [s["to"] for s in auto.switches] == ["elasticbsp", "dssp", "elasticbsp"]


def test_by_default_a_trial_measures_the_candidate_chosen_alone_and_keeps_it(caplog):
    """ElasticBSP, DSSP and ADSP are predicted alike: by default only ElasticBSP, the one chosen, runs its
    ``trial_rounds`` rounds; measured 3.3x Synchronous's samples/s, it stays, and DSSP is never run."""
    caplog.set_level(logging.WARNING, logger="horovod_hetero")
    auto = Auto(candidates=UNSERVED, trial_rounds=3)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    assert switched(auto) is auto and auto.current_name == "elasticbsp" and auto._trial == ["elasticbsp"]
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(330.0, 3), start=7)
    assert switched(auto) is None and auto.current_name == "elasticbsp" and not auto._trial
    assert [s["to"] for s in auto.switches] == ["elasticbsp"]
    assert "Auto keeps elasticbsp (measured samples/s: sync 100, elasticbsp 330)" in caplog.messages


def test_a_trial_whose_candidates_ran_no_faster_goes_back_and_bans_them_for_a_while():
    """DSSP (a single candidate: still measured) runs 1.1x Synchronous's samples/s: Auto goes back, and deciding
    every round it does not run DSSP again until ``BANNED_ROUNDS`` rounds have passed."""
    auto = Auto(candidates=["sync", "dssp"], trial_rounds=3, recheck_rounds=1, max_switches=10)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    assert switched(auto) is auto and auto.current_name == "dssp"
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(110.0, 3), start=7)
    assert switched(auto) is auto and auto.current_name == "sync"
    back = auto.switches[-1]
    assert "sync 100, dssp 110; none ran 1.15x sync's" in back["why"] and back["gain"] == round(100 / 110, 3)
    feed(auto, paced(100.0, STARTUP_ROUNDS + 40), start=13)                  # banned: deciding, it stays
    assert switched(auto) is None and auto.current_name == "sync" and len(auto.switches) == 2
    feed(auto, paced(100.0, BANNED_ROUNDS), start=55)                        # the ban over: DSSP runs again
    assert switched(auto) is auto and auto.current_name == "dssp" and len(auto.switches) == 3


def test_after_a_trial_that_went_back_it_decides_once_more_on_twelve_rounds_without_what_it_tried():
    """Four one-step rounds read a persistent straggler (as ranks slow at random can): ElasticBSP, measured
    no faster, back to Synchronous. Auto then measures every step again and decides once more on ``HISTORY``
    rounds, ElasticBSP banned: DSSP (before, it stayed on Synchronous for the rest of the job)."""
    auto = Auto(candidates=["sync", "elasticbsp", "dssp"], trial_rounds=3)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(105.0, 3), start=5)
    assert switched(auto) is auto and auto.current_name == "sync"
    assert rounds_of(auto, 3) == ["MEASURE_OVERLAPPED"] * 3                              # every step, as after a start
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(100.0, HISTORY - 1), start=10)
    assert switched(auto) is None                                           # a round short of twelve
    feed(auto, paced(100.0), start=10 + STARTUP_ROUNDS + HISTORY - 1)
    assert switched(auto) is auto and auto.current_name == "dssp", auto.switches


@pytest.mark.parametrize("ebsp, dssp, kept", [
    (330.0, 420.0, "dssp"),          # faster beyond the TIE: the one running stays
    (330.0, 320.0, "elasticbsp"),    # alike: the first in the order, back to it
    (118.0, 113.0, "elasticbsp"),    # the one running did not pass Synchronous's 1.15x, the other did
    (110.0, 113.0, "sync"),          # neither passed it: back
])
def test_of_the_candidates_that_passed_the_first_in_the_order_of_those_measured_alike_is_kept(ebsp, dssp, kept):
    auto = Auto(candidates=UNSERVED, trial_rounds=3, trial_candidates=2)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    switched(auto)
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(ebsp, 3), start=7)
    assert switched(auto) is auto and auto.current_name == "dssp"
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(dssp, 3), start=12)
    switched(auto)
    assert auto.current_name == kept, auto.switches


def even(samples_per_s, n=1, comm_s=0.1):
    """``n`` rounds of equal ranks whose collectives cost ``comm_s`` (twice a step: LocalSGD and ADSP predicted
    alike, 2.5x Synchronous), the job running at ``samples_per_s``."""
    rounds = [statistics([0.05] * 4, steps=1) for _ in range(n)]
    for r in rounds:
        r.comm_s[:], r.wall_s[:] = comm_s, r.samples.sum() / samples_per_s
    return rounds


@pytest.mark.parametrize("adsp, kept", [(264.0, "localsgd"), (286.0, "adsp")])
def test_candidates_measured_within_the_tie_keep_the_one_the_order_prefers(adsp, kept):
    """LocalSGD (220 samples/s) and ADSP, tried in turn: ADSP measured 1.2x LocalSGD is alike (within
    ``advise.TIE``), and Auto goes back to LocalSGD, which the order prefers (its models stay closer); 1.3x
    is faster, and ADSP stays."""
    auto = Auto(candidates=["sync", "localsgd", "adsp"], trial_rounds=3, trial_candidates=2)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, even(100.0, STARTUP_ROUNDS + 4))
    assert switched(auto) is auto and auto.current_name == "localsgd" and auto._trial == ["localsgd", "adsp"]
    feed(auto, even(1e6, STARTUP_ROUNDS) + even(220.0, 3), start=7)
    assert switched(auto) is auto and auto.current_name == "adsp"
    feed(auto, even(1e6, STARTUP_ROUNDS) + even(adsp, 3), start=12)
    switched(auto)
    assert auto.current_name == kept, auto.switches
    assert len(auto.switches) == (3 if kept == "localsgd" else 2)


@pytest.mark.parametrize("comm_s, moves", [(0.05, False), (0.1, True)])
def test_on_equal_ranks_a_move_to_model_averaging_needs_twice_the_samples_per_second(comm_s, moves):
    """No straggler: LocalSGD's only gain is fewer collectives, each sample moving the averaged model less, and
    its samples count at ``advise.EVEN_WORTH``. A collective as costly as a step predicts it 1.8x Synchronous,
    and Auto stays (before, it moved); twice a step, 2.5x, and it moves."""
    auto = Auto(candidates=["sync", "localsgd"])
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, even(100.0, STARTUP_ROUNDS + 4, comm_s))
    assert (switched(auto) is auto) == moves, auto.switches
    choice = advise.choose(advise.measure_rounds(even(100.0, 4, comm_s)), {n: configured(n) for n in
                                                                          ["sync", "localsgd"]}, "sync")
    assert choice.worth == {"sync": 1.0, "localsgd": advise.EVEN_WORTH}
    ratio = choice.predicted["localsgd"] / choice.predicted["sync"]
    assert 1.7 < ratio < (2.6 if moves else 1.9) and choice.gain == (ratio * advise.EVEN_WORTH if moves else 1.0)
    assert choice.reason == (f"localsgd is predicted {ratio:.2f}x sync's samples/s, {ratio * 0.55:.2f}x counted "
                             f"as progress (a sample of model averaging as 0.55) (even; needed 1.15x)" if moves else
                             "sync is predicted the fastest, a sample of model averaging counted as 0.55 (even)")


@pytest.mark.parametrize("localsgd, kept", [(200.0, "sync"), (220.0, "localsgd")])
def test_on_equal_ranks_a_trial_keeps_model_averaging_only_at_twice_the_samples_per_second(localsgd, kept):
    auto = Auto(candidates=["sync", "localsgd"], trial_rounds=3)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, even(100.0, STARTUP_ROUNDS + 4))
    assert switched(auto) is auto and auto.current_name == "localsgd"
    feed(auto, even(1e6, STARTUP_ROUNDS) + even(localsgd, 3), start=7)
    switched(auto)
    assert auto.current_name == kept, auto.switches
    if kept == "sync":
        assert "none ran 2.09x sync's" in auto.switches[-1]["why"], auto.switches


def test_a_straggler_that_leaves_takes_auto_back_to_synchronous_unguarded():
    """Rank 3 4x slower: ElasticBSP (no trial). It speeds up: the change is read at its first fast round, and
    four rounds later Auto goes back to Synchronous (ElasticBSP's samples counted at ``advise.EVEN_WORTH`` on
    equal ranks). The guard does not judge that switch (the loss before it was on another cluster): a loss
    that then stops falling does not take Auto back to ElasticBSP."""
    auto = Auto(candidates=["sync", "elasticbsp"], trial_rounds=0)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=2.0 - 0.1 * i) for i in range(STARTUP_ROUNDS + 4)])
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=1.4 - 0.1 * i) for i in range(STARTUP_ROUNDS + 5)],
         start=7)
    assert switched(auto) is None and auto._previous is None                # the guard kept ElasticBSP
    feed(auto, [statistics([0.05] * 4, loss=0.7 - 0.1 * i) for i in range(3)], start=14)
    assert switched(auto) is None                                            # read, not yet decided
    feed(auto, [statistics([0.05] * 4, loss=0.4)], start=17)
    assert switched(auto) is auto and auto.current_name == "sync"
    assert auto.switches[-1]["why"].startswith("rank 3's undelayed step moved from 0.2 s to 0.05 s: sync is "
                                               "predicted"), auto.switches[-1]
    assert auto._before is None                                              # nothing for the guard to judge by
    feed(auto, [statistics([0.05] * 4, loss=0.4 + 0.1 * i) for i in range(STARTUP_ROUNDS + 8)], start=18)
    assert switched(auto) is None and auto.current_name == "sync"


def aged(rounds, loss_at, start=0.0):
    """``rounds`` with the loss ``loss_at(samples)`` at each round's middle, the samples trained counted on from
    ``start``; and the samples after them."""
    for r in rounds:
        done = float(r.samples.sum())
        r.loss[:] = loss_at(start + done / 2)
        start += done
    return rounds, start


@pytest.mark.parametrize("per_sample, kept", [(1.0, "elasticbsp"), (0.1, "sync")])
def test_the_guard_after_a_trial_weighs_the_losss_fall_by_the_samples_trained(per_sample, kept):
    """A loss that falls alike per logarithm of the samples (``3 - 0.5 ln s``) before and after a trial of 26
    rounds: its fall per second after it is 0.3x the one before (a fresh model slows on its own), but weighed by
    the samples trained it is 3.3x (ElasticBSP's speed): the guard keeps ElasticBSP. Where it falls a tenth as
    much per sample after the decision (0.33x weighed), the guard goes back."""
    auto = Auto(candidates=UNSERVED, trial_rounds=8, trial_candidates=2)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    sync, age = aged(paced(100.0, STARTUP_ROUNDS + 4), lambda s: 3.0 - 0.5 * np.log(s))
    decided = 3.0 - 0.5 * np.log(age)
    after = lambda s: decided - per_sample * 0.5 * np.log(s / age)      # noqa: E731
    feed(auto, sync)
    assert switched(auto) is auto and auto.current_name == "elasticbsp"
    ebsp, age = aged(paced(1e6, STARTUP_ROUNDS) + paced(330.0, 8), after, age)
    feed(auto, ebsp, start=7)
    assert switched(auto) is auto and auto.current_name == "dssp"
    dssp, age = aged(paced(1e6, STARTUP_ROUNDS) + paced(300.0, 8), after, age)
    feed(auto, dssp, start=17)
    assert switched(auto) is auto and auto.current_name == "elasticbsp" and auto._previous == "sync"
    back, age = aged(paced(1e6, STARTUP_ROUNDS) + paced(330.0, 5), after, age)
    feed(auto, back, start=27)
    switched(auto)
    assert auto.current_name == kept, auto.switches
    assert ("the guard" in auto.switches[-1]["why"]) == (kept == "sync")


def test_rounds_without_wall_times_leave_the_prediction_standing():
    auto = Auto(candidates=["sync", "dssp"], trial_rounds=3)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    switched(auto)
    unmeasured = paced(1.0, STARTUP_ROUNDS + 3)
    for r in unmeasured:
        r.wall_s[:] = np.nan
    feed(auto, unmeasured, start=7)
    assert switched(auto) is None and auto.current_name == "dssp" and not auto._trial


def test_a_trial_survives_a_checkpoint():
    auto = Auto(candidates=UNSERVED, trial_rounds=3, trial_candidates=2)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2], loss=2.0 - 0.1 * i, wall=6.4) for i in range(STARTUP_ROUNDS + 4)])
    switched(auto)
    feed(auto, paced(1e6, STARTUP_ROUNDS) + paced(330.0, 2), start=7)
    again = rebuild(auto.state_dict())
    again.load_state_dict(auto.state_dict())
    again.start(Context(0, 4, None, None, lambda: 0.0))
    feed(again, paced(1e6, STARTUP_ROUNDS) + paced(330.0, 3), start=11)    # measured afresh after a restore
    assert switched(again) is again and again.current_name == "dssp" and again._previous == "sync"
    assert "sync 100, elasticbsp 330; tries dssp" in again.switches[-1]["why"] and again._before == auto._before
    assert again._samples == auto._samples + 5 * 128 == 6 * 640 + 9 * 128    # the samples trained carry on


def test_a_new_job_size_ends_a_trial_and_what_it_measured_before():
    auto = Auto(candidates=UNSERVED, trial_rounds=3)
    auto.start(Context(0, 4, None, None, lambda: 0.0))
    feed(auto, paced(100.0, STARTUP_ROUNDS + 4))
    switched(auto)
    auto.start(Context(0, 3, None, None, lambda: 0.0))                        # hvd.elastic: a rank lost
    assert (auto._trial, auto._speeds, auto._previous, auto._before) == ([], {}, None, None)


def test_a_worker_that_replaced_a_lost_one_measures_as_the_others_do():
    """A same-size reset under hvd.elastic: the survivor had decided (a round of statistics every
    ``measure_every`` steps), the new worker has measured nothing; both take rank 0's state and start, and from
    then on ask for the same rounds at the same steps (a round one asks and the other does not is a hang)."""
    survivor = Auto(candidates=CANDIDATES, measure_every=3)
    survivor.start(Context(1, 4, None, None, lambda: 0.0, session=".a"))
    feed(survivor, [statistics([0.05] * 4, steps=1) for _ in range(STARTUP_ROUNDS + HISTORY)])
    assert survivor.handover() is None and rounds_of(copy.deepcopy(survivor), 3) == ["CONTINUE", "CONTINUE", "MEASURE_OVERLAPPED"]
    newcomer = Auto(candidates=CANDIDATES, measure_every=3)
    survivor.start(Context(1, 4, None, None, lambda: 0.0, session=".a"))      # sync_model(): the same controller
    assert rounds_of(copy.deepcopy(survivor), 3) == ["CONTINUE", "CONTINUE", "MEASURE_OVERLAPPED"]
    state = survivor.state_dict()
    for rank, auto in ((1, survivor), (3, newcomer)):
        auto.load_state_dict(state)
        auto.start(Context(rank, 4, None, None, lambda: 0.0, session=".b"))
    assert rounds_of(survivor, 20) == rounds_of(newcomer, 20) == ["MEASURE_OVERLAPPED"] * 20


def test_noise_and_equal_ranks_never_make_it_switch():
    auto = Auto(candidates=CANDIDATES)
    rng = np.random.default_rng(0)
    feed(auto, [statistics(0.05 * (1 + 0.05 * rng.standard_normal(4)), spread=0.05) for _ in range(12)])
    assert auto.handover() is None and auto.switches == []


def test_the_start_up_rounds_are_left_out_of_a_decision():
    """Equal ranks whose first two steps hold start-up (as measured on a CPU: every rank's first step 2-3 s,
    rank 0's second 0.58 s): it stays with Synchronous. Measured, the first four rounds would read as transient
    stragglers worth a switch."""
    start_up = [statistics([2.1, 3.0, 0.08, 2.2], steps=1), statistics([0.58, 0.05, 0.05, 0.05], steps=1)]
    equal = [statistics([0.05] * 4, steps=1) for _ in range(4)]
    auto = Auto(candidates=CANDIDATES)
    feed(auto, start_up + equal)
    assert STARTUP_ROUNDS == 2 and auto.handover() is None and auto.switches == []
    misread = advise.choose(advise.measure_rounds(start_up + equal[:2]),
                            {n: configured(n) for n in CANDIDATES}, "sync")
    assert misread.switches and misread.gain > 1.5


def test_a_round_weighs_as_many_steps_as_it_holds():
    """Under a model-averaging strategy a round holds several steps of a fast rank; one round of a single 10x step
    of rank 0 (an evaluation on rank 0) is 1 step of 45, not 1 round of 12, and ESync stays ahead of ADSP."""
    usual = statistics([0.05, 0.05, 0.05, 0.2], steps=4)
    usual.local_steps[3] = 1
    odd = copy.deepcopy(usual)
    odd.local_steps[0], odd.step_min[0], odd.step_mean[0], odd.step_sq[0] = 1, 0.5, 0.5, 0.25
    measured = advise.measure_rounds([usual] * 11 + [odd])
    assert np.mean(measured.factors[0] > 5) == pytest.approx(1 / 45)
    assert np.mean(measured.factors[1] > 5) == 0 and np.mean(measured.factors[3] > 5) == 0
    choice = advise.choose(measured, {n: configured(n) for n in ["esync", "adsp"]}, "esync")
    assert not choice.switches, choice.reason


def test_beside_a_model_averaging_strategy_it_adds_no_round_of_statistics():
    """LocalSGD steps together but has rounds of its own, which a rank that stopped early joins with its model in
    sync_model(): a round of statistics would not match them (only LocalSGD's own rounds, every 8 steps)."""
    auto = Auto(candidates=["sync", "localsgd"], measure_every=1)
    feed(auto, costly_collectives(STARTUP_ROUNDS + 4))
    assert auto.handover() is auto and auto.current_name == "localsgd" and auto.lockstep
    assert rounds_of(auto, 16) == (["CONTINUE"] * 7 + ["AVERAGE"]) * 2


def test_a_rank_delayed_on_some_steps_is_no_change_but_one_slowed_on_every_step_is(caplog):
    auto = Auto(candidates=CANDIDATES, measure_every=1)
    feed(auto, [statistics([0.05] * 4, steps=1) for _ in range(STARTUP_ROUNDS + HISTORY)])
    assert auto.handover() is None and auto.switches == []
    # one step a round; ranks 1 and 2 delayed 4x in turn
    flipping = [statistics([0.05, 0.2 if i % 2 else 0.05, 0.05 if i % 2 else 0.2, 0.05], steps=1) for i in range(24)]
    slowed = [statistics([0.05, 0.05, 0.05, 0.2], steps=1) for _ in range(CHANGE_STEPS + 4)]
    caplog.set_level(logging.INFO, logger="horovod_hetero")
    feed(auto, flipping, start=20)
    assert auto.handover() is None and auto.switches == []
    feed(auto, slowed[:CHANGE_STEPS - 1], start=50)
    assert not [m for m in caplog.messages if "decides again" in m]
    feed(auto, slowed[CHANGE_STEPS - 1:], start=70)
    assert [m for m in caplog.messages if "decides again" in m] == [
        "Auto decides again: rank 3's undelayed step moved from 0.05 s to 0.2 s"]
    assert auto.handover() is auto and auto.switches[0]["why"].startswith("rank 3's undelayed step moved")
    assert undelayed(slowed[:1] + flipping[-2:], 2).tolist() == [0.05, 0.05, 0.05, 0.05]


def test_an_epochs_last_smaller_batch_is_no_change(caplog):
    auto = Auto(candidates=CANDIDATES, measure_every=1)
    caplog.set_level(logging.INFO, logger="horovod_hetero")
    feed(auto, [statistics([0.05] * 4, steps=1) for _ in range(STARTUP_ROUNDS + 2 * HISTORY)])
    last = statistics([0.02, 0.05, 0.05, 0.05], steps=1)
    last.samples[0] = 8                                       # 8 samples where the others took 32
    feed(auto, [last] + [statistics([0.05] * 4, steps=1) for _ in range(2 * CHANGE_STEPS)], start=40)
    assert not [m for m in caplog.messages if "decides again" in m] and auto.switches == []


def test_rounds_of_single_steps_delayed_at_random_read_as_transient_around_the_undelayed_step():
    """One step a round (Synchronous before a decision), each rank's step 4x in every other round."""
    rounds = [statistics([0.2 if (i + q) % 2 else 0.05 for q in range(4)], steps=1) for i in range(12)]
    measured = advise.measure_rounds(rounds)
    assert measured.kind == "transient" and measured.step_s == pytest.approx([0.05] * 4)
    assert [np.mean(f > 3) for f in measured.factors] == pytest.approx([0.5] * 4)


def costly_collectives(n):
    """Equal ranks whose collective costs twice a step: LocalSGD saves most of it."""
    rounds = [statistics([0.05] * 4, steps=1) for _ in range(n)]
    for r in rounds:
        r.comm_s[:] = 0.1
    return rounds


def test_unchanged_speeds_keep_its_choice_unless_told_to_decide_again():
    """Equal ranks, cheap collectives: it stays with Synchronous; the collectives then grow costly while the
    ranks' steps stay put: by default it keeps its choice, with ``recheck_rounds`` it decides again."""
    for recheck, expected in ((None, "sync"), (4, "localsgd")):
        auto = Auto(candidates=CANDIDATES, measure_every=1, recheck_rounds=recheck)
        feed(auto, [statistics([0.05] * 4, steps=1) for _ in range(STARTUP_ROUNDS + HISTORY)])
        assert auto.handover() is None and auto.switches == []
        feed(auto, costly_collectives(12), start=STARTUP_ROUNDS + HISTORY + 1)
        auto.handover()
        assert auto.current_name == expected, (recheck, auto.switches)


def test_its_state_holds_what_it_runs_and_rebuilds():
    auto = Auto(candidates=CANDIDATES, measure_every=4)
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2]) for _ in range(6)])
    auto.handover()
    state = auto.state_dict()
    assert state["kind"] == "Auto" and state["current"] == "elasticbsp" and state["config"]["kwargs"]["measure_every"] == 4
    again = rebuild(state)
    again.load_state_dict(state)
    assert again.current_name == "elasticbsp" and again.switches == auto.switches and again.measure_every == 4
    with pytest.raises(ValueError, match="state\\['current'\\] must be one of Auto's candidates"):
        Auto(candidates=["sync", "localsgd"]).load_state_dict(state)
    assert state["worth"]["elasticbsp"] == state["worth"]["sync"] == 1.0          # the trial's, persistent
    with pytest.raises(ValueError, match="state\\['worth'\\] must be"):                 # a trial would divide by it
        rebuild(state).load_state_dict({**state, "worth": {"elasticbsp": 0.0}})


@pytest.mark.parametrize("kwargs, error, match", [
    ({"candidates": ["esync"]}, ValueError, "must hold 'sync'"),
    ({"candidates": ["sync", "fast"]}, ValueError, "unknown 'fast'"),
    ({"candidates": "sync"}, TypeError, "list of strategy names"),
    ({"measure_every": 0}, ValueError, "measure_every"),
    ({"guard": 1.0}, ValueError, r"guard must be in \[0, 1\)"),
    ({"recheck_rounds": 0}, ValueError, "recheck_rounds"),
    ({"trial_rounds": -1}, ValueError, "trial_rounds"),
    ({"trial_rounds": 13}, ValueError, "trial_rounds"),
    ({"min_rounds": 13}, ValueError, "min_rounds"),
    ({"trial_candidates": 0}, ValueError, "trial_candidates"),
    ({"trial_candidates": 1.0}, TypeError, "trial_candidates must be an int"),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, match):
    with pytest.raises(error, match=match):
        Auto(**kwargs)


def test_advise_and_auto_decide_with_one_function():
    rounds = [statistics([0.05, 0.05, 0.05, 0.2]) for _ in range(4)]
    measured = advise.measure_rounds(rounds)
    choice = advise.choose(measured, {n: configured(n) for n in CANDIDATES}, "sync")
    auto = Auto(candidates=CANDIDATES)
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2])] * STARTUP_ROUNDS + rounds)
    assert choice.switches and auto.handover() is auto and auto.current_name == choice.name


def test_a_decision_simulates_each_candidate_once(monkeypatch):
    """The decision with the noise takes the predictions of the one without (``choose(predicted=...)``): each
    candidate is simulated once, and two more runs measure the noise; the choice is the same as simulating
    again, and predictions of other candidates are refused by name."""
    simulated = []
    real = advise.predict
    monkeypatch.setattr(advise, "predict", lambda measured, strategies, *a, **k: (
        simulated.extend(strategies), real(measured, strategies, *a, **k))[1])
    auto = Auto(candidates=CANDIDATES)
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2])] * (STARTUP_ROUNDS + 4))
    assert auto.handover() is auto and auto.current_name == "elasticbsp"
    assert sorted(simulated[:len(CANDIDATES)]) == sorted(CANDIDATES) and len(simulated) == len(CANDIDATES) + 4
    measured = advise.measure_rounds([statistics([0.05, 0.05, 0.05, 0.2])] * 4)
    strategies = {n: configured(n) for n in CANDIDATES}
    first = advise.choose(measured, strategies, "sync")
    assert advise.choose(measured, strategies, "sync", 0.1, predicted=first.predicted) == \
        advise.choose(measured, strategies, "sync", 0.1)
    with pytest.raises(ValueError, match=r"^predicted= holds \['sync'\], not the candidates \['dssp', "):
        advise.choose(measured, strategies, "sync", predicted={"sync": 1.0})


def test_the_runtime_imports_what_a_strategy_will_import_in_the_background():
    """``Strategy.imports`` (ADSP's SciPy optimizer, and Auto's candidates') is imported in a daemon thread when
    the strategy starts; what is imported already starts no thread; a module that fails is left to its user."""
    import sys

    from horovod_hetero.runtime.controller import import_ahead
    from horovod_hetero.strategies import ADSP

    assert ADSP().imports == ("scipy.optimize",)
    auto = Auto(candidates=["sync", "adsp", "localsgd"])
    assert auto.imports == ("scipy.optimize",)
    auto.available = ["sync", "localsgd"]
    assert auto.imports == ()
    sys.modules.pop("colorsys", None)
    thread = import_ahead(["json", "colorsys", "horovod_hetero_no_such_module"])
    assert thread is not None and thread.daemon and thread.name == "horovod_hetero-import-ahead"
    thread.join(10)
    assert not thread.is_alive() and "colorsys" in sys.modules
    assert import_ahead(["json", "colorsys"]) is None


def test_a_loaded_state_where_auto_runs_another_kind_gets_that_kinds_runner():
    """A checkpoint or ``hvd.elastic``'s restore of an Auto that had switched to ESync, loaded where a fresh Auto
    runs Synchronous (a new worker): the controller carries out model averaging, the gradient allreduce closed."""
    from fakes import ArrayCollectives, ArrayModel
    from horovod_hetero.runtime.controller import HeteroController

    def controller():
        return HeteroController(Auto(candidates=CANDIDATES), ArrayCollectives(lambda rank, arrays: arrays),
                                ArrayModel({"w": np.array([1.0])}))

    switched = controller()
    feed(switched.strategy, [statistics([0.05, 0.05, 0.05, 0.2]) for _ in range(6)])
    switched.strategy.handover()
    fresh = controller()
    assert type(fresh.runner) is GradientRunner and fresh.gradients.opened is True
    fresh.load_state_dict(switched.state_dict())
    assert fresh.strategy.current_name == "elasticbsp" and type(fresh.runner) is ModelAveragingRunner
    assert fresh.gradients.opened is None and fresh.protocol.policy is fresh.runner


def test_a_switch_keeps_the_controllers_session_so_auto_keeps_what_it_decided():
    """The controller takes fresh counters (and names its collectives anew) at each strategy's first start, a
    switch included; ``Context.session`` stays the controller's, so Auto measures afresh only under a new one
    (``hvd.elastic``'s reset)."""
    from fakes import ArrayCollectives, ArrayModel
    from horovod_hetero.runtime.controller import HeteroController

    def controller(auto):
        return HeteroController(auto, ArrayCollectives(lambda rank, arrays: arrays), ArrayModel({"w": np.array([1.0])}))

    auto = Auto(candidates=CANDIDATES)
    ctl = controller(auto)
    ctl.start()
    first = ctl.collectives.session
    feed(auto, [statistics([0.05, 0.05, 0.05, 0.2]) for _ in range(STARTUP_ROUNDS + 4)])
    ctl.sync()                                               # a round where every rank holds the same model: the switch
    ctl.start()
    assert auto.current_name == "elasticbsp" and ctl.collectives.session != first
    assert auto._session == first and auto._decided_at is not None
    controller(auto).start()                                 # a new controller: measured afresh
    assert auto._session not in ("", first) and auto._decided_at is None
