"""The runtimes' own all-reduce: its one-shot / two-shot pricing and the fit of its two latencies."""

import csv

import pytest

from simcore.collectives.constants import DEFAULT
from simcore.cost.cluster import Cluster
from simcore.cost.tasks import CostContext
from simcore.hardware.gpus import H100_SXM
from simcore.models import get_model
from simcore.serving import get_runtime
from simcore.serving.step_cost import StepCost, custom_all_reduce_time_s
from simcore.strategy.sharding import megatron_strategy
from simcore.workload import Workload
from validation.studies.collectives import fit_custom_allreduce as fca

_HEAD = ["source_url", "gpu", "world_size", "implementation", "cuda_graph", "size_bytes", "time_us", "note", "split"]


def _write(path, rows):
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_HEAD)
        w.writerows(rows)
    return path


def test_small_messages_take_one_shot_and_large_ones_two_shot():
    """One barrier and (n - 1) buffers read, or two barriers and 2 (n - 1) / n of the buffer moved: the
    faster wins, so the crossover sits where the bytes saved pay for the second barrier."""
    bw = H100_SXM.nvlink_bandwidth_bytes_per_s * DEFAULT.nvlink_efficiency
    one, two = 6e-6, 12e-6
    small, large = 16 * 1024, 4 * 2**20
    assert custom_all_reduce_time_s(8, small, H100_SXM, one, two) == pytest.approx(one + 7 * small / bw)
    assert custom_all_reduce_time_s(8, large, H100_SXM, one, two) == pytest.approx(two + 1.75 * large / bw)
    crossover = (two - one) / ((7 - 1.75) / bw)  # where the two take equal times
    for size in (0.5 * crossover, 2 * crossover):
        t = custom_all_reduce_time_s(8, size, H100_SXM, one, two)
        assert t == pytest.approx(one + 7 * size / bw if size < crossover else two + 1.75 * size / bw)


def test_a_step_prices_its_tensor_parallel_all_reduce_with_the_runtimes_two_latencies():
    """A slower two-shot kernel slows a large decode all-reduce, not a small one (one-shot)."""
    ctx = CostContext(get_model("llama-3.1-70b"), Workload(precision="fp8"), Cluster.simple("h200", 8))
    s = megatron_strategy(tp=8)
    rt = get_runtime("vllm")
    base, slow = StepCost(ctx, s, rt), StepCost(ctx, s, rt.with_overrides(two_shot_ar_s=rt.two_shot_ar_s + 20e-6))
    small, large = 4 * 8192 * 2.0, 128 * 8192 * 2.0
    assert slow.custom_all_reduce_s(small) == base.custom_all_reduce_s(small)
    assert slow.custom_all_reduce_s(large) == pytest.approx(base.custom_all_reduce_s(large) + 20e-6)
    assert base.custom_all_reduce_s(small) == pytest.approx(
        custom_all_reduce_time_s(8, small, ctx.cluster.gpu, rt.custom_ar_s, rt.two_shot_ar_s))


def test_the_fit_recovers_the_latencies_it_was_made_with(tmp_path):
    one, two = 4e-6, 10e-6
    rows = [["x", "H100", n, "k", "yes", s, custom_all_reduce_time_s(n, s, H100_SXM, one, two) * 1e6, "", "fit"]
            for n in (2, 4, 8) for s in (8192, 65536, 2**19, 2**21, 2**23)]
    points = fca.load_points(_write(tmp_path / "a.csv", rows))
    a, b, err = fca.fit(points)
    assert (a, b) == pytest.approx((one, two)) and err == pytest.approx(0.0, abs=1e-9)


def test_each_point_counts_once_at_the_fastest_own_kernel_and_nccl_is_left_out(tmp_path):
    rows = [["x", "H100", 8, "ca_1stage", "yes", 2**20, 20, "", "fit"],
            ["x", "H100", 8, "symm_mem_multimem", "yes", 2**20, 14, "", "fit"],
            ["x", "H100", 8, "pynccl", "yes", 2**20, 9, "", "fit"],
            ["x", "H100", 8, "ca_1stage", "yes", 64 * 2**20, 300, "", "fit"]]  # above the runtimes' 8 MiB
    points = fca.load_points(_write(tmp_path / "a.csv", rows))
    assert [(p["time_s"], p["implementation"]) for p in points] == [(14e-6, "symm_mem_multimem")]


def test_the_shipped_latencies_are_what_the_fit_chooses_on_the_shipped_timings():
    out = fca.main([])
    for runtime in ("vllm", "vllm-sync", "sglang"):
        rt = get_runtime(runtime)
        assert (rt.custom_ar_s, rt.two_shot_ar_s) == (out["custom_ar_s"], out["two_shot_ar_s"])
    assert out["fit_points"] > 20 and out["test_points"] > 5


@pytest.mark.parametrize(("rows", "message"), [
    ([["x", "H100", "eight", "k", "yes", 1024, 5, "", "fit"]], "line 2: world_size, size_bytes and time_us"),
    ([["x", "H100", 1, "k", "yes", 1024, 5, "", "fit"]], "line 2: world_size must be >= 2"),
    ([["x", "H100", 8, "k", "yes", 1024, 5, "", "test"]], "no fit rows"),  # test rows are scored, never fitted
    ([["x", "H100", 8, "k", "yes", 1024, 5, "", "maybe"]], "line 2: split 'maybe' is not one of fit, test"),
])
def test_bad_rows_and_test_rows_are_one_line_errors(tmp_path, capsys, rows, message):
    path = _write(tmp_path / "bad.csv", rows)
    with pytest.raises(SystemExit) as exc:
        fca.run_script(lambda: fca.main(["--data", str(path)]))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
