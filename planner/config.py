"""Config of the search app: the planner group plus the shared simcore groups.

One :class:`PlannerConfig` schema backs every ``conf/planner/*.yaml``; each file sets ``name`` and the
knobs its method reads. :func:`check_planner` turns nonsense into one-line errors naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from simcore.config import (
    ConfigError,
    SpaceConfig,
)

__all__ = ["PlannerConfig", "check_planner", "check_planner_settings", "PLANNERS", "SERVING_ONLY", "RERANKERS"]

PLANNERS = ("ppo", "random", "random-walk", "annealing", "genetic", "megatron", "exact")
#: planners of the serving search alone (``workload=serving``; :data:`planner.serving.METHODS`)
SERVING_ONLY = ("poolwise", "tpe", "cmaes")
RERANKERS = ("proxy", "sim")


@dataclass
class PlannerConfig(SpaceConfig):
    """Search method and its knobs (fields a method does not use are ignored by it).

    Space: ``batch``/``microbatches``/``max_tp``/``max_pp`` bound the coarse grid and
    ``redundant_per_rank`` lists the redundant experts per EP rank a plan may add (a head of its own,
    for MoE models under skewed routing only) (:class:`simcore.config.SpaceConfig`, shared with
    ``shard-sim``); ``masking`` removes divisibility-invalid values before sampling; ``dp_head`` and
    ``microbatch_head`` add those heads (else ``dp`` uses every GPU and microbatches are 1).
    Budget: ``budget`` proposals (invalid and repeated ones count), split into ``chunks`` checkpointed
    chunks. PPO: elite history ``T``, early exit at head confidence ``tau``, reward
    ``alpha * raw + beta * (raw - best)`` on throughput normalized by the warm start, ``invalid_reward``
    for invalid strategies, CleanRL-named PPO settings, network sizes, ``elite_prior`` (0 = the paper)
    applied to every ``elite_prior_every``-th network (the others start uniform and explore),
    ``elite_diverse`` (one elite record per (tp, ep, pp) layout) and ``polish`` (hill-climb from new
    elite records after each network, see :meth:`planner.search.PPOSearch._polish`).
    Baselines: ``t0`` initial annealing temperature (percent of the reference throughput);
    ``population``, ``tournament``, ``elitism``, ``mutation`` (per head; ``null`` = 1 / heads) for
    the genetic algorithm. Re-ranking: the ``rerank_k`` best distinct strategies by ``reranker``;
    ``rerank_pool`` > 0 puts the simulator in the loop (:mod:`planner.simloop`): of the ``rerank_pool``
    best, the top ``rerank_k`` and those a proxy correction learned on them picks are simulated, at most
    ``rerank_budget``, memoized in the run dir's ``sims.jsonl``.
    ``reference_lines``: also compute the Megatron and exact optima for the search curve.
    """

    name: str = "ppo"
    budget: int = 4000
    masking: bool = True
    dp_head: bool = False
    microbatch_head: bool = True
    chunks: int = 5
    T: int = 3
    tau: float = 0.95
    alpha: float = 1.0
    beta: float = 1.0
    invalid_reward: float = -1.0
    learning_rate: float = 1e-3
    num_steps: int = 2
    update_epochs: int = 2
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    norm_adv: bool = True
    d_model: int = 256
    n_heads: int = 4
    hidden: int = 256
    elite_prior: float = 0.0
    elite_prior_every: int = 1
    elite_diverse: bool = False
    polish: bool = False
    t0: float = 100.0
    population: int = 32
    tournament: int = 3
    elitism: int = 2
    mutation: float | None = None
    rerank_k: int = 16
    reranker: str = "sim"
    rerank_pool: int = 0
    rerank_budget: int = 48
    reference_lines: bool = True


def check_planner(p) -> None:
    """Raise :class:`ConfigError` naming the first bad field of a static search's planner config."""
    if p.name in SERVING_ONLY:
        raise ConfigError(f"planner.name: {p.name!r} searches serving plans only (workload=serving); "
                          f"static planners: {', '.join(PLANNERS)}")
    if p.name not in PLANNERS:
        raise ConfigError(f"planner.name: {p.name!r} is not one of {', '.join(PLANNERS)}")
    if p.budget < 1:
        raise ConfigError(f"planner.budget must be >= 1, got {p.budget!r}")
    check_planner_settings(p)


def check_planner_settings(p) -> None:
    """Raise :class:`ConfigError` naming the first bad method setting of ``p`` (a planner config, or any
    object with its fields): what a static search and a serving search (``workload=serving``, whose
    methods read the same settings) both refuse. The method name and the budget are each search's own."""
    def bad(name: str, requirement: str) -> None:
        raise ConfigError(f"planner.{name} {requirement}, got {getattr(p, name)!r}")

    for name in ("T", "chunks", "elite_prior_every", "num_steps", "update_epochs", "population", "tournament",
                 "rerank_k", "rerank_budget", "d_model", "n_heads", "hidden"):
        if getattr(p, name) < 1:
            bad(name, "must be >= 1")
    if not 0.0 < p.tau <= 1.0:
        bad("tau", "must be in (0, 1]")
    for name in ("learning_rate", "t0", "clip_coef"):
        if not getattr(p, name) > 0:
            bad(name, "must be > 0")
    for name in ("alpha", "beta", "ent_coef", "vf_coef", "max_grad_norm", "elite_prior", "elitism"):
        if getattr(p, name) < 0:
            bad(name, "must be >= 0")
    if p.alpha == 0 and p.beta == 0:
        bad("alpha", "and planner.beta must not both be 0")
    if p.elitism >= p.population:
        bad("elitism", f"must be below planner.population ({p.population})")
    if p.mutation is not None and not 0.0 <= p.mutation <= 1.0:
        bad("mutation", "must be in [0, 1] or null")
    if p.d_model % p.n_heads:
        bad("n_heads", f"must divide planner.d_model ({p.d_model})")
    if p.rerank_pool < 0:
        bad("rerank_pool", "must be >= 0 (0 = re-rank the top rerank_k only)")
    if p.reranker not in RERANKERS:
        raise ConfigError(f"planner.reranker: {p.reranker!r} is not one of {', '.join(RERANKERS)}")
