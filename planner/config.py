"""Config of the search app: the planner group plus the shared simcore groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

from simcore.config import HardwareConfig, ModelConfig, SimConfig, TopologyConfig, WorkloadConfig

__all__ = ["PlannerConfig", "SearchAppConfig", "register"]


@dataclass
class PlannerConfig:
    """``name``: the search method; ``budget``: proxy calls it may spend (invalid ones count);
    the lists bound the coarse search space (``null`` = the default for the cluster)."""

    name: str = "megatron"
    budget: int = 4000
    batch: list[int] | None = None
    microbatches: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    max_tp: int | None = None
    max_pp: int = 16


@dataclass
class SearchAppConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    planner: PlannerConfig = field(default_factory=PlannerConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    scenario: str = "custom"
    seed: int = 0
    top: int = 10


def register() -> None:
    ConfigStore.instance().store(name="search_schema", node=SearchAppConfig)
