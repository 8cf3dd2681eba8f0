"""The GlusterFS test cluster itself (tests/support/cluster.py): real races, separate hosts, faults, and a clean tear-down."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from support.cluster import REGISTRY, Cluster, _alive, _ns_ids, _pids_in, _proc_stat, cluster_factory

pytestmark = pytest.mark.cluster

TESTS = Path(__file__).resolve().parent
NODE_ENV = {"PYTHONPATH": str(TESTS.parent / "src")}

# Each node races on the same names; a loser reads the winner's record at once, as the protocol does.
RACE = """
import json, socket, sys
from pathlib import Path
from elastic_sharding.fsops import make_dir_exclusive, publish_once, read_record
root, count, me = Path(sys.argv[1]), int(sys.argv[2]), socket.gethostname()
print("ready", flush=True)
sys.stdin.readline()
published, made, seen = [], [], {}
for i in range(count):
    if publish_once(root / f"rec-{i}", json.dumps({"owner": me, "i": i}).encode()):
        published.append(i)
    else:
        record = read_record(root / f"rec-{i}", json.loads)
        seen[i] = record and record["owner"]
    if make_dir_exclusive(root / f"dir-{i}"):
        made.append(i)
print(json.dumps({"published": published, "made": made, "seen": seen}))
"""

# The job directory's filesystem probe, five times on each node at once, then as prepare runs it:
# prints the mount type it saw and its median time.
PROBE = """
import json, sys, time
from pathlib import Path
from elastic_sharding import fsprobe
root = Path(sys.argv[1])
times = []
for _ in range(5):
    started = time.perf_counter()
    failure = fsprobe.probe(root)
    times.append(time.perf_counter() - started)
    assert failure is None, failure.describe()
fsprobe.check_job_filesystem(root / "job", creating=True)
print(json.dumps({"fstype": fsprobe.mount_of(root).fstype, "ms": sorted(times)[2] * 1e3}))
"""

# Write a new file every 0.2 s until the mount fails: prints the errno and how long it took.
UNTIL_FAILURE = """
import sys, time
start = time.monotonic()
for i in range(10_000):
    try:
        with open(f"{sys.argv[1]}/probe-{i}", "wb") as f:
            f.write(b"x")
    except OSError as exc:
        print(exc.errno, time.monotonic() - start)
        break
    time.sleep(0.2)
