"""Collectives executed as flows on a :class:`simcore.network.flownet.FlowNetwork` (the simulator's side).

Each (algorithm, protocol) entry runs as phases. A phase waits its latency (a SimPy timeout, less the
network's own path latency: NCCL's latency term already contains the wire), then starts its flows
together. The physics lives on the links, not in per-flow handicaps:

* links are derated (:func:`~simcore.collectives.pipeline.nccl_link_efficiency`: NVLink and NIC
  efficiencies, the proxy's own bandwidth fractions), so k identical link-bound collectives on one
  bottleneck take k times one;
* a flow carries its protocol's wire bytes (LL 2x, LL128 128/120: flags travel with the data);
* a ring or tree runs as NCCL channels (``ring_channels``), each one pipelined flow over all its
  edges (a chain), so its rate is that of its slowest link: one slow link slows the whole ring;
* each channel is routed on its own ECMP hash (flow key = channel), each p2p flow on its pair's;
* a flow's rate cap is what its (algorithm, protocol) reaches on an idle fabric (NCCL's busBw rules:
  LL's per-GPU ceiling, NVLS's channel rule, the tree's factors); where that is the link itself the
  cap never binds under contention;
* the calibrated un-overlapped fill (ring fill steps, the NVLS fill) lasts ``fill_s / bandwidth_s``
  of the time the phase's flows actually took: pipeline steps at the rate the ring got.

On an idle fabric every phase therefore takes exactly its analytic bandwidth time and the collective
:func:`~simcore.collectives.collective_time_s` of that entry (``tests/test_collectives.py``). One
parameter set: the proxy's cost and the simulator's idle-fabric cost are the same formula.

Traffic patterns (payload bytes):

* ring: C channels, each a chain over the ring's n edges carrying ``nsteps x S/n / C``. Across
  NVLink domains channel c runs on rail ``c mod p`` (enter domain k at rail r_k, leave at r_{k+1},
  GPU j to GPU j of the next domain), so each domain spreads its traffic over all its NICs.
* tree: C channels, channel c on tree ``c mod 2`` and rail ``(c // 2) mod p``: one chain through the
  chain of every domain (both ways) and the tree's inter-domain edges on that rail (both ways),
  ``S / C`` each (NCCL's double binary tree, :func:`double_binary_trees`).
* nvls: every GPU to the NVSwitch and back (all-reduce S each way; all-gather S/n up and S(n-1)/n down;
  reduce-scatter the reverse); nvls_tree adds the double binary tree between domains.
* hierarchical: its three phases (:func:`~simcore.collectives.formulas.hierarchical_phases`) in turn,
  the intra-domain rings of all domains at once, then one ring per rail across domains.
* all-to-all: every pair at once (direct) or n-1 shifted steps (pairwise); a cross-domain pair goes
  NVLink to the GPU on the destination's rail and then along that rail (NCCL's PXN), as one chain.
* send/recv: ``ranks[0]`` to ``ranks[-1]``, PXN-style when it crosses rails.
"""

from __future__ import annotations

import math
import weakref
from collections import defaultdict

import simpy

from simcore.collectives.constants import DEFAULT, Fabric, NcclConstants
from simcore.collectives.cost import candidates, make_shape
from simcore.collectives.formulas import (
    PROTO_INDEX,
    EntryCost,
    Shape,
    entry_cost,
    hierarchical_phases,
    p2p_bandwidths,
)
from simcore.collectives.patterns import Flow, Leg, Plan, domains, double_binary_trees
from simcore.collectives.pipeline import WIRE_FACTOR, kernel_channels, nccl_link_efficiency
from simcore.network.chainset import ChainSet
from simcore.network.flownet import FlowNetwork

__all__ = ["run_collective", "simulate_collective", "resolve", "double_binary_trees", "collective_channels",
           "compile_collective", "run_compiled"]


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

