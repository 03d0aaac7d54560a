#!/usr/bin/env python3
"""``ssh`` for hosts that are network namespaces of this machine (installed as ``ssh`` on horovodrun's PATH).

horovodrun starts a remote rank as ``ssh -o PasswordAuthentication=no -o StrictHostKeyChecking=no
HOST [-p PORT] [-i FILE] [-o ConnectTimeout=S] COMMAND`` (``horovod.runner.util.remote``). This runs
COMMAND with ``bash -c`` inside the namespace that ``$HH_FAKE_SSH_HOSTS`` (``host=netns,...``) maps
HOST to, in its own UTS namespace named HOST (``hostname``), with a login's minimal environment
(horovodrun puts every variable it needs on the command line, as it must for a real ssh). Like a remote machine, the command does not die with this client:
it runs detached (double fork, new session), so horovodrun ending its ``ssh`` (it does when another
rank fails) does not reach it; its output is relayed from a log file while this client lives, and
this client exits with the command's status. Each command's output (``log``), exit status (``rc``,
written when it ends) and text (``command``) stay in a new directory under ``$HH_FAKE_SSH_DIR``
(default: the temporary directory). An unmapped HOST fails as ssh does (status 255).
"""
import os
import sys
import tempfile
import time

OPTIONS_WITH_VALUE = {"-o", "-p", "-i", "-l", "-F"}


def parse(argv):
    """(host, command) from ssh's arguments."""
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        i += 2 if argv[i] in OPTIONS_WITH_VALUE else 1
    host = argv[i]
    rest = argv[i + 1:]
    while rest and rest[0] in OPTIONS_WITH_VALUE:        # horovod puts -p/-i/-o after the host
        rest = rest[2:]
    return host, " ".join(rest)


def namespaces():
    return dict(item.split("=", 1) for item in os.environ.get("HH_FAKE_SSH_HOSTS", "").split(",") if item)


def detach(argv, log_path, rc_path):
    """Run ``argv`` outside this process's tree (double fork, setsid); its status goes to ``rc_path``."""
    first = os.fork()
    if first:
        os.waitpid(first, 0)        # it exits at once: reaped here, not left a zombie that
        return                      # horovodrun's termination would wait on for its 5 s grace
    os.setsid()
    if os.fork():
        os._exit(0)
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    pid = os.fork()
    if pid == 0:
        os.execvp(argv[0], argv)
    _, status = os.waitpid(pid, 0)
    with open(rc_path + ".tmp", "w") as f:
        f.write(str(os.waitstatus_to_exitcode(status)))
    os.rename(rc_path + ".tmp", rc_path)
    os._exit(0)


def main():
    host, command = parse(sys.argv[1:])
    netns = namespaces().get(host)
    if netns is None:
        print(f"ssh: connect to host {host} port 22: No route to host", file=sys.stderr)
        return 255
    work = tempfile.mkdtemp(prefix="ssh-", dir=os.environ.get("HH_FAKE_SSH_DIR"))
    log_path, rc_path = os.path.join(work, "log"), os.path.join(work, "rc")
    open(log_path, "wb").close()
    with open(os.path.join(work, "command"), "w") as f:
        f.write(command)
    env = ["env", "-i", f"PATH={os.environ.get('HH_FAKE_SSH_PATH', '/usr/local/bin:/usr/bin:/bin')}",
           f"HOME={os.environ.get('HOME', '/root')}", "LANG=C.UTF-8"]
    login = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host]
    detach(["ip", "netns", "exec", netns] + login + env + ["bash", "-c", command], log_path, rc_path)
    with open(log_path, "rb") as log:
        while True:
            done = os.path.exists(rc_path)
            data = log.read()
            if data:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            elif done:
                with open(rc_path) as f:
                    return int(f.read())
            else:
                time.sleep(0.05)


if __name__ == "__main__":
    sys.exit(main())
