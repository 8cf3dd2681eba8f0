"""How much a job directory holds: bytes on the job directory per input byte.

`job_dir_bytes(job_dir)` is the apparent size (st_size) of every regular file under the job
directory, a hard-linked inode counted once; symbolic links are neither followed nor counted.
`job_dir_breakdown(job_dir)` splits the same total into what the bytes are (a file hard-linked
under two names counts once, in the category of the name met first: attempts/ before the rest):

  shards     shards/: the normalized shard inputs prepare wrote
  processed  attempts/<shard>/<attempt>/processed.jsonl or processed.jsonl.zst: the collected
             shard outputs, as their job's --shard-output-codec stores them (plain, or zstd: on
             disk, their stored size), and the temporary file of one being collected
  raw        attempts/<shard>/<attempt>/ray-output.jsonl[/...]: Ray's raw exports (0 once collected)
  merged     the merge output, where merge.json says it is, if it lies inside the job directory
             (a file, or every file of a directory output)
  other      everything else: records, recipes, logs, Data-Juicer's work_dir files, cache

Run as a script it prints both for one job directory (optionally per input byte):
`python bench/jobdir_measure.py JOB_DIR [--input-bytes N] [--json]`.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

CATEGORIES = ("shards", "processed", "raw", "merged", "other")
# A collected shard output, stored plain or compressed (elastic_sharding.layout.PROCESSED_NAMES),
# and the prefixes of the temporary file of one being collected.
PROCESSED_NAMES = ("processed.jsonl", "processed.jsonl.zst")
PROCESSED_TEMPORARIES = tuple(f".{name}.tmp-" for name in PROCESSED_NAMES)


def _regular_files(root: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """(path, lstat) of every regular file under root, each inode once, links never followed."""
    seen: set[tuple[int, int]] = set()
    for directory, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = Path(directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # removed while we walked (a running job)
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            key = (st.st_dev, st.st_ino)
            if key in seen:
                continue
            seen.add(key)
            yield path, st


def job_dir_bytes(job_dir: Path) -> int:
    """Apparent size of all regular files under `job_dir`, a hard-linked inode counted once."""
    return sum(st.st_size for _, st in _regular_files(Path(job_dir)))


def _merged_output(job_dir: Path) -> Path | None:
    try:
        output = json.loads((job_dir / "merge.json").read_bytes())["output"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Path(os.path.abspath(output))


def _category(relative: Path, path: Path, merged: Path | None) -> str:
    parts = relative.parts
    if parts[0] == "shards":
        return "shards"
    if parts[0] == "attempts" and len(parts) >= 4:
        if len(parts) == 4 and (parts[3] in PROCESSED_NAMES or parts[3].startswith(PROCESSED_TEMPORARIES)):
            return "processed"
        if parts[3] == "ray-output.jsonl":
            return "raw"
    if merged is not None:
        absolute = Path(os.path.abspath(path))
        if absolute == merged or merged in absolute.parents:  # a file, or a directory output's files
            return "merged"
    return "other"


def job_dir_breakdown(job_dir: Path) -> dict[str, int]:
    """`job_dir_bytes` split into CATEGORIES (their sum is `job_dir_bytes(job_dir)`), plus "total"."""
    root = Path(job_dir)
    merged = _merged_output(root)
    sizes = dict.fromkeys(CATEGORIES, 0)
    for path, st in _regular_files(root):
        sizes[_category(path.relative_to(root), path, merged)] += st.st_size
    sizes["total"] = sum(sizes[name] for name in CATEGORIES)
    return sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_dir", type=Path)
    parser.add_argument("--input-bytes", type=int, help="also print each figure per input byte")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sizes = job_dir_breakdown(args.job_dir)
    per_input = {k: v / args.input_bytes for k, v in sizes.items()} if args.input_bytes else None
    if args.json:
        print(json.dumps({"bytes": sizes, "per_input_byte": per_input}))
        return 0
    for name, size in sizes.items():
        ratio = f"  {per_input[name]:.3f} per input byte" if per_input else ""
        print(f"{name:>9} {size:>14,d}{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
