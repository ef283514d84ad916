"""Collectives executed as flows on a :class:`simcore.network.FlowNetwork` (the simulator's side).

Each (algorithm, protocol) entry runs as phases. A phase waits its latency (a SimPy timeout) and then
starts its flows together; every flow's rate cap is ``bytes / D`` where ``D`` is the phase's bandwidth
time from the analytic model (:func:`simcore.collectives.formulas.entry_cost`). On an idle fabric all
flows of a phase therefore end together after exactly ``D`` and the collective takes exactly
:func:`~simcore.collectives.collective_time_s` of that entry (the network's own path latency is taken
out of the timeout: NCCL's latency term already contains the wire). Under contention the flows share
links max-min fairly and the collective slows down. One parameter set: the proxy's cost and the
simulator's idle-fabric cost are the same formula.

Traffic patterns (bytes per flow):

* ring: n flows, one per ring edge, each ``nsteps x S/n`` (a ring's identical steps over the same
  edges coalesce into one flow in a fluid model). Across NVLink domains, one ring (channel) per local
  rank carries ``1/p`` of the data and crosses between domains rail-aligned (GPU ``j`` to GPU ``j`` of
  the next domain), so each domain spreads its traffic over all its NICs, as NCCL's channels do.
* tree: a chain inside each domain (S both ways per edge) and NCCL's double binary tree between domains
  (each tree S/2, both ways, split over the p rails).
* nvls: every GPU to the NVSwitch and back (all-reduce S each way; all-gather S/n up and S(n-1)/n down;
  reduce-scatter the reverse); nvls_tree adds the double binary tree between domains.
* hierarchical: its three phases (:func:`~simcore.collectives.formulas.hierarchical_phases`) in turn,
  the intra-domain rings of all domains at once, then one ring per rail across domains.
* all-to-all: every pair at once (direct) or n-1 shifted steps (pairwise); a cross-domain pair goes
  NVLink to the GPU on the destination's rail and then along that rail (NCCL's PXN).
* send/recv: ``ranks[0]`` to ``ranks[-1]``, PXN-style when it crosses rails.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict

import simpy

from .constants import DEFAULT, Fabric, NcclConstants
from .cost import candidates, make_shape
from .formulas import PROTO_INDEX, EntryCost, Shape, entry_cost, hierarchical_phases, p2p_bandwidths

__all__ = ["run_collective", "simulate_collective", "resolve", "double_binary_trees"]

Flow = tuple[str, str, float]  # (src, dst, bytes)


def _domains(graph, ranks: list[str]) -> list[list[str]]:
    """Ranks grouped by NVLink domain (in order of first appearance), each sorted by local index."""
    groups: dict[int, list[str]] = {}
    for r in ranks:
        if r not in graph or graph.nodes[r].get("kind") != "gpu":
            raise ValueError(f"rank {r!r} is not a GPU of the topology")
        data = graph.nodes[r]
        groups.setdefault(data.get("domain", data["node"]), []).append(r)
    doms = [sorted(g, key=lambda r: graph.nodes[r]["local"]) for g in groups.values()]
    if len({len(d) for d in doms}) != 1:
        counts = [len(d) for d in doms]
        raise ValueError(f"ranks must have the same count in every NVLink domain, got {counts}")
    return doms


def resolve(collective: str, shape: Shape, fabric: Fabric, algorithm: str, protocol: str,
            constants: NcclConstants) -> tuple[str, str, EntryCost]:
    """The entry NCCL would run (argmin of its own model over the allowed ones) and its cost."""
    best = None
    for algo, proto in candidates(collective, algorithm, protocol):
        cost = entry_cost(collective, algo, proto, shape, fabric, constants)
        if best is None or float(cost.nccl_time_s) < float(best[2].nccl_time_s):
            best = (algo, proto, cost)
    if not math.isfinite(float(best[2].time_s)):
        raise ValueError(f"{collective}: algorithm {best[0]!r} protocol {best[1]!r} cannot run "
                         f"{int(shape.n)} ranks, {int(shape.p)} per NVLink domain")
    return best


def double_binary_trees(n: int) -> list[list[tuple[int, int]]]:
    """NCCL's two complementary binary trees over ``n`` members as (parent, child) edges.

    Tree 0 is the in-order btree (leaves are the odd members); tree 1 is it mirrored (even ``n``) or
    shifted by one (odd ``n``), so no member is an inner node of both.
    """
    def btree(rank: int) -> int:  # parent of rank in the btree, -1 for the root
        if rank == 0:
            return -1
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        return rank ^ bit if up >= n else up

    tree0 = [(btree(r), r) for r in range(1, n)]
    if n % 2 == 0:
        tree1 = [(n - 1 - u, n - 1 - c) for u, c in tree0]
    else:
        tree1 = [((u + 1) % n, (c + 1) % n) for u, c in tree0]
    return [tree0, tree1]


class _Plan:
    """Builds the flows of one collective on a topology graph."""

    def __init__(self, graph, doms: list[list[str]], ranks: list[str]):
        self.graph, self.doms, self.ranks = graph, doms, ranks
        self.p, self.nodes = len(doms[0]), len(doms)
        self.n = self.p * self.nodes
        self._by_pos: dict[tuple[int, int], str] | None = None

    def switch_of(self, gpu: str) -> str:
        for v in self.graph.successors(gpu):
            if self.graph.nodes[v].get("kind") == "nvswitch":
                return v
        raise ValueError(f"GPU {gpu!r} has no NVSwitch: NVLS needs one")

    def ring_flows(self, per_edge: float) -> list[Flow]:
        """Edges of the ring(s) of a ring collective, ``per_edge`` bytes in total per ring edge."""
        if self.nodes == 1:
            order = self.doms[0]
            return [(order[i], order[(i + 1) % self.n], per_edge) for i in range(self.n)]
        flows: list[Flow] = []
        for c in range(self.p):
            seq = self._channel(c)
            flows += [(seq[i], seq[(i + 1) % self.n], per_edge / self.p) for i in range(self.n)]
        return flows

    def _channel(self, c: int) -> list[str]:
        """Rank order of channel ``c``: enter domain k at rail r_k, leave at r_{k+1} (rail-aligned)."""
        p, N = self.p, self.nodes
        if p == 1:
            return [d[0] for d in self.doms]
        rails = [(c + k % 2) % p for k in range(N)]
        if N % 2 == 1 and p >= 3:
            rails[-1] = (c + 2) % p
        seq = []
        for k, dom in enumerate(self.doms):
            enter, leave = rails[k], rails[(k + 1) % N]
            if leave == enter:  # odd N on 2 rails: one crossing cannot stay on its rail
                leave = (enter + 1) % p
            middle = [dom[(enter + i) % p] for i in range(1, p) if (enter + i) % p != leave]
            seq += [dom[enter]] + middle + [dom[leave]]
        return seq

    def chain_flows(self, size: float) -> list[Flow]:
        """Both directions of a chain through each domain, ``size`` bytes each."""
        pairs = [(a, b) for dom in self.doms for a, b in zip(dom, dom[1:], strict=False)]
        return [f for a, b in pairs for f in ((a, b, size), (b, a, size))]

    def tree_flows(self, size: float) -> list[Flow]:
        """Both directions of both inter-domain trees, each tree ``size / 2`` split over the p rails."""
        part = size / 2 / self.p
        return [f for tree in double_binary_trees(self.nodes) for u, c in tree for j in range(self.p)
                for f in ((self.doms[c][j], self.doms[u][j], part), (self.doms[u][j], self.doms[c][j], part))]

    def nvls_flows(self, up: float, down: float) -> list[Flow]:
        gpus = [(g, self.switch_of(g)) for dom in self.doms for g in dom]
        return [f for g, sw in gpus for f in ((g, sw, up), (sw, g, down))]

    def p2p(self, src: str, dst: str, size: float) -> list[Flow]:
        """src -> dst; across domains via the GPU on dst's rail (PXN), then along the rail."""
        gs, gd = self.graph.nodes[src], self.graph.nodes[dst]
        if gs.get("domain", gs["node"]) == gd.get("domain", gd["node"]) or gs["local"] == gd["local"]:
            return [(src, dst, size)]
        relay = self._gpu_at(gs["node"], gd["local"])
        return [(src, dst, size)] if relay is None else [(src, relay, size), (relay, dst, size)]

    def _gpu_at(self, node: int, local: int) -> str | None:
        if self._by_pos is None:
            self._by_pos = {(d["node"], d["local"]): g for g, d in self.graph.nodes(data=True)
                            if d.get("kind") == "gpu"}
        return self._by_pos.get((node, local))

    def same_domain(self, a: str, b: str) -> bool:
        da, db = self.graph.nodes[a], self.graph.nodes[b]
        return da.get("domain", da["node"]) == db.get("domain", db["node"])


