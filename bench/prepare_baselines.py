"""The two baselines of the `prepare` rows, each one plain Python process over a JSONL file.

    prepare_baselines.py floor INPUT
        The one-process floor: read every byte once, `hashlib.sha256` every byte, and
        `orjson.loads` + `orjson.dumps` every line. Nothing is written. This is what any prepare
        that validates and re-serializes every row and fingerprints the input must at least do
        in one process.

    prepare_baselines.py original INPUT OUT_DIR NUM_SHARDS
        The original tool's algorithm: pass 1 reads the file, sha256s the raw bytes and
        stdlib-`json.loads` + `json.dumps` every row (validation, and the normalized size of
        each row for a byte-balanced cut); pass 2 reads it again, `json.loads` + `json.dumps`
        every row once more (with its row number added), sha256s the normalized stream and each
        shard, and writes the shards to OUT_DIR/shard-NNNNN.jsonl plus a small manifest.json.

Both print one JSON line (rows, bytes, digests) on stdout, so a caller can check they read what
it meant them to read.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

CHUNK = 1 << 22
ROW_KEY = "__elastic_row__"  # the ordering field our prepare adds (elastic_sharding.records.ROW_KEY)


def _lines(path: Path, sha: hashlib._Hash | None = None):  # type: ignore[name-defined]
    """Every non-empty line of `path` (without its newline), reading it in big chunks; `sha`, if
    given, is updated with every byte read."""
    rest = b""
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            if sha is not None:
                sha.update(chunk)
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            yield from (line for line in lines if line.strip())
    if rest.strip():
        yield rest


def floor(path: Path) -> dict:
    import orjson

    sha = hashlib.sha256()
    rows = out_bytes = 0
    for line in _lines(path, sha):
        out_bytes += len(orjson.dumps(orjson.loads(line)))
        rows += 1
    return {"rows": rows, "bytes": path.stat().st_size, "dumped_bytes": out_bytes, "sha256": sha.hexdigest()}


def _dumps(row: dict) -> bytes:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def original(path: Path, out_dir: Path, num_shards: int) -> dict:
    # Pass 1: validate every row, hash the raw file, size every normalized row.
    raw = hashlib.sha256()
    sizes: list[int] = []
    for line in _lines(path, raw):
        row = json.loads(line)
        if not isinstance(row, dict):
            raise SystemExit(f"{path}: row {len(sizes) + 1} is not an object")
        sizes.append(len(_dumps(row)))
    total = sum(sizes)
    if num_shards < 1 or num_shards > len(sizes):
        raise SystemExit(f"cannot cut {len(sizes)} rows into {num_shards} shards")
    # Byte-balanced cut: shard k ends at the first row where the running size reaches k+1 n-ths.
    ends, running, k = [], 0, 0
    for i, size in enumerate(sizes):
        running += size
        if running * num_shards >= total * (k + 1) or len(sizes) - i - 1 <= num_shards - k - 1:
            ends.append(i + 1)
            k += 1
            if k == num_shards:
                break
    ends[-1] = len(sizes)
    # Pass 2: normalize again, hash the stream and each shard, write the shards.
    out_dir.mkdir(parents=True, exist_ok=True)
    normalized = hashlib.sha256()
    shards = []
    lines = _lines(path)
    start = 0
    for k, end in enumerate(ends):
        shard_sha = hashlib.sha256()
        shard_path = out_dir / f"shard-{k:05d}.jsonl"
        with open(shard_path, "wb", buffering=1 << 20) as out:
            for i in range(start, end):
                row = json.loads(next(lines))
                row[ROW_KEY] = i
                data = _dumps(row)
                normalized.update(data)
                shard_sha.update(data)
                out.write(data)
        shards.append({"path": shard_path.name, "rows": end - start, "sha256": shard_sha.hexdigest()})
        start = end
    summary = {
        "rows": len(sizes),
        "bytes": path.stat().st_size,
        "raw_sha256": raw.hexdigest(),
        "normalized_sha256": normalized.hexdigest(),
        "shards": shards,
    }
    (out_dir / "manifest.json").write_text(json.dumps(summary, indent=1))
    return {k: v for k, v in summary.items() if k != "shards"} | {"shards": len(shards)}


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "floor":
        result = floor(Path(argv[1]))
    elif len(argv) == 4 and argv[0] == "original":
        result = original(Path(argv[1]), Path(argv[2]), int(argv[3]))
    else:
        sys.stderr.write(__doc__)
        return 2
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
