"""DeepSeek sparse attention against dense MLA, under attention TP and attention DP, at one long prompt length.

``python -m validation.studies.attention.sparse_layouts [--isl N] [--osl N] [--clients N]``: DeepSeek-V3 and
DeepSeek-V3.2 (the same model but for V3.2's lightning indexer and top-2048 attention,
:mod:`simcore.models.sparse_attention`) on 8 H200, SGLang's profile, BF16 KV, a closed loop of ``--clients``
clients at ``--isl`` / ``--osl`` tokens, under two layouts of the same 8 GPUs: attention TP 8 (16 query
heads per GPU, which FlashMLA's sparse prefill runs padded to its 64-head tile on Hopper) and attention
DP 8 with 8-way expert parallelism (all 128 heads on each GPU: no padding). Prints mean TTFT and TPOT per
case and ends with one JSON line ``{layout: {model: {"ttft_s", "tpot_s"}}}``.
"""

from __future__ import annotations

import argparse

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext
from simcore.files import dumps
from simcore.models import get_model
from simcore.serving import LengthDist, ServingConfig, ServingPlan, simulate_serving
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from validation.studies.common.cli import count

__all__ = ["main", "LAYOUTS"]

LAYOUTS = {"attention-tp8": dict(tp=8), "attention-dp8-ep8": dict(tp=1, ep=8)}
MODELS = ("deepseek-v3", "deepseek-v3.2")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isl", type=count, default=32768)
    parser.add_argument("--osl", type=count, default=256)
    parser.add_argument("--clients", type=count, default=16)
    args = parser.parse_args(argv)
    cfg = ServingConfig(concurrency=args.clients, num_requests=3 * args.clients, input_len=LengthDist(mean=args.isl),
                        output_len=LengthDist(mean=args.osl), runtime="sglang")
    out: dict = {}
    for layout, shape in LAYOUTS.items():
        for name in MODELS:
            ctx = CostContext(get_model(name), Workload(precision="fp8", kv_precision="bf16"),
                              Cluster.simple("h200", 8))
            plan = ServingPlan.aggregated(megatron_strategy(**shape), workers=1, max_num_seqs=args.clients)
            m = simulate_serving(ctx, plan, cfg).metrics
            out.setdefault(layout, {})[name] = {"ttft_s": round(m.ttft_s["mean"], 4), "tpot_s": round(m.tpot_s["mean"], 5)}
            print(f"{layout:18s} {name:14s} TTFT {m.ttft_s['mean']:8.2f} s  TPOT {m.tpot_s['mean'] * 1e3:7.1f} ms",
                  flush=True)
    print(dumps(out))
    return out


if __name__ == "__main__":
    main()
