"""One function per command: turn the parsed arguments into a request and run it.

Each imports its stage lazily, so `status` or `--help` never pays for Data-Juicer's or Ray's
imports.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import orjson

from elastic_sharding import settings
from elastic_sharding.errors import EXIT_OK


def _emit_json(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")
    sys.stdout.flush()


def _job_request(args: argparse.Namespace):  # -> launch.steps.JobRequest
    from elastic_sharding.launch.steps import JobRequest

    output = Path(args.output) if args.output is not None else None
    directory = args.output is not None and args.output.endswith(("/", os.sep))
    return JobRequest(
        args.job_dir,
        args.config,
        args.dataset_path,
        args.num_shards,
        settings.from_args(args),
        output,
        args.quiet,
        output_dir=directory,
        output_format=args.output_format,
        prepare_procs=args.prepare_procs,
        install_missing=args.install_missing,
        analyze=args.analyze,
        percentiles=args.percentiles,
    )


def _cmd_dlc(args: argparse.Namespace) -> int:
    from elastic_sharding.launch.dlc import DlcOptions, run_dlc

    options = DlcOptions(
        job=_job_request(args),
        nodes=args.nodes,
        require_all_nodes=args.require_all_nodes,
        run_id=args.run_id,
        wait_timeout_secs=args.wait_timeout_secs,
        poll_interval_secs=args.poll_interval_secs,
        coordinator_lease_secs=args.coordinator_lease_secs,
        runner=args.runner,
        explain=args.explain,
    )
    return run_dlc(options)


def _cmd_slurm(args: argparse.Namespace) -> int:
    from elastic_sharding.cli.parser import dlc_arguments
    from elastic_sharding.launch.slurm import SlurmRequest, run_slurm

    request = SlurmRequest(
        job=_job_request(args),
        dlc_args=dlc_arguments(args),
        nodes=args.nodes,
        array=args.array,
        max_running=args.max_running,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time=args.time,
        gpus_per_node=args.gpus_per_node,
        cpus_per_node=args.cpus_per_node,
        mem=args.mem,
        job_name=args.job_name,
        sbatch_args=args.sbatch_arg,
        setup=args.setup,
        exports=args.export,
        log_dir=args.log_dir,
        requeue=args.requeue,
        signal_secs=args.signal_secs,
        python=args.python or sys.executable,
        log_level=args.log_level,
        require_all_nodes=args.require_all_nodes,
        dry_run=args.dry_run,
        submit=args.submit,
    )
    return run_slurm(request)


def _cmd_mpi(args: argparse.Namespace) -> int:
    from elastic_sharding.launch.mpi import run_mpi

    return run_mpi(
        _job_request(args), args.np, args.hostfile, args.mpirun, args.mpirun_arg, args.max_shards, args.expect_nodes, args.runner
    )


def _cmd_local(args: argparse.Namespace) -> int:
    from elastic_sharding.launch.local import run_local

    return run_local(_job_request(args), args.workers, args.runner)


def _cmd_prepare(args: argparse.Namespace) -> int:
    import dataclasses

    from elastic_sharding.prepare.job import PrepareRequest, prepare
    from elastic_sharding.prepare.recipe import recipe_and_base

    config, base = recipe_and_base(args.config)
    request = PrepareRequest(
        config,
        args.dataset_path,
        args.job_dir,
        args.num_shards,
        settings.from_args(args),
        base,
        args.prepare_procs,
        args.install_missing,
        args.analyze,
        args.percentiles,
    )
    result = prepare(request, quiet=args.quiet or args.json)
    if args.json:
        manifest = dataclasses.asdict(result.manifest)
        _emit_json({"created": result.created, "job_dir": str(Path(os.path.abspath(args.job_dir))), "manifest": manifest})
    return EXIT_OK


def _cmd_worker(args: argparse.Namespace) -> int:
    from elastic_sharding.work.worker import WorkerOptions, run_worker

    options = WorkerOptions(
        max_shards=args.max_shards,
        **settings.overrides_from_args(args),
        allow_version_mismatch=args.allow_version_mismatch,
        runner=args.runner,
    )
    return run_worker(args.job_dir, options)


def _cmd_status(args: argparse.Namespace) -> int:
    from elastic_sharding.observe.watch import show_status, watch_status

    if args.watch is not None:
        return watch_status(args.job_dir, args.lock_timeout_secs, args.watch, args.json, args.all, args.prometheus)
    return show_status(args.job_dir, args.lock_timeout_secs, args.json, args.all, args.prometheus)


def _cmd_report(args: argparse.Namespace) -> int:
    from elastic_sharding.observe.html_report import write_report

    output = Path(os.path.abspath(args.output if args.output is not None else args.job_dir / "report.html"))
    bars = write_report(args.job_dir, output, args.lock_timeout_secs)
    sys.stdout.write(f"wrote {output} ({bars} attempts on the timeline)\n")
    return EXIT_OK


def _cmd_retry(args: argparse.Namespace) -> int:
    from elastic_sharding.finish.retry import retry

    retry(args.job_dir, args.all_failed, args.shard_id)
    return EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    import dataclasses

    from elastic_sharding.finish.analysis_output import is_analysis, publish_analysis
    from elastic_sharding.finish.merge import merge
    from elastic_sharding.layout import JobLayout

    options = dict(quiet=args.quiet or args.json, output_format=args.output_format)
    if is_analysis(JobLayout(Path(os.path.abspath(args.job_dir)))):
        analysis, record, _ = publish_analysis(args.job_dir, args.output, args.overwrite, args.lock_timeout_secs, **options)
        fields = {key: str(value) if isinstance(value, Path) else value for key, value in dataclasses.asdict(analysis).items()}
        shown = {**fields, "merge": dataclasses.asdict(record)}
    else:
        shown = dataclasses.asdict(merge(args.job_dir, args.output, args.overwrite, args.lock_timeout_secs, **options))
    if args.json:
        _emit_json(shown)
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from elastic_sharding.finish.verify import verify

    result = verify(args.job_dir, args.expect_nodes, args.output)
    message = f"PASS: {result.shards} shards were completed by {len(result.hosts)} node(s): {', '.join(result.hosts)}"
    if result.output_checked is not None:
        what = " (every file and the index)" if result.form == "directory" else ""
        message += f"; {result.output_checked}{what} ({result.output_format}) matches merge.json"
    logging.getLogger("elastic_sharding").info("%s", message)
    if args.json:
        _emit_json(
            {
                "pass": True,
                "shards": result.shards,
                "hosts": result.hosts,
                "output": str(result.output_checked) if result.output_checked else None,
                "form": result.form,
                "output_format": result.output_format,
            }
        )
    return EXIT_OK


COMMANDS = {
    "dlc": _cmd_dlc,
    "slurm": _cmd_slurm,
    "mpi": _cmd_mpi,
    "local": _cmd_local,
    "prepare": _cmd_prepare,
    "worker": _cmd_worker,
    "status": _cmd_status,
    "report": _cmd_report,
    "retry": _cmd_retry,
    "merge": _cmd_merge,
    "verify": _cmd_verify,
}
