"""DeepEP's dispatch and combine in the engine: what an MoE exchange runs under ``sim.routing.a2a=deepep``.

The lowering prices such an exchange with DeepEP's closed form (:func:`simcore.moe.deepep.uniform_time_s`:
normal kernels for prefill, low-latency kernels for decode); the engine runs the same algorithm on the
routing it draws, with DeepEP's own costs (:mod:`simcore.moe.deepep`):

- an :class:`Exchange` holds the per-pair link traffic of DeepEP's kernels for one draw
  (:func:`~simcore.moe.deepep.link_tokens`: normal mode sends a token once per destination node over
  RDMA, to the GPU of its own rail there, which forwards it over NVLink once per destination rank; low
  latency writes every copy straight into its rank's buffer, over NVLink inside a node and RDMA across)
  and DeepEP's time for it: a fixed cost plus the bandwidth term of the slowest rank (each rank's larger
  of NVLink and RDMA bytes, sent or received, at DeepEP's fitted rates). The whole op lasts as long as
  its slowest rank: no rank's dispatch has its tokens, and combine cannot finish, before the last one.
- On an idle fabric (a communicator that shares no link with another, as every other collective in
  :mod:`.pergpu` and :mod:`.comm`) the exchange takes that time without the flow solver.
- Elsewhere it runs as flows (:func:`run_exchange`): one per (sender, receiver) of each link class,
  RDMA and NVLink stages at once (DeepEP pipelines them), every flow's rate cap its bytes over the
  exchange's bandwidth time. A pair whose route crosses a spine is spread evenly over every spine
  of equal cost (InfiniBand's adaptive routing, which DeepEP recommends under load: "can completely
  eliminate network congestion caused by routing conflicts"; DeepEP's fitted rates have no such
  conflicts). On an idle fabric the exchange therefore ends exactly at DeepEP's time; traffic
  sharing its links slows the flows it takes bandwidth from. A flow's wire bytes are its payload times
  ``capacity / DeepEP rate`` of its sender's link (the link's derated capacity, :mod:`simcore.network.flownet`,
  over the rate DeepEP's kernels reach on it): a rank moving data at DeepEP's rate fills its link, as
  an NCCL flow at its protocol's rate does.

:class:`FoldedExchanges` gives the folded engine (every EP rank alike) the lowering's closed form on the
communicator's own shape, with the uniform routing's traffic for its flows.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import simpy

from simcore.collectives import DEFAULT
from simcore.collectives.constants import Fabric
from simcore.collectives.flows import _execute
from simcore.collectives.patterns import domains
from simcore.collectives.pipeline import nccl_link_efficiency
from simcore.moe.deepep import (
    DEFAULT_DEEPEP,
    DeepEPConstants,
    fixed_time_s,
    fp8_token_bytes,
    kernel_sms,
    kernel_time_s,
    link_tokens,
    uniform_time_s,
)
from simcore.network.chainset import ChainSet

__all__ = ["Exchange", "FoldedExchanges", "deepep_mode", "token_bytes", "exchange", "uniform_exchange",
           "run_exchange"]


def deepep_mode(op) -> str | None:
    """``normal`` | ``low_latency`` for an op the lowering priced as DeepEP's kernels, else None."""
    algorithm = getattr(op, "algorithm", "") or ""
    return algorithm[len("deepep_"):] if algorithm.startswith("deepep_") else None


def token_bytes(ctx, name: str, per_copy_bytes: float) -> float:
    """Bytes DeepEP moves per token copy: the op's bytes per copy, an FP8 dispatch with its scales
    (:func:`~simcore.moe.deepep.fp8_token_bytes`), as the lowering prices it."""
    h = ctx.model.hidden_size
    fp8 = name == "dispatch" and min(ctx.workload.activation_bytes, ctx.workload.weight_bytes) == 1.0
    return float(per_copy_bytes) * (fp8_token_bytes(h) / h if fp8 else 1.0)


@dataclass(frozen=True, eq=False)
class Exchange:
    """One dispatch or combine as DeepEP runs it. ``ranks`` node by node; ``nvlink[s, d]`` and
    ``rdma[s, d]``: tokens ``ranks[s]`` moves to ``ranks[d]`` on that link class
    (:class:`~simcore.moe.deepep.LinkTokens`); ``*_rate``: DeepEP's bytes/s per rank on it."""

    mode: str
    ranks: tuple[str, ...]
    nvlink: np.ndarray
    rdma: np.ndarray
    token_bytes: float
    nvlink_rate: float
    rdma_rate: float
    fixed_s: float
    bandwidth_s: float  # the slowest rank's bandwidth term
    sms: int  # SMs each rank's kernel holds

    @property
    def time_s(self) -> float:
        """DeepEP's time for the op on an idle fabric: its slowest rank's."""
        return self.fixed_s + self.bandwidth_s


