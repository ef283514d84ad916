"""The ``planner`` config group: one structured schema per planner option, and the checks on it.

Every option of ``conf/planner/`` extends its own schema (``defaults: [<option>_schema, _self_]``,
:func:`register` stores them in Hydra's ConfigStore under group ``planner``), so a knob the chosen
planner does not have (``planner=random planner.temperature=2``, ``planner=megatron planner.T=3``) fails
when Hydra composes the config, naming the key. The schemas nest by what the methods share:

- :class:`PlannerBaseConfig`: the method ``name``, the ``budget``, the search space's bounds
  (:class:`simcore.config.SpaceConfig`) and the re-ranking of the answer; ``shard-search`` types its
  ``planner`` node with it, so any option composes there. :class:`MegatronPlannerConfig` and
  :class:`ExactPlannerConfig` (one-shot) and the serving-only :class:`PoolwisePlannerConfig`,
  :class:`TPEPlannerConfig` and :class:`CMAESPlannerConfig` add nothing to it.
- :class:`IterativePlannerConfig`: the action space and the checkpointed chunks of the iterative
  planners: :class:`RandomPlannerConfig`, :class:`RandomWalkPlannerConfig` and
  :class:`AnnealingPlannerConfig`, :class:`GeneticPlannerConfig` and :class:`PPOPlannerConfig`.

:func:`planner_config` builds the schema of a method by name (``PlannerConfig`` is its old name);
:func:`check_planner` and :func:`check_planner_settings` turn nonsense into one-line errors naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf

from simcore.config import ConfigError, SpaceConfig

__all__ = ["PlannerBaseConfig", "IterativePlannerConfig", "PPOPlannerConfig", "RandomPlannerConfig",
           "RandomWalkPlannerConfig", "AnnealingPlannerConfig", "GeneticPlannerConfig", "MegatronPlannerConfig",
           "ExactPlannerConfig", "PoolwisePlannerConfig", "TPEPlannerConfig", "CMAESPlannerConfig", "SCHEMAS",
           "planner_config", "PlannerConfig", "method_defaults", "register", "check_planner",
           "check_planner_settings", "PLANNERS", "SERVING_ONLY", "RERANKERS"]

PLANNERS = ("ppo", "random", "random-walk", "annealing", "genetic", "megatron", "exact")
#: planners of the serving search alone (``workload=serving``; :data:`planner.serving.METHODS`)
SERVING_ONLY = ("poolwise", "tpe", "cmaes")
RERANKERS = ("proxy", "sim")


@dataclass
class PlannerBaseConfig(SpaceConfig):
    """What every planner option has: the space's bounds (``batch``, ``microbatches``, ``max_tp``,
    ``max_pp``, ``redundant_per_rank``: :class:`simcore.config.SpaceConfig`, shared with ``shard-sim``),
    the method and its budget, and how ``shard-search`` re-ranks the answer: the ``rerank_k`` best
    distinct strategies by ``reranker``; ``rerank_pool`` > 0 puts the simulator in the loop
    (:mod:`planner.simloop`): of the ``rerank_pool`` best, the top ``rerank_k`` and those a proxy
    correction learned on them picks are simulated, at most ``rerank_budget``, memoized in the run
    dir's ``sims.jsonl``."""

    name: str = MISSING  # the method; each option's schema sets its own (planner=<option> picks it)
    budget: int = 4000  # proposals (invalid and repeated ones count); serving: serving.search.budget
    rerank_k: int = 16  # distinct best strategies re-ranked by the reranker
    reranker: str = "sim"  # who re-ranks them: "sim" (the simulator) or "proxy"
    rerank_pool: int = 0  # > 0: the simulator in the loop over the search's this many best (planner/simloop.py)
    rerank_budget: int = 48  # most simulations of the simulator in the loop
    reference_lines: bool = True  # also compute the Megatron and exact optima for the search curve


@dataclass
class IterativePlannerConfig(PlannerBaseConfig):
    """The action space and the chunks of the iterative planners (:data:`planner.runner.ITERATIVE`):
    the budget is spent in ``chunks`` checkpointed chunks; ``masking`` removes divisibility-invalid
    values before sampling; ``dp_head`` and ``microbatch_head`` add those heads (else ``dp`` uses every
    GPU and microbatches are 1); ``invalid_reward`` scores an invalid strategy."""

    chunks: int = 5  # checkpointed chunks of the budget (PPO: a fresh network per chunk at least)
    masking: bool = True  # mask divisibility-invalid head values before sampling
    dp_head: bool = False  # a head for the data-parallel degree (else dp uses every GPU)
    microbatch_head: bool = True  # a head for the microbatch count (else 1)
    invalid_reward: float = -1.0  # score of an invalid strategy (throughput is normalized by the warm start)


