"""NCCL-faithful collectives: one analytic cost model (the proxy), its flow execution (the simulator).

* :mod:`.constants` - NCCL's Hopper tuning constants, our calibrated physical parameters, the fabric.
* :mod:`.formulas` - latency and bandwidth of each (collective, algorithm, protocol) entry.
* :mod:`.cost` - :func:`collective_time_s` and :func:`select` (NCCL's argmin), vectorized.
* :mod:`.flows` - :func:`run_collective` / :func:`simulate_collective` on a SimPy flow network; on an idle
  fabric they reproduce :func:`collective_time_s` of the same entry.
"""

from __future__ import annotations

from simcore.collectives.constants import (
           ALGORITHMS,
           ALGORITHMS_BY_COLLECTIVE,
           COLLECTIVES,
           DEFAULT,
           PROTOCOLS,
           Fabric,
           NcclConstants,
)
from simcore.collectives.cost import AUTO_ALGORITHMS, collective_time_s, select

__all__ = ["COLLECTIVES", "ALGORITHMS", "PROTOCOLS", "ALGORITHMS_BY_COLLECTIVE", "AUTO_ALGORITHMS", "DEFAULT",
           "Fabric", "NcclConstants", "collective_time_s", "select"]
