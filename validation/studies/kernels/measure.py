"""Measure GEMM, fused-attention and HBM curves on a local GPU, as rows of the kernels CSV schema.

``python -m validation.studies.kernels.measure --out PATH [--quick]``  (needs torch with CUDA; nothing else here does)

Writes ``source_url,kernel,shape_or_size,dtype,metric,value,unit,note`` rows that
``validation.studies.kernels.fit`` reads like any published file, so the calibration can mix them with
published figures or use them alone (``--data``). What is measured, all at shapes the lowering produces
for 7B-1.6T models:

* dense GEMMs ``m x n x k`` (torch.matmul, BF16; ``torch._scaled_mm`` with per-tensor scales, FP8 e4m3)
  with ``m`` from 1 (decode) to 16384 (prefill) tokens and ``(n, k)`` from the catalog's projections
  at tensor-parallel degrees 1-8;
* batched GEMMs ``b`` experts x ``m`` tokens each (torch.bmm, BF16) for MoE expert FFNs;
* fused attention forward (``scaled_dot_product_attention`` forced to the flash backend, BF16):
  prefill (``S`` queries over ``S`` keys, causal) and decode (1 query over ``S`` cached keys, GQA);
* HBM copies of 1 MiB to 4 GiB (``Tensor.copy_``), bytes read plus bytes written.

Each figure is the median over ``--repeats`` timed windows of back-to-back launches (CUDA events),
after warm-up, on random normal data (zeros run faster). The output ends with one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
import sys
from pathlib import Path

from planner.apps.common import atomic_write_text
from simcore.files import dumps

__all__ = ["main"]

#: device names as torch reports them -> the catalog GPU the rows are for
HARDWARE = {"H200": "h200", "H100": "h100-sxm"}
FIELDS = ["source_url", "kernel", "shape_or_size", "dtype", "metric", "value", "unit", "note"]
#: (n, k) of projections: Llama-3-70B QKV/out/FFN at TP 1, 2, 8; Llama-3-8B; DeepSeek-V3 expert and MLA.
NK = [(10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672), (5120, 8192), (8192, 4096),
      (28672, 8192), (8192, 14336), (1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584),
      (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (4096, 7168), (7168, 2048),
      (24576, 1536), (32768, 512)]
M_FULL = [1, 16, 64, 256, 1024, 4096, 16384]
M_QUICK = [1, 64, 1024, 8192]


def _time_s(torch, fn, repeats: int, min_window_s: float = 0.02) -> float:
    """Median per-launch time of ``fn``: windows of back-to-back launches sized to ~min_window_s."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    single_s = max(start.elapsed_time(end) * 1e-3, 1e-6)
    launches = max(1, min(200, int(min_window_s / single_s)))
    samples = []
    for _ in range(repeats):
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / launches)
    return statistics.median(samples)


