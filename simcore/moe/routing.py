"""Which experts the tokens pick: the routing configuration and each layer's expert popularity.

A :class:`RoutingConfig` names a popularity law over the routed experts:

- ``uniform``: every expert equally likely;
- ``zipf``: ``p(e) ~ 1 / rank(e)^s`` (``zipf_skew`` = s), the ranks shuffled per layer by the seed,
  so each layer has its own hot experts;
- ``histogram``: one given weight per expert, the same for every layer;
- ``file``: measured per-layer expert loads from ``path`` (CSV ``layer,expert,load`` or JSON, see
  :func:`load_expert_loads`); layer ``l`` of the model uses row ``l mod rows`` of the file.

``sampled`` draws the token copies of every (layer, step) from a seeded multinomial; otherwise a
draw is the expectation of the law (fractional token counts). ``a2a`` picks how dispatch and
combine are priced: ``nccl`` (NCCL's all-to-all on the per-rank buffer) or ``deepep`` (DeepEP's
normal kernels for prefill, low-latency kernels for decode; :mod:`simcore.moe.deepep`).
"""

from __future__ import annotations

import csv
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["RoutingConfig", "DISTRIBUTIONS", "A2A_KINDS", "layer_popularity", "load_expert_loads"]

DISTRIBUTIONS = ("uniform", "zipf", "histogram", "file")
A2A_KINDS = ("nccl", "deepep")


@dataclass
class RoutingConfig:
    """MoE routing (the ``sim.routing`` config node; also carried by the proxy's cost context).

    ``distribution``: uniform | zipf | histogram | file; ``zipf_skew``: exponent s >= 0;
    ``histogram``: relative weight per expert (length = experts); ``path``: the load file of
    ``file``; ``sampled``: draw token counts per (layer, step) instead of their expectation;
    ``a2a``: nccl | deepep, the dispatch/combine algorithm.
    """

    distribution: str = "uniform"
    zipf_skew: float = 1.0
    histogram: list[float] = field(default_factory=list)
    sampled: bool = False
    path: str | None = None
    a2a: str = "nccl"

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"routing.distribution: {self.distribution!r} is not one of {', '.join(DISTRIBUTIONS)}")
        if not self.zipf_skew >= 0:
            raise ValueError(f"routing.zipf_skew must be >= 0, got {self.zipf_skew}")
        if self.a2a not in A2A_KINDS:
            raise ValueError(f"routing.a2a: {self.a2a!r} is not one of {', '.join(A2A_KINDS)}")
        if self.distribution == "file" and not self.path:
            raise ValueError("routing.path: required when routing.distribution is file")
        if self.path and self.distribution != "file":  # a file that would be silently left unread
            raise ValueError(f"routing.path: {self.path} is read only under routing.distribution=file, "
                             f"got distribution {self.distribution}")
        if any(not w >= 0 for w in self.histogram):
            raise ValueError("routing.histogram: weights must be non-negative")

    @property
    def is_uniform(self) -> bool:
        """Expected uniform routing: every rank gets exactly its share (the proxy's old assumption)."""
        return self.distribution == "uniform" and not self.sampled

    def key(self) -> tuple:
        """A hashable identity (for caches)."""
        return (self.distribution, float(self.zipf_skew), tuple(float(w) for w in self.histogram),
                bool(self.sampled), self.path)


def _layer_rng(seed: int, layer: int, step: int | None = None) -> np.random.Generator:
    """An independent stream per (seed, layer[, step]): draws do not depend on call order."""
    words = [int(seed) & 0xFFFFFFFF, int(layer), 0 if step is None else int(step) + 1]
    return np.random.default_rng(np.random.SeedSequence(words))


def layer_popularity(cfg: RoutingConfig, num_experts: int, seed: int, layer: int) -> np.ndarray:
    """Probability that a token copy of MoE layer ``layer`` goes to each expert (sums to 1)."""
    if cfg.distribution == "uniform":
        p = np.ones(num_experts)
    elif cfg.distribution == "zipf":
        p = 1.0 / np.arange(1, num_experts + 1) ** cfg.zipf_skew
        p = p[_layer_rng(seed, layer).permutation(num_experts)]
    elif cfg.distribution == "histogram":
        p = np.asarray(cfg.histogram, dtype=float)
        if p.shape != (num_experts,) or p.sum() <= 0:
            raise ValueError(f"routing.histogram: needs {num_experts} non-negative weights (the model's "
                             f"experts) with a positive sum, got {len(p)}")
    else:
        loads = load_expert_loads(str(cfg.path), num_experts)
        p = loads[layer % len(loads)]
    return p / p.sum()


def load_expert_loads(path: str, num_experts: int) -> np.ndarray:
    """Measured loads ``[layers, experts]`` from a CSV (columns ``layer,expert,load``, one row per
    pair) or a JSON file (a list of per-layer lists, or ``{"loads": [...]}``); the expert count must
    be the model's, loads non-negative, every layer with some load. Errors name ``routing.path``."""
    loads = _read_loads(str(path))
    if loads.shape[1] != num_experts:
        raise ValueError(f"routing.path: {path} has {loads.shape[1]} experts per layer, the model has {num_experts}")
    return loads


@functools.lru_cache(maxsize=16)
def _read_loads(path: str) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"routing.path: no such file {path}")
    try:
        rows = _json_rows(p) if p.suffix.lower() == ".json" else _csv_rows(p)
    except (json.JSONDecodeError, csv.Error, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"routing.path: cannot read {path}: {exc}") from None
    widths = {len(r) for r in rows}
    if not rows or len(widths) != 1 or 0 in widths:
        raise ValueError(f"routing.path: {path} needs the same non-zero expert count in every layer, got {sorted(widths)}")
    loads = np.asarray(rows, dtype=float)
    bad = np.argwhere(~(loads >= 0))
    if len(bad):
        layer, expert = bad[0]
        raise ValueError(f"routing.path: negative or missing load {loads[layer, expert]} at layer {layer} "
                         f"expert {expert} of {path}")
    empty = np.flatnonzero(loads.sum(axis=1) <= 0)
    if len(empty):
        raise ValueError(f"routing.path: layer {empty[0]} of {path} has no load")
    loads.setflags(write=False)
    return loads


def _json_rows(p: Path) -> list[list[float]]:
    data = json.loads(p.read_text())
    if isinstance(data, dict):
        data = data["loads"]
    if not isinstance(data, list) or not all(isinstance(r, list) for r in data):
        raise TypeError("expected a list of per-layer lists of loads")
    return [[float(v) for v in r] for r in data]


def _csv_rows(p: Path) -> list[list[float]]:
    with open(p, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = {"layer", "expert", "load"} - set(reader.fieldnames or ())
        if missing:
            raise KeyError(f"missing column(s) {', '.join(sorted(missing))}")
        cells: dict[tuple[int, int], float] = {}
        for row in reader:
            cells[(int(row["layer"]), int(row["expert"]))] = float(row["load"])
    if not cells:
        return []
    layers = 1 + max(k[0] for k in cells)
    experts = 1 + max(k[1] for k in cells)
    rows = [[cells.get((la, e), float("nan")) for e in range(experts)] for la in range(layers)]
    return rows
