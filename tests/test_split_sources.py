"""A source is in one split only, across every shipped CSV (``validation/studies/common/split.py``)."""

from __future__ import annotations

import csv

from validation.studies.common.split import DATA_DIR, mixed_sources, split_of

_AZURE = "https://github.com/Azure/AI-benchmarking-guide/blob/ae0b6a7f47caee92985aafc546faf30e9d4a3ca7/" \
         "Azure_Results/ND_H100_v5_results.md"


def test_no_source_is_in_both_splits_across_the_shipped_csvs():
    assert len(list(DATA_DIR.glob("*.csv"))) >= 20  # every data file, not an empty folder
    assert mixed_sources() == {}


def test_the_azure_source_whose_kernel_rows_set_constants_is_fit_everywhere():
    """Its GEMM, HBM and attention rows are fit rows of kernels_h100.csv; its two static-batch rows in
    inference_test.csv were test rows until the split was made to hold."""
    splits = {}
    for path in DATA_DIR.glob("*.csv"):
        with path.open(newline="") as handle:
            for row in csv.DictReader(handle):
                if row.get("source_url", "").strip() == _AZURE:
                    splits.setdefault(path.name, set()).add(split_of(row))
    assert splits == {"kernels_h100.csv": {"fit"}, "inference_test.csv": {"fit"}}


def test_a_source_in_two_splits_is_named_with_its_files(tmp_path):
    header = "source_url,value,split\n"
    (tmp_path / "a.csv").write_text(header + "https://x,1,fit\nhttps://y,1,fit\n")
    (tmp_path / "b.csv").write_text(header + "https://x,2,test\n")
    assert mixed_sources(sorted(tmp_path.glob("*.csv"))) == {"https://x": {"fit": ["a.csv"], "test": ["b.csv"]}}
