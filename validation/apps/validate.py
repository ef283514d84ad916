"""``shard-validate study=NAME data=PATH.csv``: run a validation study, write its files into the run dir.

Studies live in ``validation/studies/``; each takes any CSV in its published schema, so the same
command checks the simulator against measurements this project never saw.
"""

from __future__ import annotations

import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from planner.apps.common import UserError, check_known_keys, cli_errors, config_errors_exit_2, run_dir
from simcore.files import dumps
from simcore.hardware.gpus import GPUS
from validation.studies import (
    collectives,
    fabric,
    fidelity,
    inference,
    kernels,
    moe,
    rewrites,
    serving,
    wide_ep,
)
from validation.studies.collectives.harness import check_harness
from validation.studies.rewrites import headline
from validation.studies.serving.cross_validate import cross_validate
from validation.studies.serving.journal import StudyInterrupted

__all__ = ["run", "main", "STUDIES"]

_DATA = Path(__file__).resolve().parent.parent / "data"


@dataclass
class StudyConfig:
    """``name``: which study; ``data``: its input CSV (``null`` = the shipped calibration file);
    ``engine``: ``analytic`` (the cost model) or ``flow`` (the flow-level simulator) where it applies.
    Collectives only: ``harness`` that measured the rows (``auto`` reads it from each row's setting
    and note; ``nccl-tests``, ``xla``, ``torch`` force one). Fidelity only: ``strategies`` per scenario, ``scenarios`` (``null`` = its defaults), ``quick``.
    Serving only: ``jobs``, worker processes over its rows (``null`` = one per CPU core; the results do not
    depend on it: every row is its own seeded simulation); ``cross_validate``, run leave-one-group-out over
    the fit rows instead (each (model, runtime) group predicted by its runtime's host constants refitted
    without it: :mod:`validation.studies.serving.cross_validate`). Kernels only: ``gpu``, the catalog GPU the
    rows were timed on (the kernels schema has no hardware column). A field changed for a study that does
    not read it (``study.engine=flow`` on ``study=serving``) is refused (:data:`READS`)."""

    name: str = "collectives"
    data: str | None = None
    engine: str = "analytic"
    harness: str = "auto"
    strategies: int | None = None
    scenarios: list[str] | None = None
    quick: bool = False
    jobs: int | None = None
    gpu: str = "h100-sxm"
    cross_validate: bool = False


@dataclass
class ValidateAppConfig:
    study: StudyConfig = field(default_factory=StudyConfig)
    data: str | None = None  # shorthand for study.data


def _collectives(data: Path, out: Path, study) -> dict:
    try:
        check_harness(study.harness)
    except ValueError as exc:
        raise UserError(f"study.harness: {exc}") from exc
    return collectives.main(["--data", str(data), "--out", str(out), "--engine", study.engine,  # prints per row
                             "--harness", study.harness])


def _kernels(data: Path, out: Path, study) -> dict:
    gpu = study.gpu
    if gpu not in GPUS:
        raise UserError(f"study.gpu: unknown GPU {gpu!r} (known: {', '.join(sorted(GPUS))})")
    return kernels.run(data, out, gpu=gpu)


def _inference(data: Path, out: Path, study) -> dict:
    return inference.run(data, out)


def _moe(data: Path, out: Path, study) -> dict:
    return moe.run(data, out)


def _serving(data: Path, out: Path, study) -> dict:
    try:
        if getattr(study, "cross_validate", False):  # leave one (model, runtime) group out instead
            return cross_validate(data, out, getattr(study, "jobs", None))
        return serving.run(data, out, study)
    except ValueError as exc:  # a CSV without the schema's columns: one line, exit 2
        raise UserError(str(exc)) from exc


def _wide_ep(data: Path, out: Path, study) -> dict:
    try:
        return wide_ep.run(data, out, study)
    except ValueError as exc:  # a CSV without the schema's columns: one line, exit 2
        raise UserError(str(exc)) from exc


def _fidelity(out: Path, study) -> dict:
    scenarios = list(study.scenarios) if study.scenarios else None
    summary = fidelity.run(out, scenarios=scenarios, strategies=study.strategies, quick=bool(study.quick))
    return {"study": "fidelity", "headline": summary["headline"], "summary": str(out / "summary.json")}


