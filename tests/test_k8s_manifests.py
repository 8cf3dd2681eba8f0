"""The Kubernetes manifests of docs/guides/kubernetes.md do what the guide says.

Every ```yaml block of the guide is parsed (the Chinese twin must carry the same YAML). The
Indexed Job, the Kubeflow PyTorchJob and the Volcano Job are checked field by field (a shared
ReadWriteMany claim mounted where the command's job directory lies, the run id from the downward
API, a grace period to drain in, the command in exec form); then every pod of each manifest is
simulated as its controller would create it (the variables and labels it sets, the hostname it
gives), its environment resolved from the manifest the way the kubelet resolves it, and
`scheduler.detect` must find the right scheduler, node index and node count and one run id
shared by every pod and new for every submission. Finally each command goes through the CLI's
own parser, so a renamed or removed flag breaks this test. The last test runs three pods of the
Indexed Job as processes on separate nodes of a GlusterFS cluster, with their hostnames and
environments, through a whole job (the fake processor in place of Data-Juicer).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from elastic_sharding.cli.parser import build_parser
from elastic_sharding.errors import UsageError
from elastic_sharding.launch.scheduler import detect, resolve_run_id

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guides" / "kubernetes.md"
ZH_GUIDE = REPO / "docs" / "zh" / "guides" / "kubernetes.md"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```", flags=re.S | re.M)
NAMESPACE = "data"
MIN_GRACE_SECS = 60  # the guide advises 120; Kubernetes' default of 30 is too short to drain on a loaded filesystem
SHELLS = {"sh", "bash", "dash", "ash", "zsh"}


def yaml_blocks(path: Path) -> list[str]:
    return YAML_BLOCK.findall(path.read_text())


def documents() -> list[dict[str, Any]]:
    docs = [doc for block in yaml_blocks(GUIDE) for doc in yaml.safe_load_all(block) if doc is not None]
    assert all(isinstance(doc, dict) and "kind" in doc for doc in docs), "every yaml block of the guide is a Kubernetes object"
    return docs


def one(kind: str, api_group: str) -> dict[str, Any]:
    found = [doc for doc in documents() if doc["kind"] == kind and doc["apiVersion"].split("/")[0] == api_group]
    assert len(found) == 1, f"the guide has {len(found)} {api_group} {kind} manifests, expected one"
    return found[0]


def indexed_job() -> dict[str, Any]:
    return one("Job", "batch")


def pytorch_job() -> dict[str, Any]:
    return one("PyTorchJob", "kubeflow.org")


def volcano_job() -> dict[str, Any]:
    return one("Job", "batch.volcano.sh")


def claim() -> dict[str, Any]:
    return one("PersistentVolumeClaim", "v1")


# -- the pieces every manifest has ---------------------------------------------------------------


def pod_templates(manifest: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """(replica type or task name, replicas, pod template) of a manifest, in the order pods are numbered."""
    spec = manifest["spec"]
    if manifest["kind"] == "PyTorchJob":
        replicas = spec["pytorchReplicaSpecs"]
        order = sorted(replicas, key=lambda name: (name != "Master", name))
        return [(name, replicas[name]["replicas"], replicas[name]["template"]) for name in order]
    if manifest["apiVersion"].startswith("batch.volcano.sh/"):
        return [(task["name"], task["replicas"], task["template"]) for task in spec["tasks"]]
    return [("", spec["completions"], spec["template"])]


def the_container(template: dict[str, Any]) -> dict[str, Any]:
    containers = template["spec"]["containers"]
    assert len(containers) == 1, "one container per pod: the worker"
    return containers[0]


def env_source(container: dict[str, Any], name: str) -> dict[str, Any]:
    entries = [entry for entry in container.get("env", []) if entry["name"] == name]
    assert len(entries) == 1, f"the container sets ${name} {len(entries)} times, expected once"
    return entries[0]


def run_id_field(container: dict[str, Any]) -> str:
    entry = env_source(container, "ELASTIC_SHARD_RUN_ID")
    assert "value" not in entry, "a literal run id is the same for every submission: take it from the downward API"
    return entry["valueFrom"]["fieldRef"]["fieldPath"]


def dlc_arguments(argv: list[str]) -> list[str]:
    """The arguments after the program of an exec-form `elastic-shard dlc` (or `python -m elastic_sharding dlc`)."""
    assert argv, "the container has no command"
    program = PurePosixPath(argv[0]).name
    assert program not in SHELLS, (
        f"the command runs through {program}, which does not pass SIGTERM on: the pod would be killed without draining; "
        "write it in exec form"
    )
    if program == "elastic-shard":
        return argv[1:]
    if re.fullmatch(r"python(3(\.\d+)?)?", program) and argv[1:3] == ["-m", "elastic_sharding"]:
        return argv[3:]
    raise AssertionError(f"the command {shlex.join(argv)} does not run `elastic-shard dlc`")


def parse(argv: list[str]):
    try:
        args = build_parser().parse_args(dlc_arguments(argv))
    except SystemExit as exc:  # argparse has printed why on stderr
        raise AssertionError(f"`elastic-shard` refuses the manifest's command {shlex.join(argv)}") from exc
    assert args.command == "dlc", f"the manifest runs `elastic-shard {args.command}`, not `dlc`"
    assert not args.explain, "--explain only prints what the pod detected"
    return args


def shared_mounts(manifest: dict[str, Any], template: dict[str, Any]) -> list[PurePosixPath]:
    """The mount paths of the guide's ReadWriteMany claim in this pod."""
    name = claim()["metadata"]["name"]
    volumes = {
        v["name"] for v in template["spec"].get("volumes", []) if v.get("persistentVolumeClaim", {}).get("claimName") == name
    }
    assert volumes, f"{manifest['kind']} mounts no volume of the claim {name!r}"
    mounts = [PurePosixPath(m["mountPath"]) for m in the_container(template).get("volumeMounts", []) if m["name"] in volumes]
    assert mounts, f"{manifest['kind']} declares the claim {name!r} but mounts it nowhere"
    return mounts


