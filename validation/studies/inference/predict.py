"""The inference study's predictions: a row's metric from the proxy and from the simulator."""

from __future__ import annotations

import math

from simcore.cost.proxy import evaluate
from simcore.engine import EngineConfig, simulate
from topologies import build_topology
from validation.studies.inference.rows import NODE_GPUS, RowCase

__all__ = ["predict"]


def _metric(case: RowCase, result) -> float:
    per_gpu = result.tokens_per_s_per_gpu
    return {"output_tokens_per_s": result.tokens_per_s, "output_tokens_per_s_per_gpu": per_gpu,
            "ttft_ms": result.ttft_s * 1e3, "tpot_ms": result.tpot_s * 1e3,
            "input_tokens_per_s_per_node": per_gpu * min(case.gpus, NODE_GPUS),
            "output_tokens_per_s_per_node": per_gpu * min(case.gpus, NODE_GPUS)}[case.metric]


def _graph(case: RowCase):
    name = {"h100-sxm": "h100", "h200": "h200", "h800": "h800"}[case.ctx.cluster.gpu.name]
    if case.gpus <= NODE_GPUS and name == "h100":
        return build_topology("hgx-h100")
    return build_topology(f"{name}-ib-rail", num_nodes=max(1, math.ceil(case.gpus / NODE_GPUS)))


def predict(case: RowCase, simulate_too: bool = True, engine=None) -> tuple[float, float]:
    """(simulator, proxy) prediction of the row's metric (the simulator's is NaN when not run)."""
    proxy = _metric(case, evaluate(case.ctx, case.strategy))
    if not simulate_too:
        return float("nan"), proxy
    sim = simulate(case.ctx, _graph(case), case.strategy, engine or EngineConfig())
    return _metric(case, sim), proxy