def _phases(collective: str, algo: str, proto: str, plan: _Plan, shape: Shape, fabric: Fabric,
            cost: EntryCost, c: NcclConstants) -> list[tuple[float, list[tuple[list[Flow], float]]]]:
    """[(latency_s, [(flows, duration_s), ...]), ...] to run in order; flow sets of a phase start together."""
    S, n = float(shape.size), plan.n
    latency = float(cost.latency_s + cost.extra_latency_s)
    duration = float(cost.bandwidth_s + cost.fill_s)
    ar = collective == "all_reduce"
    if algo == "ring":
        nsteps = 2 * (n - 1) if ar else n - 1
        return [(latency, [(plan.ring_flows(nsteps * S / n), duration)])]
    if algo == "tree":
        return [(latency, [(plan.chain_flows(S) + plan.tree_flows(S), duration)])]
    if algo in ("nvls", "nvls_tree"):
        up, down = {"all_reduce": (S, S), "all_gather": (S / n, S * (n - 1) / n),
                    "reduce_scatter": (S * (n - 1) / n, S / n)}[collective]
        inter = plan.tree_flows(S) if algo == "nvls_tree" else []
        return [(latency, [(plan.nvls_flows(up, down) + inter, duration)])]
    if algo == "hierarchical":
        return _hierarchical(collective, proto, plan, shape, fabric, c)
    if algo == "direct" and collective == "all_to_all":
        return [(latency, _all_to_all_direct(plan, S, proto, shape, fabric, c))]
    if algo == "pairwise":
        return _pairwise(plan, S, proto, cost, c)
    flows = plan.p2p(plan.ranks[0], plan.ranks[-1], S)  # send_recv: first rank to last
    return [(latency, [(flows, duration)])]