Phase = tuple[float, list[tuple[list[Flow], float]], float]  # (latency_s, [(flows, duration_s)], fill ratio)


def _fill_ratio(cost: EntryCost) -> float:
    bandwidth = float(cost.bandwidth_s)
    return float(cost.fill_s) / bandwidth if bandwidth > 0 else 0.0


def _phases(collective: str, algo: str, proto: str, plan: Plan, shape: Shape, fabric: Fabric,
            cost: EntryCost, c: NcclConstants) -> list[Phase]:
    """Phases to run in order; the flow sets of a phase start together (module docstring)."""
    S, n = float(shape.size), plan.n
    latency = float(cost.latency_s + cost.extra_latency_s)
    duration, fill = float(cost.bandwidth_s), _fill_ratio(cost)
    if algo == "ring":
        nsteps = 2 * (n - 1) if collective == "all_reduce" else n - 1
        return [(latency, [(plan.ring_flows(nsteps * S / n, c.ring_channels), duration)], fill)]
    if algo == "tree":
        return [(latency, [(plan.tree_channel_flows(S, c.ring_channels), duration)], fill)]
    if algo in ("nvls", "nvls_tree"):
        up, down = {"all_reduce": (S, S), "all_gather": (S / n, S * (n - 1) / n),
                    "reduce_scatter": (S * (n - 1) / n, S / n)}[collective]
        inter = plan.tree_flows(S) if algo == "nvls_tree" else []
        return [(latency, [(plan.nvls_flows(up, down) + inter, duration)], fill)]
    if algo == "hierarchical":
        return _hierarchical(collective, proto, plan, shape, fabric, c)
    if algo == "direct" and collective == "all_to_all":
        return [(latency, _all_to_all_direct(plan, S, proto, shape, fabric, c), fill)]
    if algo == "pairwise":
        return _pairwise(plan, S, proto, cost, c)
    return [(latency, [([plan.p2p(plan.ranks[0], plan.ranks[-1], S)], duration)], fill)]  # send_recv


def _hierarchical(collective: str, proto: str, plan: Plan, shape: Shape, fabric: Fabric,
                  c: NcclConstants) -> list[Phase]:
    c0 = c.with_overrides(launch_overhead_s=0.0)
    phases: list[Phase] = []
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
        flows = [(tuple((r[m], r[(m + 1) % k]) for m in range(k)), per_edge / c.ring_channels, ch)
                 for r in rings for ch in range(c.ring_channels)]
        latency = float(cost.latency_s + cost.extra_latency_s) + (c.launch_overhead_s if not phases else 0.0)
        phases.append((latency, [(flows, float(cost.bandwidth_s))], _fill_ratio(cost)))
    return phases


def _all_to_all_direct(plan: Plan, S: float, proto: str, shape: Shape, fabric: Fabric, c: NcclConstants):
    f_nvl, f_nic = (float(x) for x in p2p_bandwidths(shape, fabric, PROTO_INDEX[proto], c))
    chunk = S / plan.n
    ranks = [g for dom in plan.doms for g in dom]
    intra = [(((a, b),), chunk, 0) for a in ranks for b in ranks if a != b and plan.same_domain(a, b)]
    inter = [plan.p2p(a, b, chunk) for a in ranks for b in ranks if not plan.same_domain(a, b)]
    sets = []
    if intra:
        sets.append((intra, chunk * (plan.p - 1) / f_nvl))
    if inter:
        sets.append((inter, chunk * (plan.n - plan.p) / f_nic))
    return sets


