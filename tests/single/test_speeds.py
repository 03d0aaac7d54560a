"""``runtime.speeds.Speeds``: every rank's speed as the rounds measure it, which the epoch samplers split by."""
import numpy as np

from horovod_hetero.rules.partition import epoch_steps
from horovod_hetero.runtime.runner import runner_for
from horovod_hetero.runtime.speeds import SHARE_ROUNDS, Speeds
from horovod_hetero.strategies import ESync
from horovod_hetero.strategies.base import RoundStats

NAN = float("nan")


def round_of(*step_s):
    n = len(step_s)
    return RoundStats(np.ones(n, dtype=int), np.array(step_s, dtype=float), np.full(n, NAN), np.zeros(n, int),
                      np.zeros(n, bool))


def speeds_after(rows):
    speeds = Speeds(len(rows[0]))
    for row in rows:
        speeds.record(round_of(*row))
    return speeds


def test_one_slow_round_of_a_fast_rank_does_not_set_the_split():
    """Rank 0 once took 0.15 s a step where it takes 0.1 (a step that printed Keras's progress bar): its speed
    stays its median, and an epoch of 50 batches still gives it as many as rank 1, not 33."""
    rows = [[0.9, 0.5, 1.2]] + [[0.1, 0.1, 0.4]] * 4 + [[0.15, 0.1, 0.4]]
    speeds = speeds_after(rows)
    assert speeds.step_times.tolist() == [0.1, 0.1, 0.4]
    assert epoch_steps(50, speeds.step_times).tolist() == [50, 50, 12]
    assert epoch_steps(50, rows[-1]).tolist() == [33, 50, 12]         # what the latest round alone gave


def test_a_straggler_that_appears_sets_the_split_once_most_recent_rounds_measured_it():
    rows = [[0.5, 0.5], [0.1, 0.1], [0.1, 0.1], [0.1, 0.1], [0.1, 0.1], [0.1, 0.1]]
    speeds = speeds_after(rows)
    seen = []
    for _ in range(SHARE_ROUNDS):
        speeds.record(round_of(0.1, 0.4))
        seen.append(speeds.step_times.tolist())
    assert seen == [[0.1, 0.1], [0.1, 0.1], [0.1, 0.4], [0.1, 0.4], [0.1, 0.4]]


def test_rounds_that_did_not_measure_a_rank_leave_its_window_as_it_was():
    """Rounds where rank 1 took no step (NaN: a straggler between two rounds, a rank joined at an epoch's end)
    do not push its measurements out: its one slow round after them does not set the split."""
    rows = [[0.5, 0.5]] + [[0.1, 0.4]] * 4 + [[0.1, NAN]] * 4 + [[0.1, 0.9]]
    assert speeds_after(rows).step_times.tolist() == [0.1, 0.4]


def test_a_switch_measures_afresh_from_the_latest_step_times():
    """After ``restart`` (the controller's ``set_strategy``: another strategy, maybe of other batches) every
    rank's speed is its latest, and the next rounds alone make its median."""
    speeds = speeds_after([[0.5, 0.5]] + [[0.1, 0.4]] * 4 + [[0.1, 0.2]])
    assert speeds.step_times.tolist() == [0.1, 0.4]
    speeds.restart()
    assert speeds.step_times.tolist() == [0.1, 0.2]
    for row in ([0.1, 0.2], [0.1, 0.25]):
        speeds.record(round_of(*row))
    assert speeds.step_times.tolist() == [0.1, 0.225]
    assert speeds.differ()                                    # the rounds' spread is kept across the switch


def test_the_start_up_round_is_left_out_and_an_unmeasured_rank_keeps_its_latest():
    """The first round that measured every rank holds the start-up (a first step timed from the optimizer's
    construction); later rounds where a rank took no step (NaN) leave its speed as it was."""
    speeds = speeds_after([[NAN, 2.0], [3.0, 0.2]])
    assert speeds.step_times.tolist() == [3.0, 0.2]          # only the start-up measured rank 0 yet
    speeds.record(round_of(0.1, NAN))
    speeds.record(round_of(0.3, NAN))
    assert speeds.step_times.tolist() == [0.2, 0.2]          # 0.1 and 0.3's median; rank 1's latest
    assert speeds.measured is None                           # one round has measured every rank since
    speeds.record(round_of(0.2, 0.1))
    assert [a.tolist() for a in speeds.measured] == [[5, 5], [0.2, 0.1]]      # 0.1, 0.3, 0.2; 0.1 alone
    speeds.record(round_of(0.25, 0.12))
    assert not speeds.settled and speeds.known() is None     # two rounds have measured every rank since
    speeds.record(round_of(0.2, 0.1))
    assert speeds.settled and speeds.measured[0].tolist() == [5, 5]           # kept: what a sampler split by
    assert speeds.known() == (0.2, 0.1)                      # what a strategy started again plans from


def test_an_epoch_is_split_once_three_rounds_after_the_start_up_measured_every_rank():
    """Measured under Keras (Horovod's Keras example, 1,1,1,4 of 0.1-s steps): the round after the start-up's
    held each fast rank's second step, 1.5-2x its usual (0.15, 0.17, 0.21 s). Split there, a fast rank looked
    slow and the slow rank was given 19 batches of 50, 1.5x the fast ranks' epoch; three rounds on, each
    rank's median is its speed and the slow rank takes 12."""
    rows = [[5.2, 5.2, 5.3, 5.2], [0.15, 0.17, 0.21, 0.4], [0.1, 0.1, 0.1, 0.4], [0.11, 0.1, 0.1, 0.4]]
    speeds = Speeds(4)
    for row in rows[:2]:
        speeds.record(round_of(*row))
    runner = runner_for(ESync())
    assert speeds.differ() and not speeds.settled and runner.epoch_shares(50, speeds) is None
    assert epoch_steps(50, speeds.step_times).tolist() == [50, 44, 36, 19]        # what that round alone gave
    for row in rows[2:]:
        speeds.record(round_of(*row))
    assert speeds.settled and runner.epoch_shares(50, speeds) == [45, 50, 50, 12]
