"""The serving simulator's KV-cache size against what the runtimes logged at start-up.

``python -m validation.studies.serving.kv_capacity [--data CSV] [--rows] [--fit]``

How many tokens of KV cache a worker holds decides, at high load, how many sequences decode together
and how long prompts queue; on an 80 GB H100 it binds far more often than on a 141 GB H200. The
simulator sizes it with :func:`simcore.serving.kvcache.kv_capacity_tokens` (the runtime's memory
fraction, less the weights and the activations of the largest step, over the KV bytes of one token;
SGLang's static pool and TensorRT-LLM's fraction of the free memory as each runtime does). Every
runtime prints what it allocated when it starts:

- vLLM: ``Model loading took X GiB``, ``Available KV cache memory: Y GiB``, ``GPU KV cache size: N
  tokens`` (older releases: ``# GPU blocks: B``, of 16 tokens by default);
- SGLang: ``Load weight end. ... mem usage=X GB``, ``KV Cache is allocated. #tokens: N, K size: ..., V
  size: ...``, ``max_total_num_tokens=N``;
- TensorRT-LLM: ``Allocated Y GiB for max tokens in paged KV cache (N)``.

``validation/data/kv_capacity_published.csv`` holds such lines copied from public logs (each row's
``source_url`` and verbatim ``quote``), with the launch that printed them: runtime and version, GPU
(``system``: ``h100_sxm``, ``h200_sxm``, ``h800``), model, weight precision, KV dtype (blank or ``auto``:
the runtime's default, :func:`validation.studies.serving.launch.kv_cache_precision`), TP / PP / DP
degrees, the memory fraction (blank: the runtime's default) and the token budget. Each row is priced as
the serving study prices a row of that runtime, model and layout, and the tool prints, per row and by
runtime and GPU, the simulated against the logged KV tokens, KV GiB and weights GiB (the weights per GPU
of :func:`simcore.cost.memory.memory_per_gpu_bytes` at a one-token step, within a few MiB of the weights
alone). A vLLM row's MXFP4 experts on Hopper are held padded to Marlin's tiles, as the study holds them
(:func:`simcore.serving.deployment.vllm_mxfp4_padding`, chosen on these fit rows' weights).
A row the tool cannot price (a model without a preset, a layout the strategy refuses) is listed
with why and left out of the medians.

One constant is fitted on these rows, by source (each row's ``split``): vLLM's
``RuntimeProfile.reserved_bytes``, the memory its start-up profile holds beside the weights and the
forward's activations. ``--fit`` chooses it on the ``fit`` rows (a grid of 0-10 GiB in steps of 0.25 GiB,
minimising the median ``|log(simulated / logged)|`` of the KV size) and prints both sets at it; without
``--fit`` the shipped value is scored (``--reserve-gib X``: another, e.g. 0 for the figures before the fit). The ``fit`` rows are in sample, the ``test`` rows out of sample
(other sources and vLLM versions), and every figure says which. Any CSV with these columns is read; a bad value is one line naming its line and
column, exit 2. Ends with one JSON line:
``{"rows", "priced", "median_abs_kv_error", "median_signed_kv_error", "median_abs_weights_error",
"vllm_reserved_gib", "fit": {...}, "test": {...}, "by_runtime": {...}, "by_system": {...}, "skipped": {...}}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simcore.cost.cluster import Cluster
from simcore.cost.lowering import CostContext, StrategyArrays
from simcore.cost.memory import memory_per_gpu_bytes
from simcore.files import dumps
from simcore.models import get_model
from simcore.models.quantization import expert_format
from simcore.serving import get_runtime, runtime_strategy
from simcore.serving.deployment import vllm_mxfp4_padding
from simcore.serving.kvcache import kv_bytes_per_token, kv_capacity_tokens
from validation.studies.common.cli import BadInput, OneLineParser, read_rows, run_script
from validation.studies.common.split import split_label, split_of
from validation.studies.serving.launch import kv_cache_precision
from validation.studies.serving.mapping import SYSTEMS, model_preset, row_workload

__all__ = ["main", "load_rows", "price_row", "fit_reserve", "PricedRow", "GRID_RESERVED_GIB"]

_DATA = Path(__file__).resolve().parents[2] / "data" / "kv_capacity_published.csv"
_NEED = ("source_url", "runtime", "runtime_version", "system", "model_path", "weights_precision", "kv_cache_dtype",
         "tp_size", "pp_size", "dp_size", "expert_parallel", "memory_fraction", "max_num_batched_tokens",
         "logged_weights_gib", "logged_kv_memory_gib", "logged_kv_tokens", "logged_gpu_blocks", "block_size")
#: the GPUs a row may name: the serving study's, and the H800 (an H100's memory, NVLink cut to 8 links)
_SYSTEMS = SYSTEMS | {"h800": "h800"}
_RUNTIMES = ("vllm", "sglang", "trtllm")
#: vLLM's default KV block (``--block-size`` 16), for rows that log blocks, not tokens
_VLLM_BLOCK = 16
_KV_DTYPES = {"": None, "auto": None, "bf16": "bf16", "bfloat16": "bf16", "fp16": "bf16", "float16": "bf16",
              "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
_GIB = 2.0**30
#: the grid of vLLM's ``reserved_bytes`` the fit searches, in GiB
GRID_RESERVED_GIB = tuple(x / 4 for x in range(41))


@dataclass
class PricedRow:
    """One logged start-up and the simulator's answer for it (``skip``: why it has none)."""

    line: int
    row: dict
    split: str
    logged_tokens: float | None
    logged_kv_gib: float | None
    logged_weights_gib: float | None
    sim_tokens: float | None = None
    sim_kv_gib: float | None = None
    sim_weights_gib: float | None = None
    skip: str = ""

    @property
    def kv_error(self) -> float | None:
        """Relative error of the KV cache's size: in tokens where the log gives them (which also checks
        the bytes a token costs), else in GiB."""
        if self.sim_tokens is None:
            return None
        if self.logged_tokens is not None:
            return self.sim_tokens / self.logged_tokens - 1.0
        return self.sim_kv_gib / self.logged_kv_gib - 1.0

    @property
    def weights_error(self) -> float | None:
        if self.sim_weights_gib is None or not self.logged_weights_gib:
            return None
        return self.sim_weights_gib / self.logged_weights_gib - 1.0