def _rates(mode: str, gpu, c: DeepEPConstants) -> tuple[float, float]:
    nvl = c.nvlink_efficiency * gpu.nvlink_bandwidth_bytes_per_s
    rdma = (c.rdma_efficiency if mode == "normal" else c.ll_rdma_efficiency) * gpu.nic_bandwidth_bytes_per_s
    return float(nvl), float(rdma)


def _node_major(graph, ranks: list[str]) -> tuple[list[int], int]:
    """Indices of ``ranks`` node (NVLink domain) by node, local index within; ranks per node."""
    doms = domains(graph, list(ranks))
    index = {r: k for k, r in enumerate(ranks)}
    return [index[r] for dom in doms for r in dom], len(doms[0])


def exchange(ctx, graph, ranks: list[str], pair_tokens, mode: str, tokens_per_rank: float, top_k: int,
             token_bytes: float, ranks_per_node: int | None = None,
             c: DeepEPConstants = DEFAULT_DEEPEP) -> Exchange:
    """DeepEP's exchange of ``pair_tokens[a, b]`` copies from ``ranks[a]`` to ``ranks[b]``, at
    ``token_bytes`` each, on the GPUs of ``ctx.cluster``. The ranks' nodes are the graph's NVLink
    domains; ``ranks_per_node``, when given, takes the ranks in order instead, that many per node (the
    lowering's packed communicator: contention off prices every collective as the lowering does)."""
    if ranks_per_node is None:
        order, rpn = _node_major(graph, ranks)
    else:
        order, rpn = list(range(len(ranks))), int(ranks_per_node)
    pair = np.asarray(pair_tokens, dtype=float)[np.ix_(order, order)]
    t = link_tokens(mode, pair, tokens_per_rank, top_k, rpn, c)
    gpu, ep = ctx.cluster.gpu, len(ranks)
    fixed = fixed_time_s(mode, ep, c)
    times = kernel_time_s(mode, t.nvlink_rank * token_bytes, t.rdma_rank * token_bytes, ep - 1, gpu, c)
    nvl_rate, rdma_rate = _rates(mode, gpu, c)
    return Exchange(mode, tuple(ranks[k] for k in order), t.nvlink, t.rdma, float(token_bytes), nvl_rate,
                    rdma_rate, fixed, max(float(np.max(times)) - fixed, 0.0), kernel_sms(mode, c))


def uniform_exchange(ctx, graph, ranks: list[str], mode: str, tokens_per_rank: float, top_k: int,
                     token_bytes: float, load: float = 1.0, c: DeepEPConstants = DEFAULT_DEEPEP) -> Exchange:
    """Every rank routing uniformly, the busiest receiving ``load`` times the mean: the lowering's
    closed form (:func:`~simcore.moe.deepep.uniform_time_s`) on this communicator's own shape, its
    flows the uniform routing's."""
    order, rpn = _node_major(graph, ranks)
    ep = len(ranks)
    pair = np.full((ep, ep), tokens_per_rank * top_k / ep)
    t = link_tokens(mode, pair, tokens_per_rank, top_k, rpn, c)
    gpu = ctx.cluster.gpu
    fixed = fixed_time_s(mode, ep, c)
    time = float(uniform_time_s(mode, tokens_per_rank, top_k, token_bytes, ep, rpn, gpu, load, c))
    nvl_rate, rdma_rate = _rates(mode, gpu, c)
    return Exchange(mode, tuple(ranks[k] for k in order), t.nvlink, t.rdma, float(token_bytes), nvl_rate,
                    rdma_rate, fixed, max(time - fixed, 0.0), kernel_sms(mode, c))


class FoldedExchanges:
    """The DeepEP exchanges of a folded run (every EP rank alike): ``tokens_per_rank`` tokens per EP
    rank, the stage's ops lowered at ``load`` (:func:`uniform_exchange`, memoized per op and group)."""

    def __init__(self, ctx, graph, tokens_per_rank: float, load: float = 1.0):
        self.ctx, self.graph, self.tokens, self.load = ctx, graph, float(tokens_per_rank), float(load)
        self._cache: dict[tuple, Exchange] = {}

    def get(self, op, ranks: list[str]) -> Exchange | None:
        mode = deepep_mode(op)
        if mode is None or len(ranks) <= 1:
            return None
        key = (op.name, op.size_bytes, tuple(ranks))
        if key not in self._cache:
            k = self.ctx.model.top_k
            per_copy = op.size_bytes / max(self.tokens * k * self.load, 1e-30)
            self._cache[key] = uniform_exchange(self.ctx, self.graph, list(ranks), mode, self.tokens, k,
                                                token_bytes(self.ctx, op.name, per_copy), self.load)
        return self._cache[key]