def capture_graph(torch, fn, warmups: int = 2):
    """A CUDA graph of one call of ``fn``, captured after ``warmups`` calls on a side stream (as
    PyTorch's graph capture wants: allocations and lazy initialisation happen before capture)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def source(module: str, device_name: str) -> str:
    """The rows' source: the script (``module``, dotted) on the lent device it ran on. Shipped rows name
    the script by its path when they were measured (``validation/measure_h100.py``: this module)."""
    return f"{module.replace('.', '/')}.py (measured by this project on a lent {device_name})"


def hardware_of(device_name: str) -> str:
    """Catalog GPU for a torch device name ("NVIDIA H200" -> "h200"); a one-line error for others."""
    for key, name in HARDWARE.items():
        if key in device_name:
            return name
    raise SystemExit(f"error: device {device_name!r} is not a catalog GPU ({', '.join(HARDWARE)})")


def _row(kernel: str, shape: str, dtype: str, seconds: float, note: str) -> dict[str, str]:
    return {"source_url": "", "kernel": kernel, "shape_or_size": shape, "dtype": dtype,
            "metric": "kernel time", "value": f"{seconds * 1e6:.3f}", "unit": "us", "note": note}


def _gemms(torch, ms: list[int], repeats: int, note: str):
    dev = "cuda"
    one = torch.ones((), device=dev, dtype=torch.float32)
    for n, k in NK:
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        w8 = w.to(torch.float8_e4m3fn)
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            yield _row("GEMM torch.matmul (cuBLAS)", f"m={m} n={n} k={k}", "BF16",
                       _time_s(torch, lambda x=x, w=w: torch.matmul(x, w.t()), repeats), note)
            m8 = max(m, 16)  # _scaled_mm needs every dimension divisible by 16
            x8 = torch.randn(m8, k, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            try:
                fn = lambda x8=x8, w8=w8: torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one,  # noqa: E731
                                                    out_dtype=torch.bfloat16)
                yield _row("GEMM torch._scaled_mm (cuBLASLt)", f"m={m8} n={n} k={k}", "FP8 e4m3",
                           _time_s(torch, fn, repeats), note + "; per-tensor scales, BF16 output")
            except RuntimeError as err:  # an FP8 path this torch build lacks
                print(f"fp8 m={m8} n={n} k={k} skipped: {str(err).splitlines()[0]}", file=sys.stderr)
    for experts, m, n, k in [(8, 16, 4096, 7168), (8, 128, 4096, 7168), (8, 512, 4096, 7168),
                             (32, 64, 4096, 7168), (32, 256, 7168, 2048), (8, 2048, 28672, 6144),
                             (8, 256, 6144, 14336), (64, 32, 4096, 7168)]:
        a = torch.randn(experts, m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(experts, k, n, device=dev, dtype=torch.bfloat16)
        yield _row("GEMM torch.bmm (cuBLAS batched)", f"b={experts} m={m} n={n} k={k}", "BF16",
                   _time_s(torch, lambda a=a, b=b: torch.bmm(a, b), repeats), note + "; b experts")


def _attention(torch, quick: bool, repeats: int, note: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    dev, bf16 = "cuda", torch.bfloat16
    prefill = [(1, 64, 8, 2048), (1, 64, 8, 8192), (4, 32, 8, 4096), (2, 8, 8, 16384), (16, 64, 8, 1024),
               (8, 32, 8, 512)]
    decode = [(64, 64, 8, 2048), (256, 64, 8, 2048), (64, 64, 8, 8192), (16, 32, 8, 32768),
              (128, 8, 1, 4096), (512, 8, 1, 1024)]
    if quick:
        prefill, decode = prefill[:3], decode[:3]
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        for batch, heads, kv_heads, seq in prefill:
            q = torch.randn(batch, heads, seq, 128, device=dev, dtype=bf16)
            k = torch.randn(batch, kv_heads, seq, 128, device=dev, dtype=bf16)
            v = torch.randn_like(k)
            fn = lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True, enable_gqa=True)  # noqa: E731
            yield _row("Attention forward: flash (torch SDPA, FlashAttention-2)",
                       f"B={batch} H={heads} Hkv={kv_heads} S={seq} D=128 causal=1", "BF16",
                       _time_s(torch, fn, repeats), note + "; prefill, causal")
        for batch, heads, kv_heads, seq in decode:
            q = torch.randn(batch, heads, 1, 128, device=dev, dtype=bf16)
            k = torch.randn(batch, kv_heads, seq, 128, device=dev, dtype=bf16)
            v = torch.randn_like(k)
            fn = lambda q=q, k=k, v=v: sdpa(q, k, v, enable_gqa=True)  # noqa: E731
            yield _row("Attention forward: flash (torch SDPA, FlashAttention-2)",
                       f"B={batch} H={heads} Hkv={kv_heads} Sq=1 S={seq} D=128", "BF16",
                       _time_s(torch, fn, repeats), note + "; decode: one query over S cached keys")


def _copies(torch, quick: bool, repeats: int, note: str):
    for mib in ([1, 64, 1024] if quick else [1, 4, 16, 64, 256, 1024, 4096]):
        n = mib * 2**20
        src = torch.randn(n // 2, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        yield _row("HBM copy (torch Tensor.copy_)", f"size_bytes={2 * n}", "BF16",
                   _time_s(torch, lambda s=src, d=dst: d.copy_(s), repeats),
                   note + f"; {mib} MiB copied, size counts bytes read + written")


def kernel_args(description: str, argv: list[str] | None, quick: bool = False, extend=None):
    """``(args, torch, props, note)`` of a kernel-timing script (``--out``, ``--repeats``, ``--quick``
    if asked, and whatever ``extend(parser)`` adds), or ``None`` after a one-line error when there is
    no CUDA device."""
    parser = argparse.ArgumentParser(description=description)
    if extend is not None:
        extend(parser)
    parser.add_argument("--out", type=Path, required=True, help="CSV to write (kernels schema)")
    if quick:
        parser.add_argument("--quick", action="store_true", help="a few shapes of each kind")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    torch = cuda_torch()
    if torch is None:
        return None
    props = torch.cuda.get_device_properties(0)
    return args, torch, props, f"{props.name}, {props.multi_processor_count} SMs, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> int:
    ready = kernel_args(__doc__.splitlines()[0], argv, quick=True)
    if ready is None:
        return 2
    args, torch, props, note = ready
    rows = []
    for part in (_copies(torch, args.quick, args.repeats, note),
                 _gemms(torch, M_QUICK if args.quick else M_FULL, args.repeats, note),
                 _attention(torch, args.quick, args.repeats, note)):
        for row in part:
            row["source_url"] = source("validation.studies.kernels.measure", props.name)
            rows.append(row)
            print(f"{row['kernel']:<58} {row['shape_or_size']:<40} {row['dtype']:<9} {row['value']:>12} us",
                  flush=True)
    write_rows(args.out, FIELDS, rows)
    print(dumps({"device": props.name, "rows": len(rows), "out": str(args.out)}))
    return 0


def cuda_torch():
    """torch with a CUDA device, seeded; ``None`` after a one-line error if there is none."""
    try:
        import torch
    except ImportError:
        print("error: torch is not installed", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return None
    torch.manual_seed(0)
    return torch


def write_rows(path: Path, fields: list[str], rows: list[dict]) -> None:
    """Write measured rows as CSV, atomically: a run cut short leaves no half file."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(path, buffer.getvalue())


if __name__ == "__main__":
    sys.exit(main())
