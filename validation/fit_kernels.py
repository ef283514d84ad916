"""Fit the kernel model's few physical parameters on published single-GPU measurements.

``python -m validation.fit_kernels [--data PATH] [--gpu NAME] [--no-rows]``

Reads any CSV in the ``kernels_h100.csv`` schema (``source_url,kernel,shape_or_size,dtype,metric,
value,unit,note``) and turns each row it understands into a measured kernel time (FLOP/s, B/s or time
units; GEMM shapes ``m=.. n=.. k=..`` with ``b=``/``groups=`` as the grouped count, or ``AxBxC (MxNxK)``;
attention ``B H S D``). A row that gives a rate but no usable shape ("not stated", "best case") is
"asymptotic": it is compared with the model's large-kernel rate (peak x efficiency, or HBM x efficiency).
It then fits by least squares on log time:

* ``gemm_efficiency["bf16"]`` (XLA BF16 and torch BF16 GEMM rows), ``gemm_efficiency["fp8"]``
  (cuBLASLt, DeepGEMM and torch FP8 rows), ``hbm_efficiency`` (STREAM rows and memory-bound
  GEMMs), ``attention_efficiency`` (fused attention rows), ``kernel_overhead_s`` (all sized rows);
* ``gemm_tile`` by grid search over ``--tiles``;
* then ``DECODE_ATTENTION_FILL_S`` (``simcore.hardware.kernels``): the median residual of decode attention rows.

Each kernel family gets equal total weight, so the 375 XLA rows do not drown the 5 STREAM rows.
Error figures are on time: relative error ``pred / meas - 1``; "geomean |err|" is
``exp(mean |ln(pred / meas)|) - 1``. Rows it cannot use are listed with the reason. The output
ends with one JSON line. Deterministic: fixed start point, no randomness.

It fits on fit rows only: a test row (``validation/split.py``) is a one-line error. ``--no-fit``
scores the catalog's constants on any rows and gives every figure per split with its row count.
"""

from __future__ import annotations

import argparse
import csv
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from simcore.hardware.gpus import GpuSpec, get_gpu
from simcore.hardware.kernels import DECODE_ATTENTION_FILL_S, attention_time_s, gemm_bytes, gemm_time_s, memory_time_s
from validation import jsonline
from validation.split import BadInput, refuse_test_rows, run_script, split_label, split_of
from validation.studies.common import read_csv

__all__ = ["Sample", "load_samples", "fit", "fit_decode_fill", "evaluate", "main"]

DEFAULT_DATA = Path(__file__).parent / "data" / "kernels_h100.csv"
FAMILIES = ("gemm_bf16", "gemm_fp8", "hbm", "attention")
#: Start point of the fit (eff_bf16, eff_fp8, hbm_eff, attn_eff, overhead_us): fixed, so the result does
#: not depend on the defaults currently in hardware.py.
_X0 = np.array([0.75, 0.65, 0.90, 0.55, 4.0])
# unit (lower case, no spaces) -> (quantity, SI scale)
_UNITS = {
    "flop/s": ("flops_rate", 1.0), "gflop/s": ("flops_rate", 1e9), "tflop/s": ("flops_rate", 1e12),
    "tflops": ("flops_rate", 1e12), "pflop/s": ("flops_rate", 1e15),
    "b/s": ("bytes_rate", 1.0), "mb/s": ("bytes_rate", 1e6), "gb/s": ("bytes_rate", 1e9),
    "tb/s": ("bytes_rate", 1e12), "gib/s": ("bytes_rate", 2.0**30),
    "s": ("time", 1.0), "ms": ("time", 1e-3), "us": ("time", 1e-6), "µs": ("time", 1e-6),
    "ns": ("time", 1e-9),
}
_SIZE_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30}


@dataclass(frozen=True)
class Sample:
    """One usable measurement. ``measured_s`` is None for asymptotic rows (no shape given), which
    compare ``measured_rate`` (FLOP/s or bytes/s, per ``bound``) with the model's large-size limit."""

    line: int
    kernel: str
    shape: str
    family: str  # gemm_bf16 | gemm_fp8 | hbm | attention
    op: str  # gemm | attention | memory
    precision: str
    dims: tuple[float, float, float, float] | None = None  # gemm (m, n, k, count)
    flops: float = 0.0
    size_bytes: float = 0.0
    measured_s: float | None = None
    measured_rate: float = 0.0
    bound: str = "compute"  # asymptotic rows: compute | memory
    split: str = "fit"  # fit | test (validation/split.py)
    decode: bool = False  # attention with one query per sequence over a KV cache (Sq=1)


