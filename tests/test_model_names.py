"""One way to name a model: ``model=<preset | published id | config.json path>``, and one-line errors
that name the closest known ids, keys and options."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module

import planner.apps.sim  # noqa: F401  (registers sim_schema)
from simcore.models import CONFIG_DIR, MODEL_NAMES, closest_ids, get_model, published_ids
from topologies.scenario import model_of


def _compose(*overrides: str):
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="sim", overrides=list(overrides))


@pytest.mark.parametrize("name", [*MODEL_NAMES[:3], "moonshotai/Kimi-K2.5", "Qwen/Qwen3-32B-FP8",
                                  str(CONFIG_DIR / "llama-3.1-8b.json")])
def test_model_group_takes_presets_ids_and_paths(name):
    cfg = _compose(f"model={name}")
    assert cfg.model.name == name
    assert model_of(cfg.model) == get_model(name)


def test_every_published_id_and_preset_is_an_option():
    for name in (*MODEL_NAMES, *published_ids()):
        assert _compose(f"model={name}").model.name == name


def test_an_experiment_and_the_model_group_compose_together():
    cfg = _compose("experiment=dense-70b-1node", "model=llama-3.1-8b")
    assert cfg.model.name == "llama-3.1-8b"


def test_closest_ids_match_the_name_or_the_model_after_the_organisation():
    assert closest_ids("kimi-k3")[0] == "kimi-k2"
    assert "llama-3.1-8b" in closest_ids("someorg/llama-3.1-7b")


def _cli(*args: str, tmp_path) -> subprocess.CompletedProcess:
    code = "import sys; from planner.apps.sim import main; sys.argv[0] = 'shard-sim'; main()"
    return subprocess.run([sys.executable, "-c", code, *args, f"hydra.run.dir={tmp_path}"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize(("arg", "line"), [
    ("model=kimi-k3", "error: model: unknown model 'kimi-k3' (a preset, a published id or a config.json path); "
                      "closest: kimi-k2"),
    ("model.name=someorg/unknown-9b", "error: model.name: unknown model 'someorg/unknown-9b'"),
    ("strategy.tpp=8", "error: strategy.tpp: unknown key; closest: tp, pp"),
    ("topology=h100-ib-rial", "error: topology: unknown option 'h100-ib-rial'; closest: h100-ib-rail"),
    ("sim.routng.a2a=x", "error: sim.routng: unknown key; closest: routing"),
])
def test_unknown_names_are_one_line_naming_the_closest(arg, line, tmp_path):
    proc = _cli(arg, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and proc.stderr.startswith(line), proc.stderr
    assert "+strategy" not in proc.stderr and "Traceback" not in proc.stderr
