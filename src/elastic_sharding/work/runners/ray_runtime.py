"""Starting the node-local Ray runtime inside a runner's child process (imports Ray).

Both runners' children start Ray here before Data-Juicer does: Data-Juicer calls
`ray.init(..., ignore_reinit_error=True)`, which then keeps ours, so the node caps apply and
custom operators reach Ray's workers the same way Data-Juicer would ship them.
"""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any

from elastic_sharding.dependencies.guard import RAY_SETUP_HOOK, forbid_runtime_installs

log = logging.getLogger(__name__)

# Data-Juicer's ray_utils forwards these to Ray workers; so must we, since our init comes first.
_DJ_RAY_JOB_ENV = "RAY_JOB"
_DJ_TOKEN_ENV_PREFIX = "_DJ_SPECIAL_TOKEN_"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ray-address", default="local")
    parser.add_argument("--num-cpus", type=int)
    parser.add_argument("--num-gpus", type=int)
    parser.add_argument("--object-store-mb", type=int)
    parser.add_argument("--temp-dir")
    parser.add_argument("--custom-op", action="append", default=[])


def caps_given(args: argparse.Namespace) -> bool:
    return any(getattr(args, k) is not None for k in ("num_cpus", "num_gpus", "object_store_mb", "temp_dir"))


def init_ray(args: argparse.Namespace) -> dict[str, Any]:
    """ray.init for this node; returns what was started/joined, for the runtime log. Neither this
    process nor any Ray worker of it lets Data-Juicer install a package (`dependencies.guard`)."""
    import ray

    forbid_runtime_installs()
    os.environ[_DJ_RAY_JOB_ENV] = "1"
    env_vars = {_DJ_RAY_JOB_ENV: "1"}
    env_vars.update({k: v for k, v in os.environ.items() if k.startswith(_DJ_TOKEN_ENV_PREFIX)})
    runtime_env: dict[str, Any] = {"env_vars": env_vars, "worker_process_setup_hook": RAY_SETUP_HOOK}
    if args.custom_op:
        runtime_env["py_modules"] = list(args.custom_op)
    kwargs: dict[str, Any] = {"runtime_env": runtime_env, "include_dashboard": False, "log_to_driver": True}
    if args.ray_address == "local":
        if args.num_cpus is not None:
            kwargs["num_cpus"] = args.num_cpus
        if args.num_gpus is not None:
            kwargs["num_gpus"] = args.num_gpus
        if args.object_store_mb is not None:
            kwargs["object_store_memory"] = args.object_store_mb * 1024 * 1024
        if args.temp_dir is not None:
            os.makedirs(args.temp_dir, exist_ok=True)
            kwargs["_temp_dir"] = args.temp_dir
    elif caps_given(args):
        log.warning("ray address %s is an existing runtime: the node caps do not apply to it", args.ray_address)
    context = ray.init(args.ray_address, **kwargs)
    return {"address": context.address_info.get("address"), "resources": ray.cluster_resources()}


def runtime_alive() -> str | None:
    """None while the Ray processes this driver started are running, else what died."""
    import ray

    if not ray.is_initialized():
        return "Ray is not initialized"
    node = getattr(ray._private.worker, "_global_node", None)
    processes = getattr(node, "all_processes", None) or {}
    for kind, infos in processes.items():
        for info in infos:
            proc = getattr(info, "process", None)
            if proc is not None and proc.poll() is not None:
                return f"Ray's {kind} (pid {proc.pid}) exited with code {proc.returncode}"
    return None
