"""merge (to one file, and to a directory) vs `cat` of the same shard outputs.

`measure_merge(workdir, total_mb)` builds (once per workdir and size) a finished job of 16 shards
whose outputs total about `total_mb` MB, completed without Data-Juicer by a passthrough runner,
then times, interleaved and with the page cache warm for every side:

- `cat` of the shard outputs, in manifest order, into one file (and, as `cat_fsync_secs`, the
  same followed by an fsync of that file: the durability merge gives its output);
- `merge` into one file (in this process: what `elastic-shard merge` spends beyond its start-up);
- `merge` into a directory (one file per shard, hard-linked, plus the index).

With `codec="zstd"` the job's workers store their outputs compressed (the default since Step 13)
and the baseline is the floor of getting JSONL out of them: one process decompressing each
output in order into one file (`zstandard`, as `zstd -dc` does); merge then decompresses too, and
a directory gets decompressed parts instead of hard links.

Dirty pages are written back (`sync`, untimed) before every timed step, so no side pays for the
writeback of the one before it. It returns the medians (`cat_secs`, `merge_secs`, `dir_secs`),
the bytes merged and the details.
Run it on its own: `python bench/merge_measure.py [WORKDIR] [TOTAL_MB] [none|zstd]`.
"""

from __future__ import annotations

import base64
import filecmp
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

SHARDS = 16
ROW_BYTES = 4096  # large rows: merge never parses them, and they make the job quick to build
RECIPE = """\
project_name: merge-measure
dataset_path: {dataset}
export_path: /tmp/ignored-by-workers.jsonl
executor_type: ray
ray_address: local
process:
  - whitespace_normalization_mapper:
"""


class _Passthrough:
    """A runner that copies the shard input to the output (rows keep their ordering field)."""

    name = "passthrough"

    def run(self, ctx: Any) -> None:
        from elastic_sharding.layout import JobLayout

        ctx.set_phase("processing")
        shutil.copyfile(JobLayout(ctx.attempt_dir.parents[2]).shard_input(ctx.shard_id), ctx.ray_output)

    def close(self) -> None:
        pass


