"""A fork server for the fault harness: one process imports torch, Horovod and horovod_hetero once, then
forks a fresh rank for each request, so that a case does not spend its first 5 s with four ranks
importing them (and torch.optim loading torch._dynamo, 1.4 s a process) on two cores.

A forked rank is an ordinary process from then on: it calls ``hvd.init()`` itself, runs the worker as
``__main__`` with its own environment, argv and output, and exits as the interpreter does (atexit
handlers, Horovod's shutdown, a traceback and status 1 on an exception). The zygote itself never
initialises Horovod and starts no thread, so nothing but its one main thread is copied into a fork
(torch's idle import-time thread aside, as with torch's own fork-started DataLoader workers).

The harness (``harness.Zygote``) speaks to it over a ``SOCK_SEQPACKET`` socket, one message a packet:
a request is ``{"argv": [...], "env": {...}, "cwd": "..."}`` with the rank's output pipe passed along
(``SCM_RIGHTS``); the answer is ``PID <pid>``; ``EXIT <pid> <status> <unix time>`` follows when the rank
ends (``status`` as ``subprocess.Popen.returncode``: minus the signal that ended it).

    python zygote.py FD        FD: the zygote's end of the socket pair (inherited)
"""
import json
import os
import runpy
import select
import socket
import sys
import time


def preload():
    import torch

    import horovod.torch  # noqa: F401
    import horovod_hetero.torch  # noqa: F401
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)       # imports torch._dynamo


def serve(sock):
    """Fork a rank per request until the harness closes the socket; in a forked rank, its request."""
    while True:
        ready, _, _ = select.select([sock], [], [], 0.02)
        reap(sock)
        if not ready:
            continue
        message, fds, _, _ = socket.recv_fds(sock, 1 << 20, 1)
        if not message:                              # the harness is gone
            sys.exit(0)
        pid = os.fork()
        if pid == 0:
            sock.close()
            os.dup2(fds[0], 1)
            os.dup2(fds[0], 2)
            os.close(fds[0])
            return json.loads(message)
        os.close(fds[0])
        sock.send(f"PID {pid}".encode())


def reap(sock):
    """Report every rank that ended."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(f"EXIT {pid} {os.waitstatus_to_exitcode(status)} {time.time():.3f}".encode())


def become(request):
    """Run the rank's script as ``python script args...`` would, in this process."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")


if __name__ == "__main__":
    channel = socket.socket(fileno=int(sys.argv[1]))
    preload()
    become(serve(channel))
