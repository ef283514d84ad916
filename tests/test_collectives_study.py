"""The collectives validation study and the calibration fit, on tiny CSVs."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from simcore.collectives import DEFAULT, Fabric, collective_time_s
from simcore.hardware.gpus import get_gpu
from validation.studies import collectives as study
from validation.studies.collectives import fit as fit_collectives

HEADER = list(study.COLUMNS)
FAB = Fabric.from_gpu(get_gpu("h100-sxm"))


def _row(**kw) -> dict:
    base = {c: "" for c in HEADER}
    base.update(source_url="https://example.org/x", setting="test", nodes="1", gpus_per_node="8",
                algorithm="default")
    base.update({k: str(v) for k, v in kw.items()})
    return base


def _write(path, rows, header=HEADER):
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return path


ROWS = [
    _row(collective="all_reduce", size_bytes=2**30, time_us=4000.0),
    _row(collective="all_gather", gpus_per_node=4, size_bytes=2**28, algbw_GBps=400.0,
         note="2 concurrent group(s) of 4 GPUs"),
    _row(collective="alltoall", size_bytes=2**26, busbw_GBps=350.0),
    _row(collective="all_reduce", size_bytes="abc", time_us=10.0),
    _row(collective="broadcast", size_bytes=1024, time_us=10.0),
    _row(nodes=4, collective="all_reduce", algorithm="nvlstree", size_bytes=2**32, busbw_GBps=310.0),
]


def test_study_runs_reports_bad_rows_and_writes_outputs(tmp_path):
    summary = study.run(_write(tmp_path / "tiny.csv", ROWS), tmp_path / "out")
    assert (summary["rows_total"], summary["rows_used"], summary["rows_skipped"]) == (6, 4, 2)
    with open(tmp_path / "out" / "rows.csv") as fh:
        out = list(csv.DictReader(fh))
    assert [r["skipped_reason"] != "" for r in out] == [False, False, False, True, True, False]
    assert "size_bytes" in out[3]["skipped_reason"] and "broadcast" in out[4]["skipped_reason"]
    assert out[5]["sim_algorithm"] == "nvls_tree" and out[0]["sim_algorithm"] == "nvls"
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["rows_used"] == 4
    assert (tmp_path / "out" / "busbw.png").stat().st_size > 1000
    # the simulated time in rows.csv is the analytic model's with the row's harness overhead (nccl-tests
    # here: the setting names none), and rel_error compares it to the measurement
    nccl_tests = DEFAULT.with_overrides(launch_overhead_s=study.HARNESS_OVERHEAD_S["nccl-tests"])
    sim = float(collective_time_s("all_reduce", 2**30, 8, 8, FAB, constants=nccl_tests))
    assert float(out[0]["sim_time_us"]) == pytest.approx(sim * 1e6, rel=1e-6)
    assert float(out[0]["rel_error"]) == pytest.approx(sim / 4000e-6 - 1, abs=1e-4)


def test_measured_time_from_algbw_or_busbw():
    assert study.parse_row(ROWS[1]).measured_time_s == pytest.approx(2**28 / 400e9)
    assert study.parse_row(ROWS[1]).concurrent_groups == 2
    case = study.parse_row(ROWS[2])
    assert case.collective == "all_to_all"
    assert case.measured_time_s == pytest.approx(2**26 / (350e9 / (7 / 8)))
    assert study.parse_row(ROWS[5]).measured_time_s == pytest.approx(2**32 / (310e9 / (2 * 31 / 32)))


@pytest.mark.parametrize(("change", "needle"), [
    ({"nodes": "0"}, "nodes"), ({"gpus_per_node": "2.5"}, "gpus_per_node"), ({"algorithm": "magic"}, "magic"),
    ({"time_us": ""}, "no time_us"), ({"time_us": "fast"}, "time_us")])
def test_bad_rows_raise_with_reason(change, needle):
    with pytest.raises(ValueError, match=needle):
        study.parse_row({**ROWS[0], **change})


def test_header_errors_are_one_line(tmp_path):
    with pytest.raises(ValueError, match="unknown column 'foo'") as info:
        study.run(_write(tmp_path / "a.csv", ROWS[:1], HEADER + ["foo"]), tmp_path / "o")
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"data: .*b.csv lacks column\(s\) size_bytes"):
        header = [h for h in HEADER if h != "size_bytes"]
        study.run(_write(tmp_path / "b.csv", ROWS[:1], header), tmp_path / "o")
    with pytest.raises(ValueError, match="unknown engine"):
        study.run(_write(tmp_path / "c.csv", ROWS[:1]), tmp_path / "o", engine="packet")


def test_flow_engine_matches_analytic_on_idle_fabric(tmp_path):
    data = _write(tmp_path / "tiny.csv", ROWS)
    analytic = study.evaluate(data)
    flow = study.evaluate(data, engine="flow")
    for a, f in zip(analytic, flow, strict=True):
        if a["skipped_reason"] == "":
            assert f["_sim_s"] == pytest.approx(a["_sim_s"], rel=0.01)


def test_cli_ends_with_one_json_line(tmp_path, capsys):
    study.main(["--data", str(_write(tmp_path / "tiny.csv", ROWS)), "--out", str(tmp_path / "o")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last)["rows_skipped"] == 2


def _synthetic_rows(truth, harness: str, setting: str, base_s: float, per_device_s: float) -> list[dict]:
    """Rows a harness adding ``base_s`` + ``per_device_s`` per further GPU of its process would measure
    if ``truth`` were the fabric."""
    rows = []
    for coll in ("all_reduce", "all_gather", "reduce_scatter", "alltoall"):
        for n in (2, 4, 8):
            devices = study.devices_per_process(harness, setting, n)
            extra = study.overhead_s(harness, devices, {harness: base_s}, per_device_s)
            for size in (2**12, 2**16, 2**20, 2**24, 2**30, 2**31):
                name = "all_to_all" if coll == "alltoall" else coll
                algo = "ring" if coll != "alltoall" else "direct"
                t = float(collective_time_s(name, size, n, n, FAB, algorithm=algo,
                                            constants=truth.with_overrides(launch_overhead_s=extra)))
                rows.append(_row(collective=coll, algorithm=algo, gpus_per_node=n, size_bytes=size,
                                 time_us=t * 1e6, setting=setting))
    return rows


def test_fit_recovers_known_parameters_from_synthetic_measurements(tmp_path):
    truth = DEFAULT.with_overrides(nvlink_efficiency=0.7, ring_fill_steps_copy=0.3, ring_fill_steps_reduce=0.5)
    rows = (_synthetic_rows(truth, "xla", "XLA GPU runtime", 12e-6, 3e-6)
            + _synthetic_rows(truth, "torch", "torch.distributed", 5e-6, 3e-6)
            + _synthetic_rows(truth, "nccl-tests", "nccl-tests all_reduce_perf in a PyTorch container", 2e-6, 3e-6))
    cases = fit_collectives.load_cases(_write(tmp_path / "synthetic.csv", rows))
    assert {c.harness for c in cases} == {"xla", "torch", "nccl-tests"}
    assert {c.devices_per_process for c in cases if c.harness == "xla"} == {2, 4, 8}
    best, overheads, per_device, residuals = fit_collectives.fit_staged(cases)
    for name in fit_collectives.BANDWIDTH_PARAMS:
        assert getattr(best, name) == pytest.approx(getattr(truth, name), rel=0.02), name
    assert overheads == pytest.approx({"xla": 12e-6, "torch": 5e-6, "nccl-tests": 2e-6}, rel=0.03)
    assert per_device == pytest.approx(3e-6, rel=0.03)
    assert abs(residuals).max() < 0.01
    # the fit's residuals are the study's errors at the same values
    records = study.evaluate(tmp_path / "synthetic.csv", constants=best)
    errors = [r["_err"] for r in records]
    refit = fit_collectives.log_residuals(cases, best)
    assert errors == pytest.approx(list(np.expm1(refit)), rel=1e-6, abs=1e-9)


def test_harness_is_read_from_the_row_text_or_forced():
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20,
                                setting="OpenXLA table")).harness == "xla"
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20,
                                note="all_reduce_perf -g 8, NGC PyTorch 24.05")).harness == "nccl-tests"
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20,
                                setting="torch.distributed loop")).harness == "torch"
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20)).harness == "nccl-tests"
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20,
                                note="all_reduce_perf -b 8 -e 8G -g 8")).devices_per_process == 8
    assert study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20, algbw_GBps="0.00",
                                busbw_GBps="0.00")).measured_time_s == pytest.approx(20e-6)  # nccl-tests 0.00
    forced = study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20, setting="XLA"), "torch")
    assert forced.harness == "torch"
    with pytest.raises(ValueError, match="unknown harness 'mpi'"):
        study.parse_row(_row(collective="all_reduce", size_bytes=8, time_us=20), "mpi")


def test_each_row_pays_its_harness_overhead(tmp_path):
    rows = [_row(collective="all_reduce", size_bytes=1024, time_us=30.0, setting=s)
            for s in ("nccl-tests", "OpenXLA", "torch.distributed")]
    records = study.evaluate(_write(tmp_path / "h.csv", rows))
    sims = [r["_sim_s"] for r in records]
    xla_8_gpus = study.HARNESS_OVERHEAD_S["xla"] + 7 * study.PER_DEVICE_LAUNCH_S  # one process drives all 8
    assert sims[1] - sims[0] == pytest.approx(xla_8_gpus, rel=1e-6)
    assert sims[2] - sims[0] == pytest.approx(study.HARNESS_OVERHEAD_S["torch"], rel=1e-6)
    assert [r["harness"] for r in records] == ["nccl-tests", "xla", "torch"]


def test_fit_cli_prints_json_last_and_the_shipped_constants_are_its_output(capsys):
    fit_collectives.main([])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(study.DEFAULT_DATA) as fh:
        assert last["rows"] == sum(1 for _ in csv.DictReader(fh))  # every fit row parses
    # the shipped values are the fit's (the XLA and torch rows carry their overheads)
    for name, value in last["harness_overhead_s"].items():
        assert value == pytest.approx(study.HARNESS_OVERHEAD_S[name], rel=0.01, abs=1e-8), name
    assert last["per_device_launch_s"] == pytest.approx(study.PER_DEVICE_LAUNCH_S, rel=0.01)
    for name, value in last["fitted"].items():
        assert value == pytest.approx(getattr(DEFAULT, name), rel=0.01), name


# ------------------------------------------------------------------ fabrics, splits
def test_fabric_comes_from_the_column_else_the_setting_else_infiniband():
    base = {"collective": "all_reduce", "nodes": 2, "size_bytes": 2**30, "time_us": 1e4}
    assert study.parse_row(_row(**base)).fabric == "ib"
    assert study.parse_row(_row(**base, setting="4x p5en.48xlarge, EFA")).fabric == "efa"
    assert study.parse_row(_row(**base, note="8x 400G RoCEv2 per node")).fabric == "roce"
    assert study.parse_row(_row(**base, setting="EFA", fabric="ib")).fabric == "ib"  # the column wins
    assert study.parse_row(_row(**base, setting="DEFAULT settings")).fabric == "ib"  # a word, not a substring


def test_unknown_fabric_is_a_one_line_error_naming_the_field_and_exits_2(tmp_path):
    import subprocess
    import sys

    path = _write(tmp_path / "f.csv", [_row(collective="all_reduce", nodes=2, size_bytes=2**30, time_us=1e4,
                                            fabric="ethernet")])
    with pytest.raises(ValueError, match=r"line 2: fabric: unknown fabric 'ethernet'; choose one of: ib, efa, roce"):
        study.evaluate(path)
    proc = subprocess.run([sys.executable, "-m", "validation.studies.collectives", "--data", str(path), "--out",
                           str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "fabric" in proc.stderr, proc.stderr


def _send_recv_row(fabric: str, size: float) -> dict:
    return _row(collective="send_recv", nodes=2, gpus_per_node=1, size_bytes=size, time_us=1e3, fabric=fabric)


def test_each_fabric_pays_its_own_nic_efficiency_latency_and_fill(tmp_path):
    """A 2-node send/recv by hand: Simple base + NET hop (+ 2 x latencyInter) + S / (eff x 50 GB/s),
    plus the fill S F / (S + F) / (eff x 50 GB/s), with each fabric's fields."""
    c = DEFAULT.with_overrides(efa_nic_efficiency=0.5, efa_net_latency_s=30e-6, efa_net_fill_bytes=2**20,
                               roce_nic_efficiency=0.8, roce_net_latency_s=0.0, roce_net_fill_bytes=0.0)
    size = 2.0**26
    records = study.evaluate(_write(tmp_path / "s.csv", [_send_recv_row(f, size) for f in ("efa", "roce")]),
                             constants=c)
    # one GPU per node: the hop is Tree's NET Simple latency (14 us); nccl-tests adds no harness overhead
    efa = 8.4e-6 + 14e-6 + 2 * 30e-6 + (size + size * 2**20 / (size + 2**20)) / (0.5 * 50e9)
    roce = 8.4e-6 + 14e-6 + size / (0.8 * 50e9)
    assert [r["_sim_s"] for r in records] == pytest.approx([efa, roce], rel=1e-9)
    assert [r["fabric"] for r in records] == ["efa", "roce"]


