"""Time what a kernel costs outside and inside a CUDA graph on a local GPU and its host.

``python -m validation.studies.serving.measure_launch --out PATH [--ops 20000]``  (needs torch with CUDA)

The serving runtime profiles price two fixed costs per kernel (:mod:`simcore.serving.runtime`):
``launch_s`` (``EAGER_LAUNCH_S``), the host time PyTorch's eager dispatch and ``cudaLaunchKernel`` take
per op, which a step outside a CUDA graph cannot go below when its kernels are short; and
``graph_kernel_s``, the time one kernel adds inside a replayed CUDA graph (no host work, only the GPU's
launch and drain between dependent kernels). This measures both on the machine it runs on, for ops whose
GPU work is negligible, so the fixed cost is all that is timed:

* ``eager``: ``--ops`` back-to-back launches of one small op, timed by the host clock from the first
  launch to the synchronize after the last (the host issues faster than the GPU drains only if the GPU
  work were longer; for these ops the GPU waits on the host). Ops: an in-place add on 1,024 elements,
  a 1 x 1024 x 1024 BF16 ``F.linear``, and ``F.silu`` on 1 x 1024 (one dispatcher path each: a
  tensor-scalar method, a cuBLAS call, a functional op).
* ``graph``: the same ops captured into one CUDA graph of 1,000 dependent launches, replayed; CUDA
  events around the replays, divided by the launches.
* ``gpu``: the same ops in a loop of CUDA events with the host far ahead (events bracket the whole
  loop after a warm-up), to show the GPU-side time per op is below the eager host time.

Rows: ``source_url,op,mode,value,unit,note`` (``value`` per op, in us); ends with one JSON line. Read it
with care: the host CPU is the lent machine's, not a serving cluster's.
"""

from __future__ import annotations

import sys
import time

from simcore.files import dumps
from validation.studies.kernels.measure import capture_graph, kernel_args, source, write_rows

__all__ = ["main"]

FIELDS = ["source_url", "op", "mode", "value", "unit", "note"]
GRAPH_LAUNCHES = 1000


def _ops(torch):
    """``{name: zero-argument closure}`` of the small ops timed (module doc)."""
    dev = "cuda"
    x = torch.zeros(1024, device=dev)
    a = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
    w = torch.randn(1024, 1024, device=dev, dtype=torch.bfloat16)
    s = torch.randn(1, 1024, device=dev, dtype=torch.bfloat16)
    f = torch.nn.functional
    return {"add_ (1,024 elements)": lambda: x.add_(1.0),
            "F.linear 1x1024x1024 BF16": lambda: f.linear(a, w),
            "F.silu 1x1024 BF16": lambda: f.silu(s)}


def _eager_s(torch, fn, ops: int) -> float:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(ops):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / ops


def _graph_s(torch, fn, replays: int = 20) -> float:
    def launches():
        for _ in range(GRAPH_LAUNCHES):
            fn()

    graph = capture_graph(torch, launches, warmups=1)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / (replays * GRAPH_LAUNCHES)


def _gpu_s(torch, fn, ops: int) -> float:
    """GPU time per op with the host ahead: queue ``ops`` launches behind a long kernel, then time them."""
    big = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(40):  # ~40 x 1.4 ms of GPU work: the host queues the ops below while it runs
        big @ big
    start.record()
    for _ in range(ops):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / ops


def launches(text: str) -> int:
    """A launch count of at least 100 (argparse makes the error one usage line, exit 2)."""
    value = int(text)
    if value < 100:
        raise ValueError(text)
    return value


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "cpu?")
    except OSError:
        return "cpu?"


def main(argv: list[str] | None = None) -> int:
    def extend(parser):
        parser.add_argument("--ops", type=launches, default=20000, help="eager launches per op (>= 100)")

    ready = kernel_args(__doc__.splitlines()[0], argv, extend=extend)
    if ready is None:
        return 2
    args, torch, props, note = ready
    note = f"{note}; host {_cpu()}"
    rows, figures = [], {}
    for name, fn in _ops(torch).items():
        timed = {"eager": _eager_s(torch, fn, args.ops), "graph": _graph_s(torch, fn),
                 "gpu": _gpu_s(torch, fn, min(args.ops, 2000))}
        for mode, seconds in timed.items():
            rows.append({"source_url": source("validation.studies.serving.measure_launch", props.name), "op": name, "mode": mode,
                         "value": f"{seconds * 1e6:.3f}", "unit": "us", "note": note})
            figures[f"{name} {mode}_us"] = round(seconds * 1e6, 3)
        print(f"{name:28s} eager {timed['eager'] * 1e6:7.2f} us  graph {timed['graph'] * 1e6:6.2f} us  "
              f"gpu {timed['gpu'] * 1e6:6.2f} us", flush=True)
    write_rows(args.out, FIELDS, rows)
    print(dumps({"device": props.name, "rows": len(rows), "out": str(args.out), **figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
