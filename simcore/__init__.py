"""simcore: the simulator of LLM inference on GPU clusters, and the roofline proxy built from the same costs.

Packages, from the bottom up (each may import only those below it; ``pyproject.toml`` holds the order as
import-linter contracts):

- :mod:`simcore.hardware`: GPU specs and the single-GPU kernel roofline;
- :mod:`simcore.network`: the cluster graph's conventions and the flow-level network (max-min, ECMP);
- :mod:`simcore.collectives`: NCCL's algorithms and protocols, closed form and as flows;
- :mod:`simcore.models`: the model catalog (presets, published ids, ``config.json`` readers);
- :mod:`simcore.strategy`, :mod:`simcore.moe`: the operator graph, layouts and sharding strategies;
  expert routing, placement and DeepEP;
- :mod:`simcore.cost`: lowering a strategy to tasks, memory, host time, the proxy;
- :mod:`simcore.space`: the search space and the Megatron heuristic;
- :mod:`simcore.engine`, :mod:`simcore.serving`: the discrete-event simulator of one step, and request-level
  serving (continuous batching, KV cache, disaggregation);
- :mod:`simcore.config`, :mod:`simcore.export`: the Hydra config schemas; runtime launch commands.

Modules at the root: :mod:`simcore.workload` (phase, precision, lengths, SLOs), :mod:`simcore.files`
(strict JSON, atomic writes), :mod:`simcore.xp` (one formula for numpy arrays and Python floats).

simcore never imports ``topologies`` (it receives a cluster graph) nor ``planner``. The Python API that
composes a scenario from names and runs all of this is :mod:`planner.api`.
"""
