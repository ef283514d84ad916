"""The model catalog: presets by name or published id, and ``config.json`` paths, as :class:`ModelSpec`.

``python -m simcore.models.catalog`` prints every preset's total and active parameters beside the
published ones.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from simcore.models.hf_config import from_hf_config
from simcore.models.ids import CONFIG_DIR, MODEL_NAMES, closest_ids, preset_for
from simcore.models.spec import ModelSpec

__all__ = ["get_model", "model_summary"]


@functools.cache
def _preset(name: str) -> ModelSpec:
    return from_hf_config(CONFIG_DIR / f"{name}.json", name=name)


def get_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A preset by name (case-insensitive, see :data:`MODEL_NAMES`), by a published model id of the
    same shape (see :func:`preset_for`), or a ``config.json`` path."""
    text = os.fspath(name_or_path)
    preset = None if text.endswith(".json") else preset_for(text)
    if preset is not None:
        return _preset(preset)
    if text.endswith(".json") or Path(text).is_file():
        return from_hf_config(text)
    close = closest_ids(text)
    hint = f"closest: {', '.join(close)}" if close else f"presets: {', '.join(MODEL_NAMES)}"
    raise ValueError(f"unknown model {text!r} (a preset, a published id or a config.json path); {hint}")


def model_summary(model: ModelSpec | str) -> dict[str, Any]:
    """What ``summary.json`` and ``result.json`` report about the model (parameters in elements)."""
    spec = model if isinstance(model, ModelSpec) else get_model(model)
    return {"name": spec.name, "total_params": spec.total_params(), "active_params": spec.active_params(),
            "num_layers": spec.num_layers, "num_moe_layers": spec.num_moe_layers, "num_experts": spec.num_experts,
            "top_k": spec.top_k, "sliding_window": spec.sliding_window, "window_layers": len(spec.window_layers)}


def _print_catalog() -> None:
    """``python -m simcore.models.catalog``: every preset's counts beside its published totals."""
    print(f"{'preset':18} {'total':>17} {'published':>10} {'diff':>7} {'active':>8} {'act. no emb':>11} "
          f"{'MoE layers':>10} {'windowed':>9}")
    for name in MODEL_NAMES:
        m = get_model(name)
        diff = f"{m.total_params() / m.published_params - 1:+.2%}" if m.published_params else "-"
        active, no_emb = m.active_params() / 1e9, (m.active_params() - m.embedding_params()) / 1e9
        windows = f"{len(m.window_layers)}x{m.sliding_window}" if m.sliding_window else "-"
        print(f"{name:18} {m.total_params():>17,} {m.published_params / 1e9:>9.2f}B {diff:>7} {active:>7.2f}B "
              f"{no_emb:>10.2f}B {m.num_moe_layers:>4}/{m.num_layers:<5} {windows:>9}")


if __name__ == "__main__":
    _print_catalog()
