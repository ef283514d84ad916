"""Time Gated DeltaNet's kernels (flash-linear-attention) on a local GPU, as rows of the kernels CSV schema.

``python -m validation.studies.attention.measure_linear --out PATH [--models a,b] [--tp 1 2 4 8]``
(needs torch with CUDA and ``fla-core``, the kernels of flash-linear-attention: ``pip install fla-core``)

Qwen3-Next and Qwen3.5 mix softmax attention with Gated DeltaNet layers (:mod:`simcore.models.linear_attention`),
and vLLM and SGLang serve those layers with flash-linear-attention's Triton kernels (both vendor copies of
``fla.ops.gated_delta_rule``). The simulator prices them by counting FLOPs and HBM bytes at the fused
attention rate, an assumption no timing had checked. This times the kernels themselves, at the per-GPU
head counts of the shipped configs under tensor parallelism (heads split over ``tp``, as vLLM shards them):

* ``gdn recurrent decode``: ``fused_recurrent_gated_delta_rule``, one token for each of ``seqs``
  sequences, q/k L2-normalised in the kernel, the FP32 (or config dtype) state read and written;
* ``gdn chunked prefill``: ``chunk_gated_delta_rule`` over ``seqs`` prompts of ``new`` tokens each (the
  chunked WY form, several kernels), final state written;
* ``causal conv1d update``: ``causal_conv1d_update``, the decode step of the short convolution.

Decode kernels are timed as serving runs them, inside a CUDA graph (``REPLAYS`` calls per graph, so a
graph launch does not hide in the figure); prefill (whose Python wrapper launches several kernels) as
eager calls queued while the GPU spins, so the figure is GPU time, not the wrapper's host time. Random data; each figure a median of
CUDA-event windows. ``shape_or_size`` holds ``key=value`` fields (``model tp seqs new hk hv dk dv
state_bytes conv k``) that ``validation.studies.attention.fit_linear`` reads. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import types

from simcore.files import dumps
from simcore.models import get_model
from simcore.models.linear_attention import conv_channels
from validation.studies.kernels.measure import FIELDS, capture_graph, kernel_args, source, write_rows

__all__ = ["main", "DECODE_SEQS", "PREFILL"]

MODELS = "qwen3.5-397b-a17b,qwen3-next-80b-a3b"
TP = [1, 2, 4, 8]
DECODE_SEQS = [1, 4, 16, 64, 256]
#: (sequences, tokens each) of a prefill
PREFILL = [(1, 1024), (1, 4096), (1, 16384), (4, 2048)]
#: kernel calls captured in one CUDA graph
REPLAYS = 20


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(text)
    return value


def _models(text: str) -> list[str]:
    """Comma-separated model names, each a catalog model with linear-attention layers (else argparse's
    one-line usage error, exit 2, before any GPU is looked for)."""
    names = [name for name in text.split(",") if name]
    for name in names:
        try:
            spec = get_model(name)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).splitlines()[0]) from None
        if not spec.linear_layers:
            raise argparse.ArgumentTypeError(f"{name!r} has no linear-attention layers")
    if not names:
        raise argparse.ArgumentTypeError("no model named")
    return names


def _args(parser) -> None:
    parser.add_argument("--models", type=_models, default=_models(MODELS),
                        help="comma-separated catalog models with linear-attention layers")
    parser.add_argument("--tp", type=_positive, nargs="+", default=TP, help="tensor-parallel degrees (>= 1)")


def shape_text(model: str, tp: int, seqs: int, new: int, spec) -> str:
    """The ``shape_or_size`` of one row: every size the cost model needs, per GPU."""
    return (f"model={model} tp={tp} seqs={seqs} new={new} hk={spec.linear_key_heads // tp} "
            f"hv={spec.linear_value_heads // tp} dk={spec.linear_key_head_dim} dv={spec.linear_value_head_dim} "
            f"state_bytes={spec.linear_state_bytes} conv={conv_channels(spec) // tp} k={spec.linear_conv_kernel}")


def _graph_s(torch, fn, repeats: int) -> float:
    """Median time of one call of ``fn``, ``REPLAYS`` calls captured in one CUDA graph."""
    graph = capture_graph(torch, lambda: [fn() for _ in range(REPLAYS)])
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats + 1):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / REPLAYS)
    return statistics.median(samples[1:])


def _queued_s(torch, fn, repeats: int, calls: int = 10, sleep_cycles: int = 100_000_000) -> float:
    """Median GPU time of one call of ``fn`` launched eagerly with the host far ahead: the GPU first
    spins ``sleep_cycles`` (~50 ms) while the host queues ``calls`` calls, so the events between them
    time the kernels alone, not the Python wrapper that launches them."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3 / calls)
    return statistics.median(samples)


def _inputs(torch, seqs: int, new: int, hk: int, hv: int, dk: int, dv: int, state_dtype):
    fn = torch.nn.functional
    dev, bf16 = "cuda", torch.bfloat16
    q = torch.randn(seqs, new, hk, dk, device=dev, dtype=bf16)
    k = torch.randn(seqs, new, hk, dk, device=dev, dtype=bf16)
    v = torch.randn(seqs, new, hv, dv, device=dev, dtype=bf16)
    g = fn.logsigmoid(torch.randn(seqs, new, hv, device=dev, dtype=torch.float32))
    beta = torch.rand(seqs, new, hv, device=dev, dtype=bf16)
    h0 = torch.randn(seqs, hv, dk, dv, device=dev, dtype=state_dtype) * 0.01
    return q, k, v, g, beta, h0


