"""Operator dependencies: found from Data-Juicer's own declarations, checked before a job starts
and on every node, recorded, installed only when asked, never installed by surprise.

`opencc` (chinese_convert_mapper's import, which Data-Juicer pins at 1.1.9) is the package the
project's environment lacks on purpose: the tests that need it present install it into an
overlay environment of their own (`support.environments`), never into the project's.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
import yaml
from support.e2e_support import needs_unshare, start_node, wait_all
from support.environments import distributions, overlay_env, site_packages
from support.jobs import REPO, cli, refused, run, write_jsonl

from elastic_sharding.dependencies.operators import operator_needs
from elastic_sharding.errors import MissingPackagesError, VersionMismatchError
from elastic_sharding.layout import JobLayout
from elastic_sharding.observe.status import Status
from elastic_sharding.observe.status_text import status_text
from elastic_sharding.records import Manifest, PackageRecord, encode, load

OPENCC_PIN = "opencc==1.1.9"
needs_opencc_absent = pytest.mark.skipif(
    importlib.util.find_spec("opencc") is not None, reason="the project's environment must lack opencc for this test"
)

TRADITIONAL = "漢字測試資料，這是繁體中文的句子。"
SIMPLIFIED = "汉字测试资料，这是繁体中文的句子。"


def zh_rows(n: int = 24) -> list[dict]:
    return [{"id": i, "text": f"{TRADITIONAL} 第{i}行"} for i in range(n)]


def cc_recipe(path: Path, dataset: Path) -> Path:
    config = {
        "project_name": "dependencies",
        "dataset_path": str(dataset),
        "export_path": str(path.parent / "unused.jsonl"),
        "executor_type": "ray",
        "ray_address": "local",
        "np": 1,
        "text_keys": "text",
        "process": [
            {"whitespace_normalization_mapper": {}},
            {"chinese_convert_mapper": {"mode": "t2s"}},
            {"text_length_filter": {"min_len": 5}},
        ],
    }
    path.write_text(yaml.safe_dump(config, allow_unicode=True))
    return path


def registry_class(name: str) -> type:
    from data_juicer.ops import OPERATORS

    return OPERATORS.modules[name]


def needs_of(name: str, **params) -> dict[str, tuple[str | None, bool]]:
    return {n.package: (n.module, n.certain) for n in operator_needs(0, name, registry_class(name), params)}


# -- what an operator needs ------------------------------------------------------------------------


def test_needs_come_from_the_operators_module_and_from_the_models_it_prepares():
    assert needs_of("chinese_convert_mapper") == {"opencc": ("opencc", True)}
    assert needs_of("document_simhash_deduplicator") == {"simhash-pybind": ("simhash", True)}
    assert needs_of("document_minhash_deduplicator") == {"scipy": ("scipy.integrate", True)}
    # perplexity_filter imports nothing itself: its sentencepiece and kenlm models do.
    assert needs_of("perplexity_filter") == {"sentencepiece": ("sentencepiece", True), "kenlm": ("kenlm", True)}
    assert needs_of("language_id_score_filter") == {"fasttext-predict": ("fasttext", True)}
    assert needs_of("text_length_filter") == {}


def test_needs_read_the_same_once_the_loaders_have_loaded():
    """A loader that has loaded replaces itself with the module in its operator's globals: the
    declarations are read from the source, so nothing changes."""
    from data_juicer.ops.deduplicator import document_simhash_deduplicator
    from data_juicer.utils import model_utils

    assert document_simhash_deduplicator.simhash.__name__ == "simhash"  # loads it (installed)
    assert model_utils.kenlm.__name__ == "kenlm"
    assert needs_of("document_simhash_deduplicator") == {"simhash-pybind": ("simhash", True)}
    assert needs_of("perplexity_filter") == {"sentencepiece": ("sentencepiece", True), "kenlm": ("kenlm", True)}


def test_a_model_prepared_under_a_condition_is_needed_when_the_recipe_makes_it_true():
    assert needs_of("words_num_filter") == {}, "tokenization is off by default"
    assert needs_of("words_num_filter", tokenization=True) == {"sentencepiece": ("sentencepiece", True)}
    assert needs_of("stopwords_filter", tokenization=False) == {}


def test_a_condition_that_cannot_be_decided_makes_the_need_uncertain(tmp_path, monkeypatch):
    module = tmp_path / "branchy_filter.py"
    module.write_text(
        textwrap.dedent(
            """
            from data_juicer.ops.base_op import Filter
            from data_juicer.utils.model_utils import prepare_model


            class BranchyFilter(Filter):
                def __init__(self, threshold: int = 3, *args, **kwargs):
                    super().__init__(*args, **kwargs)
                    if threshold > 2:
                        self.model_key = prepare_model(model_type="kenlm", lang="en")

                def compute_stats_single(self, sample):
                    return sample

                def process_single(self, sample):
                    return True
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    from branchy_filter import BranchyFilter

    (need,) = operator_needs(2, "branchy_filter", BranchyFilter, {})
    assert (need.package, need.module, need.certain, need.via) == ("kenlm", "kenlm", False, "model 'kenlm'")


