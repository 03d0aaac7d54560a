"""Fault injection for horovod-hetero: a job of four ranks on this machine, one fault, what each rank did.

The ranks are started as ``horovodrun --gloo`` starts them (its rendezvous server, its environment),
but by this harness, one process each: horovodrun terminates every rank once one has failed, which
would hide what the survivors themselves do. Each case records, per rank, the exit code, the seconds
from the fault to its exit, the error class it printed (``ERROR <name>``, tests/faults/worker.py)
and its final model; and the job's samples/s before, during and after the fault.

    python tests/faults/harness.py [CASE_NAME_SUBSTRING ...]      prints the table (see ``CASES``)
"""
import atexit
import dataclasses
import json
import os
import pathlib
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
from horovod.runner.http.http_server import RendezvousServer

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER, INTRUDER = HERE / "worker.py", HERE.parent / "parallel" / "intruder.py"
NP, BATCH = 4, 16
#: The strategies' collective timeout and Gloo's own, short so that the suite stays short; the
#: frozen-rank cases end after the first (ours), the stall cases must outlast neither.
COLLECTIVE_TIMEOUT_S, GLOO_TIMEOUT_S = 5, 10
#: What every case must end within: every survivor out with the named error, or the job done.
EXIT_LIMIT_S = 60
FAULT_AT, STEPS, STALL_S = 30, 120, 3.0
#: torch ranks forked from a process that imported torch once (``Zygote``); FAULTS_ZYGOTE=0: new interpreters
FORK = os.environ.get("FAULTS_ZYGOTE", "1") != "0"


@dataclasses.dataclass
class Case:
    strategy: str
    fault: str                # kill | stop | stall | intruder
    target: int = 0           # the rank the fault hits
    framework: str = "torch"

    @property
    def name(self):
        target = "" if self.fault == "intruder" else f"-rank{self.target}"
        return f"{self.framework}-{self.strategy}-{self.fault}{target}"

    @property
    def survives(self):
        """The job must finish correctly (else: every other rank ends with the named error)."""
        return self.fault in ("stall", "intruder")


@dataclasses.dataclass
class Outcome:
    case: Case
    codes: dict               # rank -> exit code (None: stopped, killed by the harness at the end)
    exit_s: dict              # rank -> seconds from the fault to its exit
    errors: dict              # rank -> the error class name it printed, or None
    results: dict             # rank -> final model checksum, or None
    rates: tuple              # samples/s of the job before, during, after the fault
    lines: dict               # rank -> its output lines

    @property
    def survivors(self):
        return [r for r in self.codes if self.case.survives or r != self.case.target]

    def summary(self):
        if self.case.survives:
            same = len(set(self.results.values())) == 1 and None not in self.results.values()
            outcome = "finished, models identical" if same and not any(self.codes.values()) else "FAILED"
        else:
            names = sorted({str(self.errors[r]) for r in self.survivors})
            outcome = f"survivors: {'/'.join(names)}"
        slowest = max(self.exit_s[r] for r in self.survivors)
        rates = " / ".join("-" if r is None else f"{r:.0f}" for r in self.rates)
        return f"| {self.case.name} | {outcome} | {slowest:.1f} | {rates} |"


class Zygote:
    """The harness's end of ``zygote.py``: a process that imported torch, Horovod and horovod_hetero
    once and forks each torch rank from there (``FAULTS_ZYGOTE=0``: every rank a new interpreter)."""

    def __init__(self):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.proc = subprocess.Popen([sys.executable, str(HERE / "zygote.py"), str(theirs.fileno())],
                                     pass_fds=[theirs.fileno()], cwd=ROOT,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT)))
        theirs.close()
        self.sock = ours
        self._pids = queue.Queue()                   # its answers to spawn(), in order
        self._exits = {}                             # pid -> (exit status, unix time)
        self._ended = threading.Condition()
        self._gone = False
        self._spawning = threading.Lock()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self):
        while True:
            try:
                message = self.sock.recv(4096).decode()
            except OSError:
                message = ""
            if not message:                          # the zygote ended: no exit will be reported any more
                self._pids.put(None)
                with self._ended:
                    self._gone = True
                    self._ended.notify_all()
                return
            kind, *fields = message.split()
            if kind == "PID":
                self._pids.put(int(fields[0]))
            else:
                with self._ended:
                    self._exits[int(fields[0])] = (int(fields[1]), float(fields[2]))
                    self._ended.notify_all()

    def spawn(self, argv, env, out_fd):
        """A rank running ``python *argv`` with ``env``, its output to ``out_fd``; its pid."""
        with self._spawning:
            socket.send_fds(self.sock, [json.dumps({"argv": argv, "env": env, "cwd": str(ROOT)}).encode()], [out_fd])
            try:
                pid = self._pids.get(timeout=60)
            except queue.Empty:
                pid = None
        if pid is None:
            raise RuntimeError(f"the fault harness's zygote ended (exit {self.proc.wait()})")
        return pid

    def status(self, pid, timeout=None):
        """The rank's exit status once it ended (within ``timeout`` s), else None (also once the zygote ended)."""
        with self._ended:
            self._ended.wait_for(lambda: pid in self._exits or self._gone, timeout)
            return self._exits.get(pid, (None,))[0]

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)         # the zygote sees the end (close alone waits for _listen)
        self.sock.close()
        self.proc.wait(30)


