#!/usr/bin/env python3
"""Run one rank's command as this process's child and record its exit status (the multi-host test's
source of truth for how a rank ended).

``record_exit.py DIR COMMAND...``: runs COMMAND, waits for it, and writes its exit status
(``os.waitstatus_to_exitcode``: the code, or minus the signal that ended it) to
``DIR/status.rank<HOROVOD_RANK>``, then exits as the command did. Written atomically, and always
before this process exits, so the test never depends on horovodrun's own account of a rank:
Horovod 0.28.1's middleman reaps the rank's shell in two threads at once when it terminates a
job (``psutil``'s wait in ``terminate_executor_shell_and_children`` beside ``Popen.wait``), and the
loser reads status 0, so horovodrun prints no "Process N exit with status code" line for a rank
that failed by itself while the job was being torn down.

A SIGTERM (horovodrun ending the job's other ranks after a failure) is passed on to the command,
which records it itself (``worker.py``), and noted in ``DIR/sigterm.rank<r>``: if the command does
not exit within horovodrun's 5 s grace, horovodrun kills it and this process together (SIGKILL), and
that note is what is left.
"""
import os
import signal
import sys


def main():
    out, *argv = sys.argv[1:]
    rank = os.environ.get("HOROVOD_RANK") or os.environ["OMPI_COMM_WORLD_RANK"]    # horovodrun --gloo; MPI
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)

    def forward(signum, frame):
        open(os.path.join(out, f"sigterm.rank{rank}"), "w").close()
        os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    _, status = os.waitpid(pid, 0)          # retried after the handler (PEP 475)
    code = os.waitstatus_to_exitcode(status)
    path = os.path.join(out, f"status.rank{rank}")
    with open(path + ".tmp", "w") as f:
        f.write(str(code))
    os.replace(path + ".tmp", path)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
