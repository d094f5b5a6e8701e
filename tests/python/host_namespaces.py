"""Two "hosts" on one machine: network namespaces joined by a veth pair.

    with TwoHosts() as hosts:
        hosts.popen(0, ["python", ...])          # runs inside host 0's namespace
        hosts.set_link(1, up=False)              # host 1 loses the network
        hosts.kill_host(1)                       # SIGKILL every process of host 1

Each namespace has loopback and one end of the veth pair, with its address
(10.231.0.1/24 and 10.231.0.2/24) assigned only inside the namespace: traffic goes
between the two or over loopback, never out of the machine. The file system is
shared (namespaces separate the network only), so a folder of the test is the
hosts' shared file system.

Namespaces are named "hpdcp-<pid of the owning test>-<host>"; opening removes
those whose owner is gone (a test killed before its cleanup), closing (also at
interpreter exit) kills every process left inside and deletes them. Creating them
needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN): when it fails, NamespaceError says
why, and the test fails with it.
"""

import atexit
import json
import os
import signal
import subprocess
import time

PREFIX = "hpdcp-"
ADDRESSES = ("10.231.0.1", "10.231.0.2")
COMMAND_TIMEOUT_S = 20


class NamespaceError(RuntimeError):
    pass


def _ip(*args, check=True):
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise NamespaceError(f"ip {' '.join(args)}: {error}") from error
    if check and result.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    return result


def _pids_in(namespace):
    result = _ip("netns", "pids", namespace, check=False)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def _kill_all_in(namespace):
    """SIGKILLs every process in the namespace; True once none is left (bounded)."""
    for _ in range(50):
        pids = _pids_in(namespace)
        if not pids:
            return True
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    return not _pids_in(namespace)


def _delete(namespace):
    _kill_all_in(namespace)
    _ip("netns", "delete", namespace, check=False)


def remove_stale():
    """Deletes namespaces of this prefix whose owning process is gone."""
    listing = _ip("netns", "list", check=False).stdout.split("\n")
    for line in listing:
        name = line.split(" ")[0]
        if not name.startswith(PREFIX):
            continue
        owner = name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not os.path.exists(f"/proc/{owner}"):
            _delete(name)


class TwoHosts:
    def __init__(self):
        self.names = [f"{PREFIX}{os.getpid()}-{host}" for host in (0, 1)]
        self.interfaces = ["hpdcp0", "hpdcp1"]
        self.addresses = ADDRESSES
        self._open = False

    def __enter__(self):
        self.open()
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def open(self):
        if os.geteuid() != 0:
            raise NamespaceError(f"network namespaces need root; running as uid {os.geteuid()}")
        remove_stale()
        atexit.register(self.close)
        self._open = True
        for name in self.names:
            _ip("netns", "add", name)
        a, b = self.names
        _ip("link", "add", self.interfaces[0], "netns", a, "type", "veth", "peer", "name", self.interfaces[1],
            "netns", b)
        for host, name in enumerate(self.names):
            _ip("-n", name, "addr", "add", f"{self.addresses[host]}/24", "dev", self.interfaces[host])
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "link", "set", self.interfaces[host], "up")

    def close(self):
        if not self._open:
            return
        self._open = False
        for name in self.names:
            _delete(name)

    def popen(self, host, args, **kwargs):
        """Starts `args` inside host `host`'s namespace (ip netns exec)."""
        return subprocess.Popen(["ip", "netns", "exec", self.names[host], *args], **kwargs)

    def run(self, host, args, timeout=COMMAND_TIMEOUT_S):
        return subprocess.run(["ip", "netns", "exec", self.names[host], *args], capture_output=True, text=True,
                              timeout=timeout)

    def set_link(self, host, up):
        _ip("-n", self.names[host], "link", "set", self.interfaces[host], "up" if up else "down")

    def pids(self, host):
        return _pids_in(self.names[host])

    def kill_host(self, host):
        """SIGKILL to every process of the host; True once none is left."""
        return _kill_all_in(self.names[host])


def process_state(pid):
    """The state letter of /proc/PID/stat; None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def all_gone(pids, timeout=60):
    """True once none of `pids` runs (bounded). A zombie has exited: its parent
    (a torchrun agent busy in a rendezvous) may reap it much later."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(process_state(pid) in (None, "Z") for pid in pids):
            return True
        time.sleep(0.02)
    return False


class EventLog:
    """A JSON-lines file that the ranks of several hosts append to, read as it grows."""

    def __init__(self, path):
        self.path, self.offset, self.partial, self.events = path, 0, b"", []

    def poll(self):
        """Reads what was appended since the last poll; returns every event so far."""
        if not os.path.exists(self.path):
            return self.events
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        self.events.extend(json.loads(line) for line in lines if line.strip())
        return self.events

    def matching(self, event, since=0.0, **fields):
        return [e for e in self.poll() if e["event"] == event and e["t"] >= since and
                all(e.get(k) == v for k, v in fields.items())]

