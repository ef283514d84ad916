"""Figures a job did not record, computed from its composed config.

- The Megatron baseline: :func:`planner.megatron.megatron_search` holds Megatron's per-operator
  sharding fixed and searches the degrees exhaustively under the proxy (tens of milliseconds), over
  the job planner's space bounds (``planner.batch``, ``microbatches``, ``max_tp``, ``max_pp``).
- The simulator's throughput of the job's best plan (one :func:`simcore.engine.simulate` call).

A config that cannot be rebuilt leaves the figure empty with the reason; it never stops the report.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from omegaconf import OmegaConf

from planner.megatron import megatron_search
from planner.space import SearchSpace
from simcore.config import build_engine_config
from simcore.engine import EngineConfig, simulate
from simcore.strategy.sharding import Strategy
from topologies.scenario import build_context, build_graph
from validation.report.jobs import Job

__all__ = ["megatron_figure", "sim_figure", "fill_megatron", "fill_sim"]


def _context(config: dict):
    cfg = OmegaConf.create(config)
    return cfg, build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)


def megatron_figure(config: dict) -> float:
    """Best valid tokens/s/GPU of the Megatron heuristic for a composed config (raises if none is valid)."""
    cfg, ctx = _context(config)
    p = cfg.get("planner") or {}
    batch = tuple(int(b) for b in p.get("batch") or ()) or None
    microbatches = tuple(int(m) for m in p.get("microbatches") or (1, 2, 4, 8))
    space = SearchSpace.for_context(ctx, batch=batch, microbatches=microbatches, max_tp=p.get("max_tp"),
                                    max_pp=int(p.get("max_pp") or 16))
    ranked = megatron_search(ctx, space)
    if ranked.num_valid == 0:
        raise ValueError("no valid Megatron strategy")
    return float(ranked.result.tokens_per_s_per_gpu[ranked.order[0]])


def sim_figure(config: dict, strategy: dict) -> float:
    """Simulated tokens/s/GPU of ``strategy`` (a strategy dict) in the config's scenario."""
    cfg, ctx = _context(config)
    engine = EngineConfig()
    if cfg.get("sim"):
        engine = build_engine_config(OmegaConf.merge(OmegaConf.structured(EngineConfig), cfg.sim))
    result = simulate(ctx, build_graph(cfg.topology, cfg.hardware), Strategy.from_dict(strategy), engine)
    return float(result.tokens_per_s_per_gpu)


def _why(exc: Exception) -> str:
    return f"n/a: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def _attempt(compute: Callable[[], float]) -> float | str:
    try:
        return compute()
    except Exception as exc:  # a config that cannot be rebuilt must not stop the report
        return _why(exc)


def fill_megatron(jobs: list[Job]) -> None:
    """Compute the baseline of every finished job that has none (once per distinct scenario)."""
    cache: dict[str, float | str] = {}
    for job in jobs:
        if job.megatron is not None or job.strategy is None or not job.config:
            continue
        keys = ("model", "hardware", "topology", "workload", "planner")
        key = json.dumps({k: job.config.get(k) for k in keys}, sort_keys=True, default=str)
        if key not in cache:
            cache[key] = _attempt(lambda job=job: megatron_figure(job.config))
        value = cache[key]
        job.megatron, job.megatron_source = (value, "computed") if isinstance(value, float) else (None, value)


def fill_sim(jobs: list[Job]) -> None:
    """Simulate the best plan of every job with a valid plan and no simulator figure."""
    for job in jobs:
        if job.sim is not None or not job.ok or not job.config:
            continue
        value = _attempt(lambda job=job: sim_figure(job.config, job.strategy))
        job.sim, job.sim_source = (value, "computed") if isinstance(value, float) else (None, value)