@dataclass
class PPOPlannerConfig(IterativePlannerConfig):
    """``planner=ppo``, the paper's method (:class:`planner.search.PPOSearch`): elite history ``T``,
    early exit at head confidence ``tau``, reward ``alpha * raw + beta * (raw - best)`` on throughput
    normalized by the warm start, CleanRL-named PPO settings (:class:`planner.ppo.PPOConfig`), network
    sizes; beyond the paper ``elite_prior`` (0 = the paper) on every ``elite_prior_every``-th network
    (the others start uniform and explore), ``elite_diverse`` and ``polish``
    (:meth:`planner.search.PPOSearch._polish`). Defaults: the paper's; ``conf/planner/ppo.yaml`` ships
    the measured better ones."""

    name: str = "ppo"  # the method
    T: int = 3  # elite history: records the policy observes
    tau: float = 0.95  # early exit of a network once every head's confidence reaches tau
    alpha: float = 1.0  # reward weight of the normalized throughput
    beta: float = 1.0  # reward weight of the improvement over the best so far
    learning_rate: float = 1e-3  # initial Adam step size, cosine-annealed to 0
    num_steps: int = 2  # strategies per rollout
    update_epochs: int = 2  # gradient passes per rollout
    clip_coef: float = 0.2  # surrogate clipping range
    ent_coef: float = 0.01  # entropy bonus
    vf_coef: float = 0.5  # value-loss weight
    max_grad_norm: float = 0.5  # global gradient-norm clip
    norm_adv: bool = True  # normalize advantages over the rollout
    d_model: int = 256  # attention width of the policy
    n_heads: int = 4  # attention heads (must divide d_model)
    hidden: int = 256  # hidden units of the policy's heads
    elite_prior: float = 0.0  # logit bonus for the best elite's values on a fresh network (0: the paper)
    elite_prior_every: int = 1  # the prior goes to every this many-th network (the others explore)
    elite_diverse: bool = False  # one elite record per (tp, ep, pp) layout
    polish: bool = False  # hill-climb from new elite records after each network


@dataclass
class RandomPlannerConfig(IterativePlannerConfig):
    """``planner=random``: uniform proposals head by head over the masks (:class:`planner.baselines.RandomSearch`)."""

    name: str = "random"  # the method


@dataclass
class RandomWalkPlannerConfig(IterativePlannerConfig):
    """``planner=random-walk``: move to a random valid one-head neighbour (:class:`planner.baselines.RandomWalk`)."""

    name: str = "random-walk"  # the method


@dataclass
class AnnealingPlannerConfig(IterativePlannerConfig):
    """``planner=annealing``: simulated annealing (:class:`planner.baselines.Annealing`)."""

    name: str = "annealing"  # the method
    t0: float = 100.0  # initial temperature, percent of the reference throughput (cosine-annealed to 0)


@dataclass
class GeneticPlannerConfig(IterativePlannerConfig):
    """``planner=genetic``: the generational genetic algorithm (:class:`planner.baselines.Genetic`)."""

    name: str = "genetic"  # the method
    population: int = 32  # strategies per generation
    tournament: int = 3  # contestants per tournament selection
    elitism: int = 2  # best strategies carried over unchanged (below population)
    mutation: float | None = None  # per-head mutation probability; null: 1 / number of heads


@dataclass
class MegatronPlannerConfig(PlannerBaseConfig):
    """``planner=megatron``: the Megatron sharding, exhaustive over the degrees and batch (one-shot)."""

    name: str = "megatron"  # the method


@dataclass
class ExactPlannerConfig(PlannerBaseConfig):
    """``planner=exact``: the exact optimum under the proxy (:mod:`planner.exact`; one-shot)."""

    name: str = "exact"  # the method


@dataclass
class PoolwisePlannerConfig(PlannerBaseConfig):
    """``planner=poolwise`` (``workload=serving`` only): the serving search's warm start alone."""

    name: str = "poolwise"  # the method


@dataclass
class TPEPlannerConfig(PlannerBaseConfig):
    """``planner=tpe`` (``workload=serving`` only): Optuna's TPE sampler over the serving heads."""

    name: str = "tpe"  # the method


@dataclass
class CMAESPlannerConfig(PlannerBaseConfig):
    """``planner=cmaes`` (``workload=serving`` only): Optuna's CMA-ES sampler over the serving heads."""

    name: str = "cmaes"  # the method


#: the schema of each planner option (``conf/planner/<name>.yaml`` extends ``<name>_schema``)
SCHEMAS: dict[str, type[PlannerBaseConfig]] = {cls.name: cls for cls in (
    PPOPlannerConfig, RandomPlannerConfig, RandomWalkPlannerConfig, AnnealingPlannerConfig, GeneticPlannerConfig,
    MegatronPlannerConfig, ExactPlannerConfig, PoolwisePlannerConfig, TPEPlannerConfig, CMAESPlannerConfig)}