def test_infiniband_on_hopper_uses_the_constants_unchanged_and_the_others_are_cached():
    ib, efa = Fabric.from_gpu(get_gpu("h100-sxm")), Fabric.from_gpu(get_gpu("h100-sxm"), scale_out="efa")
    assert DEFAULT.for_fabric(ib) is DEFAULT
    converted = DEFAULT.for_fabric(efa)
    assert converted is DEFAULT.for_fabric(efa)
    assert (converted.nic_efficiency, converted.net_latency_s, converted.net_fill_bytes) == (
        DEFAULT.efa_nic_efficiency, DEFAULT.efa_net_latency_s, DEFAULT.efa_net_fill_bytes)


def test_blackwell_nvls_uses_nccls_sm100_rows():
    """NVLS all-reduce on one GB200 NVL72 domain of p GPUs, by hand: nCh = min(p, 24) channels of
    min(90 GB/s, B_nvl / (nCh + 1)), x 0.74 (Blackwell nvlsEfficiency) x (nCh - 1) / nCh x 2, algBw =
    nCh x that x n / (2 (n - 1))."""
    fab = Fabric.from_gpu(get_gpu("gb200"))
    assert (fab.arch, fab.nvlink_domain_size, fab.nvlink_bandwidth_bytes_per_s) == ("blackwell", 72, 900e9)
    bare = DEFAULT.with_overrides(launch_overhead_s=0.0, nvls_fill_bytes=0.0)
    size, n = 2.0**30, 72
    nch = 24
    bw_ch = min(90e9, bare.nvlink_efficiency * 900e9 / (nch + 1))
    alg = nch * bw_ch * 0.74 * (nch - 1) / nch * 2 * n / (2 * (n - 1))
    t = float(collective_time_s("all_reduce", size, n, n, fab, algorithm="nvls", constants=bare))
    assert t == pytest.approx(25e-6 + size / alg, rel=1e-9)
    hopper = Fabric.from_gpu(get_gpu("h100-sxm"), nvlink_domain_size=72)
    assert float(collective_time_s("all_reduce", size, n, n, hopper, algorithm="nvls", constants=bare)) > t


