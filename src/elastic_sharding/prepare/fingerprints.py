"""sha256 fingerprints of input files, many chunks at a time.

Repeating a `prepare` is a no-op only for the very same input, and a size and a modification
time do not prove that (`rsync --inplace --times`, `touch -r`, tools that restore times, a copy
from a snapshot). So the identical-request check hashes every input file again. hashlib releases
the GIL while it hashes a large buffer, so one thread per core hashes that many chunks at once.

A file's fingerprint is the sha256 of its bytes; a plain file that prepare read in parallel
chunks of `chunk_bytes` (it was larger than that) is fingerprinted as the sha256 of its chunks'
binary sha256 digests in order, which lets the chunks be hashed by different processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from elastic_sharding.errors import InputError
from elastic_sharding.progress import Progress

READ_SIZE = 4 << 20


def sha256_files(paths: Sequence[Path], quiet: bool = False) -> list[str]:
    """The hex sha256 of each file, in the order given; progress (bytes) on a terminal."""
    return fingerprint_files(paths, [0] * len(paths), quiet)


def fingerprint_files(paths: Sequence[Path], chunk_bytes: Sequence[int], quiet: bool = False) -> list[str]:
    """Each file's fingerprint (module docstring), chunk size 0 meaning the whole file."""
    sizes = []
    for path in paths:
        try:
            sizes.append(path.stat().st_size)
        except OSError as exc:
            raise InputError(f"cannot access: {exc.strerror or exc}", path) from None
    tasks: list[tuple[int, int, int | None]] = []  # (file, start, length or None: to the end)
    for i, (size, chunk) in enumerate(zip(sizes, chunk_bytes)):
        if chunk and size > chunk:
            tasks.extend((i, start, min(chunk, size - start)) for start in range(0, size, chunk))
        else:
            tasks.append((i, 0, None))
    lock = threading.Lock()
    workers = max(1, min(len(tasks), os.cpu_count() or 1))
    with (
        Progress("checking input", sum(sizes), quiet) as progress,
        ThreadPoolExecutor(workers, thread_name_prefix="sha256") as pool,
    ):

        def advance(done: int) -> None:
            with lock:
                progress.update(done)

        futures = [
            pool.submit(_sha256_file, paths[i], advance)
            if length is None
            else pool.submit(_sha256_range, paths[i], start, length, advance)
            for i, start, length in tasks
        ]
        try:
            digests = [future.result() for future in futures]
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    per_file: list[list[bytes | str]] = [[] for _ in paths]
    for (i, _, _), digest in zip(tasks, digests):
        per_file[i].append(digest)
    return [
        parts[0] if isinstance(parts[0], str) else hashlib.sha256(b"".join(parts)).hexdigest()  # type: ignore[arg-type]
        for parts in per_file
    ]


def sha256_concatenated(paths: Sequence[Path]) -> str:
    """The sha256 of the files' bytes one after the other (inherently one stream)."""
    digest = hashlib.sha256()
    for path in paths:
        _feed(path, 0, None, digest, lambda n: None)
    return digest.hexdigest()


def _sha256_file(path: Path, advance: Callable[[int], None]) -> str:
    digest = hashlib.sha256()
    _feed(path, 0, None, digest, advance)
    return digest.hexdigest()


def sha256_range(path: Path, start: int, length: int | None) -> str:
    """The sha256 (hex) of `length` bytes of `path` from `start` (None: to the end)."""
    return _sha256_range(path, start, length, lambda n: None).hex()


def _sha256_range(path: Path, start: int, length: int | None, advance: Callable[[int], None]) -> bytes:
    digest = hashlib.sha256()
    _feed(path, start, length, digest, advance)
    return digest.digest()


def _feed(path: Path, start: int, length: int | None, digest: Any, advance: Callable[[int], None]) -> None:
    buffer = bytearray(READ_SIZE)
    view = memoryview(buffer)
    left = length
    try:
        with open(path, "rb", buffering=0) as handle:
            with contextlib.suppress(OSError):
                os.posix_fadvise(handle.fileno(), start, length or 0, os.POSIX_FADV_SEQUENTIAL)
            handle.seek(start)
            while left is None or left > 0:
                n = handle.readinto(view if left is None or left >= READ_SIZE else view[:left])
                if not n:
                    break
                digest.update(view[:n])
                advance(n)
                if left is not None:
                    left -= n
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror or exc}", path) from None
