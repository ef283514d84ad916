"""``shard-search``: find the best sharding for the configured scenario.

A thin Hydra entry point over :func:`run`, which is pure: config in, files in the run dir out.
"""

from __future__ import annotations

import time

import hydra
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from planner.config import register
from planner.megatron import megatron_search, strategy_from_key
from planner.space import SearchSpace
from simcore.apps.common import UserError, atomic_write_json, atomic_write_text, cli_errors, console, run_dir
from simcore.config import build_context
from simcore.proxy import evaluate

__all__ = ["run", "main"]

PLANNERS = ("megatron",)


def _space(ctx, cfg: DictConfig) -> SearchSpace:
    p = cfg.planner
    if p.budget < 1:
        raise UserError(f"planner.budget must be >= 1, got {p.budget}")
    batch = tuple(int(b) for b in p.batch) if p.batch else None
    return SearchSpace.for_context(ctx, batch=batch, microbatches=tuple(int(m) for m in p.microbatches),
                                   max_tp=p.max_tp, max_pp=int(p.max_pp))


def _table(results, con, title: str) -> None:
    table = Table(title=title)
    for col in ("#", "tp", "ep", "pp", "dp", "batch", "mb", "tok/s/GPU", "TPOT ms", "TTFT ms",
                "compute", "comm", "bubble", "HBM GB"):
        table.add_column(col, justify="right")
    for i, r in enumerate(results, 1):
        s, cat = r.strategy, r.by_category
        comm = sum(v for k, v in cat.items() if k.startswith("comm"))
        total = r.step_time_s or 1.0
        table.add_row(str(i), str(s.tp), str(s.ep), str(s.pp), str(s.dp), str(s.batch), str(s.microbatches),
                      f"{r.tokens_per_s_per_gpu:,.1f}", _ms(r.tpot_s), _ms(r.ttft_s),
                      f"{cat.get('compute', 0) / total:.0%}", f"{comm / total:.0%}",
                      f"{cat.get('bubble', 0) / total:.0%}", f"{r.memory_per_gpu_bytes / 1e9:.1f}")
    con.print(table)


def _ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1e3:.2f}"


def run(cfg: DictConfig) -> dict:
    """Search, print the top plans, write ``results.json`` and ``best_plan.yaml``; return the summary."""
    if cfg.planner.name not in PLANNERS:
        raise UserError(f"planner.name: {cfg.planner.name!r} is not one of {', '.join(PLANNERS)}")
    con = console()
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)
    start = time.perf_counter()
    ranked = megatron_search(ctx, _space(ctx, cfg))
    wall_s = time.perf_counter() - start
    out = run_dir()
    top = [evaluate(ctx, strategy_from_key(ranked.keys[i])) for i in ranked.order[: int(cfg.top)]]
    _table(top, con, f"{cfg.scenario}: top plans ({cfg.planner.name}, {ranked.calls} proxy calls, "
                         f"{ranked.num_valid} valid, {wall_s:.2f} s)")
    if not top or not top[0].valid:
        reasons = top[0].reasons if top else []
        con.print(f"[red]no valid strategy[/red]; best candidate fails: {', '.join(reasons)}")
    best = top[0]
    summary = {
        "scenario": cfg.scenario, "planner": cfg.planner.name, "seed": int(cfg.seed), "calls": ranked.calls,
        "valid": ranked.num_valid, "wall_s": wall_s, "best": best.to_dict(),
        "proxy_tokens_per_s_per_gpu": best.tokens_per_s_per_gpu if best.valid else None,
        "top": [r.to_dict() for r in top], "config": OmegaConf.to_container(cfg, resolve=True),
    }
    atomic_write_json(out / "results.json", summary)
    plan = {"scenario": cfg.scenario, "model": cfg.model.name, "topology": OmegaConf.to_container(cfg.topology),
            "workload": OmegaConf.to_container(cfg.workload), "strategy": best.strategy.to_dict()}
    import yaml

    atomic_write_text(out / "best_plan.yaml", yaml.safe_dump(plan, sort_keys=False))
    con.print(f"best: {best.tokens_per_s_per_gpu:,.1f} tokens/s/GPU  ->  run dir: {out}")
    return summary


register()


@hydra.main(version_base=None, config_path="pkg://conf", config_name="search")
@cli_errors
def main(cfg: DictConfig) -> float:
    summary = run(cfg)
    return float(summary["proxy_tokens_per_s_per_gpu"] or 0.0)