def _number(row: dict, key: str, line: int, path: Path, kind=float, minimum: float = 0.0):
    """Column ``key`` as a number above ``minimum`` (None when blank), else one line naming it."""
    text = (row.get(key) or "").replace(",", "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadInput(f"--data: {path} line {line}: {key} {text!r} is not a number") from None
    if not value > minimum or math.isinf(value) or (kind is int and value != int(value)):
        raise BadInput(f"--data: {path} line {line}: {key} must be a {'whole ' if kind is int else ''}number "
                       f"above {minimum:g}, got {text!r}")
    return kind(value)


def load_rows(path: Path) -> list[PricedRow]:
    """The file's rows with their logged KV tokens (tokens, or blocks x block size), not yet priced."""
    rows = read_rows(path, _NEED)
    out = []
    for i, r in enumerate(rows, start=2):
        runtime = (r["runtime"] or "").strip()
        if runtime not in _RUNTIMES:
            raise BadInput(f"--data: {path} line {i}: runtime {runtime!r} is not one of {', '.join(_RUNTIMES)}")
        if (r["system"] or "").strip() not in _SYSTEMS:
            raise BadInput(f"--data: {path} line {i}: system {r['system']!r} is not one of {', '.join(_SYSTEMS)}")
        if (r["kv_cache_dtype"] or "").strip().lower() not in _KV_DTYPES:
            raise BadInput(f"--data: {path} line {i}: kv_cache_dtype {r['kv_cache_dtype']!r} is not one of "
                           f"{', '.join(k for k in _KV_DTYPES if k)}")
        for key in ("tp_size", "pp_size", "dp_size"):
            _number(r, key, i, path, int)
        for key in ("memory_fraction",):
            fraction = _number(r, key, i, path)
            if fraction is not None and fraction > 1:
                raise BadInput(f"--data: {path} line {i}: memory_fraction must be in (0, 1], got {fraction:g}")
        _number(r, "max_num_batched_tokens", i, path, int)
        tokens = _number(r, "logged_kv_tokens", i, path)
        blocks = _number(r, "logged_gpu_blocks", i, path, int)
        if tokens is None and blocks is not None:
            tokens = blocks * (_number(r, "block_size", i, path, int) or _VLLM_BLOCK)
        kv_gib = _number(r, "logged_kv_memory_gib", i, path)
        if tokens is None and kv_gib is None:
            raise BadInput(f"--data: {path} line {i}: logged_kv_tokens, logged_gpu_blocks or logged_kv_memory_gib "
                           f"is needed")
        try:
            split = split_of(r)
        except ValueError as exc:
            raise BadInput(f"--data: {path} line {i}: {exc}") from None
        out.append(PricedRow(i, r, split, tokens, kv_gib, _number(r, "logged_weights_gib", i, path)))
    return out


def _flag(text: str) -> bool:
    return (text or "").strip().lower() in ("true", "1", "yes")


def price_row(p: PricedRow, vllm_reserved_bytes: float | None = None) -> PricedRow:
    """Price one row as the serving study prices its runtime, model and layout (module doc); a vLLM row
    with ``vllm_reserved_bytes`` in place of the profile's ``reserved_bytes`` where given."""
    r = p.row
    preset = model_preset(r["model_path"])
    if not isinstance(preset, str):
        p.skip = f"model: {preset}" if preset is not None else f"model: no preset for {r['model_path']!r}"
        return p
    model = get_model(preset)
    gpu = _SYSTEMS[r["system"].strip()]
    precision = r["weights_precision"].strip().lower()
    workload = row_workload({"precision": precision, "model_path": r["model_path"], "moe_quant_mode": precision},
                            model, gpu)
    if isinstance(workload, str):
        p.skip = workload
        return p
    tp, pp = int(r["tp_size"] or 1), int(r["pp_size"] or 1)
    if workload.expert_weight_bytes is not None:
        expert_tp = 1 if _flag(r["expert_parallel"]) else tp  # vLLM's expert parallelism keeps experts whole
        try:
            factor = vllm_mxfp4_padding(r["runtime"].strip(), expert_format(r["model_path"], precision), gpu,
                                        model.hidden_size, model.expert_ffn_size, expert_tp)
        except ValueError as exc:
            p.skip = str(exc)
            return p
        workload = replace(workload, expert_weight_bytes=workload.expert_weight_bytes * factor)
    kv = _KV_DTYPES[(r["kv_cache_dtype"] or "").strip().lower()]
    if kv is None:  # the runtime's default for this checkpoint (the serving study's rule, at no harness length)
        kv = kv_cache_precision(r["runtime"].strip(), r["runtime_version"] or "", r["model_path"], preset,
                                workload.precision, 0, 0)
    dp = int(r["dp_size"] or 1)
    # attention-DP groups whose experts are split across them; a DP rank without expert parallelism (or of a
    # dense model) is a replica of its own, whose KV cache is the one logged
    ep = dp if model.is_moe and (_flag(r["expert_parallel"]) or r["runtime"].strip() == "sglang") else 1
    try:
        strategy = runtime_strategy(tp=tp, ep=ep, pp=pp)
        runtime = get_runtime(r["runtime"].strip())
        changes = {}
        if r["memory_fraction"].strip():
            changes["mem_fraction"] = float(r["memory_fraction"])
        if r["max_num_batched_tokens"].strip():
            changes["max_num_batched_tokens"] = int(float(r["max_num_batched_tokens"]))
        if vllm_reserved_bytes is not None and runtime.scheduler == "vllm":
            changes["reserved_bytes"] = vllm_reserved_bytes
        runtime = runtime.with_overrides(**changes)
        nodes = max(1, -(-strategy.gpus // 8))
        ctx = CostContext(model, replace(workload, kv_precision=kv),
                          Cluster.simple(gpu, num_gpus=8 * nodes, nvlink_domain_size=8))
        tokens = kv_capacity_tokens(ctx, strategy, runtime)
        probe = replace(ctx, workload=replace(ctx.workload, phase="decode", input_len=1, output_len=1))
        one = strategy.replace(dp=1, batch=strategy.ep, microbatches=1)
        weights = float(memory_per_gpu_bytes(probe, StrategyArrays.from_strategies([one]))[0])
    except ValueError as exc:  # a layout the strategy or the runtime refuses: named in its first line
        p.skip = str(exc).splitlines()[0]
        return p
    p.sim_tokens = float(tokens)
    p.sim_kv_gib = tokens * kv_bytes_per_token(ctx, strategy) / _GIB
    p.sim_weights_gib = weights / _GIB
    return p


def _score(rows: list[PricedRow]) -> float:
    """Median ``|log(simulated / logged)|`` of the KV size over the priced rows (nan without any)."""
    errors = [abs(math.log1p(p.kv_error)) if p.kv_error > -1 else math.inf for p in rows if p.kv_error is not None]
    return float(np.median(errors)) if errors else math.nan


def fit_reserve(rows: list[PricedRow]) -> tuple[float, float]:
    """``(reserved_bytes, median |log error|)``: vLLM's reserve on the grid, best on ``rows``' vLLM rows."""
    vllm = [p for p in rows if p.row["runtime"].strip() == "vllm"]
    if not vllm:
        raise BadInput("--fit: no fit rows of vLLM")
    scores = {g: _score([price_row(replace(p), g * _GIB) for p in vllm]) for g in GRID_RESERVED_GIB}
    best = min(scores, key=lambda g: (scores[g], g))
    return best * _GIB, scores[best]


def _median(values: list[float]) -> float | None:
    return float(np.median(values)) if values else None


def _summary(rows: list[PricedRow]) -> dict:
    priced = [p for p in rows if p.sim_tokens is not None]
    tok = [p.kv_error for p in priced]
    wts = [p.weights_error for p in priced if p.weights_error is not None]
    return {"rows": len(rows), "priced": len(priced),
            "median_abs_kv_error": _median([abs(e) for e in tok]), "median_signed_kv_error": _median(tok),
            "within_10pct": sum(abs(e) <= 0.10 for e in tok),
            "median_abs_weights_error": _median([abs(e) for e in wts]), "weights_rows": len(wts)}


def _count(v: float | None) -> str:
    return f"{v:,.0f}" if v is not None else "-"


def _gib(v: float | None) -> str:
    return f"{v:7.2f}" if v is not None else "      -"


def _print_rows(rows: list[PricedRow]) -> None:
    print(f"{'set':4s} {'runtime':7s} {'system':8s} {'model':34s} {'layout':12s} {'frac':>5s} | {'KV tokens logged':>16s} "
          f"{'sim':>10s} {'error':>7s} | KV GiB log   sim | weights GiB log   sim")
    for p in rows:
        r = p.row
        layout = f"tp{r['tp_size'] or 1} pp{r['pp_size'] or 1} dp{r['dp_size'] or 1}"
        head = (f"{p.split:4s} {r['runtime']:7s} {r['system']:8s} {r['model_path'].split('/')[-1][:34]:34s} {layout:12s} "
                f"{(r['memory_fraction'] or '-'):>5s} | {_count(p.logged_tokens):>16s} ")
        if p.skip:
            print(head + f"skipped: {p.skip}")
            continue
        print(head + f"{p.sim_tokens:10,.0f} {p.kv_error:+7.1%} | {_gib(p.logged_kv_gib)} {_gib(p.sim_kv_gib)} | "
                     f"{_gib(p.logged_weights_gib)} {_gib(p.sim_weights_gib)}")


def main(argv: list[str] | None = None) -> dict:
    parser = OneLineParser(prog="validation.studies.serving.kv_capacity", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=_DATA)
    parser.add_argument("--rows", action="store_true", help="print every row")
    parser.add_argument("--fit", action="store_true", help="fit vLLM's reserved_bytes on the fit rows first")
    parser.add_argument("--reserve-gib", type=float, default=None,
                        help="score vLLM's rows at this reserve instead of the shipped one (0: as before the fit)")
    args = parser.parse_args(argv)
    if args.reserve_gib is not None and (args.fit or not 0 <= args.reserve_gib < 1e3):
        parser.error("--reserve-gib: a number of GiB from 0, without --fit" if args.fit
                     else f"--reserve-gib: must be at least 0, got {args.reserve_gib:g}")
    loaded = load_rows(args.data)
    reserve = get_runtime("vllm").reserved_bytes if args.reserve_gib is None else args.reserve_gib * _GIB
    if args.fit:
        reserve, err = fit_reserve([p for p in loaded if p.split == "fit"])
        print(f"fit ({split_label('fit', sum(p.split == 'fit' for p in loaded))}): vLLM reserved_bytes = "
              f"{reserve / _GIB:g} GiB, median |log error| of the KV size {err:.3f}")
    rows = [price_row(p, reserve) for p in loaded]
    if args.rows:
        _print_rows(rows)
    out = {"data": str(args.data)} | _summary(rows) | {"vllm_reserved_gib": reserve / _GIB}
    for split in ("fit", "test"):
        part = [p for p in rows if p.split == split]
        out[split] = _summary(part) | {"median_abs_log_kv_error": _score(part)}
    out["by_runtime"] = {k: _summary([p for p in rows if p.row["runtime"].strip() == k])
                         for k in _RUNTIMES if any(p.row["runtime"].strip() == k for p in rows)}
    systems = sorted({p.row["system"].strip() for p in rows})
    out["by_system"] = {k: _summary([p for p in rows if p.row["system"].strip() == k]) for k in systems}
    out["skipped"] = {f"line {p.line}": p.skip for p in rows if p.skip}
    print(f"KV-cache size, simulated against logged, vLLM reserving {reserve / _GIB:g} GiB: {out['priced']} of "
          f"{out['rows']} rows priced (all rows: fit in sample, test out of sample)")
    for name, s in [("all", out), ("fit", out["fit"]), ("test", out["test"])] \
            + [(f"  {k}", v) for k, v in out["by_runtime"].items()] + [(f"  {k}", v) for k, v in out["by_system"].items()]:
        if s["priced"]:
            print(f"{name:10s} {s['priced']:3d} rows: median |KV size error| {s['median_abs_kv_error']:.1%} "
                  f"(signed {s['median_signed_kv_error']:+.1%}, {s['within_10pct']} within 10%)"
                  + (f", median |weights error| {s['median_abs_weights_error']:.1%} on {s['weights_rows']}"
                     if s["weights_rows"] else ""))
    print(dumps(out))
    return out


if __name__ == "__main__":
    run_script(main)