def _parse_value(text: str) -> float | None:
    try:
        value = float(text.strip().lstrip("~≈<>").replace(",", ""))
    except ValueError:
        return None
    return value if value > 0 else None


def _gemm_dims(shape: str) -> tuple[float, float, float, float] | None:
    """(m, n, k, count) from ``m=.. n=.. k=..`` (+ ``b=``/``groups=``, ``M_per_group=``) or ``AxBxC (MxNxK)``.

    Unlabelled ``AxBxC`` is read as MxNxK; the batch / group count multiplies tiles, weights and FLOPs.
    """
    pairs = {key.lower(): float(val) for key, val in re.findall(r"([A-Za-z_]+)\s*=\s*(\d+)", shape)}
    if pairs:
        m = pairs.get("m", pairs.get("m_per_group"))
        count = next((pairs[c] for c in ("b", "batch", "groups", "g", "count", "e") if c in pairs), 1.0)
        if m is None or "n" not in pairs or "k" not in pairs:
            return None
        return m, pairs["n"], pairs["k"], count
    match = re.search(r"(\d+)\s*x\s*(\d+)\s*x\s*(\d+)(?:\s*\(\s*([MNK])x([MNK])x([MNK])\s*\))?", shape, re.I)
    if not match:
        return None
    order = [c.lower() for c in match.groups()[3:]] if match.group(4) else ["m", "n", "k"]
    if sorted(order) != ["k", "m", "n"]:
        return None
    dims = dict(zip(order, (float(v) for v in match.groups()[:3]), strict=True))
    return dims["m"], dims["n"], dims["k"], 1.0


def _attention_dims(shape: str) -> tuple[float, float, bool] | None:
    """(flops, bytes, decode) of a forward attention ``B H S D`` (q, k, v, o in BF16); causal halves the flops.

    Optional ``Sq=`` (queries per sequence; a decode step has ``Sq=1`` over ``S`` cached keys) and
    ``Hkv=`` (key/value heads, grouped-query attention) change the FLOPs and the K/V bytes read.
    """
    keys = {"b": r"\bB\s*=\s*(\d+)|batch(?:_size)?\s*[=:]?\s*(\d+)",
            "h": r"\bH\s*=\s*(\d+)|(\d+)\s*heads|\b(?:n_?)?heads\s*[=:]?\s*(\d+)",
            "s": r"\bS\s*=\s*(\d+)|seq_?len\s*[=:]?\s*(\d+)",
            "d": r"\bD\s*=\s*(\d+)|head[ _]?dim\s*[=:]?\s*(\d+)"}
    found = {}
    for key, pattern in keys.items():
        match = re.search(pattern, shape, re.I)
        if not match:
            return None
        found[key] = float(next(g for g in match.groups() if g))
    b, h, s, d = found["b"], found["h"], found["s"], found["d"]
    optional = {key: re.search(rf"\b{key}\s*=\s*(\d+)", shape, re.I) for key in ("Sq", "Hkv")}
    sq = float(optional["Sq"].group(1)) if optional["Sq"] else s
    hkv = float(optional["Hkv"].group(1)) if optional["Hkv"] else h
    causal = 0.5 if sq == s and re.search(r"causal\s*[=:]?\s*(1|true|yes)\b", shape, re.I) else 1.0
    return 4.0 * b * h * sq * s * d * causal, 2.0 * b * d * (2.0 * h * sq + 2.0 * hkv * s), sq == 1 < s