def test_rows_are_labelled_fit_or_test_and_every_figure_names_its_split(tmp_path, capsys):
    rows = [_row(collective="all_reduce", size_bytes=2**30, time_us=4000.0, split="fit"),
            _row(collective="all_reduce", size_bytes=2**20, time_us=40.0, split="test"),
            _row(collective="all_reduce", nodes=2, size_bytes=2**30, time_us=9000.0, split="test", fabric="efa")]
    summary = study.main(["--data", str(_write(tmp_path / "s.csv", rows)), "--out", str(tmp_path / "o")])
    assert set(summary["splits"]) == {"fit", "test"}
    assert (summary["splits"]["fit"]["rows"], summary["splits"]["test"]["rows"]) == (1, 2)
    assert set(summary["multi_node"]) == {"test/efa/>=1MiB"}
    out = capsys.readouterr().out.splitlines()
    figures = [line for line in out if "geomean |err|" in line]
    assert figures and all(line.startswith(("[fit", "[test")) for line in figures)
    with open(tmp_path / "o" / "rows.csv") as fh:
        assert [r["split"] for r in csv.DictReader(fh)] == ["fit", "test", "test"]


def test_shipped_split_has_no_source_in_both_sets_and_no_duplicated_row():
    fit_path = study.DEFAULT_DATA
    test_path = fit_path.with_name("collectives_test.csv")
    fit_rows, test_rows = study.load_rows(fit_path), study.load_rows(test_path)
    assert {r["split"] for r in fit_rows} == {"fit"} and {r["split"] for r in test_rows} == {"test"}
    assert not {r["source_url"] for r in fit_rows} & {r["source_url"] for r in test_rows}
    key = ("collective", "nodes", "gpus_per_node", "size_bytes", "time_us", "algbw_GBps", "busbw_GBps")
    assert not {tuple(r[k] for k in key) for r in fit_rows} & {tuple(r[k] for k in key) for r in test_rows}
    assert all(r["source_url"].startswith("https://") for r in fit_rows + test_rows)
    multi = [r for r in test_rows if int(r["nodes"]) > 1]
    assert {study.fabric_of(r) for r in multi} == {"ib", "efa", "roce"}


