"""The benchmark scenarios (``conf/experiment/*.yaml``) as cost contexts, composed through Hydra so
benchmarks and apps read the very same configs, and random strategies of a scenario's search space.

Hydra (and :mod:`planner.apps.search`, which imports it and torch) is imported when a config is composed,
not with this module.
"""

from __future__ import annotations

import contextlib
from functools import cache
from pathlib import Path

import numpy as np

from planner.space import SearchSpace
from simcore.strategy.opgraph import SEARCHABLE_OPS
from topologies.scenario import build_context

__all__ = ["SCENARIOS", "scenario_config", "scenario_context", "planner_config", "random_keys"]

_CONF = Path(__file__).resolve().parents[3] / "conf"
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
    """The cost context of a scenario (its model, cluster and workload), built once per process."""
    cfg = scenario_config(name)
    return build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)


def random_keys(space: SearchSpace, n: int, seed: int = 0) -> np.ndarray:
    """``n`` random strategy keys: a random degree row of the space and random per-operator choices
    (valid and invalid alike, as a planner proposes them)."""
    rng = np.random.default_rng(seed)
    grid = space.degree_grid()
    degrees = grid[rng.integers(0, len(grid), n)]
    choices = rng.integers(0, 3, (n, len(SEARCHABLE_OPS)))
    return np.concatenate([degrees, choices], axis=1)