class Forked:
    """A rank forked by the ``Zygote``, with the part of ``subprocess.Popen``'s interface the harness uses."""

    def __init__(self, zygote, argv, env):
        self._zygote = zygote
        read, write = os.pipe()
        try:
            self.pid = zygote.spawn(argv, env, write)
        finally:
            os.close(write)
        self.stdout = open(read, errors="replace")

    @property
    def returncode(self):
        return self._zygote.status(self.pid, 0)

    def poll(self):
        return self.returncode

    def wait(self):
        return self._zygote.status(self.pid)

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


_zygote = []


def zygote():
    """The session's Zygote, started on first use."""
    if not _zygote:
        _zygote.append(Zygote())
        atexit.register(_zygote[0].close)
    return _zygote[0]


#: the rest of a marker line (``say``): a class name or a count, then a number (a time, a checksum); or a number
_MARKER_END = re.compile(r"(?:[A-Za-z_]\w* |\d+ )?[-+]?\d[\d.e+-]*")


class Rank:
    """One rank's process and its timestamped output."""

    def __init__(self, rank, command, env, forked=False):
        self.rank = rank
        if forked:
            self.proc = Forked(zygote(), command[1:], env)
        else:
            self.proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         text=True, errors="replace")
        self.lines = []                   # (arrival time, line)
        self.ended = None
        self.pid = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))
        self.proc.wait()
        self.ended = time.time()

    def find(self, prefix):
        """What follows ``prefix`` (a worker's marker, ``say``) on each line that starts with it, or that
        ends with it in full: stdout and stderr share the pipe, and Horovod's C++ log writes a line in
        pieces from its own thread, so a marker (one write, ending its line) can end a line that a log
        piece began, with or without a space between them (seen: ``282351: E ERROR RankLostError
        1795883838.284``). There only the markers' own shape counts (words or a number, then a number):
        a log's ``UNKNOWN ERROR (303)`` is not one."""
        found = []
        for _, line in list(self.lines):
            if line.startswith(prefix):
                found.append(line[len(prefix):].strip())
                continue
            at = line.rfind(prefix)
            if at > 0 and _MARKER_END.fullmatch(line[at + len(prefix):].strip()):
                found.append(line[at + len(prefix):].strip())
        return found

    def progress(self):
        """[(step, unix time)] from its PROGRESS lines."""
        return [(int(a), float(b)) for a, b in (p.split() for p in self.find("PROGRESS "))]

    def join(self, timeout):
        self._reader.join(timeout)


def launch(case, env_extra=None):
    rendezvous = RendezvousServer(verbose=0)
    port = rendezvous.start()
    plan = get_host_assignments(parse_hosts(f"localhost:{NP}"), NP)
    rendezvous.init(plan)
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), FAULTS_TIMEOUT=str(COLLECTIVE_TIMEOUT_S),
               HOROVOD_GLOO_TIMEOUT_SECONDS=str(GLOO_TIMEOUT_S), **(env_extra or {}))
    env.update({k: str(v) for k, v in create_run_env_vars("127.0.0.1", ["lo"], port).items()})
    ranks = []
    for slot in plan:
        slot_env = dict(env, **create_slot_env_vars(slot))
        command = [sys.executable, str(WORKER), case.strategy, case.framework, str(STEPS)]
        ranks.append(Rank(slot.rank, command, slot_env, forked=case.framework == "torch" and FORK))
    return rendezvous, ranks


def wait_for(predicate, limit_s):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def rate(ranks, start, end):
    """The job's samples/s between two unix times: every rank's steps in that window (from its
    PROGRESS lines, every 5 steps) over the window's length; None for a window under 0.2 s."""
    if end - start < 0.2:
        return None

    def steps_by(r, t):
        return max([s for s, at in r.progress() if at <= t], default=0)

    return sum(steps_by(r, end) - steps_by(r, start) for r in ranks) * BATCH / (end - start)


def failure_lines(rank, lines, tail=30):
    """Rank ``rank``'s output ``lines`` for a failure message: what it printed before its first traceback
    but its progress (where Horovod's background thread logs the error that shut Horovod down, and the
    library its warnings), then its last ``tail`` lines."""
    first = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), len(lines))
    before = [line for line in lines[:first] if not line.startswith(("PROGRESS ", "PID "))][-40:]
    return [f"--- rank {rank}: before its first traceback ---", *before, "--- its last lines ---", *lines[-tail:]]


