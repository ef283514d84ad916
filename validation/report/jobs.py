"""The jobs of a run or multirun directory: what each one found, or why it has no result.

A job directory holds ``.hydra/`` (Hydra's config snapshot) and, once finished, ``results.json``
(``shard-search``) and possibly ``summary.json``; keys of ``summary.json`` take precedence. A job
without either is failed or unfinished: its error is the last error-looking line of its logs.
A ``shard-sim`` run dir (``result.json`` only) is not a search job and is skipped.

A job's GPU count is its cluster's (``topology.num_nodes`` nodes of the preset's GPUs per node: 8 for
the H100/H200/H800 presets, 72 for ``gb200-nvl72``, whose node is a whole NVL72 rack), known even when
the job failed; a plan always uses every GPU (``dp`` is derived).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from topologies import build_topology, load_topology_yaml
from validation.report.curves import Curve, read_curve

__all__ = ["Job", "find_jobs", "read_job", "collect", "cluster_size", "CSV_COLUMNS"]

CSV_COLUMNS = ("job", "status", "scenario", "topology", "model", "gpus", "num_nodes", "gpus_per_node", "planner", "plan", "tp", "ep", "pp",
               "dp", "batch", "microbatches", "proxy_tokens_per_s_per_gpu", "sim_tokens_per_s_per_gpu",
               "sim_source", "megatron_tokens_per_s_per_gpu", "ratio_to_megatron", "megatron_source", "calls", "search_s",
               "error")
_DEGREES = ("tp", "ep", "pp", "dp", "batch", "microbatches")
_ERROR = re.compile(r"error|exception|traceback|failed|killed", re.IGNORECASE)
_LOG_PATTERNS = ("*.log", "*.err", "stderr*", "error*")
_LOG_PREFIX = re.compile(r"^(\[[^\]]*\])+\s*(-\s*)?")  # Hydra's "[time][logger][LEVEL] - "


@dataclass
class Job:
    """One job's outcome; throughputs in tokens/s/GPU, ``search_s`` in seconds; ``strategy`` is the
    best plan as a strategy dict (degrees and sharding)."""

    name: str
    path: Path
    status: str
    error: str = ""
    scenario: str | None = None
    model: str | None = None
    topology: str | None = None
    planner: str | None = None
    strategy: dict | None = None
    proxy: float | None = None
    sim: float | None = None
    sim_source: str = ""
    megatron: float | None = None
    megatron_source: str = ""
    calls: int | None = None
    search_s: float | None = None
    num_nodes: int | None = None
    gpus_per_node: int | None = None
    config: dict = field(default_factory=dict)
    curve: Curve | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def gpus(self) -> int | None:
        """GPUs of the best plan (all of the cluster's), else of the configured cluster."""
        s = self.strategy
        if s:
            return s["tp"] * s["ep"] * s["pp"] * s["dp"]
        return self.num_nodes * self.gpus_per_node if self.num_nodes and self.gpus_per_node else None

    @property
    def ratio(self) -> float | None:
        if self.proxy is None or not self.megatron:
            return None
        return self.proxy / self.megatron

    @property
    def plan(self) -> str:
        s = self.strategy
        if not s:
            return ""
        return f"tp{s['tp']} ep{s['ep']} pp{s['pp']} dp{s['dp']} b{s['batch']} mb{s['microbatches']}"

    def row(self) -> dict:
        """One CSV row (:data:`CSV_COLUMNS`); missing figures are empty strings."""
        def num(value, digits=2):
            return "" if value is None else round(float(value), digits)

        row = {"job": self.name, "status": self.status, "scenario": self.scenario or "",
               "topology": self.topology or "", "model": self.model or "", "gpus": self.gpus or "",
               "num_nodes": self.num_nodes or "", "gpus_per_node": self.gpus_per_node or "",
               "planner": self.planner or "", "plan": self.plan,
               "proxy_tokens_per_s_per_gpu": num(self.proxy), "sim_tokens_per_s_per_gpu": num(self.sim),
               "sim_source": self.sim_source,
               "megatron_tokens_per_s_per_gpu": num(self.megatron), "ratio_to_megatron": num(self.ratio, 4),
               "megatron_source": self.megatron_source, "calls": "" if self.calls is None else self.calls,
               "search_s": num(self.search_s, 3), "error": self.error}
        return row | {d: (self.strategy or {}).get(d, "") for d in _DEGREES}


def _job_key(path: Path) -> tuple:
    match = re.match(r"(\d+)", path.name)
    return (str(path.parent), int(match.group(1)) if match else -1, path.name)


def find_jobs(root: Path) -> list[Path]:
    """Job directories under ``root`` (``root`` itself when it is a single run), in job order."""
    marks = {p.parent for p in root.rglob(".hydra") if p.is_dir()}
    marks |= {p.parent for name in ("results.json", "summary.json") for p in root.rglob(name)}
    jobs = [d for d in marks if (d / "results.json").is_file() or (d / "summary.json").is_file()
            or not (d / "result.json").is_file()]
    return sorted(jobs, key=_job_key)


def _load_json(path: Path) -> dict:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return data


def _hydra_config(job: Path) -> dict:
    path = job / ".hydra" / "config.yaml"
    try:
        data = yaml.safe_load(path.read_text()) if path.is_file() else {}
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def error_text(job: Path, limit: int = 240) -> str:
    """The last error-looking line of the job's logs (else their last line), or why there is none."""
    lines: list[str] = []
    for pattern in _LOG_PATTERNS:
        for log in sorted(job.glob(pattern)):
            if log.is_file():
                with open(log, "rb") as fh:
                    fh.seek(max(log.stat().st_size - 8192, 0))
                    lines += [ln.strip() for ln in fh.read().decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return "no results.json and nothing logged (unfinished, or failed before logging)"
    errors = [ln for ln in lines if _ERROR.search(ln)]
    text = _LOG_PREFIX.sub("", (errors or lines)[-1]) or (errors or lines)[-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _megatron(data: dict) -> float | None:
    """A Megatron baseline figure a job recorded: a number, or a dict holding tokens/s/GPU."""
    value = data.get("megatron_tokens_per_s_per_gpu", data.get("megatron"))
    if isinstance(value, dict):
        value = value.get("proxy_tokens_per_s_per_gpu", value.get("tokens_per_s_per_gpu"))
    return float(value) if isinstance(value, int | float) and value > 0 else None


_CLUSTERS: dict[str, tuple[int, int] | None] = {}


def cluster_size(topology: dict) -> tuple[int, int] | None:
    """(nodes, GPUs per node) of a composed ``topology`` config, or ``None`` when it cannot be built."""
    key = repr(sorted(topology.items()))
    if key not in _CLUSTERS:
        try:
            if topology.get("name") == "custom":
                graph = load_topology_yaml(str(topology.get("path")))
            else:
                graph = build_topology(str(topology.get("name")), num_nodes=int(topology.get("num_nodes", 1)),
                                       oversubscription=float(topology.get("oversubscription", 1.0)))
            _CLUSTERS[key] = (int(graph.graph["num_nodes"]), int(graph.graph["gpus_per_node"]))
        except Exception:  # a broken config (the job's own error says why) must not stop the report
            _CLUSTERS[key] = None
    return _CLUSTERS[key]


def _describe(job: Job, config: dict) -> None:
    job.config = config
    job.scenario = job.scenario or config.get("scenario")
    job.model = (config.get("model") or {}).get("name")
    topo = config.get("topology") or {}
    job.topology = Path(str(topo.get("path"))).stem if topo.get("name") == "custom" else topo.get("name")
    job.planner = job.planner or (config.get("planner") or {}).get("name")
    size = cluster_size(topo) if isinstance(topo, dict) and topo else None
    job.num_nodes, job.gpus_per_node = size or (None, None)


def read_job(root: Path, path: Path) -> Job:
    """Everything the report shows about one job; never raises on a broken job."""
    job = Job(name=str(path.relative_to(root)) if path != root else path.name, path=path, status="failed")
    data: dict = {}
    try:
        for name in ("results.json", "summary.json"):
            if (path / name).is_file():
                data |= _load_json(path / name)
    except (OSError, ValueError) as exc:
        job.error = f"unreadable results: {str(exc).splitlines()[0]}"
        _describe(job, _hydra_config(path))
        return job
    _describe(job, data.get("config") if isinstance(data.get("config"), dict) else _hydra_config(path))
    best = data.get("best") if isinstance(data.get("best"), dict) else {}
    strategy = best.get("strategy", data.get("strategy"))
    if not data or not isinstance(strategy, dict):
        job.error = error_text(path) if not data else "results hold no best strategy"
        return job
    job.scenario, job.planner = data.get("scenario", job.scenario), data.get("planner", job.planner)
    job.strategy = dict(strategy) | {d: int(strategy.get(d, 1)) for d in _DEGREES}
    valid = bool(best.get("valid", data.get("valid", True)))
    job.status = "ok" if valid else "no valid plan"
    proxy = data.get("proxy_tokens_per_s_per_gpu", best.get("tokens_per_s_per_gpu") if valid else None)
    job.proxy = float(proxy) if isinstance(proxy, int | float) else None
    sim = data.get("sim_tokens_per_s_per_gpu")
    job.sim = float(sim) if isinstance(sim, int | float) else None
    job.sim_source = "job summary" if job.sim is not None else ""
    job.megatron = _megatron(data)
    job.megatron_source = "job summary" if job.megatron else ""
    job.calls = data.get("calls")
    job.search_s = data.get("wall_s", data.get("search_s"))
    job.curve = read_curve(path, data)
    if not valid:
        job.error = ", ".join(best.get("reasons", [])) or "no valid strategy"
    return job


def collect(root: Path) -> list[Job]:
    """Every job under ``root``, read."""
    return [read_job(root, path) for path in find_jobs(root)]
