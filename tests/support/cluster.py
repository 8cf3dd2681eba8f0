#!/usr/bin/env python3
"""A GlusterFS test cluster on one machine: one server and N "nodes" that share only a network filesystem.

Why: the job protocol must hold on a real network filesystem seen from separate hosts (own hostname,
own client cache, own network link that can be cut, own client that can die), not only on one local
disk. This module builds that on one Linux machine with namespaces. It needs root, FUSE and Debian's
glusterfs-server/-client (`scripts/system-packages`); `cluster_available()` says what is missing.

Topology (k is a free index 1..250, so concurrent clusters never clash)::

    server   net+mnt+uts namespaces, netns es-srv-<k>: bridge br0 10.200.<k>.1/24, glusterd, brick of volume "es"
      | veth v<i> on br0  <->  eth0 10.200.<k>.<10+i>/24
    node i   net+mnt+uts namespaces, netns es-n<i>-<k>: hostname node<i>, glusterfs client at /mnt/es-cluster-<k>

Each set of namespaces is held by an "anchor" process (`unshare ... sleep infinity`); everything runs
in a node through `nsenter -t <anchor> -u -m -n`, which execs without forking, so a Popen's pid is the
real process. The server's mount namespace has a private tmpfs on /run (glusterd's sockets and pid
files) and binds /var/lib/glusterd and /var/log/glusterfs to this cluster's private directory: two
clusters never share glusterd state and the host's gluster directories stay untouched. The 10.200.<k>
addresses exist only inside these namespaces. The volume is mounted only inside the node mount
namespaces, at the same path on every node; the rest of the host filesystem (/work, /tmp, the venv)
is visible in every node.

Modes: "strict" turns Gluster's caches off, so exclusive create, link and rename behave as on one disk.
"cached" keeps Gluster's default caching, which behaves like a NAS with attribute caching: a racing
loser can read a just-created file as empty and changes show up to ~1 s late elsewhere. The protocol
must survive both. Both set network.ping-timeout 5, so a cut link surfaces as ENOTCONN after ~7 s.

By hand (as root):

    python tests/support/cluster.py check
    python tests/support/cluster.py up --nodes 3 --mode cached   # prints how to enter each node; Ctrl-C tears down
    nsenter -t <anchor pid> -u -m -n bash                # a shell on a node
    ip -n es-srv-<k> link set v1 down                    # cut node1 off (`up` to heal)

In tests: the `gluster` fixture (tests/conftest.py): `cluster = gluster(nodes=2, mode="strict")`, then
`cluster.nodes[0].popen([...])`, `node.partition()`, `node.kill_client()`, ...

Clean-up: `down()` runs on exit, on SIGTERM, at the end of the fixture and after a failed `up()`. It
kills every process in the cluster's namespaces (found by namespace, never by name), deletes them and
removes the private directory. Each cluster registers as /run/es-cluster/<k> -> its private directory,
which records the owner PID; a later `up()` removes what a dead owner left behind.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REGISTRY = Path("/run/es-cluster")
NETNS_DIR = Path("/run/netns")
VOLUME = "es"
MODES = ("strict", "cached")
_STRICT_OFF = [
    "stat-prefetch",
    "quick-read",
    "io-cache",
    "read-ahead",
    "readdir-ahead",
    "open-behind",
    "write-behind",
    "nl-cache",
    "flush-behind",
]
STRICT_OPTIONS = {f"performance.{name}": "off" for name in _STRICT_OFF} | {"client.strict-locks": "on"}
COMMON_OPTIONS = {"network.ping-timeout": "5"}
STRICT_CLIENT_ARGS = ["--attribute-timeout=0", "--entry-timeout=0", "--negative-timeout=0"]
NAMESPACES = ("net", "uts", "mnt")
_SBIN_PATH = os.environ.get("PATH", os.defpath) + ":/usr/local/sbin:/usr/sbin:/sbin"

# Drop the copies of other named network namespaces (other clusters') that a new mount namespace
# inherits: they would keep those namespaces alive after their owner deleted them.
_DROP_NETNS_MOUNTS = """for m in $(awk '$5 ~ "^/run/netns/." {print $5}' /proc/self/mountinfo); do umount -l "$m" || true; done"""
_SERVER_SETUP = """set -e
{drop}
mkdir -p /var/lib/glusterd /var/log/glusterfs
mount -t tmpfs -o mode=0755 es-run /run
mkdir -p /run/gluster /run/lock
mount --bind {private}/glusterd /var/lib/glusterd
mount --bind {private}/log /var/log/glusterfs
hostname {hostname}
ip link set lo up
echo ready
exec sleep infinity
"""
_NODE_SETUP = """set -e
{drop}
hostname {hostname}
ip link set lo up
echo ready
exec sleep infinity
"""
_READ_SNIPPET = """import sys
try:
    with open(sys.argv[1], "rb") as f:
        sys.stdout.buffer.write(f.read())
