"""Error types. Every failure the user can act on is one of these, carrying its exit code.

The CLI catches `ElasticShardError` once and prints its one-line message; nothing else in the
package decides how the process exits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

EXIT_OK = 0
EXIT_INCOMPLETE = 1
EXIT_ERROR = 2


class ElasticShardError(Exception):
    """Base class: a user-facing error with an exit code."""

    exit_code: int = EXIT_ERROR


class UsageError(ElasticShardError):
    """Bad command-line parameters or an impossible combination of them."""


class InputError(ElasticShardError):
    """Rejected input data; names the file and, where there is one, the line."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None):
        self.path = str(path) if path is not None else None
        self.line = line
        where = ""
        if self.path is not None:
            where = f"{self.path}:{line}: " if line is not None else f"{self.path}: "
        super().__init__(f"{where}{message}")


class RecipeError(ElasticShardError):
    """The Data-Juicer recipe cannot be run shard by shard."""


class JobStateError(ElasticShardError):
    """The job directory is missing, foreign, corrupt or in a state that forbids the request."""


class VersionMismatchError(ElasticShardError):
    """This worker's Data-Juicer differs from the one recorded at prepare."""


class MissingPackagesError(ElasticShardError):
    """A Python package an operator of the recipe imports is not installed on this node."""


class IntegrityError(ElasticShardError):
    """A shard input, attempt output or completion record failed validation."""


class AnalysisError(ElasticShardError):
    """A statistic cannot be analysed exactly as `dj-analyze` would (a column pandas would read in a
    way the analysis across shards does not reproduce); names the column and what to do."""


class AttemptFailed(Exception):
    """One shard attempt failed; the worker records it and applies the retry rules.

    `node_local`: the failure says something about the node, not the shard (its runtime did not
    start, died or hung, or Ray ran out of memory there), so the retry goes to another node first
    and a node that keeps failing this way stops claiming (`work.node_health`)."""

    def __init__(self, message: str, node_local: bool = False):
        super().__init__(message)
        self.node_local = node_local


class AttemptInterrupted(AttemptFailed):
    """An attempt ended through no fault of its own (its runtime was replaced because of another
    attempt): handed back, not counted against its retries."""


class Interrupted(ElasticShardError):
    """SIGTERM/SIGINT: the process stopped early after handing back what it held."""


class Aborted(ElasticShardError):
    """A launcher instance ends because its submission failed; every instance uses one code."""

    def __init__(self, message: str, exit_code: int = EXIT_ERROR):
        super().__init__(message)
        self.exit_code = exit_code


class UnsuitableFilesystem(ElasticShardError):
    """The job directory's filesystem lacks a guarantee the claim protocol rests on, or cannot be written."""


@contextmanager
def next_step(advice: str, *kinds: type[ElasticShardError]) -> Iterator[None]:
    """Add what to do next to the errors of `kinds` a block (or, as a decorator, a function)
    raises: the checks deep inside know what is wrong and where; the command that ran them knows
    what the user can do about it."""
    try:
        yield
    except kinds as exc:
        raise type(exc)(f"{exc}; {advice}") from None


def rebuilt(name: str, message: str) -> ElasticShardError:
    """An error another process published (its class name here and its message), as the same
    type with the same message and exit code, so every participant fails the same way."""
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, ElasticShardError)):
        cls = ElasticShardError
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)
    if isinstance(exc, InputError):
        exc.path, exc.line = None, None
    return exc
