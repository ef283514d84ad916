"""The MoE study's predictions: a case's kernel time under :mod:`simcore.moe.deepep`, its error on time
or bandwidth, and the errors per (split, mode, EP size)."""

from __future__ import annotations

import dataclasses
import statistics

from simcore.hardware.gpus import get_gpu
from simcore.moe.deepep import DEFAULT_DEEPEP, DeepEPConstants, uniform_time_s
from simcore.moe.draws import expected_max_load
from simcore.moe.routing import RoutingConfig
from validation.studies.moe.rows import MoeCase

__all__ = ["bottleneck_bytes", "busiest_load", "predict", "error", "evaluate", "BENCH_ROUTING", "BENCH_EXPERTS"]

#: How DeepEP's benchmarks route (``tests/test_intranode.py``, ``test_internode.py``,
#: ``test_low_latency.py``): every token's top-k experts drawn from random gate scores among
#: DeepSeek-V3's 256 routed experts, i.e. a sampled uniform routing. Its busiest rank receives more
#: than the mean (by 5-10% at these sizes), and a dispatch or combine ends with it.
BENCH_ROUTING = RoutingConfig("uniform", sampled=True)
BENCH_EXPERTS = 256


def busiest_load(case: MoeCase) -> float:
    """The expected load of the busiest rank over the mean under :data:`BENCH_ROUTING`
    (:func:`simcore.moe.expected_max_load`, what the proxy prices for that routing)."""
    return expected_max_load(BENCH_ROUTING, BENCH_EXPERTS, case.ep, case.tokens * case.top_k * case.ep)


def bottleneck_bytes(case: MoeCase) -> float:
    """Bytes per rank DeepEP's bandwidth figure counts: every token copy to another rank
    (low-latency); the distinct tokens per other rank over NVLink within a node, or per destination
    node, its own included, over RDMA across nodes (normal; see :mod:`simcore.moe.deepep`)."""
    ep, rpn, k, t = case.ep, case.ranks_per_node, case.top_k, case.tokens
    if case.mode == "low_latency":
        return t * k * (ep - 1) / ep * case.token_bytes
    if rpn >= ep:
        return (ep - 1) * t * (1.0 - (1.0 - 1.0 / ep) ** k) * case.token_bytes
    return ep / rpn * t * (1.0 - (1.0 - rpn / ep) ** k) * case.token_bytes


def predict(case: MoeCase, c: DeepEPConstants = DEFAULT_DEEPEP) -> float:
    """Predicted time (s) of the case's kernel on its GPU, its busiest rank at the expected load of
    the benchmark's routing (:func:`busiest_load`)."""
    c = dataclasses.replace(c, ll_nvlink=c.ll_nvlink and case.ll_nvlink)
    return float(uniform_time_s(case.mode, case.tokens, case.top_k, case.token_bytes, case.ep,
                                case.ranks_per_node, get_gpu(case.gpu), load=busiest_load(case), c=c))


def error(case: MoeCase, c: DeepEPConstants = DEFAULT_DEEPEP) -> tuple[str, float]:
    """``(metric, predicted / measured - 1)``: on time where a latency is given, else on bandwidth."""
    t = predict(case, c)
    if case.latency_s is not None:
        return "time", t / case.latency_s - 1.0
    return "bandwidth", bottleneck_bytes(case) / t / case.bandwidth_bytes_per_s - 1.0


def _stats(values: list[float]) -> dict:
    a = [abs(v) for v in values]
    return {"rows": len(a), "median_abs_error": round(statistics.median(a), 4), "max_abs_error": round(max(a), 4)}


def evaluate(cases: list[MoeCase], c: DeepEPConstants = DEFAULT_DEEPEP) -> tuple[list[dict], dict]:
    """Per-row records and the summary: errors per (split, mode, EP size) for dispatch and combine."""
    records = []
    for case in cases:
        metric, err = error(case, c)
        records.append({"line": case.line, "split": case.split, "mode": case.mode, "kernel": case.kernel,
                        "op": case.op, "ep": case.ep, "gpu": case.gpu, "ll_nvlink": case.ll_nvlink,
                        "metric": metric, "predicted_s": predict(case, c), "rel_error": err})
    by_ep: dict[str, dict] = {}
    for r in records:
        key = f"{r['split']}/{r['mode']}/ep{r['ep']}"
        by_ep.setdefault(key, {}).setdefault(r["op"], []).append(r["rel_error"])
    order = sorted(by_ep, key=lambda k: (k.split("/")[0], k.split("/")[1], int(k.split("/")[2][2:])))
    table = {k: {op: _stats(v) for op, v in sorted(by_ep[k].items())} for k in order}
    splits = {s: _stats([r["rel_error"] for r in records if r["split"] == s])
              for s in ("fit", "test") if any(r["split"] == s for r in records)}
    return records, {"by_ep": table, "by_split": splits}