# -- prepare ------------------------------------------------------------------------------------


@needs_opencc_absent
def test_prepare_refuses_a_missing_package_creates_nothing_and_installs_nothing(tmp_path):
    dataset = write_jsonl(tmp_path / "zh.jsonl", zh_rows())
    recipe = cc_recipe(tmp_path / "cc.yaml", dataset)
    before = distributions()
    proc = cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "2")
    line = refused(
        proc,
        f"{recipe}: process[1] chinese_convert_mapper needs the Python package opencc (import opencc)",
        f"Data-Juicer asks for {OPENCC_PIN}",
        f"install it with: {sys.executable} -m pip install {OPENCC_PIN}",
    )
    assert "--install-missing" in proc.stderr.split(line, 1)[1], "the last line says how prepare can install it"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cc.yaml", "zh.jsonl"], "nothing created"
    assert distributions() == before, "nothing installed"


def test_a_prepared_job_records_the_packages_and_versions_its_operators_import(tmp_path):
    from importlib.metadata import version

    dataset = write_jsonl(tmp_path / "d.jsonl", zh_rows())
    config = yaml.safe_load(cc_recipe(tmp_path / "r.yaml", dataset).read_text())
    config["process"][1] = {"document_simhash_deduplicator": {}}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    out = cli("prepare", "--config", str(tmp_path / "r.yaml"), "--job-dir", str(tmp_path / "job"), "--num-shards", "2", "--json")
    assert out.returncode == 0, out.stderr
    (record,) = json.loads(out.stdout)["manifest"]["packages"]
    assert record == {
        "package": "simhash-pybind",
        "module": "simhash",
        "distribution": "simhash-pybind",
        "version": version("simhash-pybind"),
        "operators": ["process[1] document_simhash_deduplicator"],
        "required": True,
        "wanted": "simhash-pybind",
    }


# -- workers ------------------------------------------------------------------------------------


def _record_packages(job: Path, *records: PackageRecord) -> None:
    layout = JobLayout(job)
    manifest = load(Manifest, layout.manifest)
    manifest.packages = list(records)
    layout.manifest.write_bytes(encode(manifest))


@needs_opencc_absent
def test_a_worker_missing_a_package_refuses_to_claim_and_status_shows_its_node(make_job):
    job = make_job(rows=10, shards=2)
    _record_packages(
        job, PackageRecord("opencc", "opencc", "opencc", "1.1.9", ["process[1] chinese_convert_mapper"], True, OPENCC_PIN)
    )
    with pytest.raises(
        MissingPackagesError, match=r"process\[1\] chinese_convert_mapper needs the Python package opencc"
    ) as refusal:
        run(job)
    assert f"pip install {OPENCC_PIN}" in str(refusal.value)
    assert not list(JobLayout(job).locks_dir.iterdir()), "nothing claimed"
    status = Status(job)
    (node,) = status.as_json()["refused_nodes"]
    assert (node["host"], node["reason"]) == (socket.gethostname(), "missing packages")
    assert "opencc" in node["message"]
    assert f"refused node: {socket.gethostname()}" in status_text(status, show_all=False)
    # A package needed only on an undecided branch is a warning, not a refusal.
    _record_packages(job, PackageRecord("opencc", "opencc", "opencc", "1.1.9", ["process[1] x"], False, OPENCC_PIN))
    assert run(job) == 0
    assert Status(job).as_json()["refused_nodes"] == [], "a worker that passes clears its node's refusal"


