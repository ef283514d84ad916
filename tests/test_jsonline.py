"""simcore.files.dumps: the figures' JSON is strict JSON (no NaN or Infinity)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from simcore.files import dumps


def test_non_finite_numbers_become_null_and_the_rest_is_kept():
    value = {"a": math.nan, "b": [1.5, np.float64("inf"), (2, -math.inf)], "c": {"d": np.float64(0.25), "e": "NaN"}}
    text = dumps(value)
    assert json.loads(text) == {"a": None, "b": [1.5, None, [2, None]], "c": {"d": 0.25, "e": "NaN"}}
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    with pytest.raises(ValueError):  # json.dumps itself would have written NaN
        json.dumps(math.nan, allow_nan=False)


def test_numpy_float32_and_arrays_are_strict_too():
    """``default=float`` would turn a float32 nan into a float only after the walk, and json refuses it."""
    text = dumps({"f32": np.float32("nan"), "arr": np.array([1.0, np.nan]), "ok": np.float32(0.5)}, default=float)
    assert json.loads(text) == {"f32": None, "arr": [1.0, None], "ok": 0.5}


def test_every_tool_prints_its_figures_through_strict_dumps():
    """The last line of every benchmark, fit and study is strict JSON: none prints ``json.dumps`` itself."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "validation"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py") if "print(json.dumps(" in p.read_text()]
    assert offenders == []


def test_the_apps_result_files_are_strict_json(tmp_path):
    """``atomic_write_json`` (every app's results.json / summary.json / result.json) writes null for a
    figure with no value, and still turns numpy scalars and arrays into JSON."""
    from planner.apps.common import atomic_write_json

    path = atomic_write_json(tmp_path / "r.json", {"reranked": math.nan, "n": np.int64(3), "v": np.array([0.5, np.inf])})

    def refuse(constant):
        raise ValueError(constant)

    assert json.loads(path.read_text(), parse_constant=refuse) == {"reranked": None, "n": 3, "v": [0.5, None]}
