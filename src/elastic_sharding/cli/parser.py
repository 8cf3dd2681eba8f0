"""The argument parsers of `elastic-shard` and the original demo's `dlc_job.py` / `shard_job.py`.

`docs/reference/cli.md` is generated from these parsers (`scripts/cli-reference`), so the help
texts here are the reference.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from elastic_sharding import settings
from elastic_sharding.output_formats import FORMATS
from elastic_sharding.work.runners import DEFAULT_RUNNER, RUNNERS

DEFAULT_WATCH_SECS = 2.0
DEFAULT_NUM_SHARDS = 4
DEFAULT_WAIT_TIMEOUT = 126000.0
DEFAULT_COORDINATOR_LEASE = 60.0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text} is outside [0, 1]; write 0.999 for the 99.9th percentile")
    return value


def _add_job_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--job-dir", required=True, type=Path, help="shared job directory")


def _add_job_request(parser: argparse.ArgumentParser, config_required: bool, launcher: bool) -> None:
    """What `prepare` needs; the launchers default to the bundled demo recipe and 4 shards."""
    if config_required:
        parser.add_argument("--config", required=True, type=Path, help="Data-Juicer YAML recipe")
    else:
        parser.add_argument(
            "--config", type=Path, help="Data-Juicer YAML recipe (default: the bundled demos/elastic_sharding/configs/demo.yaml)"
        )
    parser.add_argument(
        "--dataset-path",
        type=Path,
        help="the input: a JSONL (.jsonl, .jsonl.gz, .jsonl.zst) or Parquet file, or a directory of one kind "
        "(overrides the recipe's dataset_path)",
    )
    _add_job_dir(parser)
    if config_required:
        parser.add_argument("--num-shards", required=True, type=_positive_int, help="exact number of non-empty shards")
    else:
        parser.add_argument(
            "--num-shards",
            type=_positive_int,
            default=DEFAULT_NUM_SHARDS,
            help="exact number of non-empty shards (default %(default)s)",
        )
    parser.add_argument(
        "--prepare-procs",
        type=_positive_int,
        help="processes on this node that share the prepare (default: its usable cores; for `local`, --workers)",
    )
    parser.add_argument(
        "--analyze",
        action="store_true",
        help="analyze instead of process: every worker computes, shard by shard, the statistics dj-analyze computes "
        "for this recipe (its stats-producing filters, not filtering, and its tagging operators; the rest is skipped), "
        "and the finish writes dj-analyze's analysis directory, exact (docs/guides/analysis.md)",
    )
    parser.add_argument(
        "--percentiles",
        nargs="+",
        type=_fraction,
        metavar="Q",
        help="with --analyze: percentiles to report besides 25%%, 50%% and 75%%, as fractions (0.01 0.999), as "
        "dj-analyze's --percentiles (default: the recipe's percentiles)",
    )
    parser.add_argument(
        "--install-missing",
        action="store_true",
        help="install the packages the recipe's operators need and this node lacks (pip, once, before the job is "
        "published); without it a missing package is refused",
    )
    settings.add_arguments(parser, as_overrides=False, launcher=launcher)


def _add_runner(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--runner",
        default=DEFAULT_RUNNER,
        choices=RUNNERS,
        help="warm: one Ray runtime per worker, reused for every shard; process: a fresh dj-process per attempt "
        "(default %(default)s, or $ELASTIC_SHARD_RUNNER)",
    )


def _add_quiet(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr (shown on a terminal by default)")


def _add_output_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output-format",
        choices=FORMATS,
        help="what the output holds: jsonl, jsonl.zst (zstd-compressed JSONL) or parquet (default: the --output file's "
        "suffix, .jsonl.zst or .zst, .parquet, else jsonl; a directory output: jsonl); a flag the suffix contradicts is refused",
    )


def _add_launcher(parser: argparse.ArgumentParser) -> None:
    _add_job_request(parser, config_required=False, launcher=True)
    parser.add_argument(
        "--output",
        help="final merged file (default <job-dir>/merged.jsonl, or merged.jsonl.zst / merged.parquet with --output-format), "
        "or a directory (ending in /, or existing) to publish one file per shard plus an index; missing directories are "
        "created before anything starts",
    )
    _add_output_format(parser)
    _add_runner(parser)
    _add_quiet(parser)


def _add_dlc_run(parser: argparse.ArgumentParser) -> None:
    """What every `dlc` instance runs with; `slurm` passes these on to the instances it starts."""
    _add_launcher(parser)
    parser.add_argument(
        "--require-all-nodes",
        action="store_true",
        help="strict mode: cap claims per Worker and require --nodes distinct hostnames",
    )
    parser.add_argument(
        "--run-id",
        help="identifier shared by every instance of one submission (default: $ELASTIC_SHARD_RUN_ID, $PAI_JOB_ID, "
        "$DLC_JOB_ID, $JOB_ID, else the Slurm job or array job id, or the mpirun job id)",
    )
    parser.add_argument(
        "--wait-timeout-secs",
        type=float,
        default=DEFAULT_WAIT_TIMEOUT,
        help="maximum prepare/completion/finalize wait (default %(default)s)",
    )
    parser.add_argument(
        "--coordinator-lease-secs",
        type=float,
        default=DEFAULT_COORDINATOR_LEASE,
        help="a prepare/finalize coordinator that stops heartbeating for this long is taken over (default %(default)s)",
    )


def dlc_arguments(args: argparse.Namespace) -> list[str]:
    """The `dlc` flags of `args` that differ from their defaults, paths made absolute: the command
    `slurm` runs on every node, rebuilt from the one parser so that no flag is forgotten."""
    probe = argparse.ArgumentParser(add_help=False)
    _add_dlc_run(probe)
    argv: list[str] = []
    for action in probe._actions:
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or value is None or value == action.default:
            continue
        flag = action.option_strings[0]
        if action.nargs == 0:
            argv.append(flag)
            continue
        if isinstance(value, list):
            argv += [flag, *map(str, value)]
            continue
        if isinstance(value, Path) or action.dest == "output":
            text = str(value)
            value = os.path.abspath(text) + (os.sep if text.endswith(("/", os.sep)) else "")
        argv += [flag, str(value)]
    return argv


def _add_slurm(parser: argparse.ArgumentParser) -> None:
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--nodes", type=_positive_int, help="one allocation of N nodes, one worker per node, all started together")
    shape.add_argument(
        "--array",
        type=_positive_int,
        metavar="K",
        help="elastic: K single-node array tasks that join the job whenever the scheduler starts them",
    )
    parser.add_argument("--max-running", type=_positive_int, metavar="M", help="at most M array tasks at once (--array=0-K%%M)")
    parser.add_argument("--partition", help="sbatch --partition")
    parser.add_argument("--account", help="sbatch --account")
    parser.add_argument("--qos", help="sbatch --qos")
    parser.add_argument("--time", help="sbatch --time limit, e.g. 12:00:00 (drained and requeued before it is reached)")
    parser.add_argument("--gpus-per-node", type=_positive_int, help="GPUs on each node (sbatch and srun --gpus-per-node)")
    parser.add_argument(
        "--cpus-per-node", type=_positive_int, help="CPUs of each node for its worker (default: the whole node, --exclusive)"
    )
    parser.add_argument("--mem", help="memory of each node, e.g. 200G (sbatch --mem)")
    parser.add_argument("--job-name", help="Slurm job name shown by squeue (default es-<job-dir name>)")
    parser.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more #SBATCH option, e.g. --sbatch-arg=--constraint=a100 (repeatable)",
    )
    parser.add_argument(
        "--setup",
        action="append",
        default=[],
        metavar="LINE",
        help="shell line run before the workers, e.g. 'module load cuda' (repeatable)",
    )
    parser.add_argument(
        "--export", action="append", default=[], metavar="NAME=VALUE", help="environment variable for the workers (repeatable)"
    )
    parser.add_argument(
        "--log-dir", type=Path, default=Path("."), help="where the script and Slurm's output files go (default: here)"
    )
    parser.add_argument(
        "--requeue",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="let Slurm requeue a preempted job and requeue it before the time limit; it rejoins its run (default on)",
    )
    parser.add_argument(
        "--signal-secs",
        type=int,
        default=120,
        help="seconds before the time limit at which the workers drain (sbatch --signal=B:USR1@S; 0: none; default %(default)s)",
    )
    parser.add_argument(
        "--python", help="the Python on every node that has elastic-sharding (default: the one running this command)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the batch script (inside an allocation: the srun command); submit nothing"
    )
    parser.add_argument(
        "--submit",
        action="store_true",
        help="inside an allocation, submit a new job instead of running on the allocation's nodes",
    )


def build_parser(prog: str = "elastic-shard", profile: str = "shard") -> argparse.ArgumentParser:
    """`profile="dlc"` is the original demo's `dlc_job.py`: its sub-commands default to the bundled demo."""
    dlc = profile == "dlc"
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a Data-Juicer recipe over a large JSONL or Parquet dataset on many nodes that share a POSIX directory.",
    )
    parser.add_argument("--log-level", default=os.environ.get("ELASTIC_SHARD_LOG_LEVEL", "INFO"), help="stderr log level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("dlc", help="the same command on every node of a Worker-broadcast job: prepare, work, merge")
    _add_dlc_run(p)
    p.add_argument(
        "--nodes",
        type=_positive_int,
        help="expected Workers (default: what the scheduler says): informational in elastic mode, required in strict mode",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="print the scheduler, node count, node and run id this instance detected, and why, then exit without running",
    )

    p = sub.add_parser("slurm", help="submit a whole job to Slurm: an allocation of N nodes or an elastic array of tasks")
    _add_dlc_run(p)
    _add_slurm(p)

    p = sub.add_parser("mpi", help="MPIJob Launcher: prepare, mpirun one worker per node, merge")
    _add_launcher(p)
    p.add_argument("--np", type=_positive_int, help="number of worker ranks (default: the hosts in --hostfile)")
    p.add_argument("--hostfile", type=Path, help="OpenMPI hostfile (default /etc/mpi/hostfile when it exists)")
    p.add_argument("--mpirun", default="mpirun", help="mpirun executable (default %(default)s)")
    p.add_argument("--mpirun-arg", action="append", default=[], metavar="ARG", help="extra mpirun argument (repeatable)")
    p.add_argument("--max-shards", type=_positive_int, help="per-worker claim cap (default unlimited)")
    p.add_argument(
        "--expect-nodes", type=_positive_int, default=1, help="minimum distinct completion hostnames (default %(default)s)"
    )

    p = sub.add_parser("local", help="a whole job on this machine: prepare, N worker processes, merge")
    _add_launcher(p)
    p.add_argument("--workers", type=_positive_int, default=2, help="worker processes (default %(default)s)")

    p = sub.add_parser("prepare", help="validate recipe and input, split into shards, publish the job")
    _add_job_request(p, config_required=not dlc, launcher=dlc)
    p.add_argument("--json", action="store_true", help="print the manifest summary as JSON on stdout (implies --quiet)")
    _add_quiet(p)

    p = sub.add_parser("worker", help="claim and process shards until the job is complete")
    _add_job_dir(p)
    p.add_argument("--max-shards", type=_positive_int, help="maximum claims (failed attempts count); default unlimited")
    settings.add_arguments(p, as_overrides=True)
    p.add_argument("--allow-version-mismatch", action="store_true", help="run even if Data-Juicer differs from the manifest")
    _add_runner(p)

    p = sub.add_parser("status", help="show the state of every shard (read-only)")
    _add_job_dir(p)
    p.add_argument("--lock-timeout-secs", type=float, help="only affects whether claims display as stale")
    p.add_argument("--json", action="store_true", help="machine-readable JSON on stdout")
    p.add_argument(
        "--all", action="store_true", default=dlc, help="list every shard and owner" + (" (always on here)" if dlc else "")
    )
    p.add_argument(
        "--watch",
        nargs="?",
        type=_positive_float,
        const=DEFAULT_WATCH_SECS,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {DEFAULT_WATCH_SECS:g}) until the job completes or fails; "
        "plain lines when stdout is not a terminal, one JSON object per line with --json",
    )
    p.add_argument(
        "--prometheus",
        type=Path,
        metavar="FILE",
        help="also write the metrics in node-exporter textfile format to FILE, atomically (every tick with --watch)",
    )

    p = sub.add_parser("report", help="write a self-contained HTML page: timeline of every attempt, throughput, shards")
    _add_job_dir(p)
    p.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="the HTML file to write (default: report.html in the job directory); missing directories are created",
    )
    p.add_argument("--lock-timeout-secs", type=float, help="only affects whether claims display as stale")

    if not dlc:
        p = sub.add_parser("retry", help="requeue terminally failed shards")
        _add_job_dir(p)
        p.add_argument("--all-failed", action="store_true", help="requeue every failed shard")
        p.add_argument("--shard-id", action="append", default=[], help="requeue this shard (repeatable)")

        p = sub.add_parser("merge", help="validate and merge all shard outputs in manifest order")
        _add_job_dir(p)
        p.add_argument(
            "--output",
            required=True,
            help="final merged file, or a directory (ending in /, or existing): one file per shard in manifest order plus "
            "an index (a part is a hard link to its shard output where that is stored in the part's format); missing directories are created",
        )
        _add_output_format(p)
        p.add_argument("--lock-timeout-secs", type=float, help="used while computing pre-merge status")
        p.add_argument(
            "--overwrite", action="store_true", help="replace an existing output (a directory only if it is an earlier merge's)"
        )
        p.add_argument("--json", action="store_true", help="print the merge record as JSON on stdout (implies --quiet)")
        _add_quiet(p)

    p = sub.add_parser("verify", help="check that the job is complete, valid, and ran on enough nodes")
    _add_job_dir(p)
    p.add_argument(
        "--output",
        help="merged file, or directory output, to check against merge.json (default: <job-dir>/merged.jsonl, or the "
        "merged.jsonl.zst / merged.parquet merge.json names, if present)",
    )
    p.add_argument(
        "--expect-nodes", type=_positive_int, default=1, help="minimum distinct completion hostnames (default %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    return parser