def test_a_worker_with_another_version_of_a_package_is_refused_unless_allowed(make_job):
    job = make_job(rows=10, shards=2)
    _record_packages(
        job, PackageRecord("scipy", "scipy.integrate", "scipy", "0.0.1", ["process[0] document_minhash_deduplicator"])
    )
    with pytest.raises(VersionMismatchError, match=r"scipy .* here, 0\.0\.1 when the job was prepared.*--allow-version-mismatch"):
        run(job)
    assert Status(job).as_json()["refused_nodes"][0]["reason"] == "version mismatch"
    assert run(job, allow_version_mismatch=True) == 0
    assert Status(job).as_json()["refused_nodes"] == []


# -- never installed by surprise ----------------------------------------------------------------

GUARDED_OPERATOR = """
import sys
from elastic_sharding.dependencies.guard import forbid_runtime_installs

forbid_runtime_installs()
from data_juicer.ops import load_ops

try:
    (op,) = load_ops([{"chinese_convert_mapper": {"mode": "t2s"}}])  # its __init__ builds the converter
    op.process({"text": ["漢字"]})
except ImportError as exc:
    print(exc)
    sys.exit(0)
sys.exit("no ImportError")
"""


@needs_opencc_absent
def test_an_operator_that_imports_a_missing_package_fails_loudly_and_installs_nothing():
    before = distributions()
    out = subprocess.run([sys.executable, "-c", GUARDED_OPERATOR], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "operator chinese_convert_mapper needs the Python package 'opencc'" in out.stdout
    assert f"pip install {OPENCC_PIN}" in out.stdout and "never installs packages while a job runs" in out.stdout
    assert distributions() == before


LATE_IMPORT_OP = '''
from data_juicer.ops.base_op import OPERATORS, Mapper
from data_juicer.utils.lazy_loader import LazyLoader


@OPERATORS.register_module("late_import_mapper")
class LateImportMapper(Mapper):
    """Imports a package by a name only known at run time, which no reading of the code finds."""

    def __init__(self, module_name: str = "opencc", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.module_name = module_name

    def process_single(self, sample):
        getattr(LazyLoader(self.module_name), "anything")
        return sample
'''


def _late_import_ops(directory: Path) -> Path:
    (directory / "ops").mkdir()
    (directory / "ops" / "__init__.py").write_text("from . import late_import_mapper  # noqa: F401\n")
    (directory / "ops" / "late_import_mapper.py").write_text(LATE_IMPORT_OP)
    return directory / "ops"


def _late_import_recipe(directory: Path) -> Path:
    dataset = write_jsonl(directory / "d.jsonl", zh_rows(6))
    config = yaml.safe_load(cc_recipe(directory / "r.yaml", dataset).read_text())
    config["process"] = [{"late_import_mapper": {}}]
    config["custom_operator_paths"] = [str(_late_import_ops(directory))]
    (directory / "r.yaml").write_text(yaml.safe_dump(config))
    return directory / "r.yaml"


def test_install_missing_with_custom_operators_loads_them_once(tmp_path):
    """--install-missing reads the registry before the recipe unit does, in the same process:
    Data-Juicer refuses to load a custom operator package twice, so it is loaded once."""
    recipe = _late_import_recipe(tmp_path)
    out = cli("prepare", "--config", str(recipe), "--job-dir", str(tmp_path / "job"), "--num-shards", "1", "--install-missing")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "every package the recipe's operators need is installed" in out.stderr


@pytest.mark.e2e
@needs_opencc_absent
def test_a_job_whose_operator_imports_a_missing_package_at_run_time_fails_it_by_name(tmp_path):
    """Ray's workers run with Data-Juicer's installer switched off: the attempt fails, and the
    failure names the operator and the package."""
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "__init__.py").write_text("from . import late_import_mapper  # noqa: F401\n")
    (tmp_path / "ops" / "late_import_mapper.py").write_text(LATE_IMPORT_OP)
    dataset = write_jsonl(tmp_path / "d.jsonl", zh_rows(6))
    config = yaml.safe_load(cc_recipe(tmp_path / "r.yaml", dataset).read_text())
    config["process"] = [{"late_import_mapper": {}}]
    config["custom_operator_paths"] = [str(tmp_path / "ops")]
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(config))
    job = tmp_path / "job"
    before = distributions()
    cli(
        "prepare",
        "--config",
        str(tmp_path / "r.yaml"),
        "--job-dir",
        str(job),
        "--num-shards",
        "1",
        "--max-retries",
        "0",
        check=True,
    )
    worker = cli("worker", "--job-dir", str(job), timeout=900)
    assert worker.returncode == 2, worker.stderr[-3000:]
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    (failure,) = status["failures"]
    assert "operator late_import_mapper needs the Python package 'opencc'" in failure["error"], failure
    assert distributions() == before


