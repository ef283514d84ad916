"""Kernel study: the calibrated compute model (hardware catalog defaults, not refitted) against any
CSV in the schema of ``kernels_h100.csv``; per-family median and geomean |relative error|, given per
split (``fit`` rows calibrated the constants, ``test`` rows did not) with row counts.

The package: :mod:`.rows` (CSV rows as measured kernel times), :mod:`.model` (the model's predictions
against them), :mod:`.fit` (``python -m validation.studies.kernels.fit``: the GEMM, HBM and attention
efficiencies, launch overhead and decode fill), :mod:`.measure` (``python -m
validation.studies.kernels.measure``: GEMM, attention and HBM timings on a local GPU, and the GPU timing
helpers the other measurement scripts share)."""

from __future__ import annotations

from pathlib import Path

from simcore.hardware.gpus import get_gpu
from validation.studies.common import atomic_write_json, write_csv
from validation.studies.common.split import split_label
from validation.studies.kernels.model import evaluate
from validation.studies.kernels.rows import load_samples

__all__ = ["run"]


def run(data_path: str | Path, out_dir: str | Path, gpu: str = "h100-sxm") -> dict:
    """Predict every usable row, write ``rows.csv`` and ``summary.json`` into ``out_dir``."""
    out = Path(out_dir)
    samples, skipped = load_samples(Path(data_path))
    if not samples:
        raise ValueError(f"data: no usable kernel rows in {data_path}")
    ratio, stats = evaluate(samples, get_gpu(gpu))
    out.mkdir(parents=True, exist_ok=True)
    columns = ["line", "split", "family", "kernel", "predicted_over_measured", "rel_error"]
    write_csv(out / "rows.csv", columns,
              [dict(zip(columns, (s.line, s.split, s.family, s.kernel, f"{r:.4f}", f"{r - 1:.4f}"), strict=True))
               for s, r in zip(samples, ratio, strict=True)]
              + [{"line": line, "kernel": kernel, "rel_error": f"skipped: {reason}"} for line, kernel, reason in skipped])
    by_split = {}
    for split in sorted({s.split for s in samples}, key=lambda name: name != "test"):
        chosen = [s for s in samples if s.split == split]
        by_split[split] = {"label": split_label(split, len(chosen)), "families": evaluate(chosen, get_gpu(gpu))[1]}
        print(f"kernels {by_split[split]['label']}: " + ", ".join(
            f"{f} {st['median_abs_rel_err']:.1%} ({st['rows']})" for f, st in by_split[split]["families"].items()))
    summary = {"study": "kernels", "data": str(data_path), "rows_used": len(samples),
               "rows_skipped": len(skipped), "by_split": by_split, "families": stats}
    atomic_write_json(out / "summary.json", summary)
    return summary