def test_fit_refuses_test_rows(tmp_path):
    rows = [_row(collective="all_reduce", size_bytes=2**30, time_us=4000.0, split="test")]
    with pytest.raises(SystemExit, match="1 test row"):
        fit_collectives.load_cases(_write(tmp_path / "t.csv", rows))
    with pytest.raises(SystemExit, match="test row"):
        fit_collectives.main(["--data", str(study.DEFAULT_DATA.with_name("collectives_test.csv"))])


def test_fit_recovers_a_fabric_efficiency_and_fill_from_synthetic_multi_node_rows(tmp_path):
    truth = DEFAULT.with_overrides(efa_nic_efficiency=0.6, efa_net_fill_bytes=30e6)
    efa = Fabric.from_gpu(get_gpu("h100-sxm"), scale_out="efa")
    rows = []
    for nodes in (2, 4, 8):
        for size in (2**22, 2**25, 2**28, 2**31):
            t = float(collective_time_s("all_to_all", size, 8 * nodes, 8, efa, constants=truth.with_overrides(
                launch_overhead_s=0.0)))
            rows.append(_row(collective="alltoall", nodes=nodes, size_bytes=size, time_us=t * 1e6, fabric="efa"))
    cases = fit_collectives.load_cases(_write(tmp_path / "m.csv", rows))
    best, used = fit_collectives.fit_fabrics(cases, DEFAULT)
    assert used["efa"] == (12, 0) and used["ib"] == (0, 0)
    assert best.efa_nic_efficiency == pytest.approx(0.6, rel=1e-3)
    assert best.efa_net_fill_bytes == pytest.approx(30e6, rel=1e-2)
    assert best.nic_efficiency == DEFAULT.nic_efficiency  # no InfiniBand row: its prior stays