def _fabric(out: Path, study) -> dict:
    scenarios = list(study.scenarios) if study.scenarios else None
    summary = fabric.run(out, scenarios=scenarios, quick=bool(study.quick))
    return {k: v for k, v in summary.items() if k not in ("picks", "plots")} | {"summary": str(out / "summary.json")}


def _rewrites(out: Path, study) -> dict:
    scenarios = list(study.scenarios) if study.scenarios else None
    summary = rewrites.run(out, scenarios=scenarios, quick=bool(study.quick))
    return {"study": "rewrites", "headline": headline(summary), "summary": str(out / "summary.json")}


# name -> (function, default data file). A study with data is called as function(data, out_dir, study config);
# one without (default None; it refuses ``data=``) as function(out_dir, study config).
STUDIES = {
    "collectives": (_collectives, "collectives_calibration.csv"),
    "kernels": (_kernels, "kernels_h100.csv"),
    "inference": (_inference, "inference_calibration.csv"),
    "moe": (_moe, "ep_alltoall_deepep.csv"),
    "serving": (_serving, "serving_h200_measured.csv"),
    "wide_ep": (_wide_ep, "wide_ep_published.csv"),
    "fidelity": (_fidelity, None),
    "rewrites": (_rewrites, None),
    "fabric": (_fabric, None),
}

#: the ``study`` fields each study reads besides ``name`` and ``data`` (StudyConfig's docstring); another
#: field changed from its default would be read by nothing, so it is refused
READS = {"collectives": {"engine", "harness"}, "kernels": {"gpu"}, "inference": set(), "moe": set(),
         "serving": {"jobs", "cross_validate"}, "wide_ep": set(), "fidelity": {"strategies", "scenarios", "quick"}, "rewrites": {"scenarios", "quick"},
         "fabric": {"scenarios", "quick"}}


def _check_read(name: str, study) -> None:
    for f in fields(StudyConfig):
        if f.name in ("name", "data") or f.name in READS[name]:
            continue
        default = f.default_factory() if f.default is MISSING else f.default
        if study.get(f.name, default) != default:
            readers = ", ".join(n for n, read in READS.items() if f.name in read)
            raise UserError(f"study.{f.name}: study {name} does not read it (read by: {readers}), "
                            f"got {study.get(f.name)!r}")


def run(cfg: DictConfig) -> dict:
    name = cfg.study.name
    if name not in STUDIES:
        raise UserError(f"study.name: {name!r} is not one of {', '.join(STUDIES)}")
    func, default = STUDIES[name]
    _check_read(name, cfg.study)
    if default is None and (cfg.data or cfg.study.data):
        raise UserError(f"data: study {name} reads no CSV (it simulates its own "
                        f"scenarios: study.scenarios), got {cfg.data or cfg.study.data}")
    data = None if default is None else Path(cfg.data or cfg.study.data or _DATA / default)
    if data is not None and not data.is_file():
        raise UserError(f"data: no such file {data}")
    if cfg.study.engine not in ("analytic", "flow"):
        raise UserError(f"study.engine: {cfg.study.engine!r} is not one of analytic, flow")
    jobs = cfg.study.get("jobs")
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"study.jobs: must be a positive number of processes or null, got {jobs!r}")
    if cfg.study.get("scenarios") is not None and not len(cfg.study.scenarios):  # null means the defaults; [] would too
        raise UserError("study.scenarios: an empty list; name the scenarios, or null for the study's own")
    out = run_dir()
    if data is not None:
        summary = func(data, out, cfg.study)
    else:
        try:
            summary = func(out, cfg.study)
        except ValueError as exc:  # a bad setting (an unknown scenario, strategies < 1): one line, exit 2
            raise UserError(f"study.{name}: {exc}") from exc
    print(f"run dir: {out}")
    print(dumps({k: v for k, v in summary.items() if not isinstance(v, list)}, default=str))
    return summary


ConfigStore.instance().store(name="validate_schema", node=ValidateAppConfig)


@hydra.main(version_base=None, config_path="pkg://conf", config_name="validate")
@cli_errors
def _main(cfg: DictConfig) -> None:
    check_known_keys(cfg, ValidateAppConfig)
    try:
        run(cfg)
    except StudyInterrupted as exc:
        out = exc.path.parent
        print(f"interrupted: {exc.done} of {exc.total} rows saved in {exc.path}; continue with "
              f"hydra.run.dir={out}", file=sys.stderr)
        sys.exit(128 + int(exc.signal or 2))


main = config_errors_exit_2(_main)
