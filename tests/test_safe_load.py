"""Nothing runs from a data file: checkpoints and journals load only what the project writes.

A crafted file whose unpickling would call ``os.system`` is refused (one line naming the file and the
global, exit code 2 through the apps) and its command never runs; a checkpoint missing a field is
named; every checkpoint the project writes still loads.
"""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_rows

from planner import safe_pickle
from planner.checkpoint import _ALLOWED, CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from planner.errors import UserError
from planner.serving.journal import JOURNAL_NAME, SimJournal

SYSTEM = f"{os.system.__module__}.system"  # posix.system here
ENTRY = {"search": "from planner.apps.search import main; main()",
         "validate": "from validation.apps.validate import main; main()"}


class _Exploit:
    """Unpickling it runs ``touch MARKER`` (what a crafted file would do)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _crafted(marker: Path, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    return pickle.dumps({"version": 1, "config": _Exploit(marker)}, protocol=protocol)


def _app(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ENTRY[name], *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def _refused_in_one_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert all(w in proc.stderr for w in words), proc.stderr


# ----- the loader ------------------------------------------------------------------------------------
@pytest.mark.parametrize("protocol", [0, 2, pickle.HIGHEST_PROTOCOL])
def test_the_loader_refuses_a_global_outside_the_allow_list_without_calling_it(tmp_path, protocol):
    marker = tmp_path / "MARKER"
    with pytest.raises(safe_pickle.RefusedPickle, match=rf"refused to load {SYSTEM} \(not a class this project"):
        safe_pickle.load(io.BytesIO(_crafted(marker, protocol)), safe_pickle.DATA)
    assert not marker.exists()


def test_a_refused_module_is_not_even_imported():
    data = b"cthis_module_is_not_imported_by_loading\nanything\n."  # protocol 0: GLOBAL module name
    with pytest.raises(safe_pickle.RefusedPickle, match="this_module_is_not_imported_by_loading.anything"):
        safe_pickle.load(io.BytesIO(data), safe_pickle.DATA)
    assert "this_module_is_not_imported_by_loading" not in sys.modules


@pytest.mark.parametrize("name", ["builtins.eval", "builtins.getattr", "builtins.__import__", "subprocess.Popen",
                                  "copyreg._reconstructor", "planner.apps.common.atomic_write_text"])
def test_dangerous_names_are_on_no_list(name):
    assert name not in safe_pickle.DATA | safe_pickle.OMEGACONF
    assert not safe_pickle.is_config_schema(*name.rsplit(".", 1))


def test_config_schemas_are_the_projects_imported_config_dataclasses():
    import simcore.config

    assert safe_pickle.is_config_schema("simcore.config", "ModelConfig")
    assert not safe_pickle.is_config_schema("simcore.config", "ConfigError")  # a class, not a dataclass schema
    assert not safe_pickle.is_config_schema("simcore.config", "build_space")
    assert not safe_pickle.is_config_schema("dataclasses", "Config")  # not the project's
    assert not safe_pickle.is_config_schema("planner.not_a_module", "XConfig")
    assert simcore.config.ModelConfig.__name__ == "ModelConfig"


def test_plain_data_numpy_and_generators_round_trip():
    import numpy as np

    value = {"a": [1, 2.5, "x", (3, None)], "b": np.arange(6.0).reshape(2, 3), "c": np.float64(1.5),
             "rng": np.random.default_rng(7), "s": {1, 2}, "f": frozenset({3})}
    back = safe_pickle.load(io.BytesIO(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)), safe_pickle.DATA)
    assert back["a"] == value["a"] and (back["b"] == value["b"]).all() and back["c"] == value["c"]
    assert back["rng"].random() == np.random.default_rng(7).random() and back["s"] == {1, 2}


def test_corrupt_bytes_are_unreadable_not_a_traceback():
    with pytest.raises(safe_pickle.UnreadablePickle):
        safe_pickle.load(io.BytesIO(b"\x80\x05\x95garbage that is not a pickle"), safe_pickle.DATA)


# ----- checkpoints -----------------------------------------------------------------------------------
def test_a_crafted_checkpoint_is_refused_on_resume_through_the_cli(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "MARKER"
    (run / CHECKPOINT_NAME).write_bytes(_crafted(marker))
    proc = _app("search", "planner=random", "planner.budget=8", f"+resume={run}", f"hydra.run.dir={run}", cwd=tmp_path)
    _refused_in_one_line(proc, f"{run / CHECKPOINT_NAME}: refused to load {SYSTEM}")
    assert not marker.exists()


def test_a_crafted_checkpoint_is_refused_by_the_loader(tmp_path):
    marker = tmp_path / "MARKER"
    (tmp_path / CHECKPOINT_NAME).write_bytes(_crafted(marker))
    with pytest.raises(UserError, match=rf"checkpoint.pkl: refused to load {SYSTEM}"):
        load_checkpoint(tmp_path, {})
    assert not marker.exists()


@pytest.mark.parametrize("missing", ["config", "planner", "evaluator", "chunk", "wall_s"])
def test_a_checkpoint_missing_a_field_is_named(tmp_path, missing):
    state = {"config": {"seed": 0}, "planner": None, "evaluator": None, "chunk": 0, "wall_s": 0.0}
    del state[missing]
    save_checkpoint(tmp_path, state, {})
    with pytest.raises(UserError, match=rf"checkpoint.pkl has no '{missing}'$"):
        load_checkpoint(tmp_path, {})


def test_a_checkpoint_with_a_field_of_the_wrong_kind_is_named(tmp_path):
    save_checkpoint(tmp_path, {"config": {}, "planner": {"not": "a planner"}, "evaluator": None, "chunk": 0,
                               "wall_s": 0.0}, {})
    with pytest.raises(UserError, match=r"'planner' is not a planner \(a builtins.dict\)"):
        load_checkpoint(tmp_path, {})


def test_an_empty_or_truncated_checkpoint_is_unreadable(tmp_path):
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path, {})
    (tmp_path / CHECKPOINT_NAME).write_bytes(pickle.dumps({"version": 1, "config": {"a": 1}})[:-5])
    with pytest.raises(UserError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path, {})


@pytest.fixture(scope="module")
def dense():
    from planner.space import SearchSpace
    from validation.studies.common.scenarios import scenario_context

    ctx = scenario_context("dense-70b-1node")
    return ctx, SearchSpace.for_context(ctx)


def test_every_iterative_planners_checkpoint_loads_through_the_allow_list(dense, tmp_path):
    from planner.config import planner_config
    from planner.runner import ITERATIVE, make_actions, run_planner

    ctx, space = dense
    for name in ITERATIVE:
        cfg = planner_config(name, budget=24, chunks=2, **({"d_model": 32, "hidden": 32} if name == "ppo" else {}))
        run_planner(ctx, space, cfg, seed=0, run_dir=tmp_path / name, config={"seed": 0})
        actions = make_actions(ctx, space, cfg)
        state = load_checkpoint(tmp_path / name, {"ctx": ctx, "actions": actions})
        assert type(state["planner"]).name == name and state["chunk"] == 2


@pytest.mark.parametrize("overrides", [[], ["workload=serving"], ["planner=genetic", "experiment=mixtral-2node"]])
def test_a_composed_config_node_loads_through_the_allow_list(tmp_path, overrides):
    """The app's planners keep ``cfg.planner``, an omegaconf node that carries the whole composed config."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from planner.apps.search import register

    register()
    with initialize_config_module(config_module="conf", version_base=None):
        cfg = compose(config_name="search", overrides=overrides)
    save_checkpoint(tmp_path, {"config": {}, "planner": None, "evaluator": None, "chunk": 0, "wall_s": 0.0,
                               "node": cfg.planner}, {})
    with (tmp_path / CHECKPOINT_NAME).open("rb") as fh:  # what load_checkpoint reads it with
        node = safe_pickle.load(fh, _ALLOWED, rule=safe_pickle.is_config_schema)["node"]
    assert OmegaConf.to_container(node) == OmegaConf.to_container(cfg.planner)


