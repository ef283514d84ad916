"""``shard-validate study=NAME data=PATH.csv``: run a validation study, write its files into the run dir.

Studies live in ``validation/studies/``; each takes any CSV in its published schema, so the same
command checks the simulator against measurements this project never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from simcore.apps.common import UserError, cli_errors, run_dir

__all__ = ["run", "main", "STUDIES"]

_DATA = Path(__file__).resolve().parent.parent / "data"


@dataclass
class StudyConfig:
    """``name``: which study; ``data``: its input CSV (``null`` = the shipped calibration file);
    ``engine``: ``analytic`` (the cost model) or ``flow`` (the flow-level simulator) where it applies."""

    name: str = "collectives"
    data: str | None = None
    engine: str = "analytic"


@dataclass
class ValidateAppConfig:
    study: StudyConfig = field(default_factory=StudyConfig)
    data: str | None = None  # shorthand for study.data


def _collectives(data: Path, out: Path, engine: str) -> dict:
    from validation.studies import collectives

    return collectives.main(["--data", str(data), "--out", str(out), "--engine", engine])  # prints per row


def _kernels(data: Path, out: Path, engine: str) -> dict:
    from validation.studies import kernels

    return kernels.run(data, out)


def _inference(data: Path, out: Path, engine: str) -> dict:
    from validation.studies import inference

    return inference.run(data, out)


STUDIES = {
    "collectives": (_collectives, "collectives_calibration.csv"),
    "kernels": (_kernels, "kernels_h100.csv"),
    "inference": (_inference, "inference_calibration.csv"),
}


def run(cfg: DictConfig) -> dict:
    name = cfg.study.name
    if name not in STUDIES:
        raise UserError(f"study.name: {name!r} is not one of {', '.join(STUDIES)}")
    func, default = STUDIES[name]
    data = Path(cfg.data or cfg.study.data or _DATA / default)
    if not data.is_file():
        raise UserError(f"data: no such file {data}")
    if cfg.study.engine not in ("analytic", "flow"):
        raise UserError(f"study.engine: {cfg.study.engine!r} is not one of analytic, flow")
    out = run_dir()
    summary = func(data, out, cfg.study.engine)
    print(f"run dir: {out}")
    print(json.dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, default=str))
    return summary


ConfigStore.instance().store(name="validate_schema", node=ValidateAppConfig)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="validate")
@cli_errors
def main(cfg: DictConfig) -> None:
    run(cfg)
