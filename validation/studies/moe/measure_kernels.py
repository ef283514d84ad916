"""Time grouped expert GEMMs on a local GPU, as rows of the kernels CSV schema.

``python -m validation.studies.moe.measure_kernels --out PATH [--tokens 1 4 16 64] [--experts 8 32 128]``
(needs torch >= 2.8 with CUDA on a Hopper GPU)

A serving runtime's MoE layer at decode runs every active expert's GEMM in one grouped kernel
(vLLM's and SGLang's fused MoE, TensorRT-LLM's CUTLASS MoE), each expert seeing a handful of tokens; at
prefill (``--tokens 128 512 2048``) each sees hundreds to thousands, the regime of a chunked prefill.
This times that kernel shape with PyTorch's own grouped GEMMs: ``torch._grouped_mm`` (BF16, CUTLASS
grouped GEMM on sm90) and ``torch._scaled_grouped_mm`` (FP8 e4m3, row-wise scales), ``b`` experts of
``m`` tokens each (``offs`` marks the groups of a ``[b * m, k]`` input against ``[b, k, n]``
weights), at the per-GPU expert shapes of the serving sample's MoE models: DeepSeek-V3 with its
experts split 8 ways (TP 8: the gate/up GEMM ``n = 2 x 2048 / 8``, down ``k = 2048 / 8``) and whole
(EP), Qwen3-235B-A22B at TP 4, MiniMax-M2 at TP 8, gpt-oss-120b at TP 4 (BF16: Hopper runs its MXFP4
experts dequantized). Rows are ``b= m= n= k=`` (grouped count ``b``), so ``shard-validate
study=kernels data=PATH study.gpu=h200`` scores the cost model's grouped GEMMs on them. Medians over
CUDA-event windows as :mod:`validation.studies.kernels.measure` takes them; ends with one JSON line.
"""

from __future__ import annotations

import sys

from simcore.files import dumps
from validation.studies.common.cli import count
from validation.studies.kernels.measure import FIELDS, _time_s, kernel_args, source, write_rows

__all__ = ["main", "SHAPES"]

#: (label, n, k) of one expert's GEMM on one GPU: gate/up fused (n = 2 x intermediate / shards), down
SHAPES = [("deepseek-v3 tp8 gate_up", 512, 7168), ("deepseek-v3 tp8 down", 7168, 256),
          ("deepseek-v3 ep gate_up", 4096, 7168), ("deepseek-v3 ep down", 7168, 2048),
          ("qwen3-235b tp4 gate_up", 768, 4096), ("qwen3-235b tp4 down", 4096, 384),
          ("minimax-m2 tp8 gate_up", 384, 3072), ("minimax-m2 tp8 down", 3072, 192),
          ("gpt-oss-120b tp4 gate_up", 1440, 2880), ("gpt-oss-120b tp4 down", 2880, 720)]
EXPERTS = [8, 32, 128]
TOKENS = [1, 4, 16, 64]


def _grouped(torch, b: int, m: int, n: int, k: int, fp8: bool):
    """A closure running one grouped GEMM of ``b`` groups of ``m`` rows (``None`` if unsupported)."""
    dev = "cuda"
    a = torch.randn(b * m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(b, n, k, device=dev, dtype=torch.bfloat16) * 0.02
    offs = torch.arange(1, b + 1, device=dev, dtype=torch.int32) * m
    if not fp8:
        wt = w.transpose(-2, -1)  # [b, k, n], column-major per group as CUTLASS wants
        return lambda: torch._grouped_mm(a, wt, offs=offs, out_dtype=torch.bfloat16)
    a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).transpose(-2, -1)
    sa = torch.ones(b * m, device=dev, dtype=torch.float32)
    sb = torch.ones(b, n, device=dev, dtype=torch.float32)
    return lambda: torch._scaled_grouped_mm(a8, w8, sa, sb, offs=offs, out_dtype=torch.bfloat16)


def _grid_args(parser) -> None:
    parser.add_argument("--tokens", type=count, nargs="+", default=TOKENS, help="tokens per expert (>= 1)")
    parser.add_argument("--experts", type=count, nargs="+", default=EXPERTS, help="experts per grouped kernel (>= 1)")


def main(argv: list[str] | None = None) -> int:
    ready = kernel_args(__doc__.splitlines()[0], argv, extend=_grid_args)
    if ready is None:
        return 2
    args, torch, props, note = ready
    rows, failed = [], []
    for label, n, k in SHAPES:
        for fp8 in (False, True):
            for b in args.experts:
                for m in args.tokens:
                    try:
                        seconds = _time_s(torch, _grouped(torch, b, m, n, k, fp8), args.repeats)
                    except (RuntimeError, TypeError) as err:  # a grouped path this torch or GPU lacks (or OOM)
                        failed.append(f"{label} fp8={fp8} b={b} m={m}: {str(err).splitlines()[0][:120]}")
                        continue
                    kernel = "GEMM torch._scaled_grouped_mm (CUTLASS grouped)" if fp8 else \
                        "GEMM torch._grouped_mm (CUTLASS grouped)"
                    rows.append({"source_url": source("validation.studies.moe.measure_kernels", props.name), "kernel": kernel,
                                 "shape_or_size": f"b={b} m={m} n={n} k={k}",
                                 "dtype": "FP8 e4m3" if fp8 else "BF16", "metric": "kernel time",
                                 "value": f"{seconds * 1e6:.3f}", "unit": "us",
                                 "note": f"{note}; {label}: {b} experts x {m} tokens each, one grouped kernel"})
                    print(f"{label:26s} {'fp8' if fp8 else 'bf16'} b={b:<4d} m={m:<4d} {seconds * 1e6:10.2f} us",
                          flush=True)
    for line in failed[:10]:
        print(f"skipped: {line}", file=sys.stderr)
    write_rows(args.out, FIELDS, rows)
    print(dumps({"device": props.name, "rows": len(rows), "failed": len(failed), "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
