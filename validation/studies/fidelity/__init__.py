"""Fidelity study: does the roofline proxy rank strategies as the simulator does, and where not, why?

``run(out_dir, scenarios, strategies=500, seed=0, quick=False)``. For each benchmark scenario it
samples proxy-valid strategies (:mod:`.sample`: the Megatron heuristic's best, the PPO
planner's search trajectory, random valid ones), prices each with the proxy and with the simulator
(contention and overlap on, the scenario's ``sim`` settings otherwise), and reports

- Kendall tau and Spearman rho of the two tokens/s/GPU rankings (also over the proxy's top 50),
  and the overlap of their top 10;
- the sim/proxy step-time ratio by regime (:mod:`.regimes`);
- re-ranking: the simulator's best valid strategy among the proxy's top ``K = 16``, against the proxy's
  own pick, over the whole sample and over each source alone;
- every large disagreement (``|ratio - 1| > 5%``) explained from the simulator's breakdown of its
  critical stage against the proxy's (:mod:`.explain`); the ``explain_top`` largest per
  scenario are simulated once more with contention off, to split overlap from link sharing.

Scenarios on ``LARGE_GPUS`` GPUs or more (the 1024-GPU GPT-MoE ones take seconds per simulation) get
``large_strategies`` strategies instead. Outputs (:mod:`.report`): ``strategies.csv``, ``summary.json``,
``report.md`` (:mod:`.markdown`), ``scatter.png`` and ``ratios.png`` (:mod:`.plot`); unless ``measured``
is off, also the three-way comparison with measurements (:mod:`.measured`).

Run: ``python -m validation.studies.fidelity [--quick] [--scenarios a b] [--strategies N] [--out DIR]``
(or ``shard-validate study=fidelity``) ends with one JSON line of the headline figures;
``python -m validation.studies.fidelity.measured [--quick] [--out DIR]`` runs the three-way part alone.

Scripts beside the study: :mod:`.rerank_regret` (``python -m validation.studies.fidelity.rerank_regret``: does
re-ranking the proxy's top 16 find the simulator's best plan?) and :mod:`.contention_report` (where and why the
simulator with contention departs from the proxy).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simcore.files import dumps
from validation.studies.common.scenarios import scenario_context
from validation.studies.fidelity.report import write_outputs
from validation.studies.fidelity.scenario import LARGE, scenario_rows
from validation.studies.fidelity.simulate import simulate_keys

__all__ = ["DEFAULT_SCENARIOS", "QUICK", "LARGE_GPUS", "K_RERANK", "LARGE", "simulate_keys", "run", "main"]

DEFAULT_SCENARIOS = ("dense-70b-1node", "dense-70b-prefill", "mixtral-2node", "deepseek-8node", "gptmoe-1.6t-16k")
LARGE_GPUS = 512
K_RERANK = 16
QUICK = {"scenarios": ("dense-70b-1node",), "strategies": 12, "large_strategies": 6, "search_budget": 4,
         "workers": 1, "explain_top": 2}
FULL = {"scenarios": DEFAULT_SCENARIOS, "strategies": 500, "large_strategies": 60, "search_budget": 200,
        "workers": 2, "explain_top": 6}


def _settings(quick: bool, given: dict) -> dict:
    base = dict(QUICK if quick else FULL)
    return base | {k: v for k, v in given.items() if v is not None}


def run(out_dir: str | Path, scenarios: tuple[str, ...] | list[str] | None = None, strategies: int | None = None,
        seed: int = 0, quick: bool = False, large_strategies: int | None = None, search_budget: int | None = None,
        workers: int | None = None, explain_top: int | None = None, measured: bool = True) -> dict:
    """Run the study, write its files into ``out_dir``, return the summary (``None`` = the quick or full
    default of that setting). ``measured``: also the three-way section against measurements
    (:mod:`.measured`, on its first rows per file when ``quick``), ``headline["three_way"]``."""
    opts = _settings(quick, {"scenarios": tuple(scenarios) if scenarios else None, "strategies": strategies,
                             "large_strategies": large_strategies, "search_budget": search_budget,
                             "workers": workers, "explain_top": explain_top})
    for field in ("strategies", "large_strategies", "workers"):
        if int(opts[field]) < 1:
            raise ValueError(f"{field} must be >= 1, got {opts[field]}")
    rows = []
    for name in opts["scenarios"]:
        large = scenario_context(name).cluster.num_gpus >= LARGE_GPUS
        n = min(opts["strategies"], opts["large_strategies"]) if large else opts["strategies"]
        rows += scenario_rows(name, int(n), seed, int(opts["search_budget"]), int(opts["workers"]),
                              int(opts["explain_top"]))
    summary = write_outputs(rows, Path(out_dir), opts | {"seed": seed, "quick": quick, "k_rerank": K_RERANK,
                                                         "large": LARGE, "large_gpus": LARGE_GPUS})
    if measured:
        # imported here, not above: ``python -m validation.studies.fidelity.measured`` runs that module as
        # __main__, and runpy warns (and runs it twice) when its package has imported it already
        from validation.studies.fidelity import measured as three_way

        summary["headline"]["three_way"] = three_way.run(out_dir, quick=quick)["headline"]
    return summary


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one small scenario, a dozen strategies")
    parser.add_argument("--scenarios", nargs="+", help="scenario names (space or comma separated)")
    parser.add_argument("--strategies", type=int, help="strategies per scenario (default 500)")
    parser.add_argument("--large-strategies", type=int, help=f"cap on scenarios of >= {LARGE_GPUS} GPUs (60)")
    parser.add_argument("--search-budget", type=int, help="PPO proposals for the trajectory (200)")
    parser.add_argument("--workers", type=int, help="simulation processes (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-measured", action="store_true", help="skip the three-way section")
    parser.add_argument("--out", default="outputs/fidelity", help="output directory")
    args = parser.parse_args(argv)
    names = [n for part in args.scenarios or [] for n in part.split(",") if n]
    summary = run(args.out, names or None, args.strategies, args.seed, args.quick, args.large_strategies,
                  args.search_budget, args.workers, measured=not args.no_measured)
    print(dumps(summary["headline"]))
    return summary
