"""``shard-sim``: price one strategy (from the config or a ``best_plan.yaml``) and print its breakdown.

``shard-sim plan=outputs/.../best_plan.yaml`` replays a plan found by ``shard-search``;
``shard-sim strategy.tp=8 strategy.batch=64`` prices a strategy given on the command line. The
scenario groups (model, topology, workload) are the same as ``shard-search``'s; a plan file's
scenario fields are applied unless overridden.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from rich.table import Table

from planner.config import SearchAppConfig
from simcore.apps.common import UserError, atomic_write_json, cli_errors, console, run_dir
from simcore.config import build_context
from simcore.proxy import evaluate
from simcore.strategy import Strategy

__all__ = ["run", "main", "SimAppConfig"]


@dataclass
class SimAppConfig(SearchAppConfig):
    plan: str | None = None
    strategy: dict[str, Any] = field(default_factory=dict)


def _load(cfg: DictConfig) -> Strategy:
    if cfg.plan:
        return Strategy.from_yaml(str(cfg.plan))
    return Strategy.from_dict(OmegaConf.to_container(cfg.strategy, resolve=True) or {})


def run(cfg: DictConfig) -> dict:
    """Evaluate the strategy, print the per-operator breakdown, write ``result.json``."""
    strategy = _load(cfg)
    ctx = build_context(cfg.model, cfg.hardware, cfg.topology, cfg.workload)
    result = evaluate(ctx, strategy)
    con = console()
    table = Table(title=f"{cfg.scenario}: {ctx.model.name} on {ctx.cluster.num_gpus} x {ctx.cluster.gpu.name}, "
                        f"{ctx.workload.phase} — proxy breakdown of one step")
    table.add_column("operator / category")
    table.add_column("ms", justify="right")
    table.add_column("share", justify="right")
    total = result.step_time_s
    for name, value in sorted({**result.by_operator, **{f"[{k}]": v for k, v in result.by_category.items()}}
                              .items(), key=lambda kv: -kv[1]):
        table.add_row(name, f"{value * 1e3:.3f}", f"{value / total:.1%}")
    con.print(table)
    verdict = "valid" if result.valid else f"INVALID ({', '.join(result.reasons)})"
    con.print(f"step {total * 1e3:.3f} ms, {result.tokens_per_s_per_gpu:,.1f} tokens/s/GPU, "
                  f"{result.memory_per_gpu_bytes / 1e9:.1f} GB/GPU: {verdict}")
    out = run_dir()
    payload = {"proxy": result.to_dict(), "scenario": cfg.scenario}
    atomic_write_json(out / "result.json", payload)
    con.print(f"run dir: {out}")
    return payload


ConfigStore.instance().store(name="sim_schema", node=SimAppConfig)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="sim")
@cli_errors
def main(cfg: DictConfig) -> float:
    if not cfg.plan and not cfg.strategy:
        raise UserError("give plan=PATH/best_plan.yaml or strategy.tp=... (see shard-sim --help)")
    return float(run(cfg)["proxy"]["tokens_per_s_per_gpu"])
