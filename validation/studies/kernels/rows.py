"""Rows of the kernels CSV schema as measured kernel times (:class:`Sample`), or the reason a row is skipped.

Any CSV in the ``kernels_h100.csv`` schema (``source_url,kernel,shape_or_size,dtype,metric,value,unit,
note``): each row it understands becomes a measured kernel time (FLOP/s, B/s or time units; GEMM shapes
``m=.. n=.. k=..`` with ``b=``/``groups=`` as the grouped count, or ``AxBxC (MxNxK)``; attention ``B H S
D``). A row that gives a rate but no usable shape ("not stated", "best case") is "asymptotic": it is
compared with the model's large-kernel rate (peak x efficiency, or HBM x efficiency). Each sample keeps its
split (:func:`validation.studies.common.split.split_of`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simcore.hardware.kernels import gemm_bytes
from validation.studies.common import read_csv
from validation.studies.common.split import split_of

__all__ = ["DEFAULT_DATA", "FAMILIES", "Sample", "load_samples"]

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "data" / "kernels_h100.csv"
FAMILIES = ("gemm_bf16", "gemm_fp8", "hbm", "attention")
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
    split: str = "fit"  # fit | test (validation/studies/common/split.py)
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