def under(path: PurePosixPath, mounts: list[PurePosixPath]) -> bool:
    return any(path == mount or mount in path.parents for mount in mounts)


# -- Kubernetes, simulated: the pods a controller creates and the environment the kubelet gives -----


@dataclass
class Pod:
    role: str  # the replica type or task whose template made it
    hostname: str
    name: str
    labels: dict[str, str]
    annotations: dict[str, str]
    injected: dict[str, str]  # what the controller adds to the container's environment
    expected: dict[str, Any]  # what detect must find


FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")


def resolve_field(pod: Pod, path: str) -> str:
    """A downward-API fieldRef, as the kubelet resolves it for an environment variable."""
    match = FIELD.match(path)
    if match:
        kind, key = match.groups()
        values = pod.labels if kind == "labels" else pod.annotations
        assert key in values, f"the manifest reads the {kind[:-1]} {key!r}, which this controller does not set on its pods"
        return values[key]
    plain = {"metadata.name": pod.name, "metadata.namespace": NAMESPACE, "spec.nodeName": f"node-of-{pod.name}"}
    assert path in plain, f"the simulated pod does not provide the field {path!r}"
    return plain[path]


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` references in values, commands and arguments (`$$` escapes)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text
    )


def environment(pod: Pod, container: dict[str, Any]) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOSTNAME": pod.hostname,
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBERNETES_PORT": "tcp://10.96.0.1:443",
    }
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = expand(str(entry["value"]), env)
        else:
            source = entry["valueFrom"]
            assert set(source) == {"fieldRef"}, f"${entry['name']}: only downward-API fields are simulated, not {sorted(source)}"
            env[entry["name"]] = resolve_field(pod, source["fieldRef"]["fieldPath"])
    env.update(pod.injected)
    return env


def command(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    return [expand(str(part), env) for part in [*container.get("command", []), *container.get("args", [])]]


def indexed_job_pods(manifest: dict[str, Any], uid: str) -> Iterator[Pod]:
    """The Job controller: one pod per index, hostname `<job>-<index>`, JOB_COMPLETION_INDEX."""
    name = manifest["metadata"]["name"]
    template_labels = manifest["spec"]["template"].get("metadata", {}).get("labels", {})
    nodes = int(env_source(the_container(manifest["spec"]["template"]), "ELASTIC_SHARD_NODES")["value"])
    for index in range(manifest["spec"]["completions"]):
        labels = {
            **template_labels,
            "batch.kubernetes.io/controller-uid": uid,
            "controller-uid": uid,
            "batch.kubernetes.io/job-name": name,
            "job-name": name,
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
        yield Pod(
            role="",
            hostname=f"{name}-{index}",
            name=f"{name}-{index}-x{index}z9q",
            labels=labels,
            annotations=annotations,
            injected={"JOB_COMPLETION_INDEX": str(index)},
            expected={"scheduler": "kubernetes", "shape": "indexed", "node_index": index, "nodes": nodes, "run_id": uid},
        )


def pytorch_job_pods(manifest: dict[str, Any], uid: str) -> Iterator[Pod]:
    """Kubeflow's training operator: `<job>-master-0`, `<job>-worker-<i>`; RANK, WORLD_SIZE, PET_*."""
    name = manifest["metadata"]["generateName"] + uid[:5]  # what the API server makes of generateName
    templates = pod_templates(manifest)
    total = sum(replicas for _, replicas, _ in templates)
    for replica_type, replicas, _ in templates:
        for index in range(replicas):
            rank = index if replica_type == "Master" else index + 1  # the operator's numbering: the Master is rank 0
            pod_name = f"{name}-{replica_type.lower()}-{index}"
            labels = {
                "training.kubeflow.org/job-name": name,
                "training.kubeflow.org/operator-name": "pytorchjob-controller",
                "training.kubeflow.org/replica-type": replica_type.lower(),
                "training.kubeflow.org/replica-index": str(index),
            }
            if replica_type == "Master":
                labels["training.kubeflow.org/job-role"] = "master"
            injected = {
                "PYTHONUNBUFFERED": "1",
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": "23456",
                "PET_MASTER_ADDR": f"{name}-master-0",
                "PET_MASTER_PORT": "23456",
                "WORLD_SIZE": str(total),
                "RANK": str(rank),
                "PET_NODE_RANK": str(rank),
                "PET_NNODES": str(total),
            }
            yield Pod(
                role=replica_type,
                hostname=pod_name,
                name=pod_name,
                labels=labels,
                annotations={},
                injected=injected,
                expected={"scheduler": "kubeflow", "shape": "ranks", "node_index": rank, "nodes": total, "run_id": name},
            )


def volcano_job_pods(manifest: dict[str, Any], uid: str) -> Iterator[Pod]:
    """Volcano's job controller: `<job>-<task>-<i>`, the PodGroup `<job>-<uid>`; its env and svc plugins."""
    name = manifest["metadata"]["name"]
    group = f"{name}-{uid}"
    plugins = manifest["spec"].get("plugins", {})
    tasks = pod_templates(manifest)
    svc: dict[str, str] = {}
    if "svc" in plugins:
        for task, replicas, _ in tasks:
            key = task.replace("-", "_").upper()
            svc[f"VC_{key}_HOSTS"] = ",".join(f"{name}-{task}-{i}.{name}" for i in range(replicas))
            svc[f"VC_{key}_NUM"] = str(replicas)
    for task, replicas, _ in tasks:
        for index in range(replicas):
            pod_name = f"{name}-{task}-{index}"
            injected = dict(svc)
            if "env" in plugins:
                injected |= {"VK_TASK_INDEX": str(index), "VC_TASK_INDEX": str(index)}
            yield Pod(
                role=task,
                hostname=pod_name,
                name=pod_name,
                labels={"volcano.sh/job-name": name, "volcano.sh/job-namespace": NAMESPACE, "volcano.sh/task-spec": task},
                annotations={
                    "scheduling.k8s.io/group-name": group,
                    "volcano.sh/job-name": name,
                    "volcano.sh/job-version": "0",
                    "volcano.sh/task-spec": task,
                },
                injected=injected,
                expected={"scheduler": "volcano", "shape": "indexed", "node_index": index, "nodes": replicas, "run_id": group},
            )


@dataclass
class Kind:
    name: str
    manifest: Callable[[], dict[str, Any]]
    pods: Callable[[dict[str, Any], str], Iterator[Pod]]
    run_id_field: str


KINDS = [
    Kind("indexed-job", indexed_job, indexed_job_pods, "metadata.labels['batch.kubernetes.io/controller-uid']"),
    Kind("pytorchjob", pytorch_job, pytorch_job_pods, "metadata.labels['training.kubeflow.org/job-name']"),
    Kind("volcano-job", volcano_job, volcano_job_pods, "metadata.annotations['scheduling.k8s.io/group-name']"),
]
SUBMISSIONS = ("5d0c3b1e-94a2-4f57-8b1c-2e6f0a9d7c41", "c8e1f7a2-0b3d-4c69-9e85-71d4a6b2f3e0")  # two submissions' uids


# -- the guide --------------------------------------------------------------------------------------


def test_the_chinese_guide_carries_the_same_yaml():
    assert yaml_blocks(GUIDE), f"{GUIDE.relative_to(REPO)} has no yaml block"
    assert yaml_blocks(ZH_GUIDE) == yaml_blocks(GUIDE)


def test_the_claim_is_read_write_many():
    pvc = claim()
    assert "ReadWriteMany" in pvc["spec"]["accessModes"], "every pod of every node writes the job directory"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_every_pod_runs_dlc_on_the_shared_claim_and_has_time_to_drain(kind):
    manifest = kind.manifest()
    for role, _, template in pod_templates(manifest):
        container = the_container(template)
        argv = command(container, {})
        args = parse(argv)
        mounts = shared_mounts(manifest, template)
        job_dir = PurePosixPath(str(args.job_dir))
        assert job_dir.is_absolute() and under(job_dir.parent, mounts), (
            f"{role or manifest['kind']}: --job-dir {job_dir} is not on the shared claim (mounted at {', '.join(map(str, mounts))})"
        )
        for flag, path in (("--config", args.config), ("--dataset-path", args.dataset_path), ("--output", args.output)):
            if path is not None:
                assert under(PurePosixPath(str(path)), mounts), (
                    f"{flag} {path} is not on the shared claim: other pods cannot read it"
                )
        field = run_id_field(container)
        assert field == kind.run_id_field, (
            f"$ELASTIC_SHARD_RUN_ID from {field}; the guide's run id table says {kind.run_id_field}"
        )
        grace = template["spec"].get("terminationGracePeriodSeconds")
        assert grace is not None and grace >= MIN_GRACE_SECS, (
            f"terminationGracePeriodSeconds {grace}: the default 30 s is too short to drain"
        )
        shm = {v["name"] for v in template["spec"].get("volumes", []) if v.get("emptyDir", {}).get("medium") == "Memory"}
        assert any(m["mountPath"] == "/dev/shm" and m["name"] in shm for m in container.get("volumeMounts", [])), (
            "Ray's object store needs a memory-backed /dev/shm"
        )


def test_the_indexed_job():
    job = indexed_job()
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"], "one pod per node, all of them allowed to run at once"
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never", "podFailurePolicy requires restartPolicy: Never"
    container = the_container(spec["template"])
    nodes = env_source(container, "ELASTIC_SHARD_NODES")["value"]
    assert nodes == str(spec["completions"]), f"ELASTIC_SHARD_NODES={nodes} but completions={spec['completions']}"
    rules = spec["podFailurePolicy"]["rules"]
    actions = [rule["action"] for rule in rules]
    ignore = actions.index("Ignore")
    assert {"type": "DisruptionTarget"} in [{"type": c["type"]} for c in rules[ignore]["onPodConditions"]]
    fail = actions.index("FailJob")
    assert ignore < fail, "a drained pod also exits 2: disruptions must be ignored before exit 2 fails the Job"
    assert rules[fail]["onExitCodes"]["operator"] == "In" and rules[fail]["onExitCodes"]["values"] == [2]
    assert rules[fail]["onExitCodes"].get("containerName", container["name"]) == container["name"]


def test_the_pytorchjob():
    job = pytorch_job()
    assert "generateName" in job["metadata"] and "name" not in job["metadata"], (
        "the run id is the job's name: only generateName makes it new for every submission"
    )
    spec = job["spec"]
    assert "elasticPolicy" not in spec, "elasticPolicy turns PET_NNODES into a range, which dlc refuses"
    assert spec.get("nprocPerNode", "1") in ("1", 1), "one worker per pod"
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1, "the operator sets RANK and WORLD_SIZE only with one Master"
    for role, replica in replicas.items():
        assert replica["restartPolicy"] != "ExitCode", f"{role}: ExitCode takes a drained pod's exit 2 as a permanent failure"
        assert the_container(replica["template"])["name"] == "pytorch", "the operator configures the container named pytorch"
    assert spec["runPolicy"]["schedulingPolicy"]["minAvailable"] == 1, "no gang wait: start with the first pod"


def test_the_volcano_job():
    job = volcano_job()
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["minAvailable"] == 1, "no gang wait: start with the first pod"
    assert {"env", "svc"} <= set(spec["plugins"]), "env sets VC_TASK_INDEX, svc VC_<TASK>_NUM and the pods' hostnames"
    assert not [p for p in spec.get("policies", []) if p.get("action") == "RestartJob"], (
        "RestartJob kills every pod for one eviction"
    )
    for task in spec["tasks"]:
        assert task["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


# -- every pod finds its place ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_every_pod_detects_its_scheduler_index_node_count_and_one_run_id(kind):
    manifest = kind.manifest()
    templates = {role: template for role, _, template in pod_templates(manifest)}
    run_ids = []
    for uid in SUBMISSIONS:
        pods = list(kind.pods(manifest, uid))
        assert len({pod.hostname for pod in pods}) == len(pods), "every pod needs its own hostname"
        found = []
        for pod in pods:
            container = the_container(templates[pod.role])
            env = environment(pod, container)
            parse(command(container, env))
            placement = detect(env, hostname=pod.hostname)
            seen = {
                "scheduler": placement.scheduler,
                "shape": placement.shape,
                "node_index": placement.node_index,
                "nodes": placement.nodes,
                "run_id": placement.run_id,
            }
            assert seen == pod.expected, f"{pod.name}: detected {seen}, expected {pod.expected}\n" + placement.describe()
            assert placement.node_name == pod.hostname
            assert placement.warnings == (), f"{pod.name}: " + "; ".join(placement.warnings)
            found.append(placement)
        assert sorted(p.node_index for p in found) == list(range(len(pods))), "the indexes are 0 .. N-1, each once"
        assert len({p.run_id for p in found}) == 1, "every pod of one submission has the same run id"
        run_ids.append(found[0].run_id)
    assert run_ids[0] != run_ids[1], "a new submission must get a new run id"


def test_a_pod_without_the_run_id_is_warned_and_named_the_variable():
    """What the guide's "no run id" section shows: the variable is named before anything runs."""
    manifest = indexed_job()
    pod = next(indexed_job_pods(manifest, SUBMISSIONS[0]))
    container = dict(the_container(manifest["spec"]["template"]))
    container["env"] = [entry for entry in container["env"] if entry["name"] != "ELASTIC_SHARD_RUN_ID"]
    placement = detect(environment(pod, container), hostname=pod.hostname)
    assert placement.run_id is None
    assert any("ELASTIC_SHARD_RUN_ID" in warning for warning in placement.warnings)
    with pytest.raises(UsageError, match="ELASTIC_SHARD_RUN_ID"):
        resolve_run_id(None, placement)


@pytest.mark.cluster
def test_the_indexed_job_runs_as_n_pods_with_their_variables_and_hostnames_on_a_shared_volume(gluster, tmp_path):
    """The guide's Indexed Job, three pods of it: each a node of a GlusterFS cluster with the pod's
    hostname and the environment the kubelet would give it, running the manifest's own command
    (paths moved onto the test's volume, the fake processor in place of Data-Juicer). No --nodes
    and no --run-id: strict mode gets its node count from ELASTIC_SHARD_NODES and every pod its run
    id from the controller-uid label, so the three finish one job, each with shards of its own."""
    import copy
    import json
    import os
    import subprocess
    import sys

    from support.fake_worker import launch_command
    from support.jobs import sample_rows, write_jsonl
    from support.launchers import LAUNCH_RECIPE, QUICK

    manifest = copy.deepcopy(indexed_job())
    manifest["spec"]["completions"] = manifest["spec"]["parallelism"] = 3
    container = the_container(manifest["spec"]["template"])
    env_source(container, "ELASTIC_SHARD_NODES")["value"] = "3"
    cluster = gluster(nodes=3, mode="cached")
    dataset = write_jsonl(tmp_path / "input.jsonl", sample_rows(24))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(LAUNCH_RECIPE.format(dataset=dataset))
    job = cluster.mount / "jobs" / "my-dataset-001"
    cluster.nodes[0].run(["mkdir", "-p", str(job.parent)])  # the claim's directory layout, made once
    moved = {"--job-dir": str(job), "--config": str(recipe), "--dataset-path": str(dataset), "--num-shards": "6",
             "--output": str(cluster.mount / "output" / "merged.jsonl")}  # fmt: skip
    procs = {}
    for node, pod in zip(cluster.nodes, indexed_job_pods(manifest, SUBMISSIONS[0]), strict=False):
        env = environment(pod, container)
        argv = dlc_arguments(command(container, env))
        argv = [moved.get(argv[i - 1], arg) if i else arg for i, arg in enumerate(argv)]
        full = launch_command(*argv, *QUICK, "--require-all-nodes", "--coordinator-lease-secs", "4")
        pod_env = {**env, "PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        with open(tmp_path / f"{pod.hostname}.log", "wb") as log:
            procs[pod.hostname] = node.popen(
                ["sh", "-c", f'hostname {pod.hostname} && exec "$@"', "sh", *full],
                env=pod_env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
    codes = {host: proc.wait(timeout=180) for host, proc in procs.items()}
    logs = {host: (tmp_path / f"{host}.log").read_text() for host in procs}
    assert set(codes.values()) == {0}, f"{codes}\n" + "\n".join(text[-2000:] for text in logs.values())
    for index, host in enumerate(procs):
        assert f"(kubernetes node {index} of 3 {host}): run {SUBMISSIONS[0]}," in logs[host]
    report = json.loads(
        cluster.nodes[0].run([sys.executable, "-m", "elastic_sharding", "status", "--job-dir", str(job), "--json"]).stdout
    )
    assert report["complete"] and {s["host"] for s in report["shards"]} == set(procs), "every pod did shards of its own"