def _pairwise(plan: Plan, S: float, proto: str, cost: EntryCost, c: NcclConstants) -> list[Phase]:
    """n-1 steps; step s sends rank i's chunk to rank i+s. Latency: base + launch once, a hop per step."""
    ranks = [g for dom in plan.doms for g in dom]
    n = plan.n
    base = c.ring_base_latency_s[PROTO_INDEX[proto]] + float(cost.extra_latency_s)
    hop = (float(cost.latency_s) - c.ring_base_latency_s[PROTO_INDEX[proto]]) / (n - 1)
    per_step = float(cost.bandwidth_s) / (n - 1)
    fill = _fill_ratio(cost)  # the network fill across domains (0 inside one)
    return [((base if s == 1 else 0.0) + hop,
             [([plan.p2p(ranks[i], ranks[(i + s) % n], S / n) for i in range(n)], per_step)], fill)
            for s in range(1, n)]


Program = list[tuple[float, list[ChainSet], float, float]]


def _compile(network, phases: list[Phase], proto: str) -> Program:
    """Phases as [(wait_s, groups, fill ratio, path_s)]: each wait is the phase latency minus the network's
    longest path latency ``path_s`` among its flows; equal-size flows of a set share one group (a
    :class:`~simcore.network.chainset.ChainSet`, checked once however often the program runs); sizes and caps are
    wire bytes (:data:`~simcore.collectives.pipeline.WIRE_FACTOR`)."""
    wire = WIRE_FACTOR[proto]
    program: Program = []
    for latency, sets, fill in phases:
        max_path = max((network.path_latency(a, b, key) for flows, _ in sets for legs, _, key in flows
                        for a, b in legs), default=0.0)
        groups: list[ChainSet] = []
        for flows, duration in sets:
            by_size: dict[float, list[tuple[tuple[Leg, ...], int]]] = defaultdict(list)
            for legs, size, key in flows:
                by_size[size].append((legs, key))
            groups += [ChainSet(tuple(legs for legs, _ in chains), size * wire, size * wire / duration,
                                tuple(key for _, key in chains))
                       for size, chains in by_size.items() if size > 0 and duration > 0]
        program.append((max(latency - max_path, 0.0), groups, fill, max_path))
    return program


def _execute(env: simpy.Environment, network, program: Program, tag):
    """Run a compiled program; the process value is the elapsed time (s)."""
    start = env.now
    for wait, groups, fill, path in program:
        if wait > 0:
            yield env.timeout(wait)
        if groups:
            t0 = env.now
            yield env.all_of([network.send(group, tag) for group in groups])
            if fill > 0:  # un-overlapped fill steps, at the rate the phase actually got
                yield env.timeout(fill * max(env.now - t0 - path, 0.0))
    return env.now - start


# Compiled programs per network (a decode step repeats the same collectives many times).
_PROGRAMS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_CHANNELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # kernel channels of entries not compiled


def run_collective(env: simpy.Environment, network, collective: str, size_bytes: float, ranks: list[str],
                   algorithm: str = "auto", protocol: str = "auto", constants: NcclConstants = DEFAULT,
                   fabric: Fabric | None = None) -> simpy.events.Process:
    """Start one collective on ``network`` over GPU nodes ``ranks``; the process value is its duration (s).

    ``auto`` resolves to NCCL's choice (:func:`resolve`). ``ValueError`` for unknown names, ranks that
    are not GPUs or are spread unevenly over NVLink domains, or an entry that cannot run them. A network
    whose links were never derated gets :func:`~simcore.collectives.pipeline.nccl_link_efficiency` of
    these constants before the first collective (the idle-fabric equality needs it).
    """
    return run_compiled(env, network, compile_collective(network, collective, size_bytes, ranks, algorithm,
                                                         protocol, constants, fabric))


def compile_collective(network, collective: str, size_bytes: float, ranks: list[str], algorithm: str = "auto",
                       protocol: str = "auto", constants: NcclConstants = DEFAULT,
                       fabric: Fabric | None = None) -> tuple[Program, tuple | None, int]:
    """What :func:`run_collective` runs, for :func:`run_compiled`: a caller that runs the same collective
    many times keeps it and skips re-hashing the key (the constants and fabric hash field by field).
    Derates the network's links the first time, as :func:`run_collective` does."""
    if network.link_efficiency is None:
        graph = network.graph
        network.set_link_efficiency(nccl_link_efficiency(graph, constants, fabric or Fabric.from_topology(graph)))
    key = (collective, float(size_bytes), tuple(ranks), algorithm, protocol, constants, fabric)
    cache = _PROGRAMS.setdefault(network, {})
    if key not in cache:
        cache[key] = _program(network, collective, float(size_bytes), list(ranks), algorithm, protocol,
                              constants, fabric)
    return cache[key]