def _hierarchical(collective: str, proto: str, plan: _Plan, shape: Shape, fabric: Fabric, c: NcclConstants):
    c0 = c.with_overrides(launch_overhead_s=0.0)
    phases = []
    for sub, sub_shape in hierarchical_phases(collective, shape):
        k = int(sub_shape.n)
        if k <= 1:
            continue
        cost = entry_cost(sub, "ring", proto, sub_shape, fabric, c0)
        nsteps = 2 * (k - 1) if sub == "all_reduce" else k - 1
        per_edge = nsteps * float(sub_shape.size) / k
        if int(sub_shape.nodes) == 1:  # inside each domain, all domains at once
            rings = [[dom[j] for j in range(plan.p)] for dom in plan.doms]
        else:  # one ring per rail across the domains
            rings = [[dom[j] for dom in plan.doms] for j in range(plan.p)]
        flows = [(r[m], r[(m + 1) % k], per_edge) for r in rings for m in range(k)]
        latency = float(cost.latency_s + cost.extra_latency_s) + (c.launch_overhead_s if not phases else 0.0)
        phases.append((latency, [(flows, float(cost.bandwidth_s + cost.fill_s))]))
    return phases


def _all_to_all_direct(plan: _Plan, S: float, proto: str, shape: Shape, fabric: Fabric, c: NcclConstants):
    f_nvl, f_nic = (float(x) for x in p2p_bandwidths(shape, fabric, PROTO_INDEX[proto], c))
    chunk = S / plan.n
    ranks = [g for dom in plan.doms for g in dom]
    intra = [(a, b, chunk) for a in ranks for b in ranks if a != b and plan.same_domain(a, b)]
    inter = [f for a in ranks for b in ranks if not plan.same_domain(a, b) for f in plan.p2p(a, b, chunk)]
    sets = []
    if intra:
        sets.append((intra, chunk * (plan.p - 1) / f_nvl))
    if inter:
        sets.append((inter, chunk * (plan.n - plan.p) / f_nic))
    return sets


