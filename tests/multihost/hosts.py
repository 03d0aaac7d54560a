"""Two hosts on one machine: network namespaces joined by a veth pair, reached by a fake ``ssh``.

``Hosts`` creates ``hostA`` (10.77.0.1) and ``hostB`` (10.77.0.2), each a network namespace with
``lo`` up and one end of a veth pair named ``hheth0``, its own ``/etc/hosts``
(``/etc/netns/<ns>/hosts``, bind-mounted by ``ip netns exec``: each host resolves its own name and the
other's to the veth address, as on a cluster) and, for what runs there, its own host name (a UTS
namespace). ``horovodrun`` runs on hostA (its rendezvous server at hostA's address); ranks on hostB
start through ``fake_ssh.py`` installed as ``ssh`` on its PATH. ``cut()`` takes the link down at
both ends (a pulled cable: no reset reaches either side). Needs root and iproute2's ``ip``;
``available()`` says why not otherwise.
"""
import os
import shutil
import signal
import stat
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
IFACE = "hheth0"
ADDRESSES = {"hostA": "10.77.0.1", "hostB": "10.77.0.2"}


def available():
    """None if namespaces can be built here, else why not (a sentence for pytest.skip)."""
    if os.geteuid() != 0:
        return "the multi-host test builds network namespaces: run it as root"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"the multi-host test needs `{tool}` (iproute2, util-linux)"
    return None


def _ip(*args):
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Hosts:
    """hostA and hostB as network namespaces (a context manager: removed, with what runs in them, on exit)."""

    def __init__(self):
        tag = f"hh{os.getpid()}"
        self.netns = {"hostA": tag + "a", "hostB": tag + "b"}
        self.dir = tempfile.mkdtemp(prefix="hh-multihost-")
        self.ssh_dir = os.path.join(self.dir, "ssh")
        os.mkdir(self.ssh_dir)
        self.bin = os.path.join(self.dir, "bin")
        os.mkdir(self.bin)
        os.symlink(os.path.join(HERE, "fake_ssh.py"), os.path.join(self.bin, "ssh"))
        os.chmod(os.path.join(HERE, "fake_ssh.py"), os.stat(os.path.join(HERE, "fake_ssh.py")).st_mode | stat.S_IXUSR)

    def __enter__(self):
        try:
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def _create(self):
        a, b = self.netns["hostA"], self.netns["hostB"]
        for ns in (a, b):
            _ip("netns", "add", ns)
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in ADDRESSES.items()))
        _ip("link", "add", IFACE, "netns", a, "type", "veth", "peer", "name", IFACE, "netns", b)
        for host, ns in self.netns.items():
            _ip("-n", ns, "addr", "add", ADDRESSES[host] + "/24", "dev", IFACE)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", IFACE, "up")

    def command(self, host, argv):
        """``argv`` as run on ``host`` (its namespace and host name) by this machine's root."""
        return ["ip", "netns", "exec", self.netns[host], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', host, *argv]

    def env(self, **extra):
        """The environment for horovodrun on hostA: the fake ssh first on PATH, and its host table."""
        env = dict(os.environ, **extra)
        env["PATH"] = self.bin + os.pathsep + env["PATH"]
        env["HH_FAKE_SSH_HOSTS"] = ",".join(f"{h}={ns}" for h, ns in self.netns.items())
        env["HH_FAKE_SSH_DIR"] = self.ssh_dir
        env["HH_FAKE_SSH_PATH"] = os.environ["PATH"]
        return env

    def cut(self):
        """Take the link down at both ends."""
        for ns in self.netns.values():
            _ip("-n", ns, "link", "set", IFACE, "down")

    def pids(self, host):
        """Process ids running in ``host``'s namespace."""
        return self.pids_of(self.netns[host])

    def remote_runs(self):
        """What the fake ssh ran: a list of dicts ``command``, ``log``, ``rc`` (None while running), ``ended`` (mtime of rc)."""
        runs = []
        for name in sorted(os.listdir(self.ssh_dir)):
            path = os.path.join(self.ssh_dir, name)
            run = {"command": open(os.path.join(path, "command")).read(),
                   "log": open(os.path.join(path, "log"), errors="replace").read(), "rc": None, "ended": None}
            rc = os.path.join(path, "rc")
            if os.path.exists(rc):
                run["rc"], run["ended"] = int(open(rc).read()), os.path.getmtime(rc)
            runs.append(run)
        return runs

    def close(self):
        for ns in self.netns.values():
            for pid in self.pids_of(ns):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        try:
            os.rmdir("/etc/netns")          # if this made it and nothing else uses it
        except OSError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def pids_of(ns):
        """Process ids running in namespace ``ns``."""
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]
