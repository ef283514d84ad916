"""What the fabric study serves, on what: the fabrics, the model deployments, their loads and SLOs.

A case is one model served by one runtime on ``nodes`` 8-GPU H100 nodes; every fabric builds the same
GPUs behind a different scale-out network (a preset of ``conf/topology`` with its parameters):

- ``ib-rail``: rail-optimized InfiniBand, non-blocking (``h100-ib-rail``);
- ``fattree-2:1`` / ``fattree-4:1``: a two-tier fat tree whose leaves take whole nodes (a node's eight
  NICs share one leaf), its uplinks 2:1 and 4:1 oversubscribed (``h100-ib-fattree``, 4 nodes a leaf);
- ``roce``: RoCE v2 on the rail-optimized layout, with RoCE's collective constants (``h100-roce``);
- ``efa``: AWS EFA v2 on a non-blocking Clos, with EFA's constants (``h100-efa``).

The candidate plans of a case are every plan of the serving search's space (:class:`planner.serving.space.
ServingSpace`, restricted to the case's degrees) that uses every GPU of the cluster: the search an
operator would run for a cluster they own. Loads are closed-loop clients per GPU; goodput is output
tokens/s per GPU of a plan that meets both SLOs (mean TTFT and mean TPOT), else 0.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Case", "Fabric", "FABRICS", "CASES", "DEFAULT_CASES", "QUICK_CASES"]


@dataclass(frozen=True)
class Fabric:
    name: str
    topology: str
    overrides: tuple[str, ...] = ()


FABRICS = (
    Fabric("ib-rail", "h100-ib-rail"),
    Fabric("fattree-2:1", "h100-ib-fattree", ("topology.oversubscription=2.0",)),
    Fabric("fattree-4:1", "h100-ib-fattree", ("topology.oversubscription=4.0",)),
    Fabric("roce", "h100-roce"),
    Fabric("efa", "h100-efa"),
)


@dataclass(frozen=True)
class Case:
    """``model`` on ``nodes`` nodes under ``runtime``: plans of the degrees ``tp``, ``ep``, ``pp`` and
    ``max_num_seqs`` (per worker), ``isl``/``osl`` tokens per request, ``loads`` clients per GPU, SLOs in s."""

    name: str
    model: str
    runtime: str
    nodes: int
    tp: tuple[int, ...]
    ep: tuple[int, ...]
    pp: tuple[int, ...]
    max_num_seqs: tuple[int, ...]
    isl: int
    osl: int
    loads: tuple[int, ...]
    ttft_slo_s: float
    tpot_slo_s: float
    requests_per_client: float = 2.0
    min_requests: int = 200


_DEEPSEEK = dict(model="deepseek-v3", runtime="sglang-deepep", tp=(1,), ep=(16, 32, 64, 128), pp=(1,),
                 max_num_seqs=(4096,), isl=2000, osl=500, loads=(4, 16, 32), ttft_slo_s=5.0, tpot_slo_s=0.1)
_LLAMA = dict(model="llama-3.1-70b", runtime="vllm", tp=(8, 16), ep=(1,), pp=(1, 2), max_num_seqs=(256,),
              isl=2000, osl=500, loads=(2, 8, 24), ttft_slo_s=3.0, tpot_slo_s=0.06)

CASES = (
    Case("deepseek-v3-4node", nodes=4, **_DEEPSEEK),
    Case("deepseek-v3-8node", nodes=8, **_DEEPSEEK),
    Case("deepseek-v3-16node", nodes=16, **(_DEEPSEEK | {"ep": (32, 64, 128), "loads": (16,)})),
    Case("llama-3.1-70b-4node", nodes=4, **_LLAMA),
)
#: what ``shard-validate study=fabric`` runs; ``deepseek-v3-16node`` (a minute a simulation on 2 cores,
#: about an hour for its five fabrics) runs when named: ``study.scenarios=[deepseek-v3-16node]``
DEFAULT_CASES = ("deepseek-v3-4node", "deepseek-v3-8node", "llama-3.1-70b-4node")
#: ``study.quick``: the smallest cluster of each model at its middle load
QUICK_CASES = ("deepseek-v3-4node", "llama-3.1-70b-4node")
