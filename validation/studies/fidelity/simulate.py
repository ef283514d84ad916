"""Simulations of the fidelity study: one strategy of one scenario, reduced to what the study keeps.

:func:`simulate_keys` runs a scenario's strategies in order, on ``workers`` spawned processes; each
process builds a scenario's context, topology graph and engine config once (contention as asked,
overlap on, no trace). A simulator exception becomes the row's ``error`` (first line, no object
addresses), so the study goes on and the report lists the strategy.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from planner.megatron import strategy_from_key
from simcore.config import build_engine_config
from simcore.engine import simulate
from topologies.scenario import build_graph
from validation.studies.common.scenarios import scenario_config, scenario_context

__all__ = ["simulate_keys"]


@functools.cache
def _setup(name: str, contention: bool):
    """Context, topology graph and engine config of a scenario (cached per process)."""
    cfg = scenario_config(name)
    engine = dataclasses.replace(build_engine_config(cfg.sim), contention=contention, overlap=True, trace=False)
    return scenario_context(name), build_graph(cfg.topology, cfg.hardware), engine


def _simulate_one(args: tuple[str, tuple, bool]) -> dict:
    """One simulation, reduced to what the study keeps. A simulator exception is kept as ``error``
    (the study goes on; the report lists the strategy)."""
    name, key, contention = args
    ctx, graph, engine = _setup(name, contention)
    start = time.perf_counter()
    try:
        res = simulate(ctx, graph, strategy_from_key(key), engine)
    except Exception as exc:  # any engine failure becomes a reported row, the study goes on
        nan = float("nan")
        return {"step_time_s": nan, "tokens_per_s_per_gpu": nan, "valid": False, "reasons": [],
                "split": [], "max_link_utilization": 0.0, "busiest_link": "",
                "wall_s": time.perf_counter() - start, "error": _error_text(exc)}
    util = sorted(res.link_utilization.items(), key=lambda kv: -kv[1])
    return {"step_time_s": res.step_time_s, "tokens_per_s_per_gpu": res.tokens_per_s_per_gpu, "valid": res.valid,
            "reasons": list(res.reasons), "split": list(res.split),
            "max_link_utilization": util[0][1] if util else 0.0, "busiest_link": util[0][0] if util else "",
            "wall_s": res.wall_s, "error": ""}


def _error_text(exc: Exception) -> str:
    """First line of an exception, without object addresses (stable across runs)."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return re.sub(r" (object )?at 0x[0-9a-f]+", "", text)


def simulate_keys(name: str, keys: np.ndarray, workers: int = 1, contention: bool = True) -> list[dict]:
    """Simulate every key of scenario ``name`` (in order), on ``workers`` processes."""
    jobs = [(name, tuple(int(v) for v in k), contention) for k in keys]
    if workers <= 1 or len(jobs) < 2:
        return [_simulate_one(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_simulate_one, jobs, chunksize=1))
