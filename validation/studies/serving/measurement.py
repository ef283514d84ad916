"""What one measurement of the serving sample is, however many times and at whatever precision it is listed.

The sample lists some InferenceX runs more than once: under its database dump and under two daily
source files, DeepSeek-R1's runs also as ``deepseek-ai/DeepSeek-V3`` (ids ``dsr1_*``), and its
Qwen3.5-397B and Kimi-K2.5 runs a third time in a gap-analysis file (``source_file=qwen3.5-397b-gap-analysis.csv``,
``kimi-k2.5-gap-analysis.csv``) whose TTFT and TPOT are rounded to 0.01 ms (``307.79`` for
``307.79067178664263``). Rows are one measurement when they have the same backend, mode, lengths and
client count (:func:`run_key`) and their measured TTFT and TPOT agree to the precision of the less
precise copy, read to 0.01 ms at the coarsest, or to six significant digits where both are full floats
(the copies differ in the last bits) (:func:`same_values`). A rounded copy may differ from its run by 0.005 ms; two distinct runs of
one configuration are further apart than that: the closest two in the shipped sample (gpt-oss-120b on
TensorRT-LLM, 8k/1k, 4 clients, TP 4 with and without expert parallelism) differ by 0.058 ms in TTFT
(``tests/test_serving_study.py`` holds the sample's closest pair above twice that tolerance).

:func:`duplicates` names, for every row, the row that stands for its measurement: the first of its
group that maps to a simulation, else the first. :func:`measurement_key` is the exact key a simulated
row is journaled under (:mod:`.journal`).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from validation.studies.serving.mapping import RowCase

__all__ = ["duplicates", "measurement_groups", "measurement_key", "run_key", "same_values"]

#: The measured latencies two copies of one run must agree on (module doc)
_LATENCIES = ("silicon_ttft_ms", "silicon_tpot_ms")
#: Half the coarsest rounding a copy is read to, 0.01 ms (module doc): a value written coarser (``100``)
#: is read as if to 0.01 ms, so it never absorbs a run 0.1 ms away
_COARSEST_HALF_STEP_MS = 0.005


def _sig(text) -> str:
    try:
        return f"{float(text):.6g}"
    except (TypeError, ValueError):
        return str(text).strip()


def run_key(row: dict) -> tuple:
    """The configuration a row measured: backend, mode, lengths and client count (module doc)."""
    found = re.search(r"silicon_concurrency=(\d+)", row.get("silicon_data_source", ""))
    return (row.get("backend", "").strip(), row.get("mode", "").strip(), _sig(row.get("isl")), _sig(row.get("osl")),
            found.group(1) if found else "")


def measurement_key(row: dict) -> tuple:
    """A row's configuration and its measured TTFT and TPOT to six significant digits: the key its
    simulation is journaled under."""
    return run_key(row) + tuple(_sig(row.get(f)) for f in _LATENCIES)


def _half_step(text: str) -> float | None:
    """Half the last decimal place ``text`` is written to (0.005 for ``307.79``), None if not a number."""
    try:
        exponent = Decimal(text.strip()).as_tuple().exponent
    except (InvalidOperation, AttributeError):
        return None
    return 0.5 * 10.0 ** exponent if isinstance(exponent, int) else None


def _same_value(a, b) -> bool:
    if _sig(a) == _sig(b):
        return True
    step_a, step_b = _half_step(str(a)), _half_step(str(b))
    if step_a is None or step_b is None:
        return False
    return abs(float(a) - float(b)) <= min(max(step_a, step_b), _COARSEST_HALF_STEP_MS) * (1 + 1e-9)


def same_values(a: dict, b: dict) -> bool:
    """Whether two rows' measured TTFT and TPOT agree to the precision of the less precise copy, 0.01 ms at
    the coarsest (module doc)."""
    return all(_same_value(a.get(f, ""), b.get(f, "")) for f in _LATENCIES)


def measurement_groups(rows: list[dict]) -> list[list[int]]:
    """The rows' indices, grouped by measurement (module doc), each group in row order."""
    by_run: dict[tuple, list[list[int]]] = {}
    groups: list[list[int]] = []
    for i, row in enumerate(rows):
        clusters = by_run.setdefault(run_key(row), [])
        home = next((c for c in clusters if any(same_values(rows[j], row) for j in c)), None)
        if home is None:
            home = []
            clusters.append(home)
            groups.append(home)
        home.append(i)
    return groups


def duplicates(cases: list[RowCase]) -> list[str]:
    """Per case, ``""`` or the id of the row that stands for its measurement (module doc)."""
    out = [""] * len(cases)
    for members in measurement_groups([c.row for c in cases]):
        keep = next((i for i in members if not cases[i].skip), members[0])
        for i in members:
            if i != keep:
                out[i] = cases[keep].row.get("id", "") or f"row {keep + 1}"
    return out