def _memory_size(shape: str) -> float | None:
    """Bytes moved by a memory kernel from ``size_bytes=N`` or ``<number> <GiB|MB|bytes|...>``."""
    number = r"(\d+(?:\.\d*)?(?:e[+-]?\d+)?)"
    match = re.search(rf"size_bytes\s*=\s*(\d+)|{number}\s*(GiB|MiB|KiB|GB|MB|KB|bytes|byte|B)\b", shape)
    if not match:
        return None
    if match.group(1):
        return float(match.group(1))
    unit = match.group(3).lower().removesuffix("ytes").removesuffix("yte")
    return float(match.group(2)) * _SIZE_UNITS[unit]


def _classify(kernel: str, dtype: str) -> tuple[str, str] | str:
    """(op, precision) or the reason the row is skipped."""
    k, d = kernel.lower(), dtype.lower()
    if "nvbandwidth" in k or "host to" in k or "device to" in k:
        return "interconnect/host copy bandwidth, not an on-GPU kernel"
    if any(word in k for word in ("attention", "mla", "fmha")):
        if not any(word in k for word in ("flash", "mla", "fmha", "fused")):
            return "unfused attention (several kernels), outside the fused-kernel model"
        if "fp8" in d and "bf16" not in d:
            return "FP8 attention compute; the model runs attention MMAs at the BF16 rate"
        return "attention", "bf16"
    if any(word in k for word in ("hbm", "stream", "memcpy", "elementwise")):
        return "memory", "bf16"
    if not any(word in k for word in ("gemm", "matmul", "dot", "cublas", "cutlass", "linear")):
        return "unrecognized kernel family"
    if re.search(r"\bf32\b|fp32|tf32", d):
        return "FP32/TF32 GEMM: no fp32 precision in the catalog (TF32 use not stated)"
    if "fp8" in d or "e4m3" in d:
        return "gemm", "fp8"
    if "bf16" in d or "fp16" in d:
        return "gemm", "bf16"
    return "GEMM precision not stated"


def _sample(line: int, row: dict[str, str], throughput_keys: set[tuple[str, str, str]]) -> Sample | str:
    """Build one Sample from a CSV row, or return why it is skipped."""
    kind = _classify(row["kernel"], row["dtype"])
    if isinstance(kind, str):
        return kind
    try:
        split = split_of(row)
    except ValueError as exc:
        return str(exc)
    op, precision = kind
    value = _parse_value(row["value"])
    unit = _UNITS.get(row["unit"].strip().lower().replace(" ", ""))
    if value is None or unit is None:
        return f"unparsable value/unit {row['value']!r} {row['unit']!r}"
    quantity, scale = unit[0], value * unit[1]
    shape = row["shape_or_size"]
    family = {"gemm": f"gemm_{precision}", "attention": "attention", "memory": "hbm"}[op]
    base = {"line": line, "kernel": row["kernel"], "shape": shape, "family": family, "op": op,
            "precision": precision, "split": split}
    if op == "gemm":
        dims = _gemm_dims(shape)
        duplicate = (row["kernel"], shape, row["dtype"]) in throughput_keys
        if dims is not None and quantity == "bytes_rate" and duplicate:
            return "same timing as the FLOP/s row of this shape (bandwidth derived from it)"
        if dims is not None:
            flops, size = 2.0 * np.prod(dims), float(gemm_bytes(*dims[:3], precision, dims[3]))
            return Sample(**base, dims=dims, measured_s=_time(quantity, scale, flops, size))
    elif op == "attention":
        sized = _attention_dims(shape)
        if sized is not None:
            return Sample(**base, flops=sized[0], size_bytes=sized[1], decode=sized[2],
                          measured_s=_time(quantity, scale, *sized[:2]))
    else:
        size = _memory_size(shape)
        if size is not None:
            return Sample(**base, size_bytes=size, measured_s=_time(quantity, scale, 0.0, size))
    if quantity == "time":
        return "time given but shape not parsable"
    if op == "gemm" and quantity == "bytes_rate":
        return "GEMM bandwidth without a parsable shape"
    return Sample(**base, measured_rate=scale, bound="memory" if quantity == "bytes_rate" else "compute")


def _time(quantity: str, scale: float, flops: float, size_bytes: float) -> float:
    if quantity == "time":
        return scale
    return (flops if quantity == "flops_rate" else size_bytes) / scale