# ----- the serving search's journal ------------------------------------------------------------------
def test_a_crafted_serving_journal_is_refused_on_resume_through_the_cli(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "MARKER"
    (run / JOURNAL_NAME).write_bytes(_crafted(marker))
    proc = _app("search", "workload=serving", "experiment=dense-70b-1node", "serving.search.budget=4",
                f"+resume={run}", f"hydra.run.dir={run}", cwd=tmp_path)
    _refused_in_one_line(proc, f"{run / JOURNAL_NAME}: refused to load {SYSTEM}")
    assert not marker.exists()


def test_a_crafted_record_after_a_good_header_is_refused(tmp_path):
    config = {"seed": 0}
    marker = tmp_path / "MARKER"
    header = pickle.dumps({"version": 1, "config": config}, protocol=pickle.HIGHEST_PROTOCOL)
    record = pickle.dumps(((1, 2), _Exploit(marker)), protocol=pickle.HIGHEST_PROTOCOL)
    (tmp_path / JOURNAL_NAME).write_bytes(header + record)
    with pytest.raises(UserError, match=rf"serving_sims.pkl: refused to load {SYSTEM}"):
        SimJournal(tmp_path, config, resume=True)
    assert not marker.exists()


def test_a_serving_journal_without_a_config_or_with_a_foreign_record_is_named(tmp_path):
    (tmp_path / JOURNAL_NAME).write_bytes(pickle.dumps({"version": 1}))
    with pytest.raises(UserError, match=r"serving_sims.pkl has no 'config'$"):
        SimJournal(tmp_path, {}, resume=True)
    (tmp_path / JOURNAL_NAME).write_bytes(pickle.dumps({"version": 1, "config": {}}) + pickle.dumps(((1, 2), [3])))
    with pytest.raises(UserError, match=r"a record is not a \(plan key, simcore.serving.simulate.ServingResult\)"):
        SimJournal(tmp_path, {}, resume=True)


# ----- the serving study's journal (JSON lines: data only) -----------------------------------------------
@pytest.mark.parametrize("protocol", [0, pickle.HIGHEST_PROTOCOL])
def test_a_foreign_study_journal_is_refused_and_nothing_runs(tmp_path, protocol):
    from validation.studies.serving.journal import RowJournal

    marker = tmp_path / "MARKER"
    path = tmp_path / RowJournal.NAME
    path.write_bytes(_crafted(marker, protocol))
    with pytest.raises(UserError, match="rows.jsonl is not a serving study journal"):
        RowJournal(tmp_path, "stamp")
    assert not marker.exists() and path.read_bytes() == _crafted(marker, protocol)  # left as it was


def test_an_empty_study_journal_is_a_new_one(tmp_path):
    from validation.studies.serving.journal import RowJournal

    (tmp_path / RowJournal.NAME).write_text("")
    with RowJournal(tmp_path, "stamp") as journal:
        assert journal.reused == 0
    assert (tmp_path / RowJournal.NAME).read_text() == '{"fingerprint": "stamp"}\n'


def test_a_crafted_study_journal_is_refused_through_the_cli(tmp_path):
    data = write_rows(tmp_path / "in.csv", [{
        "id": "c2", "source_url": "x", "backend": "vllm", "backend_version": "0.12.0", "system": "h200_sxm",
        "precision": "fp8", "mode": "agg", "isl": "256", "osl": "16", "gemm_quant_mode": "fp8",
        "moe_quant_mode": "fp8", "batch_size": "8", "tp_size": "1", "pp_size": "1", "attention_dp_size": "1",
        "model_path": "meta-llama/Llama-3.1-8B-Instruct", "silicon_ttft_ms": "100", "silicon_tpot_ms": "10",
        "silicon_data_source": "silicon_concurrency=2"}])
    run = tmp_path / "run"
    run.mkdir()
    marker = tmp_path / "MARKER"
    (run / "rows.jsonl").write_bytes(_crafted(marker))
    proc = _app("validate", "study=serving", f"data={data}", "study.jobs=1", f"hydra.run.dir={run}", cwd=tmp_path)
    _refused_in_one_line(proc, f"{run / 'rows.jsonl'} is not a serving study journal")
    assert not marker.exists()
