"""Shared fixtures: small cost contexts built without topology graphs; a CSV of rows (``from conftest import write_rows``)."""

import csv
from pathlib import Path

import pytest

from simcore.cluster import Cluster
from simcore.lowering import CostContext
from simcore.models import get_model
from simcore.workload import Workload


def make_ctx(model: str = "llama-3.1-70b", gpus: int = 8, phase: str = "decode", precision: str = "bf16",
             input_len: int = 2048, output_len: int = 128, gpu: str = "h100-sxm", **slo) -> CostContext:
    return CostContext(get_model(model), Workload(phase, precision, input_len, output_len, **slo),
                       Cluster.simple(gpu, gpus))


@pytest.fixture
def ctx_factory():
    return make_ctx


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a CSV with the first row's keys as its header; returns ``path``."""
    with Path(path).open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return Path(path)
