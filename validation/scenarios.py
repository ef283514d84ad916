"""The benchmark scenarios (``conf/experiment/*.yaml``) as cost contexts, composed through Hydra so
benchmarks and apps read the very same configs."""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path

__all__ = ["SCENARIOS", "scenario_config", "scenario_context", "planner_config"]

_CONF = Path(__file__).resolve().parent.parent / "conf"
SCENARIOS = tuple(sorted(p.stem for p in (_CONF / "experiment").glob("*.yaml")))


def scenario_config(name: str, overrides: list[str] | None = None):
    """The composed ``shard-search`` config of a scenario (``experiment=<name>``)."""
    from hydra import compose, initialize_config_module

    from planner.apps.search import register

    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose one of: {', '.join(SCENARIOS)}")
    register()
    with _outside_hydra(), initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="search", overrides=[f"experiment={name}", *(overrides or [])])


def planner_config(method: str, overrides: list[str] | None = None):
    """The composed ``planner`` node ``shard-search planner=<method>`` runs with (``conf/planner/<method>.yaml``
    over :class:`planner.config.PlannerConfig`'s schema), so a study searches with the settings users get."""
    from hydra import compose, initialize_config_module

    from planner.apps.search import register

    register()
    with _outside_hydra(), initialize_config_module(config_module="conf", version_base=None):
        return compose(config_name="search", overrides=[f"planner={method}", *(overrides or [])]).planner


@contextlib.contextmanager
def _outside_hydra():
    """Hydra's compose API refuses to start inside a running Hydra app (``shard-validate`` running a
    study): set the app's global Hydra aside meanwhile, and put it back."""
    from hydra.core.global_hydra import GlobalHydra

    app = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    try:
        yield
    finally:  # compose's context restores a copy of the singletons: ask for the instance again
        GlobalHydra.instance().clear()
        if app is not None:
            GlobalHydra.instance().initialize(app)


@cache
def scenario_context(name: str):
    from topologies.scenario import build_context

    cfg = scenario_config(name)
    return build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)