def register() -> None:
    """Store every planner option's schema in Hydra's ConfigStore as ``planner/<name>_schema``."""
    from hydra.core.config_store import ConfigStore

    for name, schema in SCHEMAS.items():
        ConfigStore.instance().store(group="planner", name=f"{name}_schema", node=schema)


def planner_config(name: str = "ppo", **knobs: Any) -> PlannerBaseConfig:
    """The schema of planner ``name`` with ``knobs`` set (Python's way to what ``planner=<name>
    planner.<knob>=...`` composes, at the schema's defaults, not the YAML's); a knob that planner does
    not have is a :class:`ConfigError` naming it."""
    if name not in SCHEMAS:
        raise ConfigError(f"planner.name: {name!r} is not one of {', '.join(SCHEMAS)}")
    schema = SCHEMAS[name]
    known = {f.name for f in fields(schema)}
    for key in knobs:
        if key not in known:
            raise ConfigError(f"planner.{key}: not a setting of planner={name} (it takes {', '.join(sorted(known))})")
    return schema(name=name, **knobs)


#: the old flat schema's name, kept for scripts: ``PlannerConfig(name=..., **knobs)`` is :func:`planner_config`
PlannerConfig = planner_config


def method_defaults() -> dict[str, Any]:
    """Every knob of every planner at its schema's default (``name``: ``ppo``), for callers that run
    several methods on one set of knobs (the serving search's :func:`planner.serving.methods.method_config`)."""
    out: dict[str, Any] = {}
    for schema in SCHEMAS.values():
        out |= {f.name: getattr(schema(), f.name) for f in fields(schema)}
    return out | {"name": "ppo"}


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


def _schema_of(p) -> type | None:
    """The structured schema ``p`` was composed or built from (None: a plain object)."""
    schema = OmegaConf.get_type(p) if isinstance(p, DictConfig) else type(p)
    return schema if isinstance(schema, type) and issubclass(schema, PlannerBaseConfig) else None


def _check_name(p) -> None:
    """``planner.name`` must be the method of the schema ``p`` was composed from: ``planner=random
    planner.name=annealing`` would run annealing without its knobs."""
    schema = _schema_of(p)
    if schema in SCHEMAS.values() and p.name in SCHEMAS and SCHEMAS[p.name] is not schema:
        raise ConfigError(f"planner.name: {p.name!r} is not the method of planner={schema.name} "
                          f"(choose the method with planner={p.name})")


def check_planner_settings(p) -> None:
    """Raise :class:`ConfigError` naming the first bad method setting of ``p`` (a planner config, or any
    object with its fields; a setting ``p`` does not have is not checked): what a static search and a
    serving search (``workload=serving``, whose methods read the same settings) both refuse. The method
    name's membership and the budget are each search's own; the name must be its schema's method."""
    _check_name(p)

    def has(*names: str) -> bool:
        return all(hasattr(p, name) for name in names)

    def bad(name: str, requirement: str) -> None:
        raise ConfigError(f"planner.{name} {requirement}, got {getattr(p, name)!r}")

    for name in ("T", "chunks", "elite_prior_every", "num_steps", "update_epochs", "population", "tournament",
                 "rerank_k", "rerank_budget", "d_model", "n_heads", "hidden"):
        if has(name) and getattr(p, name) < 1:
            bad(name, "must be >= 1")
    if has("tau") and not 0.0 < p.tau <= 1.0:
        bad("tau", "must be in (0, 1]")
    for name in ("learning_rate", "t0", "clip_coef"):
        if has(name) and not getattr(p, name) > 0:
            bad(name, "must be > 0")
    for name in ("alpha", "beta", "ent_coef", "vf_coef", "max_grad_norm", "elite_prior", "elitism"):
        if has(name) and getattr(p, name) < 0:
            bad(name, "must be >= 0")
    if has("alpha", "beta") and p.alpha == 0 and p.beta == 0:
        bad("alpha", "and planner.beta must not both be 0")
    if has("elitism", "population") and p.elitism >= p.population:
        bad("elitism", f"must be below planner.population ({p.population})")
    if has("mutation") and p.mutation is not None and not 0.0 <= p.mutation <= 1.0:
        bad("mutation", "must be in [0, 1] or null")
    if has("d_model", "n_heads") and p.d_model % p.n_heads:
        bad("n_heads", f"must divide planner.d_model ({p.d_model})")
    if has("rerank_pool") and p.rerank_pool < 0:
        bad("rerank_pool", "must be >= 0 (0 = re-rank the top rerank_k only)")
    if has("reranker") and p.reranker not in RERANKERS:
        raise ConfigError(f"planner.reranker: {p.reranker!r} is not one of {', '.join(RERANKERS)}")
