"""validation.jsonline: the figures' JSON is strict JSON (no NaN or Infinity)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from validation import jsonline


def test_non_finite_numbers_become_null_and_the_rest_is_kept():
    value = {"a": math.nan, "b": [1.5, np.float64("inf"), (2, -math.inf)], "c": {"d": np.float64(0.25), "e": "NaN"}}
    text = jsonline.dumps(value)
    assert json.loads(text) == {"a": None, "b": [1.5, None, [2, None]], "c": {"d": 0.25, "e": "NaN"}}
    assert "NaN" not in text.replace('"NaN"', "") and "Infinity" not in text
    with pytest.raises(ValueError):  # json.dumps itself would have written NaN
        json.dumps(math.nan, allow_nan=False)
