"""Gated DeltaNet kernel fit: the constants are recovered from rows priced at them, rows and bad input."""

from __future__ import annotations

import csv

import pytest

from simcore.hardware.gpus import get_gpu
from simcore.models import linear_attention as gdn
from validation.studies.attention import fit_linear as fla_fit

FIELDS = ["source_url", "kernel", "shape_or_size", "dtype", "metric", "value", "unit", "note", "split"]
SHAPES = [("gdn recurrent decode", s, 1) for s in (1, 16, 64, 256)] + \
         [("gdn chunked prefill", s, n) for s, n in ((1, 1024), (1, 4096), (1, 16384), (4, 2048))]


def _write(path, rows) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows({"source_url": "synthetic", "dtype": "bf16", "metric": "kernel time", "unit": "us",
                          "note": "", **r} for r in rows)


def _synthetic(share: float, latency_s: float, state_bytes: int = 4) -> list[dict]:
    """Rows at four tensor-parallel degrees of Qwen3.5's heads, priced by the model at the given constants."""
    gpu, rows = get_gpu("h100-sxm"), []
    for tp in (1, 2, 4, 8):
        for kernel, seqs, new in SHAPES:
            shape = (f"model=syn tp={tp} seqs={seqs} new={new} hk={16 // tp} hv={64 // tp} dk=128 dv=128 "
                     f"state_bytes={state_bytes}")
            r = {"phase": fla_fit.KERNELS[kernel], "seqs": seqs, "new": new, "hk": 16 // tp, "hv": 64 // tp,
                 "dk": 128, "dv": 128, "state_bytes": state_bytes}
            seconds = fla_fit.model_s(r, gpu, share, latency_s)
            rows.append({"kernel": kernel, "shape_or_size": shape, "value": f"{seconds * 1e6:.6f}", "split": "fit"})
    return rows


def test_constants_priced_into_rows_are_recovered(tmp_path) -> None:
    data = tmp_path / "k.csv"
    _write(data, _synthetic(0.62, 2.3e-6))
    rows = fla_fit.load_rows(data)
    assert len(rows) == 4 * len(SHAPES) and {r["split"] for r in rows} == {"fit"}
    share, latency = fla_fit.fit(rows, get_gpu("h100-sxm"))
    assert share == pytest.approx(0.62) and latency == pytest.approx(2.3e-6)


def test_the_shipped_rows_score_the_shipped_constants(capsys) -> None:
    assert fla_fit.main(["--no-fit", "--hold-out-tp", "4"]) == 0
    out = capsys.readouterr().out
    assert f"HBM share {gdn.GDN_HBM_EFFICIENCY:.2f}" in out
    assert "not used (BF16 state)" in out and "held out" in out


@pytest.mark.parametrize("case, message", [
    ("missing", "no such file"),
    ("no_column", "lacks column(s) value"),
    ("no_size", "shape_or_size lacks hv"),
    ("no_rows", "has no rows of kernel"),
    ("bf16_only", "no FP32-state rows"),
    ("test_rows", "test row(s)"),
    ("bad_gpu", "--gpu"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, case, message) -> None:
    data = tmp_path / "k.csv"
    args = ["--data", str(data)]
    if case == "no_column":
        data.write_text("kernel,shape_or_size,unit\ngdn recurrent decode,seqs=1,us\n")
    elif case == "no_size":
        _write(data, [{"kernel": "gdn recurrent decode", "shape_or_size": "seqs=1 new=1 hk=1 dk=1 dv=1 state_bytes=4",
                       "value": "3"}])
    elif case == "no_rows":
        _write(data, [{"kernel": "gemm", "shape_or_size": "m=1", "value": "3"}])
    elif case == "bf16_only":
        _write(data, _synthetic(0.7, 1e-6, state_bytes=2))
    elif case == "test_rows":
        rows = _synthetic(0.7, 1e-6)
        _write(data, [dict(rows[0], split="test"), *rows[1:]])
    elif case == "bad_gpu":
        _write(data, _synthetic(0.7, 1e-6))
        args += ["--gpu", "tpu-v9"]
    assert fla_fit.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_the_timing_script_refuses_a_model_without_linear_attention_before_looking_for_a_gpu(tmp_path) -> None:
    from validation.studies.attention import measure_linear as measure_linear_attention
    for bad in ("llama-3.1-8b", "no-such-model"):
        with pytest.raises(SystemExit) as exc:
            measure_linear_attention.main(["--out", str(tmp_path / "g.csv"), "--models", bad])
        assert exc.value.code == 2