def _pairwise(plan: _Plan, S: float, proto: str, cost: EntryCost, c: NcclConstants):
    """n-1 steps; step s sends rank i's chunk to rank i+s. Latency: base + launch once, a hop per step."""
    ranks = [g for dom in plan.doms for g in dom]
    n = plan.n
    base = c.ring_base_latency_s[PROTO_INDEX[proto]] + float(cost.extra_latency_s)
    hop = (float(cost.latency_s) - c.ring_base_latency_s[PROTO_INDEX[proto]]) / (n - 1)
    per_step = float(cost.bandwidth_s) / (n - 1)
    return [((base if s == 1 else 0.0) + hop,
             [([f for i in range(n) for f in plan.p2p(ranks[i], ranks[(i + s) % n], S / n)], per_step)])
            for s in range(1, n)]


Program = list[tuple[float, list[tuple[tuple[tuple[str, str], ...], float, float]]]]


def _compile(network, phases) -> Program:
    """Phases as [(wait_s, [(pairs, bytes, rate_cap), ...])]: each wait is the phase latency minus the
    network's longest path latency among its flows; equal-size flows of a set share one group."""
    program: Program = []
    for latency, sets in phases:
        max_path = max((network.path_latency(a, b) for flows, _ in sets for a, b, _ in flows), default=0.0)
        groups = []
        for flows, duration in sets:
            by_size: dict[float, list[tuple[str, str]]] = defaultdict(list)
            for a, b, size in flows:
                by_size[size].append((a, b))
            groups += [(tuple(pairs), size, size / duration) for size, pairs in by_size.items()
                       if size > 0 and duration > 0]
        program.append((max(latency - max_path, 0.0), groups))
    return program


def _execute(env: simpy.Environment, network, program: Program, tag):
    """Run a compiled program; the process value is the elapsed time (s)."""
    start = env.now
    for wait, groups in program:
        if wait > 0:
            yield env.timeout(wait)
        if groups:
            yield env.all_of([network.transfer_group(pairs, size, cap, tag=tag)
                              for pairs, size, cap in groups])
    return env.now - start


# Compiled programs per network (a decode step repeats the same collectives many times).
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_collective(env: simpy.Environment, network, collective: str, size_bytes: float, ranks: list[str],
                   algorithm: str = "auto", protocol: str = "auto", constants: NcclConstants = DEFAULT,
                   fabric: Fabric | None = None) -> simpy.events.Process:
    """Start one collective on ``network`` over GPU nodes ``ranks``; the process value is its duration (s).

    ``auto`` resolves to NCCL's choice (:func:`resolve`). ``ValueError`` for unknown names, ranks that
    are not GPUs or are spread unevenly over NVLink domains, or an entry that cannot run them.
    """
    key = (collective, float(size_bytes), tuple(ranks), algorithm, protocol, constants, fabric)
    cache = _PROGRAMS.setdefault(network, {})
    if key not in cache:
        cache[key] = _program(network, collective, float(size_bytes), list(ranks), algorithm, protocol,
                              constants, fabric)
    program, tag = cache[key]
    return env.process(_execute(env, network, program, tag))


def _program(network, collective: str, size: float, ranks: list[str], algorithm: str, protocol: str,
             constants: NcclConstants, fabric: Fabric | None) -> tuple[Program, tuple | None]:
    graph = network.graph
    fabric = Fabric.from_topology(graph) if fabric is None else fabric
    plan = _Plan(graph, _domains(graph, ranks), ranks)
    shape = make_shape(size, plan.n, plan.p, fabric)
    if plan.n <= 1 or size <= 0:
        candidates(collective, algorithm, protocol)  # still reject bad names
        return [], None
    algo, proto, cost = resolve(collective, shape, fabric, algorithm, protocol, constants)
    phases = _phases(collective, algo, proto, plan, shape, fabric, cost, constants)
    return _compile(network, phases), (collective, algo, proto)


def simulate_collective(graph, collective: str, size_bytes: float, ranks: list[str], algorithm: str = "auto",
                        protocol: str = "auto", concurrent_groups: list[list[str]] | None = None,
                        seed: int = 0, constants: NcclConstants = DEFAULT) -> float:
    """Time (s) of one collective over ``ranks`` on a fresh idle network, with optional concurrent groups
    running the same collective at the same time (the result is when the last group finishes)."""
    from simcore.network import FlowNetwork

    env = simpy.Environment()
    network = FlowNetwork(env, graph, seed=seed)
    procs = [run_collective(env, network, collective, size_bytes, group, algorithm, protocol, constants)
             for group in [list(ranks)] + [list(g) for g in (concurrent_groups or [])]]
    env.run(until=env.all_of(procs))
    return max(p.value for p in procs)