def _write_dataset(path: Path, total_bytes: int) -> None:
    with open(path, "wb", buffering=1 << 20) as out:
        written, i = 0, 0
        while written < total_bytes:
            text = base64.b64encode(os.urandom(ROW_BYTES * 3 // 4 - 48)).decode()
            line = orjson.dumps({"id": i, "text": text}) + b"\n"
            out.write(line)
            written += len(line)
            i += 1


def build_job(workdir: Path, total_mb: float, codec: str = "none") -> Path:
    """A finished job of `SHARDS` shards, about `total_mb` MB of outputs stored as `codec`; reused
    when already built."""
    from elastic_sharding.prepare.job import PrepareRequest, prepare
    from elastic_sharding.records import Settings
    from elastic_sharding.work.worker import Worker, WorkerOptions

    job = workdir / f"job-{int(total_mb)}mb-{codec}"
    if (job / "built").exists():
        return job
    shutil.rmtree(job, ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    dataset = workdir / "input.jsonl"
    _write_dataset(dataset, int(total_mb * 1e6))
    recipe = workdir / "recipe.yaml"
    recipe.write_text(RECIPE.format(dataset=dataset))
    settings = Settings(
        lock_timeout_secs=600.0,
        max_retries=1,
        poll_interval_secs=0.05,
        heartbeat_interval_secs=30.0,
        ray_address="local",
        shard_output_codec=codec,
    )
    prepare(PrepareRequest(recipe, None, job, SHARDS, settings), quiet=True)
    dataset.unlink()  # the job's shards hold the rows now
    if Worker(job, WorkerOptions(), runner=_Passthrough()).run() != 0:
        raise RuntimeError(f"the passthrough worker did not complete {job}")
    (job / "built").write_text("")
    return job


def shard_outputs(job: Path) -> list[Path]:
    from elastic_sharding.finish.validate import completed_outputs
    from elastic_sharding.layout import JobLayout

    return [path for _, path in completed_outputs(JobLayout(job))]


def _same_bytes(files: list[Path], whole: Path) -> bool:
    """Whether `files` concatenated are `whole`, compared block by block."""
    with open(whole, "rb") as expected:
        for path in files:
            with open(path, "rb") as part:
                while block := part.read(1 << 24):
                    if expected.read(len(block)) != block:
                        return False
        return not expected.read(1)


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _decompress_all(outputs: list[Path], target: Path, fsync: bool) -> None:
    import zstandard

    with open(target, "wb") as out:
        for path in outputs:
            with open(path, "rb") as source:
                zstandard.ZstdDecompressor().copy_stream(source, out, read_size=1 << 20, write_size=1 << 20)
        if fsync:
            out.flush()
            os.fsync(out.fileno())


def measure_merge(workdir: Path, total_mb: float, repeats: int = 3, codec: str = "none") -> dict[str, Any]:
    """Median seconds of `cat` (outputs stored compressed: decompressing them into one file),
    `merge` to a file and `merge` to a directory over `repeats` interleaved runs."""
    import logging

    from elastic_sharding.finish.merge import merge

    logging.getLogger("elastic_sharding").setLevel(logging.WARNING)
    workdir = Path(workdir)
    job = build_job(workdir, total_mb, codec)
    outputs = shard_outputs(job)
    size = sum(p.stat().st_size for p in outputs)
    merged, catted, directory = workdir / "merged.jsonl", workdir / "cat.jsonl", workdir / "merged-dir"
    for path in outputs:  # warm the page cache for every side alike
        with open(path, "rb") as handle:
            while handle.read(1 << 24):
                pass
    cats, cat_fsyncs, merges, dirs = [], [], [], []

    def cat(fsync: bool) -> None:
        if codec != "none":
            _decompress_all(outputs, catted, fsync)
            return
        with open(catted, "wb") as out:
            subprocess.run(["cat", *map(str, outputs)], stdout=out, check=True)
            if fsync:
                os.fsync(out.fileno())

    for _ in range(max(1, repeats)):
        for timings, step in (
            (cats, lambda: cat(False)),
            (cat_fsyncs, lambda: cat(True)),
            (merges, lambda: merge(job, merged, quiet=True)),
            (dirs, lambda: merge(job, f"{directory}/", quiet=True)),
        ):
            for path in (merged, catted):
                path.unlink(missing_ok=True)
            shutil.rmtree(directory, ignore_errors=True)
            os.sync()
            timings.append(_timed(step))
    cat(False)  # the products of the last round, to compare (the loop removes each before its step)
    merge(job, merged, quiet=True)
    parts = sorted(p for p in directory.iterdir() if not p.name.startswith("."))
    identical = filecmp.cmp(merged, catted, shallow=False)
    same_as_dir = _same_bytes(parts, catted)
    stored = size
    size = merged.stat().st_size
    linked = sum(1 for p, o in zip(parts, outputs) if os.stat(p).st_ino == os.stat(o).st_ino)
    result = {
        "cat_secs": statistics.median(cats),
        "cat_fsync_secs": statistics.median(cat_fsyncs),
        "merge_secs": statistics.median(merges),
        "dir_secs": statistics.median(dirs),
        "bytes": size,
        "stored_bytes": stored,
        "codec": codec,
        "shards": len(outputs),
        "cpus": os.cpu_count(),
        "runs_cat": cats,
        "runs_cat_fsync": cat_fsyncs,
        "runs_merge": merges,
        "runs_dir": dirs,
        "identical_output": identical,
        "dir_same_bytes_as_cat": same_as_dir,
        "dir_files_linked": linked,
    }
    for path in (merged, catted):
        path.unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
    return result


def main() -> int:
    workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/merge-measure")
    total_mb = float(sys.argv[2]) if len(sys.argv) > 2 else 1000.0
    codec = sys.argv[3] if len(sys.argv) > 3 else "none"
    result = measure_merge(workdir, total_mb, codec=codec)
    result["merge_vs_cat"] = result["merge_secs"] / result["cat_secs"]
    result["merge_vs_cat_fsync"] = result["merge_secs"] / result["cat_fsync_secs"]
    result["dir_vs_cat"] = result["dir_secs"] / result["cat_secs"]
    sys.stdout.write(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
