"""The planner group's schemas: every option composes over its own, a knob it lacks fails at compose time."""

import inspect
from dataclasses import fields
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from planner.apps.common import UserError, check_known_keys
from planner.apps.search import SearchAppConfig, register
from planner.config import (
    PLANNERS,
    SCHEMAS,
    SERVING_ONLY,
    AnnealingPlannerConfig,
    GeneticPlannerConfig,
    RandomPlannerConfig,
    check_planner,
    check_planner_settings,
    method_defaults,
    planner_config,
)
from simcore.config import ConfigError

OPTIONS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "conf" / "planner").glob("*.yaml"))


def _compose(*overrides: str):
    register()
    with initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="search", overrides=list(overrides))


def _knobs(schema: type) -> set[str]:
    return {f.name for f in fields(schema)}


def test_every_planner_option_has_a_schema():
    assert set(OPTIONS) == set(SCHEMAS) == set(PLANNERS) | set(SERVING_ONLY)


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_composes_over_its_own_schema(option):
    cfg = _compose(f"planner={option}")
    assert OmegaConf.get_type(cfg.planner) is SCHEMAS[option] and cfg.planner.name == option
    assert set(cfg.planner) == _knobs(SCHEMAS[option])  # only its knobs
    check_known_keys(cfg, SearchAppConfig)  # the app's check reads the option's schema, not the base's
    if option in PLANNERS:
        check_planner(cfg.planner)
    check_planner_settings(cfg.planner)


@pytest.mark.parametrize("option", OPTIONS)
def test_a_knob_the_option_lacks_fails_at_compose_time_naming_it(option):
    # a knob no planner has, and one of another family's (its node holds only its own: see above)
    other = next(k for k in ("chunks", "T", "t0", "population") if k not in _knobs(SCHEMAS[option]))
    assert other in method_defaults()
    for key in ("temperature", other):
        with pytest.raises(ConfigCompositionException, match=rf"planner\.{key}"):
            _compose(f"planner={option}", f"planner.{key}=2")


def test_each_option_takes_its_own_knobs():
    assert _compose("planner=annealing", "planner.t0=50", "planner.budget=100").planner.t0 == 50
    assert _compose("planner=genetic", "planner.population=8").planner.population == 8
    assert _compose("planner=ppo", "planner.T=3").planner.T == 3
    assert _compose("planner=megatron", "planner.reranker=proxy", "planner.max_tp=4").planner.max_tp == 4
    with pytest.raises(ConfigCompositionException, match="planner.population"):
        _compose("planner=genetic", "planner.population=many")  # still typed


def test_an_appended_foreign_knob_is_refused_by_the_app_check():
    cfg = _compose("planner=random", "+planner.T=3")
    with pytest.raises(UserError, match=r"^planner\.T: unknown setting"):
        check_known_keys(cfg, SearchAppConfig)


def test_the_name_must_be_the_options_method():
    with pytest.raises(ConfigError, match=r"^planner\.name: 'annealing' is not the method of planner=random"):
        check_planner(_compose("planner=random", "planner.name=annealing").planner)
    with pytest.raises(ConfigError, match=r"^planner\.name: 'genetic' is not the method of planner=random"):
        check_planner(RandomPlannerConfig(name="genetic"))


def test_planner_config_builds_the_schema_of_a_method_and_refuses_foreign_knobs():
    cfg = planner_config("annealing", budget=10, t0=5.0)
    assert isinstance(cfg, AnnealingPlannerConfig) and (cfg.budget, cfg.t0) == (10, 5.0)
    assert isinstance(planner_config(), SCHEMAS["ppo"])
    with pytest.raises(ConfigError, match=r"^planner\.temperature: not a setting of planner=random"):
        planner_config("random", temperature=2)
    with pytest.raises(ConfigError, match=r"^planner\.name"):
        planner_config("ppo2")


def test_settings_are_checked_on_the_knobs_a_schema_has():
    check_planner(planner_config("megatron"))  # no PPO or genetic knobs to check
    with pytest.raises(ConfigError, match=r"^planner\.elitism must be below planner\.population \(2\)"):
        check_planner_settings(GeneticPlannerConfig(population=2, elitism=2))
    with pytest.raises(ConfigError, match=r"^planner\.t0 must be > 0"):
        check_planner(AnnealingPlannerConfig(t0=0))


def test_serving_methods_read_the_composed_options_knobs():
    from planner.serving.methods import method_config

    knobs = method_config(_compose("planner=genetic", "planner.population=8").planner)
    assert knobs.population == 8 and knobs.T == planner_config("ppo").T  # other methods' knobs: defaults
    with pytest.raises(ConfigError, match=r"^planner\.population must be >= 1"):
        method_config(_compose("planner=genetic", "planner.population=0").planner)
    with pytest.raises(ConfigError, match=r"^planner\.name"):
        method_config(_compose("planner=tpe", "planner.name=cmaes").planner)


def test_every_field_of_every_schema_says_what_it_is():
    for schema in {c for s in SCHEMAS.values() for c in s.__mro__ if c.__module__ == "planner.config"}:
        source = inspect.getsource(schema).splitlines()
        for name in schema.__dict__.get("__annotations__", {}):
            line = next(ln for ln in source if ln.strip().startswith(f"{name}:"))
            assert "#" in line and line.split("#", 1)[1].strip(), f"{schema.__name__}.{name} has no comment"


def test_the_serving_schema_carries_every_launch_flag_with_its_type():
    """The ``serving`` node mirrors simcore's LaunchFlags field for field (the schema documents each flag for
    the command line; ``build_serving_config`` reads them by LaunchFlags' names), so a flag added to one and
    not the other fails here, not at a user's command."""
    import dataclasses

    from planner.serving.config import ServingAppConfig
    from simcore.serving.deployment import LaunchFlags

    schema = {f.name: f.type for f in dataclasses.fields(ServingAppConfig)}
    for f in dataclasses.fields(LaunchFlags):
        assert f.name in schema, f.name
        assert str(schema[f.name]).replace(" ", "") == str(f.type).replace(" ", ""), f.name
