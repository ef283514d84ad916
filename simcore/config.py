"""Structured configs shared by every app, registered in Hydra's ConfigStore.

Each dataclass backs one config group (``model``, ``hardware``, ``topology``, ``workload``, ``sim``);
the YAML files under ``conf/`` extend them, so a misspelled key or a wrong type fails when Hydra
composes the config. Units at this boundary are the ones people type (milliseconds for SLOs); they
are converted to SI here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import OmegaConf

from simcore.engine.simulate import EngineConfig
from simcore.space.bounds import SearchSpace
from simcore.workload import Workload

__all__ = ["ModelConfig", "HardwareConfig", "TopologyConfig", "WorkloadConfig", "SimConfig", "SpaceConfig",
           "build_workload", "build_engine_config", "build_space",
           "ConfigError", "slo_seconds"]


class ConfigError(ValueError):
    """A config value that composes but makes no sense (names the field)."""


@dataclass
class ModelConfig:
    """``name``: a preset from ``simcore.models.MODEL_NAMES``, a published model id of the same shape
    (``moonshotai/Kimi-K2.5``, see ``simcore.models.preset_for``) or a path to a Hugging Face config.json."""

    name: str = "deepseek-v3"


@dataclass
class HardwareConfig:
    """``name``: GPU catalog entry, or ``auto`` for the topology's GPU; ``overrides``: calibrated
    GpuSpec fields to replace (e.g. ``hbm_efficiency``)."""

    name: str = "auto"
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class TopologyConfig:
    """``name``: a preset of ``topologies.TOPOLOGY_NAMES`` or ``custom`` with ``path`` to a YAML file;
    ``fabric``: the preset's scale-out network (``ib`` | ``efa`` | ``roce``; ``null``: the preset's own,
    InfiniBand unless its name says otherwise; a custom topology names its own in its file)."""

    name: str = "h100-ib-rail"
    num_nodes: int = 8
    oversubscription: float = 1.0
    path: str | None = None
    fabric: str | None = None


@dataclass
class WorkloadConfig:
    phase: str = "decode"
    precision: str = "fp8"
    kv_precision: str | None = None  # the KV cache's element type; null: as precision
    input_len: int = 4096
    output_len: int = 256
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None


# The simulator's switches (``sim`` group): contention, overlap, routing, placement, decode steps.
SimConfig = EngineConfig


@dataclass
class SpaceConfig:
    """Bounds of the coarse search space (the ``planner`` node's first fields; ``null`` = the cluster's
    default): ``batch`` sizes, ``microbatches`` counts, ``max_tp`` (default: one NVLink domain, at
    least 8), ``max_pp`` and ``redundant_per_rank``, the redundant expert replicas per EP rank a plan
    may add (``strategy.redundant_experts = value * ep``; searched only for an MoE model under skewed
    routing, see :func:`simcore.space.bounds.replicas_can_help`; ``[0]``: never). ``shard-search`` draws every
    planner's proposals from it; ``shard-sim`` searches it for the best Megatron plan (no replicas)
    when given no plan."""

    batch: list[int] | None = None
    microbatches: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    max_tp: int | None = None
    max_pp: int = 16
    # DeepSeek-V3 serves prefill with one redundant expert per GPU (32 over EP32); ranks holding many
    # experts (small EP) may want a few more
    redundant_per_rank: list[int] = field(default_factory=lambda: [0, 1, 2, 4])


def build_space(ctx, space: SpaceConfig):
    """The :class:`~simcore.space.bounds.SearchSpace` of a context and a composed ``planner`` node."""

    if space.batch is not None and not len(space.batch):  # null is the default; [] would silently be too
        raise ConfigError("planner.batch: an empty list; give batch sizes, or null for the default")
    for name in ("batch", "microbatches"):
        values = [int(v) for v in getattr(space, name) or ()]
        if any(v < 1 for v in values) or (name == "microbatches" and not values):
            raise ConfigError(f"planner.{name} must list positive integers, got {values}")
    if space.max_tp is not None and int(space.max_tp) < 1:
        raise ConfigError(f"planner.max_tp must be >= 1 (or null: one NVLink domain), got {space.max_tp}")
    if int(space.max_pp) < 1:
        raise ConfigError(f"planner.max_pp must be >= 1, got {space.max_pp}")
    batch = tuple(int(b) for b in space.batch) if space.batch else None
    redundant = tuple(int(v) for v in getattr(space, "redundant_per_rank", (0,)) or (0,))
    if any(v < 0 for v in redundant):
        raise ConfigError(f"planner.redundant_per_rank: values must be >= 0, got {list(redundant)}")
    return SearchSpace.for_context(ctx, batch=batch, microbatches=tuple(int(m) for m in space.microbatches),
                                   max_tp=space.max_tp, max_pp=int(space.max_pp), redundant_per_rank=redundant)


def build_engine_config(cfg) -> EngineConfig:
    """The engine config of a composed ``sim`` node (validated by its ``__post_init__``)."""

    return OmegaConf.to_object(cfg) if OmegaConf.is_config(cfg) else cfg


def slo_seconds(value_ms, name: str) -> float | None:
    """An SLO given in ms (``None``: no target) in seconds; checked here, at the input, so that the error
    names the field ``name`` as the user set it."""
    if value_ms is None:
        return None
    if not (float(value_ms) > 0 and math.isfinite(float(value_ms))):
        raise ConfigError(f"{name} must be a positive number of milliseconds, got {value_ms!r}")
    return float(value_ms) / 1e3


def build_workload(cfg: WorkloadConfig):

    return Workload(phase=cfg.phase, precision=cfg.precision, kv_precision=getattr(cfg, "kv_precision", None),
                    input_len=int(cfg.input_len),
                    output_len=int(cfg.output_len), ttft_slo_s=slo_seconds(cfg.ttft_slo_ms, "workload.ttft_slo_ms"),
                    tpot_slo_s=slo_seconds(cfg.tpot_slo_ms, "workload.tpot_slo_ms"))