def load_samples(path: Path, field: str = "data") -> tuple[list[Sample], list[tuple[int, str, str]]]:
    """Usable samples and skipped rows ``(line, kernel, reason)`` of one CSV; ``ValueError`` naming
    ``field`` for a file without the schema's columns."""
    _, rows = read_csv(path, ("kernel", "shape_or_size", "dtype", "value", "unit"), field)
    throughput_keys = {(r["kernel"], r["shape_or_size"], r["dtype"]) for r in rows
                       if _UNITS.get(r["unit"].strip().lower().replace(" ", ""), ("",))[0] == "flops_rate"}
    samples, skipped = [], []
    for line, row in enumerate(rows, start=2):
        result = _sample(line, row, throughput_keys)
        if isinstance(result, Sample):
            samples.append(result)
        else:
            skipped.append((line, row["kernel"], result))
    return samples, skipped


def _with_params(gpu: GpuSpec, x: np.ndarray, tile: int) -> GpuSpec:
    return gpu.with_overrides(gemm_efficiency={"bf16": float(x[0]), "fp8": float(x[1])},
                              hbm_efficiency=float(x[2]), attention_efficiency=float(x[3]),
                              kernel_overhead_s=float(x[4]) * 1e-6, gemm_tile=int(tile))


def _predicted_over_measured(samples: list[Sample], gpu: GpuSpec, fill_s: float | None = None) -> np.ndarray:
    """pred / meas of time for every sample (for asymptotic rows: meas rate / model rate); decode
    attention rows add ``fill_s`` (default: the catalog's ``DECODE_ATTENTION_FILL_S``)."""
    fill_s = DECODE_ATTENTION_FILL_S if fill_s is None else fill_s
    ratio = np.empty(len(samples))
    for precision in ("bf16", "fp8"):
        idx = [i for i, s in enumerate(samples) if s.op == "gemm" and s.dims and s.precision == precision]
        if idx:
            m, n, k, count = np.array([samples[i].dims for i in idx]).T
            ratio[idx] = gemm_time_s(m, n, k, gpu, precision, count) / [samples[i].measured_s for i in idx]
    for op in ("attention", "memory"):
        idx = [i for i, s in enumerate(samples) if s.op == op and s.measured_s is not None]
        if idx:
            size = np.array([samples[i].size_bytes for i in idx])
            decode = np.array([samples[i].decode for i in idx])
            pred = (attention_time_s([samples[i].flops for i in idx], size, gpu, "bf16") + fill_s * decode
                    if op == "attention" else memory_time_s(size, gpu))
            ratio[idx] = pred / [samples[i].measured_s for i in idx]
    hbm_rate = gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency
    compute_rate = {"gemm": lambda p: gpu.peak_flops_per_s[p] * gpu.gemm_efficiency[p],
                    "attention": lambda p: gpu.peak_flops_per_s["bf16"] * gpu.attention_efficiency}
    for i, s in enumerate(samples):
        if s.measured_s is None:
            rate = hbm_rate if s.bound == "memory" or s.op == "memory" else compute_rate[s.op](s.precision)
            ratio[i] = s.measured_rate / rate
    return ratio


def _free_params(samples: list[Sample]) -> np.ndarray:
    """Which parameters the data can determine; the others keep the GPU's current values."""
    families = {s.family for s in samples}
    sized = any(s.measured_s is not None for s in samples)
    attn_compute = any(s.op == "attention" and (s.measured_s is not None or s.bound == "compute")
                       for s in samples)
    return np.array(["gemm_bf16" in families, "gemm_fp8" in families,
                     bool(families & {"hbm", "gemm_bf16", "gemm_fp8"}), attn_compute, sized])