def run_compiled(env: simpy.Environment, network, compiled: tuple[Program, tuple | None, int]) -> simpy.events.Process:
    """Start a :func:`compile_collective` result on ``network`` (the network it was compiled for)."""
    program, tag, _ = compiled
    return env.process(_execute(env, network, program, tag))


def collective_channels(network, collective: str, size_bytes: float, ranks: list[str], algorithm: str = "auto",
                        protocol: str = "auto", constants: NcclConstants = DEFAULT,
                        fabric: Fabric | None = None) -> int:
    """CTAs (SMs) per GPU the kernel of this collective holds while it runs (0 when it moves nothing):
    :func:`~simcore.collectives.pipeline.kernel_channels` of the entry :func:`run_collective` runs."""
    key = (collective, float(size_bytes), tuple(ranks), algorithm, protocol, constants, fabric)
    compiled = _PROGRAMS.get(network, {}).get(key)
    if compiled is not None:
        return compiled[2]
    cache = _CHANNELS.setdefault(network, {})
    if key not in cache:  # the entry only, without building its flows
        graph = network.graph
        fab = Fabric.from_topology(graph) if fabric is None else fabric
        plan = Plan(graph, domains(graph, list(ranks)), list(ranks))
        if plan.n <= 1 or size_bytes <= 0:
            cache[key] = 0
        else:
            algo = resolve(collective, make_shape(float(size_bytes), plan.n, plan.p, fab), fab, algorithm,
                           protocol, constants)[0]
            cache[key] = kernel_channels(algo, plan.p, constants)
    return cache[key]


def _program(network, collective: str, size: float, ranks: list[str], algorithm: str, protocol: str,
             constants: NcclConstants, fabric: Fabric | None) -> tuple[Program, tuple | None, int]:
    graph = network.graph
    fabric = Fabric.from_topology(graph) if fabric is None else fabric
    plan = Plan(graph, domains(graph, ranks), ranks)
    shape = make_shape(size, plan.n, plan.p, fabric)
    if plan.n <= 1 or size <= 0:
        candidates(collective, algorithm, protocol)  # still reject bad names
        return [], None, 0
    algo, proto, cost = resolve(collective, shape, fabric, algorithm, protocol, constants)
    phases = _phases(collective, algo, proto, plan, shape, fabric, cost, constants)
    return (_compile(network, phases, proto), (collective, algo, proto),
            kernel_channels(algo, plan.p, constants))


def simulate_collective(graph, collective: str, size_bytes: float, ranks: list[str], algorithm: str = "auto",
                        protocol: str = "auto", concurrent_groups: list[list[str]] | None = None,
                        seed: int = 0, constants: NcclConstants = DEFAULT, routing: str = "ecmp") -> float:
    """Time (s) of one collective over ``ranks`` on a fresh idle network (links derated by
    :func:`~simcore.collectives.pipeline.nccl_link_efficiency`), with optional concurrent groups running
    the same collective at the same time (the result is when the last group finishes)."""

    env = simpy.Environment()
    efficiency = nccl_link_efficiency(graph, constants, Fabric.from_topology(graph))
    network = FlowNetwork(env, graph, seed=seed, link_efficiency=efficiency, routing=routing)
    procs = [run_collective(env, network, collective, size_bytes, group, algorithm, protocol, constants)
             for group in [list(ranks)] + [list(g) for g in (concurrent_groups or [])]]
    env.run(until=env.all_of(procs))
    return max(p.value for p in procs)
