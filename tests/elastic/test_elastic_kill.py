"""Horovod elastic with a worker that dies (SIGKILL, mid-epoch), every strategy (``elastic_kill_worker.py``)
and, with Horovod's elastic Keras recipe, Synchronous and three callbacks (``elastic_keras_kill_worker.py``):
once rank 0, once rank 2 (the other host's first). The two workers of the other host go on from the
last commit and finish the job's epochs with identical models, with Horovod's defaults (Gloo's 30-s
timeout): the survivors start again well within it (``common.failures.end_gloo_waits``: each process ends
the failed session's Gloo connections, so no survivor waits for a peer that has left the collective);
the seconds from the kill to their restart are printed. WAGMA, whose process sets Horovod 0.28 cannot reset,
ends the job at once with ``RankLostError``."""
import time
from pathlib import Path

import pytest

from elastic_job import job_output, run


WORKER = Path(__file__).with_name("elastic_kill_worker.py")
KERAS_WORKER = Path(__file__).with_name("elastic_keras_kill_worker.py")
HOSTS = "localhost:2\n127.0.0.1:2\n"
#: Horovod's defaults: no timeout set (Gloo's is 30 s)
ENV: dict[str, str] = {}
#: seconds from the kill to the survivors' restart that would mean a survivor waited out part of Gloo's timeout
#: (measured 0.6-1.4 s; with Horovod's own optimizer, which ends no connection, 30-35 s)
RESTARTED_S = 15.0


@pytest.mark.parametrize("victim", [0, 2])
#: WAGMA is not here: Horovod 0.28's removal of the process sets after a failure (a Gloo allgather outside its
#: loop's error handling) ends every survivor (the WAGMA test below)
@pytest.mark.parametrize("strategy", ["sync", "localsgd", "esync", "elasticbsp", "dssp", "adsp", "balanced"])
def test_a_killed_worker_costs_a_reset_not_the_job(tmp_path, strategy, victim):
    records = run(WORKER, strategy, tmp_path, hosts_text=HOSTS, np=4, args=(str(victim),), **ENV)
    survivors = check_killed(records, f"{strategy}, rank {victim} killed")
    kill = next(r["t"] for r in records if r["event"] == "kill")
    starts = {pid: [r["t"] - kill for r in records if r["event"] == "start" and r["pid"] == pid and r["t"] > kill]
              for pid in survivors}
    # two starts each: after the failure's reset, and after the one more that clears Horovod's queue
    # (StaleRequestsReset: what the failed session left there would crash the survivors' first hvd.join)
    assert all(len(ts) == 2 for ts in starts.values()), starts
    print(f"the reset that clears Horovod's queue took {max(ts[1] - ts[0] for ts in starts.values()):.2f} s")
    names = {}      # a survivor's gradient allreduces, each session's first: Horovod's names carry a new session
    for r in records:
        if r["event"] == "names" and r["pid"] in survivors:
            names.setdefault(r["pid"], []).append(r["names"])
    assert all(len(n) == 2 and not set(n[0]) & set(n[1]) for n in names.values()), names
    assert strategy not in ("sync", "balanced") or len(names) == 2, names


@pytest.mark.parametrize("victim", [0, 2])
def test_wagma_a_killed_worker_ends_the_job_at_once_with_the_named_error(tmp_path, victim):
    """WAGMA's groups are Horovod process sets, and Horovod 0.28 removes them after a failed collective over
    the broken connections, outside its error handling: no process can reset. The survivors raise
    ``RankLostError`` (not Horovod's error, which ``hvd.elastic.run`` would take for a reset that waits
    20 s for Horovod's failed thread) and the job ends, in 0.6-1.4 s (32 runs). No survivor waits in an
    enqueue until the library's GIL watchdog (``common.failures.GIL_LIMIT_S``, 45 s), as 3 runs of 9 did
    with rank 2 killed before the survivors ended the failed session's Gloo connections and asked Horovod's
    process-set table before an enqueue, and 1 in about 50 after, where Horovod's thread failed between
    that ask and the enqueue: during the enqueue the C++ runtime's terminate handler stands in for ours
    (``common.failures.enqueueing``), and such a survivor aborts at once, as without the library."""
    records = run(WORKER, "wagma", tmp_path, hosts_text=HOSTS, np=4, args=(str(victim),), ok=False, **ENV)
    job_ended = time.time()
    kill = next(r for r in records if r["event"] == "kill")
    ended = {r["pid"]: r["error"] for r in records if r["event"] == "ended"}
    assert ended and kill["pid"] not in ended, records
    assert all(error.startswith("RankLostError") and "hvd.elastic cannot start this worker again" in error
               for error in ended.values()), ended
    assert not [r for r in records if r["event"] in ("start", "reset") and r["t"] > kill["t"]]    # no reset
    print(f"\nWAGMA, rank {victim} killed: {len(ended)} survivors raised RankLostError after "
          f"{max(r['t'] for r in records if r['event'] == 'ended') - kill['t']:.2f} s, the job ended after "
          f"{job_ended - kill['t']:.2f} s")
    assert job_ended - kill["t"] < RESTARTED_S, job_output(tmp_path)


@pytest.mark.parametrize("victim", [0, 2])
@pytest.mark.parametrize("strategy", ["sync", "localsgd", "esync", "elasticbsp"])
def test_keras_a_killed_worker_costs_a_reset_not_the_job(tmp_path, strategy, victim):
    """The same with Horovod's elastic Keras recipe (``KerasState``, Keras 2), Synchronous
    (``hh.DistributedOptimizer``: Horovod's own there) and three strategy callbacks."""
    records = run(KERAS_WORKER, strategy, tmp_path, hosts_text=HOSTS, np=4, args=(str(victim),),
                  TF_USE_LEGACY_KERAS="1", **ENV)
    # Synchronous is Horovod's own optimizer under Keras 2: no code of this library sees its failure, and a
    # survivor waits out Gloo's timeout (30.2-30.4 s), as without this library
    check_killed(records, f"Keras {strategy}, rank {victim} killed", bounded=strategy != "sync")


def check_killed(records, case, bounded=True):
    """The two survivors restarted from the last commit (epoch 1) without the dead worker, finished the
    job's 4 epochs with identical models, ``bounded``: within ``RESTARTED_S`` of the kill; what they saw is
    printed. Their process ids."""
    kill = next(r for r in records if r["event"] == "kill")
    ends = [r for r in records if r["event"] == "end"]
    assert sorted(r["rank"] for r in ends) == [0, 1] and {r["size"] for r in ends} == {2}
    assert all(r["params"] == ends[0]["params"] for r in ends)                 # identical models
    assert {r["epoch"] for r in ends} == {4}
    restarts = [r for r in records if r["event"] == "start" and r["t"] > kill["t"]]
    assert {r["size"] for r in restarts} == {2} and {r["epoch"] for r in restarts} == {1}   # the last commit
    assert not bounded or min(r["t"] for r in restarts) - kill["t"] < RESTARTED_S, f"{case}: waited out Gloo's timeout"
    survivors = {r["pid"] for r in ends}
    assert survivors == {r["pid"] for r in restarts} and kill["pid"] not in survivors
    failed = [r for r in records if r["event"] == "failed"]
    resets = [r for r in records if r["event"] == "reset"]
    since = lambda rs: f"{min(r['t'] for r in rs) - kill['t']:.1f} s" if rs else "-"    # noqa: E731
    print(f"\n{case}: a survivor failed after {since(failed)} "
          f"({failed[0]['error'][:120] if failed else '-'}), reset after {since(resets)}, started again after "
          f"{since(restarts)}")
    return survivors