def _decode_s(torch, ops, seqs: int, heads: tuple[int, int, int, int], state_dtype, repeats: int) -> float:
    q, k, v, g, beta, h0 = _inputs(torch, seqs, 1, *heads, state_dtype)
    return _graph_s(torch, lambda: ops.fused_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True), repeats)


def _conv_update_s(torch, ops, seqs: int, conv: int, width: int, repeats: int) -> float:
    x = torch.randn(seqs, conv, device="cuda", dtype=torch.bfloat16)
    cache = torch.randn(seqs, conv, width, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(conv, width, device="cuda", dtype=torch.bfloat16)
    return _graph_s(torch, lambda: ops.causal_conv1d_update(x, cache, weight=weight, activation="silu"), repeats)


def _prefill_s(torch, ops, seqs: int, new: int, heads: tuple[int, int, int, int], state_dtype, repeats: int) -> float:
    q, k, v, g, beta, _ = _inputs(torch, seqs, new, *heads, state_dtype)
    return _queued_s(torch, lambda: ops.chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True), repeats)


def measure(torch, model: str, tp: int, repeats: int, note: str, failed: list[str]):
    """Rows of one model at one tensor-parallel degree; a convolution this fla cannot run is noted in
    ``failed`` and skipped (the recurrent and chunked kernels are what the run is for)."""
    from fla.modules.causal_conv1d import causal_conv1d_update
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    ops = types.SimpleNamespace(causal_conv1d_update=causal_conv1d_update, chunk_gated_delta_rule=chunk_gated_delta_rule,
                                fused_recurrent_gated_delta_rule=fused_recurrent_gated_delta_rule)
    spec = get_model(model)
    heads = (spec.linear_key_heads // tp, spec.linear_value_heads // tp, spec.linear_key_head_dim,
             spec.linear_value_head_dim)
    state_dtype = torch.float32 if spec.linear_state_bytes == 4 else torch.bfloat16
    dtype = f"bf16, state {'fp32' if spec.linear_state_bytes == 4 else 'bf16'}"
    graphed = note + f"; CUDA graph of {REPLAYS} calls"
    for seqs in DECODE_SEQS:
        shape = shape_text(model, tp, seqs, 1, spec)
        yield _row("gdn recurrent decode", shape, dtype, _decode_s(torch, ops, seqs, heads, state_dtype, repeats),
                   graphed)
        try:
            seconds = _conv_update_s(torch, ops, seqs, conv_channels(spec) // tp, spec.linear_conv_kernel, repeats)
        except (RuntimeError, TypeError, ValueError) as err:
            failed.append(f"{model} tp={tp} conv1d update seqs={seqs}: {str(err).splitlines()[0][:160]}")
            torch.cuda.synchronize()
        else:
            yield _row("causal conv1d update", shape, "bf16", seconds, graphed)
    for seqs, new in PREFILL:
        seconds = _prefill_s(torch, ops, seqs, new, heads, state_dtype, repeats)
        torch.cuda.empty_cache()
        yield _row("gdn chunked prefill", shape_text(model, tp, seqs, new, spec), dtype, seconds,
                   note + "; eager launches queued behind a GPU spin (kernel time, not host time)")


def _row(kernel: str, shape: str, dtype: str, seconds: float, note: str) -> dict[str, str]:
    return {"kernel": kernel, "shape_or_size": shape, "dtype": dtype, "metric": "kernel time",
            "value": f"{seconds * 1e6:.3f}", "unit": "us", "note": note}


def main(argv: list[str] | None = None) -> int:
    ready = kernel_args(__doc__.splitlines()[0], argv, extend=_args)
    if ready is None:
        return 2
    args, torch, props, note = ready
    models = args.models
    for model in models:
        spec = get_model(model)
        for tp in args.tp:
            if spec.linear_key_heads % tp:
                print(f"error: --tp: {tp} does not divide {model}'s {spec.linear_key_heads} key heads", file=sys.stderr)
                return 2
    try:
        import fla  # noqa: F401
    except ImportError:
        print("error: fla-core (flash-linear-attention's kernels) is not installed", file=sys.stderr)
        return 2
    note += f", fla-core {getattr(sys.modules['fla'], '__version__', '?')}"
    rows, failed = [], []
    for model in models:
        for tp in args.tp:
            try:
                with torch.inference_mode():
                    for row in measure(torch, model, tp, args.repeats, note, failed):
                        row["source_url"] = source("validation.studies.attention.measure_linear", props.name)
                        rows.append(row)
                        print(f"{row['kernel']:<22} {row['shape_or_size']:<100} {row['value']:>12} us", flush=True)
            except (RuntimeError, TypeError, ValueError) as err:  # a kernel this fla or GPU cannot run (or OOM)
                failed.append(f"{model} tp={tp}: {str(err).splitlines()[0][:160]}")
                print(f"failed: {failed[-1]}", file=sys.stderr, flush=True)
                torch.cuda.empty_cache()
            write_rows(args.out, FIELDS, rows)  # after each degree: a run cut short keeps what it timed
    print(dumps({"device": props.name, "rows": len(rows), "failed": failed, "out": str(args.out)}))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