except OSError as e:
    sys.stderr.write(f"{e.errno} {e}")
    sys.exit(3)
"""


def _tool(name: str) -> str:
    return shutil.which(name, path=_SBIN_PATH) or name


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # deleted
        return "/"


def cluster_available() -> str | None:
    """None if a test cluster can be built here, else the reason why not."""
    if os.geteuid() != 0:
        return "the GlusterFS test cluster needs root (namespaces, FUSE mounts)"
    missing = [
        name
        for name in ("glusterd", "glusterfs", "gluster", "unshare", "nsenter", "ip")
        if shutil.which(name, path=_SBIN_PATH) is None
    ]
    if missing:
        return f"missing {', '.join(missing)} (scripts/system-packages installs glusterfs-server and glusterfs-client)"
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    probe = subprocess.run([_tool("unshare"), "-m", "-n", "-u", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create namespaces: {probe.stderr.strip()}"
    return None


# --- processes and namespaces ------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time) of a process; None once it is gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


def _alive(pid: int, start: int | None = None) -> bool:
    """Running (a zombie is not: this VM's PID 1 reaps orphans slowly) and, if given, the same process."""
    stat = _proc_stat(pid)
    return stat is not None and stat[0] != "Z" and (start is None or stat[1] == start)


def _ns_ids(pid: int | str) -> set[str]:
    return {os.readlink(f"/proc/{pid}/ns/{ns}") for ns in NAMESPACES}


def _pids_in(ids: set[str]) -> list[int]:
    """Live processes in any of these namespaces, never this process or the host's namespaces."""
    ids = ids - _ns_ids("self")
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        for ns in NAMESPACES:
            try:
                if os.readlink(f"/proc/{entry.name}/ns/{ns}") in ids:
                    found.append(int(entry.name))
                    break
            except OSError:
                break
    return [pid for pid in found if _alive(pid)]


def _kill_all(ids: set[str], children: Sequence[subprocess.Popen], timeout: float = 15.0) -> None:
    """SIGKILL everything in these namespaces until nothing is left, and reap our own children."""
    deadline = time.monotonic() + timeout
    while True:
        pids = _pids_in(ids) if ids else []
        pids += [child.pid for child in children if child.poll() is None]
        if not pids or time.monotonic() > deadline:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1)


def _netns_names(k: int | None = None) -> dict[str, int]:
    """Named network namespaces of test clusters ("es-srv-<k>", "es-n<i>-<k>") -> their k."""
    pattern = re.compile(r"es-(?:srv|n\d+)-(\d+)")
    try:
        names = os.listdir(NETNS_DIR)
    except OSError:
        return {}
    found = {name: int(m.group(1)) for name in names if (m := pattern.fullmatch(name))}
    return {name: index for name, index in found.items() if k is None or index == k}