def fit(samples: list[Sample], gpu: GpuSpec,
        tiles: tuple[int, ...] = (64, 128, 256)) -> tuple[GpuSpec, float]:
    """Least squares on log time, family-weighted; returns the fitted GpuSpec and its cost. Decode
    attention rows are left to :func:`fit_decode_fill` (their fixed latency is its own parameter)."""
    samples = [s for s in samples if not s.decode]
    counts = {f: sum(s.family == f for s in samples) for f in FAMILIES}
    weights = np.array([1.0 / np.sqrt(counts[s.family]) for s in samples])
    free = _free_params(samples)
    x_base = np.array([gpu.gemm_efficiency["bf16"], gpu.gemm_efficiency["fp8"], gpu.hbm_efficiency,
                       gpu.attention_efficiency, gpu.kernel_overhead_s * 1e6])
    lower, upper = np.array([0.05] * 4 + [0.0]), np.array([1.0] * 4 + [100.0])
    x_start = np.where(free, _X0, x_base)
    best: tuple[float, GpuSpec] | None = None
    for tile in tiles:
        def residuals(free_x: np.ndarray, tile: int = tile) -> np.ndarray:
            x = x_base.copy()
            x[free] = free_x
            return weights * np.log(_predicted_over_measured(samples, _with_params(gpu, x, tile)))

        result = least_squares(residuals, x_start[free],
                               bounds=(lower[free], upper[free]), x_scale="jac")
        x = x_base.copy()
        x[free] = result.x
        if best is None or result.cost < best[0] - 1e-12:
            best = (float(result.cost), _with_params(gpu, x, tile))
    assert best is not None
    return best[1], best[0]


def fit_decode_fill(samples: list[Sample], gpu: GpuSpec) -> float | None:
    """``DECODE_ATTENTION_FILL_S``: the median time decode attention rows take beyond the kernel model
    without it (None without sized decode rows)."""
    decode = [s for s in samples if s.decode and s.measured_s is not None]
    if not decode:
        return None
    base = _predicted_over_measured(decode, gpu, fill_s=0.0) * [s.measured_s for s in decode]
    return max(float(np.median([s.measured_s for s in decode] - base)), 0.0)


def evaluate(samples: list[Sample], gpu: GpuSpec,
             fill_s: float | None = None) -> tuple[np.ndarray, dict[str, dict[str, float]]]:
    """pred/meas per sample and, per family, rows, median |rel err|, geomean |err| and median signed err."""
    ratio = _predicted_over_measured(samples, gpu, fill_s)
    stats = {}
    for family in FAMILIES:
        r = ratio[[s.family == family for s in samples]]
        if r.size:
            stats[family] = {"rows": int(r.size), "median_abs_rel_err": float(np.median(np.abs(r - 1.0))),
                             "geomean_abs_err": float(np.exp(np.mean(np.abs(np.log(r)))) - 1.0),
                             "median_rel_err": float(np.median(r - 1.0))}
    return ratio, stats


def _print_rows(samples: list[Sample], ratio: np.ndarray) -> None:
    print(f"{'line':>5} {'family':<10} {'kernel':<44} {'shape':<34} {'meas':>10} {'pred':>10} {'err':>7}")
    for s, r in zip(samples, ratio, strict=True):
        if s.measured_s is None:  # asymptotic row: rates in FLOP/s (F) or bytes/s (B)
            unit = "B" if s.bound == "memory" or s.op == "memory" else "F"
            cells = f"{s.measured_rate:9.3g}{unit} {s.measured_rate / r:9.3g}{unit}"
        else:
            cells = f"{s.measured_s * 1e6:8.1f}us {s.measured_s * r * 1e6:8.1f}us"
        print(f"{s.line:>5} {s.family:<10} {s.kernel[:44]:<44} {s.shape[:34]:<34} {cells} {r - 1:+7.1%}")


def _print_kernels(samples: list[Sample], ratio: np.ndarray) -> None:
    """Median signed and absolute error per kernel name (the family's sources, for bias hunting)."""
    print(f"\n{'kernel':<66} {'rows':>4} {'median err':>10} {'median|err|':>11}")
    for kernel in dict.fromkeys(s.kernel for s in samples):
        r = ratio[[s.kernel == kernel for s in samples]] - 1.0
        print(f"{kernel[:66]:<66} {r.size:>4} {np.median(r):>+10.1%} {np.median(np.abs(r)):>11.1%}")


def _report(gpu: GpuSpec) -> dict[str, float]:
    return {"gemm_efficiency_bf16": round(gpu.gemm_efficiency["bf16"], 4),
            "gemm_efficiency_fp8": round(gpu.gemm_efficiency["fp8"], 4),
            "hbm_efficiency": round(gpu.hbm_efficiency, 4),
            "attention_efficiency": round(gpu.attention_efficiency, 4),
            "kernel_overhead_s": float(f"{gpu.kernel_overhead_s:.4g}"), "gemm_tile": gpu.gemm_tile}


