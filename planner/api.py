"""The Python API: what the ``shard-*`` commands do, from a script or a notebook.

A :class:`Scenario` is a model on a cluster under a workload, composed from the same Hydra configs the
apps read (a shipped experiment, or model, topology and workload chosen by name). On it:

- :func:`megatron_plan`: the Megatron heuristic's best plan (``shard-sim``'s default plan);
- :func:`price`: a strategy under the roofline proxy (fast, closed form);
- :func:`simulate`: the same strategy in the discrete-event simulator (contention, overlap, skew);
- :func:`serve`: a serving plan request by request (``shard-sim workload=serving``);
- :func:`search`: a planner's search of the plan space (``shard-search``).

Example (the README runs it)::

    from planner import api

    sc = api.scenario("dense-70b-1node")                  # Llama-3.1-70B decode on one HGX H100 node
    plan = api.megatron_plan(sc)
    print(plan.describe(), api.price(sc, plan).tokens_per_s_per_gpu)
    print(api.simulate(sc, plan).tokens_per_s_per_gpu)
    served = api.serve(sc, {"mode": "agg", "pool": {"tp": 8}}, concurrency=16, osl=128)
    print(served.metrics.tpot_s["mean"])
    print(api.search(sc, method="random", budget=64).best_value)

Bad input raises :class:`~planner.errors.UserError` or :class:`~simcore.config.ConfigError` (one line,
naming the field), as the apps report it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from planner.apps.common import config_error_line
from planner.apps.search import register
from planner.runner import SearchResult, run_planner
from planner.serving.config import build_serving_config, build_serving_context, plan_from_dict
from simcore.config import ConfigError, build_engine_config, build_space
from simcore.cost.proxy import ProxyResult, evaluate
from simcore.cost.tasks import CostContext
from simcore.engine import simulate as simulate_step
from simcore.engine.result import SimResult
from simcore.serving import ServingResult, simulate_serving
from simcore.space.megatron import megatron_search
from simcore.strategy.sharding import Strategy, megatron_strategy
from topologies.scenario import build_context, build_graph

__all__ = ["Scenario", "scenario", "strategy", "megatron_plan", "price", "simulate", "serve", "search"]


@dataclass(frozen=True)
class Scenario:
    """A composed config (``config``, as ``shard-search`` would run it), its cost context and its
    cluster graph."""

    config: DictConfig
    ctx: CostContext
    graph: nx.DiGraph

    @property
    def name(self) -> str:
        return str(self.config.scenario)


@contextlib.contextmanager
def composing() -> Iterator[None]:
    """Hydra's compose API, usable inside a running Hydra app too: the app's global Hydra is set
    aside meanwhile and put back."""
    app = GlobalHydra.instance().hydra if GlobalHydra.instance().is_initialized() else None
    GlobalHydra.instance().clear()
    register()
    try:
        with initialize_config_module(config_module="conf", version_base=None):
            yield
    finally:
        GlobalHydra.instance().clear()
        if app is not None:
            GlobalHydra.instance().initialize(app)


def compose_search(overrides: list[str]) -> DictConfig:
    """The ``shard-search`` config with ``overrides`` (Hydra override strings)."""
    try:
        with composing():
            return compose(config_name="search", overrides=overrides)
    except (HydraException, OmegaConfBaseException) as exc:  # as the apps say it: one line naming the key
        raise ConfigError(config_error_line(exc)) from None


def scenario(experiment: str | None = None, *, model: str | None = None, topology: str | None = None,
             num_nodes: int | None = None, workload: str | None = None,
             overrides: list[str] | tuple[str, ...] = ()) -> Scenario:
    """A shipped experiment (``conf/experiment/<experiment>.yaml``) or the default scenario, with
    ``model`` (a preset, a published id or a ``config.json`` path), ``topology`` (a preset of
    ``conf/topology``), ``num_nodes`` and ``workload`` (``decode``, ``prefill``, ``serving``) replaced
    when given, and any further Hydra ``overrides`` (``["workload.input_len=2048"]``)."""
    args = [f"experiment={experiment}"] if experiment else []
    args += [f"model={model}"] if model else []
    args += [f"topology={topology}"] if topology else []
    args += [f"topology.num_nodes={int(num_nodes)}"] if num_nodes is not None else []
    args += [f"workload={workload}"] if workload else []
    cfg = compose_search([*args, *overrides])
    if cfg.workload.phase == "serving":  # a serving scenario's context takes its lengths from the serving node
        ctx = build_serving_context(cfg)
    else:
        ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload, cfg.sim)
    return Scenario(cfg, ctx, build_graph(cfg.topology, cfg.hardware))


def strategy(tp: int = 1, ep: int = 1, pp: int = 1, dp: int = 1, batch: int = 1, microbatches: int = 1,
             **sharding: str) -> Strategy:
    """A strategy at these degrees with Megatron's per-operator sharding, any operator's choice
    replaced by ``sharding`` (``qkv="dim0"``)."""
    s = megatron_strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=batch, microbatches=microbatches)
    return s.replace(sharding=dict(s.sharding) | sharding) if sharding else s


def megatron_plan(sc: Scenario) -> Strategy:
    """The best valid plan of the Megatron heuristic over the scenario's search space (the proxy ranks)."""
    ranked = megatron_search(sc.ctx, build_space(sc.ctx, sc.config.planner))
    return ranked.strategy(0)


def price(sc: Scenario, s: Strategy) -> ProxyResult:
    """``s`` under the roofline proxy: step time, TTFT/TPOT, tokens/s/GPU, validity with reasons."""
    return evaluate(sc.ctx, s)


def simulate(sc: Scenario, s: Strategy, **sim: Any) -> SimResult:
    """``s`` in the simulator; ``sim`` sets fields of the ``sim`` config (``contention=False``)."""
    engine = build_engine_config(OmegaConf.merge(sc.config.sim, sim) if sim else sc.config.sim)
    return simulate_step(sc.ctx, sc.graph, s, engine)


def serve(sc: Scenario, plan: Mapping[str, Any], **serving: Any) -> ServingResult:
    """The serving ``plan`` (``{"mode": "agg", "pool": {"tp": 8}}``, or ``disagg`` with ``prefill`` and
    ``decode`` pools, as ``best_plan.yaml``'s ``serving_plan``) request by request; ``serving`` sets
    fields of the ``serving`` config (``concurrency``, ``isl``, ``osl``, ``runtime``, ``rate``...)."""
    cfg = OmegaConf.merge(sc.config, {"serving": serving}) if serving else sc.config
    ctx = build_serving_context(cfg)
    scfg = build_serving_config(cfg.serving, model=cfg.model.name)
    return simulate_serving(ctx, plan_from_dict(dict(plan)), scfg, graph=sc.graph if cfg.serving.network else None)


def search(sc: Scenario, method: str = "ppo", budget: int | None = None, seed: int = 0,
           **planner: Any) -> SearchResult:
    """Run planner ``method`` (``ppo``, ``random``, ``annealing``, ``genetic``, ``megatron``, ``exact``...)
    on the scenario with the settings ``shard-search planner=<method>`` uses, ``budget`` proxy calls and
    any other ``planner`` field; returns every evaluated plan and the best valid one."""
    fields = dict(planner) | ({"budget": int(budget)} if budget is not None else {})
    pcfg = compose_search([f"planner={method}", *(f"planner.{k}={v}" for k, v in fields.items())]).planner
    return run_planner(sc.ctx, build_space(sc.ctx, pcfg), pcfg, seed)