"""

HOST_GLUSTER_DIRS = [Path("/var/lib/glusterd"), Path("/var/log/glusterfs"), Path("/run/gluster")]


def host_gluster_state() -> dict[str, list[str]]:
    return {str(d): sorted(os.listdir(d)) if d.is_dir() else [] for d in HOST_GLUSTER_DIRS} | {
        "/run/glusterd.socket": [str(Path("/run/glusterd.socket").exists())]
    }


def snapshot(cluster: Cluster) -> dict:
    """What must be gone after down(), recorded while the cluster is up."""
    anchors = [cluster.server_anchor, *(node.anchor for node in cluster.nodes)]
    return namespaces_snapshot(cluster.k, cluster.private, cluster.mount, [anchor.pid for anchor in anchors if anchor])


def namespaces_snapshot(k: int, private: Path, mount: Path, anchors: list[int]) -> dict:
    ns = set().union(*(_ns_ids(pid) for pid in anchors))
    return {"k": k, "private": private, "mount": mount, "ns": ns, "procs": [(pid, _proc_stat(pid)[1]) for pid in _pids_in(ns)]}


def leftovers(snap: dict) -> list[str]:
    """Everything of a torn-down cluster that is still there.

    Namespace ids and k are reused at once by the next cluster (another test run may be building one),
    so processes are checked by (pid, start time) and a netns or mountpoint only while k is not taken again.
    """
    found = [f"process {pid}" for pid, start in snap["procs"] if _alive(pid, start)]
    netns = Path("/run/netns")
    names = [p.name for p in (netns.iterdir() if netns.is_dir() else []) if f"net:[{os.stat(p).st_ino}]" in snap["ns"]]
    mount_dir = snap["mount"].exists()
    entry = REGISTRY / str(snap["k"])  # made before a cluster's netns, removed after them: read it last
    reused = entry.is_symlink() and Path(os.readlink(entry)) != snap["private"]
    if not reused:
        found += [f"netns {name}" for name in names] + ([f"mountpoint dir {snap['mount']}"] if mount_dir else [])
        found += [f"registry entry {entry}"] if entry.is_symlink() else []
    if snap["private"].exists():
        found.append(f"private dir {snap['private']}")
    if any(line.split()[4] == str(snap["mount"]) for line in Path("/proc/self/mountinfo").read_text().splitlines()):
        found.append(f"host mount at {snap['mount']}")
    return found


def race(cluster: Cluster, count: int = 200) -> list[dict]:
    root = cluster.mount / "race"
    cluster.nodes[0].run(["mkdir", str(root)], check=True)
    procs = [
        node.popen(
            [sys.executable, "-c", RACE, str(root), str(count)],
            env=NODE_ENV,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for node in cluster.nodes
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:  # start line: both race from the same moment
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append(json.loads(out))
    return results


def probe_on_every_node(cluster: Cluster) -> list[dict]:
    root = cluster.mount / "probe"
    cluster.nodes[0].run(["mkdir", str(root)], check=True)
    procs = [
        node.popen([sys.executable, "-c", PROBE, str(root)], env=NODE_ENV, stdout=subprocess.PIPE, text=True)
        for node in cluster.nodes
    ]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        results.append(json.loads(out))
    deadline = time.monotonic() + 5  # a caching volume may list a removed name for about a second
    while (left := cluster.nodes[0].run(["ls", "-A", str(root)], check=True).stdout.split()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], "every probe directory is removed"
    return results


@pytest.mark.parametrize("mode", ["strict", "cached"])
def test_exclusive_create_and_publish_once_have_exactly_one_winner_per_name_and_the_probe_passes(gluster, mode):
    count = 200
    cluster = gluster(nodes=2, mode=mode)
    for result in probe_on_every_node(cluster):  # the job directory's filesystem probe, on both nodes at once
        assert result["fstype"] == "fuse.glusterfs", result
        print(f"GlusterFS ({mode}): the filesystem probe takes {result['ms']:.1f} ms")
    first, second = race(cluster, count)
    names = [node.name for node in cluster.nodes]
    for kind in ("published", "made"):
        assert not set(first[kind]) & set(second[kind]), f"{kind}: two winners for one name"
    assert sorted(first["published"] + second["published"]) == list(range(count)), "publish_once: a name without a winner"
    for result, other in ((first, names[1]), (second, names[0])):
        assert all(owner == other for owner in result["seen"].values()), "a loser read no or the wrong record"
    # The records as a third reader sees them afterwards.
    for i in (0, count // 2, count - 1):
        winner = names[0] if i in first["published"] else names[1]
        assert json.loads(cluster.nodes[1].read_bytes(cluster.mount / "race" / f"rec-{i}")) == {"owner": winner, "i": i}
    # Gluster's brick has a race in concurrent mkdir (posix_mkdir rolls back a directory whose gfid it
    # could not set): for ~0.3% of names BOTH sides get EEXIST, and in strict mode no directory exists
    # (in caching mode one sometimes does: seen once in CI). Never a double win, but "EEXIST" from mkdir
    # does not prove that somebody else holds the name, so the protocol never decides ownership by mkdir.
    unclaimed = sorted(set(range(count)) - set(first["made"]) - set(second["made"]))
    if mode == "strict":
        for i in unclaimed:
            assert cluster.nodes[0].run(["stat", str(cluster.mount / "race" / f"dir-{i}")]).returncode != 0, (
                "a directory nobody created"
            )
    assert len(unclaimed) <= count // 20
    if unclaimed:
        warnings.warn(f"GlusterFS ({mode}): mkdir returned EEXIST to both nodes for {unclaimed}", stacklevel=1)


def test_nodes_are_separate_hosts_and_the_host_has_no_cluster_address(gluster):
    cluster = gluster(nodes=2)
    names = [node.name for node in cluster.nodes]
    assert names == ["node1", "node2"]
    for node in cluster.nodes:
        assert node.run(["hostname"], check=True).stdout.strip() == node.name
        python = node.run([sys.executable, "-c", "import socket; print(socket.gethostname())"], check=True)
        assert python.stdout.strip() == node.name
        assert node.ip in node.run(["ip", "-4", "-o", "addr", "show"], check=True).stdout
    host = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    host += subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=True).stdout
    assert "10.200." not in host
    assert cluster.mount.is_dir() and not os.path.ismount(cluster.mount), "the volume must be mounted only inside the nodes"
    # The same volume at the same path on every node, run with the node's own cwd.
    cluster.nodes[0].run(["sh", "-c", "hostname > written-by"], cwd=cluster.mount, check=True)
    assert cluster.nodes[1].read_bytes(cluster.mount / "written-by") == b"node1\n"


def test_partition_fails_with_enotconn_and_heal_recovers(gluster):
    cluster = gluster(nodes=2)
    cut, other = cluster.nodes
    cut.partition()
    probe = cut.run([sys.executable, "-c", UNTIL_FAILURE, str(cluster.mount)], timeout=30, check=True)
    code, seconds = probe.stdout.split()
    assert int(code) == errno.ENOTCONN and float(seconds) < 15
    other.run(["touch", str(cluster.mount / "during-partition")], check=True, timeout=10)
    started = time.monotonic()
    cut.heal()
    assert time.monotonic() - started < 20
    cut.run(["touch", str(cluster.mount / "after-heal")], check=True, timeout=10)
    assert cut.read_bytes(cluster.mount / "during-partition") == b""


def test_killed_client_fails_with_enotconn_until_remount(gluster):
    cluster = gluster(nodes=2)
    node = cluster.nodes[0]
    node.run(["sh", "-c", f"echo before > {cluster.mount}/file"], check=True)
    node.kill_client()
    with pytest.raises(OSError) as failed:
        node.read_bytes(cluster.mount / "file", timeout=10)
    assert failed.value.errno == errno.ENOTCONN
    assert cluster.nodes[1].read_bytes(cluster.mount / "file") == b"before\n"
    node.remount()
    assert node.read_bytes(cluster.mount / "file") == b"before\n"


def test_down_leaves_nothing_behind():
    before = host_gluster_state()
    with cluster_factory() as make:
        cluster = make(nodes=2, mode="cached")
        straggler = cluster.nodes[0].popen(["sleep", "1000"])  # still running in a node at tear-down
        snap = snapshot(cluster)
        cluster.down()
        cluster.down()  # idempotent
        assert straggler.wait(timeout=5) == -signal.SIGKILL
    assert leftovers(snap) == []
    assert host_gluster_state() == before, "glusterd state leaked into the host"


def test_a_failing_test_body_still_tears_down():
    with pytest.raises(RuntimeError, match="the test failed"), cluster_factory() as make:
        snap = snapshot(make(nodes=1))
        raise RuntimeError("the test failed")
    assert leftovers(snap) == []


def test_a_failed_up_tears_down_what_it_built(monkeypatch):
    def broken(self):
        self.snap = snapshot(self)
        raise RuntimeError("volume creation broke")

    monkeypatch.setattr(Cluster, "_create_volume", broken)
    cluster = Cluster(nodes=2)
    with pytest.raises(RuntimeError, match="volume creation broke"):
        cluster.up()
    assert leftovers(cluster.snap) == []
    cluster.down()


def start_script(*args: str) -> tuple[subprocess.Popen, str]:
    """`python tests/support/cluster.py up ...` until it says it is up; returns it and its private dir."""
    proc = subprocess.Popen(
        [sys.executable, str(TESTS / "support" / "cluster.py"), "up", *args], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    lines = []
    while not lines or not lines[-1].startswith("Ctrl-C"):
        lines.append(proc.stdout.readline())
        assert lines[-1], f"cluster.py up exited: {lines}"
    private = next(line.split()[2].rstrip(";") for line in lines if line.startswith("private dir:"))
    return proc, private


def script_snapshot(private: str) -> dict:
    state = json.loads((Path(private) / "owner.json").read_text())
    return namespaces_snapshot(state["k"], Path(private), Path(state["mount"]), [pid for pid, _ in state["anchors"]])


def test_script_tears_down_on_sigterm():
    proc, private = start_script("--nodes", "1")
    snap = script_snapshot(private)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and "down in" in out
    assert leftovers(snap) == []


def test_up_removes_what_a_killed_owner_left_behind():
    proc, private = start_script("--nodes", "1")
    snap = script_snapshot(private)
    proc.kill()
    proc.wait()
    proc.stdout.close()  # type: ignore[union-attr]
    assert leftovers(snap) != []
    with Cluster(nodes=1):
        assert leftovers(snap) == []
