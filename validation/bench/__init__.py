"""Speed benchmarks: each prints its figures and ends with one JSON line (``python -m validation.bench.<name>``).

- :mod:`.proxy`: strategies per second through the proxy's batch API, the time of one scalar call;
- :mod:`.network`: the flow-level network's speed and scaling, two collectives sharing links;
- :mod:`.engine`: the simulator's wall time per scenario (folded and per GPU), its ratio to the proxy;
- :mod:`.serving`: the serving simulator, 1000 requests at concurrency 64;
- :mod:`.planner`: every planner against the exact optimum and the Megatron heuristic.

They read the benchmark scenarios through :mod:`validation.studies.common.scenarios`; no study imports them.
"""
