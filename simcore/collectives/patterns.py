"""Traffic patterns of the flow-level collectives on a topology graph: which GPUs exchange what, as flows.

A flow is ``(legs, payload bytes, ECMP flow key)``: its legs move at one rate (a pipelined NCCL ring or
tree channel, a PXN hop pair), see :meth:`simcore.network.flownet.FlowNetwork.transfer_chains`. The patterns are
described in :mod:`simcore.collectives.flows`.
"""

from __future__ import annotations

__all__ = ["Leg", "Flow", "domains", "double_binary_trees", "Plan", "pxn_relay"]

Leg = tuple[str, str]
Flow = tuple[tuple[Leg, ...], float, int]  # (legs moved at one rate, payload bytes, ECMP flow key)


def domains(graph, ranks: list[str]) -> list[list[str]]:
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


class Plan:
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

    def ring_flows(self, per_edge: float, channels: int) -> list[Flow]:
        """``channels`` pipelined ring channels, ``per_edge`` payload bytes per ring edge in all."""
        flows: list[Flow] = []
        for c in range(channels):
            seq = self.doms[0] if self.nodes == 1 else self._channel(c % self.p)
            legs = tuple((seq[i], seq[(i + 1) % self.n]) for i in range(self.n))
            flows.append((legs, per_edge / channels, c))
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

    def _chain_legs(self) -> tuple[Leg, ...]:
        """Both directions of a chain through each domain."""
        return tuple(leg for dom in self.doms for a, b in zip(dom, dom[1:], strict=False)
                     for leg in ((a, b), (b, a)))

    def tree_channel_flows(self, size: float, channels: int) -> list[Flow]:
        """Channel c: the chains of all domains and tree ``c mod 2`` on rail ``(c // 2) mod p``, both
        ways, as one pipelined flow of ``size / channels``."""
        chain = self._chain_legs()
        trees = double_binary_trees(self.nodes) if self.nodes > 1 else [[], []]
        flows: list[Flow] = []
        for c in range(channels):
            j = (c // 2) % self.p
            inter = tuple(leg for u, v in trees[c % 2]
                          for leg in ((self.doms[v][j], self.doms[u][j]), (self.doms[u][j], self.doms[v][j])))
            flows.append((chain + inter, size / channels, c))
        return flows

    def tree_flows(self, size: float) -> list[Flow]:
        """Both directions of both inter-domain trees, each tree ``size / 2`` split over the p rails."""
        part = size / 2 / self.p
        return [(((self.doms[a][j], self.doms[b][j]),), part, 0) for tree in double_binary_trees(self.nodes)
                for u, c in tree for j in range(self.p) for a, b in ((c, u), (u, c))]

    def nvls_flows(self, up: float, down: float) -> list[Flow]:
        gpus = [(g, self.switch_of(g)) for dom in self.doms for g in dom]
        return [f for g, sw in gpus for f in ((((g, sw),), up, 0), (((sw, g),), down, 0))]

    def p2p(self, src: str, dst: str, size: float) -> Flow:
        """src -> dst; across domains via the GPU on dst's rail (PXN), then along the rail, pipelined.
        Its ECMP key is the source's rank: each (src, dst) pair is its own queue pair, also when
        several sources share a relay."""
        gs, gd = self.graph.nodes[src], self.graph.nodes[dst]
        key = int(src[3:])  # GPU nodes are gpu<rank> (simcore.network.cluster_graph)
        if gs.get("domain", gs["node"]) == gd.get("domain", gd["node"]) or gs["local"] == gd["local"]:
            return (((src, dst),), size, key)
        relay = self._gpu_at(gs["node"], gd["local"])
        return (((src, dst),), size, key) if relay is None else (((src, relay), (relay, dst)), size, key)

    def _gpu_at(self, node: int, local: int) -> str | None:
        if self._by_pos is None:
            self._by_pos = {(d["node"], d["local"]): g for g, d in self.graph.nodes(data=True)
                            if d.get("kind") == "gpu"}
        return self._by_pos.get((node, local))

    def same_domain(self, a: str, b: str) -> bool:
        da, db = self.graph.nodes[a], self.graph.nodes[b]
        return da.get("domain", da["node"]) == db.get("domain", db["node"])


def pxn_relay(graph, src: str, dst: str) -> str | None:
    """The GPU in ``src``'s node on ``dst``'s rail when the pair crosses NVLink domains and rails."""
    a, b = graph.nodes[src], graph.nodes[dst]
    if a.get("domain", a.get("node")) == b.get("domain", b.get("node")) or a.get("local") == b.get("local"):
        return None
    per = graph.graph.get("gpus_per_node")
    if per is None or a.get("node") is None or b.get("local") is None:
        return None
    peer = f"gpu{int(a['node']) * int(per) + int(b['local'])}"
    return peer if peer in graph else None
