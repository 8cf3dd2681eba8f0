"""Every error a user can see says what is wrong, where, and what to do next.

The walk reads every `raise` of a user-facing error (`ElasticShardError` and its subclasses) in
the package's source, so a new message cannot skip the rules:

* it says what in words, not only placeholders (a message that passes another error's text on,
  `f"{path}: {exc}"`, is the only exception: that text was written, and checked, where it was raised);
* where: the walk cannot see into placeholders, so it is asserted for the kinds that always carry
  a location: an InputError names its file (and line) through the class, the others a path,
  shard or flag in the message (see the tests of each command);
* what to do next: a RecipeError, JobStateError or IntegrityError says it (a clause such as
  "; run merge", "(run prepare first)", "restore the file"), or states the one constraint that
  is broken ("must be ...", "expected ..."), or comes from a check whose caller adds the advice
  (`errors.next_step`, listed in ADVISED_BY_CALLER and proven below by a real run). A UsageError
  names the flag or value to change; an InputError the input to fix.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import elastic_sharding
from elastic_sharding import errors

SRC = Path(elastic_sharding.__file__).parent
USER_FACING = {name for name, obj in vars(errors).items() if isinstance(obj, type) and issubclass(obj, errors.ElasticShardError)}
MUST_ADVISE = {"RecipeError", "JobStateError", "IntegrityError"}
NEXT_STEP = re.compile(
    r"(;|\.|\(|:|,| or| and| then)\s*(first\s+)?(run|re-run|rerun|restore|remove|use|pass|prepare|install|wait|check|fix|edit|"
    r"delete|move|publish|list|let|put|give|save|select|choose|copy|start|see|report)\b|\bfirst\b|\bagain\b",
    re.I,
)
CONSTRAINT = re.compile(r"\b(must|expected|needs|only)\b")
# Checks whose callers add what to do (errors.next_step), per module: the advice they add.
ADVISED_BY_CALLER = {
    "finish/validate.py": "SHARD_CHANGED",  # and merge.publish around its own reads
    "finish/verify.py": "MERGED_CHANGED",
}


def _text(node: ast.AST) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join("{}" if isinstance(v, ast.FormattedValue) else _text(v) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    return "{}"


def _raised() -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = str(path.relative_to(SRC))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                func = node.exc.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name in USER_FACING:
                    found.append((module, node.lineno, name, _text(node.exc.args[0])))
    return found


RAISED = _raised()


def test_the_walk_finds_the_messages():
    assert len(RAISED) > 150, len(RAISED)
    assert {kind for _, _, kind, _ in RAISED} >= {"UsageError", "InputError", "RecipeError", "JobStateError", "IntegrityError"}


@pytest.mark.parametrize(("module", "line", "kind", "message"), RAISED, ids=[f"{m}:{n}" for m, n, _, _ in RAISED])
def test_every_message_says_what_and_what_to_do(module, line, kind, message):
    words = re.sub(r"\{\}", " ", message)
    passes_on = re.fullmatch(r"(\{\}(: )?)+", message) is not None
    assert passes_on or len(re.findall(r"[A-Za-z]{2,}", words)) >= 2, f"{module}:{line}: {message!r} says nothing in words"
    if kind in MUST_ADVISE and not passes_on and module not in ADVISED_BY_CALLER:
        assert NEXT_STEP.search(message) or CONSTRAINT.search(message), (
            f"{module}:{line}: {kind} {message!r} does not say what to do next"
        )


def test_a_changed_shard_output_and_a_changed_merge_say_what_to_do(make_job, tmp_path):
    """The advice ADVISED_BY_CALLER promises, as the commands a user runs print it."""
    from support.jobs import cli, merged_rows, run
    from support.outputs import rewrite_output

    from elastic_sharding.finish.validate import SHARD_CHANGED
    from elastic_sharding.finish.verify import MERGED_CHANGED
    from elastic_sharding.layout import JobLayout, processed_file
    from elastic_sharding.records import CompletionRecord, load

    job = make_job(rows=30, shards=3)
    assert run(job) == 0
    out = tmp_path / "out.jsonl"
    merged_rows(job, out)
    out.write_bytes(out.read_bytes().replace(b"sample", b"SAMPLE", 1))
    changed_merge = cli("verify", "--job-dir", str(job), "--output", str(out))
    assert changed_merge.returncode == 2 and MERGED_CHANGED in changed_merge.stderr, changed_merge.stderr
    layout = JobLayout(job)
    done = load(CompletionRecord, layout.done("part-00001-of-00003"))
    processed = processed_file(layout.attempt_dir(done.shard_id, done.attempt_id), done.output_codec)
    rewrite_output(processed, lambda lines: lines.replace(b"sample", b"SAMPLE", 1))
    changed_shard = cli("merge", "--job-dir", str(job), "--output", str(out), "--overwrite")
    assert changed_shard.returncode == 2 and SHARD_CHANGED in changed_shard.stderr, changed_shard.stderr