def run(case, start_limit_s=120):
    """Run one case; an ``Outcome``."""
    until = pathlib.Path(tempfile.mkdtemp(prefix="hh-faults-")) / "stop"
    rendezvous, ranks = launch(case, {"FAULTS_UNTIL": str(until)} if case.fault == "intruder" else None)
    try:
        target = ranks[case.target]
        started = wait_for(lambda: any(int(s.split()[0]) >= FAULT_AT for s in target.find("PROGRESS ")), start_limit_s)
        if not started:
            raise RuntimeError(f"{case.name}: rank {case.target} never reached step {FAULT_AT}:\n" +
                               "\n".join(line for r in ranks for line in failure_lines(r.rank, [l for _, l in r.lines])))
        pid = int(target.find("PID ")[0])
        fault = time.time()
        fault_end = fault
        if case.fault == "kill":
            os.kill(pid, signal.SIGKILL)
        elif case.fault in ("stop", "stall"):
            os.kill(pid, signal.SIGSTOP)
            if case.fault == "stall":
                time.sleep(STALL_S)
                os.kill(pid, signal.SIGCONT)
                fault_end = time.time()
        elif case.fault == "intruder":
            try:
                fault_end = attack(ranks[0])
            finally:
                time.sleep(1.0)                  # a second of training after the attack
                until.touch()
        others = [r for r in ranks if case.survives or r.rank != case.target]
        wait_for(lambda: all(r.ended for r in others), int(os.environ.get("FAULTS_WAIT_S", EXIT_LIMIT_S + GLOO_TIMEOUT_S)))
        for r in ranks:                          # the stopped rank, and any rank still running
            if r.proc.poll() is None and os.environ.get("FAULTS_GDB"):
                subprocess.run(["gdb", "-p", str(r.proc.pid), "-batch", "-ex", "thread apply all bt 12"],
                               stdout=open(f"/tmp/gdb.rank{r.rank}.txt", "w"), stderr=subprocess.STDOUT, timeout=60)
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGCONT)
                r.proc.kill()
        for r in ranks:
            r.join(10)
        after = None
        if case.survives:
            after = rate(ranks, fault_end + 0.5, min(r.progress()[-1][1] for r in ranks))
        else:                   # "during": from the fault to the last survivor's exit (no step should count)
            fault_end = max((r.ended or time.time()) for r in others)
        first = min((r.progress()[0][1] for r in ranks if r.progress()), default=fault)
        rates = (rate(ranks, first, fault), rate(ranks, fault, fault_end), after)
        ends = {r.rank: (r.ended or time.time()) - fault for r in ranks}
        codes = {r.rank: r.proc.returncode for r in ranks}
        errors = {r.rank: (r.find("ERROR ") or [None])[0] and r.find("ERROR ")[0].split()[0] for r in ranks}
        results = {r.rank: (r.find("RESULT ") or [None])[0] for r in ranks}
        return Outcome(case, codes, ends, errors, results, rates, {r.rank: [l for _, l in r.lines] for r in ranks})
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
        rendezvous.stop()


def attack(rank0):
    """The intruder (tests/parallel/intruder.py) against rank 0's state server or every activation socket."""
    state, activations = rank0.find("STATE "), rank0.find("ACTIVATIONS ")
    if state:
        command = [sys.executable, str(INTRUDER), "state", state[0], str(NP)]
    elif activations:
        command = [sys.executable, str(INTRUDER), "activations", *activations[0].split()]
    else:
        raise RuntimeError("rank 0 printed no address to attack (no STATE or ACTIVATIONS line)")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"the intruder failed: {done.stderr}")
    return time.time()


STRATEGIES = ("sync", "localsgd", "esync", "wagma", "elasticbsp", "dssp", "adsp")
CASES = ([Case(s, fault, target) for s in STRATEGIES for fault, target in
          (("kill", 1), ("kill", 0), ("stop", 1), ("stop", 0), ("stall", 0))]
         + [Case("esync", "intruder"), Case("wagma", "intruder")]
         + [Case(s, fault, target, "keras") for s in ("sync", "localsgd") for fault, target in
            (("kill", 1), ("stop", 0), ("stall", 0))])

HEADER = "| case | outcome | seconds to exit (slowest survivor) | samples/s before / during / after |\n| --- | --- | --- | --- |"


if __name__ == "__main__":
    chosen = [c for c in CASES if not sys.argv[1:] or any(a in c.name for a in sys.argv[1:])]
    print(HEADER, flush=True)
    for c in chosen:
        o = run(c)
        print(o.summary(), flush=True)
        if os.environ.get("FAULTS_VERBOSE"):
            for r, lines in o.lines.items():
                print(f"--- rank {r} (exit {o.codes[r]}, {o.exit_s[r]:.1f} s)")
                print("\n".join(l for l in lines if not l.startswith("PROGRESS"))[-3000:])