# -- --install-missing, and a node without the package ------------------------------------------


@pytest.fixture(scope="module")
def overlay(tmp_path_factory) -> Path:
    """An environment that is the project's plus whatever a test installs into it."""
    return overlay_env(tmp_path_factory.mktemp("overlay") / "env")


@pytest.mark.e2e
@needs_opencc_absent
def test_install_missing_installs_once_on_the_preparing_node_before_publishing(tmp_path, overlay):
    project_before = distributions()
    dataset = write_jsonl(tmp_path / "zh.jsonl", zh_rows())
    recipe = cc_recipe(tmp_path / "cc.yaml", dataset)
    prepare = [str(overlay), "-m", "elastic_sharding", "prepare", "--config", str(recipe), "--num-shards", "2"]
    out = subprocess.run(
        [*prepare, "--job-dir", str(tmp_path / "job"), "--install-missing"], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    installing = out.stderr.index(f"--install-missing: installing {OPENCC_PIN}")
    assert installing < out.stderr.index("prepared "), "the install comes before the job is published"
    assert any(p.name.lower().startswith("opencc-1.1.9") for p in site_packages(overlay.parent.parent).iterdir())
    (record,) = load(Manifest, JobLayout(tmp_path / "job").manifest).packages
    assert (record.distribution.lower(), record.version, record.operators) == (
        "opencc",
        "1.1.9",
        ["process[1] chinese_convert_mapper"],
    )
    assert distributions() == project_before, "the project's own environment is untouched"
    again = subprocess.run(
        [*prepare, "--job-dir", str(tmp_path / "job2"), "--install-missing"], capture_output=True, text=True, timeout=600
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert "every package the recipe's operators need is installed" in again.stderr
    assert "installing" not in again.stderr


@pytest.mark.e2e
@needs_unshare
@needs_opencc_absent
def test_a_node_without_the_package_refuses_and_a_node_with_it_finishes_the_job(tmp_path, overlay):
    if importlib.util.find_spec("opencc", None) is None and not any(
        p.name.lower().startswith("opencc") for p in site_packages(overlay.parent.parent).iterdir()
    ):
        install = subprocess.run(
            [str(overlay), "-m", "pip", "install", "-q", OPENCC_PIN], capture_output=True, text=True, timeout=600
        )
        assert install.returncode == 0, install.stderr[-2000:]
    dataset = write_jsonl(tmp_path / "zh.jsonl", zh_rows())
    recipe = cc_recipe(tmp_path / "cc.yaml", dataset)
    job = tmp_path / "job"
    fast = ["--poll-interval-secs", "0.5", "--heartbeat-interval-secs", "1", "--ray-num-cpus", "1"]
    prepared = subprocess.run(
        [str(overlay), "-m", "elastic_sharding", "prepare", "--config", str(recipe), "--job-dir", str(job), "--num-shards", "3", *fast],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    envs_before = distributions(), distributions(str(overlay))
    bare_log, full_log = tmp_path / "bare.log", tmp_path / "full.log"
    script = REPO / "demos" / "elastic_sharding" / "shard_job.py"
    codes = wait_all({"bare": start_node("bare", "worker", "--job-dir", str(job), log=bare_log, script=script)}, timeout=300)
    assert codes == {"bare": 2}, bare_log.read_text()[-3000:]
    assert "process[1] chinese_convert_mapper needs the Python package opencc" in bare_log.read_text()
    status = json.loads(cli("status", "--job-dir", str(job), "--json").stdout)
    assert [(n["host"], n["reason"]) for n in status["refused_nodes"]] == [("bare", "missing packages")]
    assert status["counts"]["pending"] == 3, "the refusing node claimed nothing"
    full = start_node("full", "worker", "--job-dir", str(job), log=full_log, script=script, python=overlay)
    assert wait_all({"full": full}) == {"full": 0}, full_log.read_text()[-3000:]
    cli("merge", "--job-dir", str(job), "--output", str(tmp_path / "merged.jsonl"), check=True)
    merged = [orjson.loads(line) for line in (tmp_path / "merged.jsonl").read_bytes().splitlines()]
    assert [row["text"] for row in merged] == [f"{SIMPLIFIED} 第{i}行" for i in range(24)], "opencc converted every row"
    assert (distributions(), distributions(str(overlay))) == envs_before, "the job installed nothing on either node"
