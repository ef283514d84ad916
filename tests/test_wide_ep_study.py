"""``shard-validate study=wide_ep``: the shipped rows parse as their sources state them, a row simulates to a
throughput per node beside the measurement, a CSV in another schema is one line."""

import csv

import pytest
from omegaconf import OmegaConf

from planner.apps.common import UserError
from validation.apps.validate import StudyConfig, ValidateAppConfig
from validation.apps.validate import run as validate_run
from validation.studies import wide_ep
from validation.studies.wide_ep.rows import load_cases
from validation.studies.wide_ep.serve import deployment_plan


def test_the_shipped_rows_parse_with_their_stated_layouts_and_loads():
    cases, skipped = load_cases(wide_ep.DATA)
    assert not skipped and len(cases) == 7
    assert {c.split for c in cases if "lm-sys" in c.source_url} == {"fit"}  # a fit source of inference_calibration
    assert {c.split for c in cases if "open-infra-index" in c.source_url} == {"test"}
    deepseek = {c.phase: c for c in cases if c.hardware == "h800"}
    assert deepseek["decode"].batch_per_gpu == round(14800 / 8 / 21) == 88  # throughput over the users' speed
    assert deepseek["prefill"].measured == pytest.approx(73700 * (1 - 0.563))  # cache hits taken out: 32,207
    assert (deepseek["decode"].ep, deepseek["decode"].redundant_experts, deepseek["decode"].nodes) == (144, 32, 18)
    plan = deployment_plan(deepseek["prefill"], deepseek["decode"])
    assert plan.mode == "disagg" and (plan.prefill.gpus, plan.decode.gpus) == (32, 144)


def test_one_decode_row_is_simulated_beside_its_measurement(tmp_path):
    with open(wide_ep.DATA, newline="") as handle:
        rows = list(csv.DictReader(handle))
    path = tmp_path / "one.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerow(next(r for r in rows if r["phase"] == "decode" and r["hardware"] == "h100-sxm"))
    summary = wide_ep.run(path, tmp_path / "out")
    (row,) = summary["rows"].values()
    assert row["measured"] == 22282 and row["sim"] > 0 and row["proxy"] > 0
    assert row["sim_error"] == pytest.approx(row["sim"] / 22282 - 1, abs=1e-3)
    assert summary["fit"]["rows"] == 1 and "test" not in summary
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"rows.csv", "summary.json"}


def test_a_csv_in_another_schema_is_one_line_naming_the_missing_columns(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("source_url,value\nhttps://x,1\n")
    cfg = OmegaConf.structured(ValidateAppConfig(study=StudyConfig(name="wide_ep"), data=str(path)))
    with pytest.raises(UserError, match=r"^data: .*x.csv lacks column\(s\) source, hardware"):
        validate_run(cfg)