_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # network -> {exchange: program}
_MAX_PROGRAMS = 512


def _flow_key(rank: str, index: int) -> int:
    """The sender's ECMP key (its rank, as the collectives' p2p flows: one queue pair per pair)."""
    return int(rank[3:]) if rank.startswith("gpu") and rank[3:].isdigit() else index


def _routes(network, src: str, dst: str, key: int) -> list[tuple[tuple[str, str], ...]]:
    """The chains that carry ``src -> dst``: its route, or where that crosses one spine, one chain
    through each spine joining the same two switches (equal cost: adaptive routing's spread)."""
    path = network.path(src, dst, key)
    graph = network.graph
    hops = [u for u, _ in path] + ([path[-1][1]] if path else [])
    spines = [k for k, v in enumerate(hops) if graph.nodes[v].get("kind") == "spine"]
    if len(spines) != 1 or spines[0] in (0, len(hops) - 1):
        return [((src, dst),)]
    up, down = hops[spines[0] - 1], hops[spines[0] + 1]
    alternatives = [v for v in graph.successors(up)
                    if graph.nodes[v].get("kind") == "spine" and graph.has_edge(v, down)]
    return [((src, v), (v, dst)) for v in alternatives]


def _program(network, ex: Exchange, spread: bool = True):
    """``[(wait, groups, fill, path)]`` for :func:`~simcore.collectives.flows._execute`: after the
    fixed cost less the longest path latency, every flow at once, each spread over the bandwidth time
    (``spread``: a pair crossing a spine over every spine, else on its own route)."""
    cache = _PROGRAMS.setdefault(network, {})
    program = cache.get((ex, spread))
    if program is not None:
        return program
    capacity = network.capacity  # derated bytes/s per link
    by_size: dict[float, tuple[list, list]] = {}
    max_path = 0.0
    for tokens, rate in ((ex.nvlink, ex.nvlink_rate), (ex.rdma, ex.rdma_rate)):
        for a, b in zip(*np.nonzero(tokens), strict=True):
            if a == b:  # normal mode's own-node share: pipelined by the kernel, on no link
                continue
            src, dst = ex.ranks[a], ex.ranks[b]
            key = _flow_key(src, int(a))
            path = network.path(src, dst, key)
            if not path:
                continue
            wire = capacity[path[0]] / rate  # DeepEP's rate fills the sender's link
            routes = _routes(network, src, dst, key) if spread else [((src, dst),)]
            size = float(tokens[a, b]) * ex.token_bytes * wire / len(routes)
            chains, keys = by_size.setdefault(size, ([], []))
            for legs in routes:
                chains.append(legs)
                keys.append(key)
                max_path = max(max_path, max(network.path_latency(u, v, key) for u, v in legs))
    groups = []
    if ex.bandwidth_s > 0:
        groups = [ChainSet(chains, size, size / ex.bandwidth_s, keys) for size, (chains, keys) in by_size.items()
                  if size > 0]
    if not groups:
        max_path = 0.0
    program = [(max(ex.fixed_s - max_path, 0.0), groups, 0.0, max_path)]
    if len(cache) >= _MAX_PROGRAMS:
        cache.clear()
    cache[(ex, spread)] = program
    return program


def run_exchange(env: simpy.Environment, network, ex: Exchange, constants=None, fabric: Fabric | None = None,
                 spread: bool = True):
    """Process: ``ex`` as flows on ``network`` (module docstring); value: elapsed seconds. A network
    whose links were never derated gets NCCL's link efficiencies first (as every collective's flows).
    ``spread=False`` keeps each pair on its own ECMP route (a fifth of the flows on a rail fabric: the
    serving simulator's choice, :mod:`simcore.serving.fabric`)."""
    if len(ex.ranks) <= 1 or ex.time_s <= 0:
        return 0.0
    if network.link_efficiency is None:
        graph = network.graph
        constants = constants or DEFAULT
        network.set_link_efficiency(nccl_link_efficiency(graph, constants, fabric or Fabric.from_topology(graph)))
    return (yield from _execute(env, network, _program(network, ex, spread), ("all_to_all", f"deepep_{ex.mode}", "simple")))