def _ip(*args: str, batch: Sequence[str] = ()) -> None:
    cmd = [_tool("ip"), *args] + (["-batch", "-"] if batch else [])
    proc = subprocess.run(cmd, input="".join(f"{line}\n" for line in batch), capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {proc.stderr.strip()}\n{batch}")


def _mount_path(k: int) -> Path:
    return Path(f"/mnt/es-cluster-{k}")


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _owner_alive(state: dict) -> bool:
    return state.get("boot_id") == _boot_id() and _alive(state["pid"], state["start"])


def _read_state(entry: Path) -> dict | None:
    try:
        return json.loads((Path(os.readlink(entry)) / "owner.json").read_text())
    except (OSError, ValueError):
        return None


def _teardown(k: int, state: dict | None, children: Sequence[subprocess.Popen] = ()) -> None:
    """Remove everything of cluster k: processes in its namespaces, the namespaces, mounts, private dir, registry entry.

    A namespace is identified by its named netns (pinned, so its id is current) or, while it is still
    alive, by the anchor process recorded in the private directory: ids of dead namespaces can be reused.
    """
    names = _netns_names(k)
    ids: set[str] = set()
    for name in names:
        with contextlib.suppress(OSError):
            ids.add(f"net:[{os.stat(NETNS_DIR / name).st_ino}]")
    for pid, start in (state or {}).get("anchors", []):
        if _alive(pid, start):
            with contextlib.suppress(OSError):
                ids |= _ns_ids(pid)
    _kill_all(ids, children)
    if names:
        batch = "".join(f"netns delete {name}\n" for name in names)
        subprocess.run([_tool("ip"), "-force", "-batch", "-"], input=batch, capture_output=True, text=True, timeout=30)
    if state and Path(state["private"]).name.startswith("es-cluster-"):  # rm is ~1.5x faster than rmtree on a brick
        subprocess.run(["rm", "-rf", "--one-file-system", state["private"]], capture_output=True, timeout=300)
    if not os.path.ismount(mount := _mount_path(k)):  # the volume is mounted only in the nodes: this is an empty dir
        shutil.rmtree(mount, ignore_errors=True)
    entry = REGISTRY / str(k)
    if state is None or (entry.is_symlink() and os.readlink(entry) == state["private"]):
        with contextlib.suppress(FileNotFoundError):
            entry.unlink()


def _remove_stale() -> None:
    """Tear down clusters whose owner died without `down()` (caller holds the registry lock)."""
    for entry in REGISTRY.iterdir():
        if entry.name.isdigit():
            state = _read_state(entry)
            if state is None or not _owner_alive(state):
                _teardown(int(entry.name), state)
    for k in set(_netns_names().values()):
        if not (REGISTRY / str(k)).is_symlink():  # registry entries are made before and removed after the netns
            _teardown(k, None)


# --- the cluster -------------------------------------------------------------------------------


class Node:
    """One simulated host: its own hostname, network link and glusterfs client, the volume at `Cluster.mount`."""

    def __init__(self, cluster: Cluster, index: int, name: str):
        self.cluster = cluster
        self.index = index
        self.name = name
        self.netns = f"es-n{index}-{cluster.k}"
        self.ip = f"10.200.{cluster.k}.{10 + index}"
        self.veth = f"v{index}"  # the server end, in the server netns
        self.anchor: subprocess.Popen | None = None
        self.client: subprocess.Popen | None = None

    def __repr__(self) -> str:
        return f"Node({self.name!r}, ip={self.ip}, anchor={self.anchor.pid if self.anchor else None})"

    def enter(self, cwd: Path | str | None = None) -> list[str]:
        """The command prefix that runs something in this node, in `cwd` (default: ours).

        nsenter and sh both exec, so the command keeps the pid. The cd happens inside the node
        (nsenter --wd would open the directory on the host, not on the node's mount).
        """
        assert self.anchor is not None, "node is not up"
        enter = [_tool("nsenter"), "-t", str(self.anchor.pid), "-u", "-m", "-n", "--"]
        return [*enter, "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(cwd or _cwd())]

    def popen(
        self,
        args: Sequence[str | os.PathLike],
        *,
        env: dict | None = None,
        cwd: Path | str | None = None,
        stdout=None,
        stderr=None,
        stdin=None,
        text: bool = False,
        **kwargs,
    ) -> subprocess.Popen:
        """Start a process in this node; its pid is the real process, so signals hit it. `env` is merged over os.environ."""
        full_env = None if env is None else {**os.environ, **env}
        cmd = [*self.enter(cwd), *map(str, args)]
        return subprocess.Popen(cmd, env=full_env, stdout=stdout, stderr=stderr, stdin=stdin, text=text, **kwargs)

    def run(
        self,
        args: Sequence[str | os.PathLike],
        *,
        env: dict | None = None,
        cwd: Path | str | None = None,
        timeout: float | None = None,
        check: bool = False,
        input: str | None = None,
    ) -> subprocess.CompletedProcess:
        """Run a command in this node to completion, output captured as text."""
        full_env = None if env is None else {**os.environ, **env}
        cmd = [*self.enter(cwd), *map(str, args)]
        return subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout, check=check, input=input)

    def read_bytes(self, path: Path | str, timeout: float = 60) -> bytes:
        """Read a file as this node sees it; a failure raises OSError with the node's errno (e.g. ENOTCONN)."""
        proc = subprocess.run(
            [*self.enter(), sys.executable, "-I", "-c", _READ_SNIPPET, str(path)], capture_output=True, timeout=timeout
        )
        if proc.returncode == 3:
            code = int(proc.stderr.split()[0])
            raise OSError(code, os.strerror(code), str(path))
        if proc.returncode != 0:
            raise RuntimeError(f"reading {path} on {self.name} failed: {proc.stderr.decode(errors='replace')}")
        return proc.stdout

    def partition(self) -> None:
        """Cut this node off the server (its link goes down in the server netns); the mount fails with ENOTCONN after ~7 s."""
        _ip("-n", self.cluster.server_netns, "link", "set", self.veth, "down")

    def heal(self, timeout: float = 30) -> None:
        """Bring the link up again and wait until the mount answers (~3 s)."""
        _ip("-n", self.cluster.server_netns, "link", "set", self.veth, "up")
        self.wait_mounted(timeout)

    def kill_client(self) -> None:
        """SIGKILL this node's glusterfs client: every op on the mount then fails with ENOTCONN."""
        if self.client is not None:
            self.client.kill()
            self.client.wait()

    def remount(self, timeout: float = 30) -> None:
        """A fresh client mount (processes still using the dead one stay broken)."""
        self.kill_client()
        self.run([_tool("umount"), "-l", str(self.cluster.mount)], timeout=30)
        self.start_client()
        self.wait_mounted(timeout)

    def start_client(self) -> None:
        c = self.cluster
        args = [_tool("glusterfs"), "-N", f"--volfile-server={c.server_ip}", f"--volfile-id={VOLUME}"]
        args += [f"--log-file={c.private}/log/client-{self.name}.log"]
        args += STRICT_CLIENT_ARGS if c.mode == "strict" else []
        self.client = self.popen(
            [*args, str(c.mount)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_mounted(self, timeout: float = 30) -> None:
        """Wait until the volume is mounted here and a stat of its root succeeds."""
        assert self.anchor is not None
        deadline = time.monotonic() + timeout
        mountinfo = Path(f"/proc/{self.anchor.pid}/mountinfo")
        last = ""
        while time.monotonic() < deadline:
            if self.client is not None and self.client.poll() is not None:
                raise RuntimeError(
                    f"glusterfs client of {self.name} exited {self.client.returncode}, see {self.cluster.private}/log"
                )
            if any(
                line.split()[4] == str(self.cluster.mount) and " - fuse" in line for line in mountinfo.read_text().splitlines()
            ):
                try:
                    probe = self.run(
                        [_tool("stat"), "-c", "%i", str(self.cluster.mount)], timeout=max(1.0, deadline - time.monotonic())
                    )
                except subprocess.TimeoutExpired:
                    break
                if probe.returncode == 0:
                    return
                last = probe.stderr.strip()
            time.sleep(0.05)
        raise TimeoutError(f"{self.cluster.mount} did not answer on {self.name} within {timeout} s: {last}")


class Cluster:
    """One GlusterFS server and `nodes` nodes (see the module docstring); `up()` builds it, `down()` removes it."""

    _instances: set[Cluster] = set()

    def __init__(self, nodes: int = 2, mode: str = "strict", workdir: Path | None = None, hostname_prefix: str = "node"):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if not 1 <= nodes <= 200:
            raise ValueError("nodes must be 1..200")
        self.mode = mode
        self.node_count = nodes
        self.workdir = workdir
        self.hostname_prefix = hostname_prefix
        self.k: int | None = None
        self.private: Path | None = None
        self.nodes: list[Node] = []
        self.server_anchor: subprocess.Popen | None = None
        self.glusterd: subprocess.Popen | None = None
        self.timings: dict[str, float] = {}  # seconds: "up" (and its phases so far: "anchors", "volume"), "down"
        self._built = False  # something to tear down
        self._owner = os.getpid()
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        return f"Cluster(k={self.k}, mode={self.mode}, nodes={[n.name for n in self.nodes]})"

    @property
    def mount(self) -> Path:
        """Where the volume is mounted in every node (known once `up()` has picked k)."""
        if self.k is None:
            raise RuntimeError("cluster is not up")
        return _mount_path(self.k)

    @property
    def server_ip(self) -> str:
        return f"10.200.{self.k}.1"

    @property
    def server_netns(self) -> str:
        return f"es-srv-{self.k}"

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> Cluster:
        """Build the cluster; on any failure everything built so far is removed again."""
        if self.k is not None:
            raise RuntimeError("a Cluster is brought up once; make a new one")
        reason = cluster_available()
        if reason is not None:
            raise RuntimeError(f"test cluster unavailable: {reason}")
        started = time.monotonic()
        _register(self)
        try:
            self._claim()
            self._build()
        except BaseException:
            self.down()
            raise
        self.timings["up"] = time.monotonic() - started
        return self

    def down(self) -> None:
        """Remove everything of this cluster; idempotent, safe after a partial `up()`."""
        with self._lock:
            started = time.monotonic()
            if self._built and self.k is not None:
                children = [p for p in (self.glusterd, self.server_anchor) if p]
                children += [p for node in self.nodes for p in (node.client, node.anchor) if p]
                keep = os.environ.get("ES_CLUSTER_KEEP_LOGS")  # a directory to copy the gluster logs to, for debugging
                if keep and self.private is not None:
                    with contextlib.suppress(OSError):
                        shutil.copytree(self.private / "log", Path(keep) / f"es-cluster-{self.k}-{time.time():.0f}")
                _teardown(self.k, self._state(), children)
                self._built = False
                self.timings["down"] = time.monotonic() - started
            Cluster._instances.discard(self)

    def gluster(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        """Run the gluster CLI against this cluster's glusterd (e.g. `volume set es ...`)."""
        assert self.server_anchor is not None
        cmd = [_tool("nsenter"), "-t", str(self.server_anchor.pid), "-m", "-n", "--", _tool("gluster"), "--mode=script", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    # --- bring-up steps ---

    def _state(self) -> dict:
        anchors = [p for p in [self.server_anchor, *(n.anchor for n in self.nodes)] if p is not None]
        return {
            "pid": os.getpid(),
            "start": _proc_stat(os.getpid())[1],  # type: ignore[index]
            "boot_id": _boot_id(),
            "k": self.k,
            "private": str(self.private),
            "mount": str(self.mount),
            "anchors": [[p.pid, stat[1]] for p in anchors if (stat := _proc_stat(p.pid))],
        }

    def _save_state(self) -> None:
        assert self.private is not None
        tmp = self.private / "owner.json.tmp"
        tmp.write_text(json.dumps(self._state()))
        tmp.replace(self.private / "owner.json")

    def _claim(self) -> None:
        """Pick a free k under the registry lock, after removing what dead owners left behind."""
        REGISTRY.mkdir(parents=True, exist_ok=True)
        with open(REGISTRY / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _remove_stale()
            taken = {int(p.name) for p in REGISTRY.iterdir() if p.name.isdigit()} | set(_netns_names().values())
            free = [k for k in range(1, 251) if k not in taken]
            if not free:
                raise RuntimeError("no free cluster index (250 test clusters exist)")
            private = Path(tempfile.mkdtemp(prefix=f"es-cluster-{free[0]}-", dir=self.workdir))
            self.k, self.private, self._built = free[0], private, True
            self._save_state()
            (REGISTRY / str(self.k)).symlink_to(private)

    def _anchor(self, script: str, log: str) -> subprocess.Popen:
        assert self.private is not None
        with open(self.private / "log" / log, "wb") as err:
            cmd = [_tool("unshare"), "--mount", "--net", "--uts", "--propagation", "private", "--", "sh", "-c", script]
            env = {**os.environ, "PATH": _SBIN_PATH}
            return subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True
            )

    def _await_anchor(self, proc: subprocess.Popen, log: str) -> None:
        assert proc.stdout is not None and self.private is not None
        line = proc.stdout.readline()
        proc.stdout.close()
        if line.strip() != b"ready":
            raise RuntimeError(f"namespace anchor failed: {(self.private / 'log' / log).read_text()}")

    def _build(self) -> None:
        started = time.monotonic()
        k, private = self.k, self.private
        assert k is not None and private is not None
        for name in ("glusterd", "log", "brick"):
            (private / name).mkdir()
        self.mount.mkdir(parents=True, exist_ok=True)
        self.server_anchor = self._anchor(
            _SERVER_SETUP.format(drop=_DROP_NETNS_MOUNTS, private=private, hostname=self.server_netns), "anchor-server.log"
        )
        self.nodes = [Node(self, i, f"{self.hostname_prefix}{i}") for i in range(1, self.node_count + 1)]
        for node in self.nodes:
            node.anchor = self._anchor(_NODE_SETUP.format(drop=_DROP_NETNS_MOUNTS, hostname=node.name), f"anchor-{node.name}.log")
        self._await_anchor(self.server_anchor, "anchor-server.log")
        self._save_state()
        with open(private / "log" / "glusterd.out", "wb") as out:
            cmd = [_tool("nsenter"), "-t", str(self.server_anchor.pid), "-m", "-n", "-u", "--", _tool("glusterd"), "-N"]
            self.glusterd = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
        for node in self.nodes:
            assert node.anchor is not None
            self._await_anchor(node.anchor, f"anchor-{node.name}.log")
        self._save_state()
        anchors = {self.server_netns: self.server_anchor, **{node.netns: node.anchor for node in self.nodes}}
        _ip(batch=[f"netns attach {name} {anchor.pid}" for name, anchor in anchors.items() if anchor])
        self.timings["anchors"] = time.monotonic() - started
        server_net = ["link add br0 type bridge forward_delay 0", f"addr add {self.server_ip}/24 dev br0", "link set br0 up"]
        for node in self.nodes:
            server_net += [
                f"link add {node.veth} type veth peer name eth0 netns {node.netns}",
                f"link set {node.veth} master br0 up",
            ]
        _ip("-n", self.server_netns, batch=server_net)
        for node in self.nodes:
            _ip("-n", node.netns, batch=[f"addr add {node.ip}/24 dev eth0", "link set eth0 up"])
        self._create_volume()
        self.timings["volume"] = time.monotonic() - started
        for node in self.nodes:
            node.start_client()
        for node in self.nodes:
            node.wait_mounted()

    def _create_volume(self) -> None:
        assert self.server_anchor is not None and self.glusterd is not None and self.private is not None
        socket = Path(f"/proc/{self.server_anchor.pid}/root/run/glusterd.socket")
        deadline = time.monotonic() + 30
        while True:
            if self.glusterd.poll() is not None:
                raise RuntimeError(
                    f"glusterd exited {self.glusterd.returncode}: {(self.private / 'log' / 'glusterd.out').read_text()}"
                )
            if socket.exists():
                created = self.gluster("volume", "create", VOLUME, f"{self.server_ip}:{self.private / 'brick'}", "force")
                if created.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"gluster volume create failed: {created.stdout}{created.stderr}")
            elif time.monotonic() > deadline:
                raise RuntimeError("glusterd did not start within 30 s")
            time.sleep(0.05)
        options = COMMON_OPTIONS | (STRICT_OPTIONS if self.mode == "strict" else {})
        for args in (["volume", "set", VOLUME, *(x for kv in options.items() for x in kv)], ["volume", "start", VOLUME]):
            proc = self.gluster(*args)
            if proc.returncode != 0:
                raise RuntimeError(f"gluster {' '.join(args)} failed: {proc.stdout}{proc.stderr}")


# --- clean-up on exit and SIGTERM ----------------------------------------------------------------

_handlers_installed = False


def _down_all() -> None:
    for cluster in list(Cluster._instances):
        if cluster._owner == os.getpid():  # not in a forked child that exits
            with contextlib.suppress(Exception):
                cluster.down()


def _on_sigterm(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _down_all()
    os.kill(os.getpid(), signal.SIGTERM)


def _register(cluster: Cluster) -> None:
    """Track live clusters so that exit and SIGTERM (when nobody else handles it) still tear them down."""
    global _handlers_installed
    Cluster._instances.add(cluster)
    if not _handlers_installed:
        _handlers_installed = True
        atexit.register(_down_all)
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)


# --- pytest ------------------------------------------------------------------------------------


@contextlib.contextmanager
def built_for_a_test(reason: str | None, what: str) -> Iterator[list]:
    """Skip (or fail, with ELASTIC_SHARD_REQUIRE_CLUSTER=1) when `reason` says `what` cannot be built;
    else yield a list for what the test builds, and tear it all down afterwards, newest first."""
    import pytest

    if reason is not None:
        if os.environ.get("ELASTIC_SHARD_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"{what} required (ELASTIC_SHARD_REQUIRE_CLUSTER=1) but unavailable: {reason}")
        pytest.skip(reason)
    made: list = []
    try:
        yield made
    finally:
        errors = []
        for thing in reversed(made):
            try:
                thing.down()
            except Exception as exc:  # still tear down the others
                errors.append(exc)
        if errors:
            raise errors[0]


@contextlib.contextmanager
def cluster_factory() -> Iterator[Callable[..., Cluster]]:
    """Behind the `gluster` fixture: skip (or fail, with ELASTIC_SHARD_REQUIRE_CLUSTER=1) if unavailable; tear all down."""
    with built_for_a_test(cluster_available(), "test cluster") as made:

        def make(nodes: int = 2, mode: str = "strict", **kwargs) -> Cluster:
            cluster = Cluster(nodes, mode, **kwargs)
            made.append(cluster)
            return cluster.up()

        yield make


# --- script ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A GlusterFS test cluster of network namespaces on this machine.")
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build a cluster and keep it until Ctrl-C/SIGTERM")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--mode", choices=MODES, default="strict")
    up.add_argument("--workdir", type=Path, default=None, help="where the private directory goes (default: the temp dir)")
    up.add_argument("--hostname-prefix", default="node")
    commands.add_parser("check", help="say whether a cluster can be built here")
    args = parser.parse_args(argv)
    if args.command == "check":
        reason = cluster_available()
        print("available" if reason is None else f"unavailable: {reason}")
        return 0 if reason is None else 1
    signal.signal(signal.SIGTERM, _interrupt)
    cluster = Cluster(args.nodes, args.mode, args.workdir, args.hostname_prefix)
    try:
        cluster.up()
        print(
            f"mount: {cluster.mount} ({cluster.mode} mode) on every node; server {cluster.server_ip} in netns {cluster.server_netns}"
        )
        print(f"private dir: {cluster.private}; up in {cluster.timings['up']:.1f} s")
        for node in cluster.nodes:
            assert node.anchor is not None
            print(f"  {node.name}  {node.ip}  enter: nsenter -t {node.anchor.pid} -u -m -n bash", end="")
            print(f"   cut off: ip -n {cluster.server_netns} link set {node.veth} down")
        print("Ctrl-C or SIGTERM tears it down.", flush=True)
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        cluster.down()
    print(f"down in {cluster.timings.get('down', 0):.1f} s")
    return 0


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