def _rounded(stats: dict[str, dict]) -> dict[str, dict]:
    return {f: {k: (round(v, 4) if isinstance(v, float) else v) for k, v in st.items()} for f, st in stats.items()}


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, nargs="+", default=[DEFAULT_DATA],
                        help="one or more CSVs in the kernels_h100.csv schema (fitted together)")
    parser.add_argument("--gpu", default="h100-sxm", help="catalog GPU the rows were measured on")
    parser.add_argument("--tiles", default="64,128,256", help="gemm_tile candidates, comma separated")
    parser.add_argument("--no-rows", action="store_true", help="omit the per-row table")
    parser.add_argument("--no-fit", action="store_true",
                        help="score the catalog GPU's current parameters on the data (out-of-sample check)")
    args = parser.parse_args(argv)
    samples, skipped = [], []
    for path in args.data:
        if not path.is_file():
            raise BadInput(f"error: --data: no such file {path}")
        if not args.no_fit:  # constants are fitted on fit rows only
            with open(path, newline="") as handle:
                refuse_test_rows(csv.DictReader(handle), path)
        try:
            used, dropped = load_samples(path, "--data")
        except ValueError as exc:
            raise BadInput(f"error: {exc}") from None
        samples += used
        prefix = f"{path.name}:" if len(args.data) > 1 else ""
        skipped += [(f"{prefix}{line}", kernel, reason) for line, kernel, reason in dropped]
    if not samples:
        raise BadInput(f"error: --data: no usable rows in {', '.join(map(str, args.data))}")
    if args.no_fit:
        fitted, cost, fill_s = get_gpu(args.gpu), float("nan"), DECODE_ATTENTION_FILL_S
    else:
        fitted, cost = fit(samples, get_gpu(args.gpu), tuple(int(t) for t in args.tiles.split(",")))
        fill_s = fit_decode_fill(samples, fitted)
        fill_s = DECODE_ATTENTION_FILL_S if fill_s is None else fill_s
    ratio, stats = evaluate(samples, fitted, fill_s)
    if not args.no_rows:
        _print_rows(samples, ratio)
        _print_kernels(samples, ratio)
    reasons: dict[str, list[int]] = {}
    for line, _kernel, reason in skipped:
        reasons.setdefault(reason, []).append(line)
    print(f"\nrows used {len(samples)}, skipped {len(skipped)}:")
    for reason, lines in sorted(reasons.items()):
        shown = ", ".join(map(str, lines[:6])) + (", ..." if len(lines) > 6 else "")
        print(f"  skipped {len(lines):4d}: {reason} (lines {shown})")
    splits = sorted({s.split for s in samples}, key=lambda name: name != "test")
    by_split = {name: evaluate([s for s in samples if s.split == name], fitted, fill_s)[1] for name in splits}
    for name, split_stats in by_split.items():
        rows = sum(s.split == name for s in samples)
        print(f"\n{split_label(name, rows)}\nfamily       rows  median|err|  geomean|err|  median err")
        for family, st in split_stats.items():
            print(f"{family:<12} {st['rows']:>4}  {st['median_abs_rel_err']:>10.1%}"
                  f"  {st['geomean_abs_err']:>11.1%}  {st['median_rel_err']:>+10.1%}")
    params = _report(fitted) | {"decode_attention_fill_s": float(f"{fill_s:.4g}")}
    print("\ncatalog (not fitted):" if args.no_fit else "\nfitted:", ", ".join(f"{k}={v}" for k, v in params.items()), f"(cost {cost:.4g})")
    summary = {"data": [str(p) for p in args.data], "gpu": args.gpu, "fitted": not args.no_fit, "rows_used": len(samples),
               "rows_skipped": len(skipped),
               "skipped": {reason: len(lines) for reason, lines in sorted(reasons.items())}, "params": params,
               "families": _rounded(stats),
               "by_split": {name: _rounded(st) for name, st in by_split.items()}}
    print(jsonline.dumps(summary))
    return summary


if __name__ == "__main__":
    run_script(main)
