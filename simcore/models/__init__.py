"""The model catalog: a transformer's shape read from its Hugging Face ``config.json``.

- :mod:`simcore.models.spec`: :class:`ModelSpec`, shapes and parameter counts;
- :mod:`simcore.models.catalog`: :func:`get_model` by preset, published id or ``config.json`` path;
- :mod:`simcore.models.ids`: which preset a published id names;
- :mod:`simcore.models.reader`, :mod:`simcore.models.hf_config`, :mod:`simcore.models.moe_families`:
  the ``config.json`` readers, one per family;
- :mod:`simcore.models.linear_attention`, :mod:`simcore.models.sparse_attention`: Gated DeltaNet and
  DeepSeek sparse attention (parameters, state, kernel costs);
- :mod:`simcore.models.quantization`: weight formats (4-bit experts' bytes with their block scales, a
  checkpoint's expert format, Marlin's MXFP4 padding);
- ``configs/``: the shipped presets.
"""

from simcore.models.catalog import get_model, model_summary
from simcore.models.hf_config import from_hf_config
from simcore.models.ids import CONFIG_DIR, MODEL_NAMES, closest_ids, preset_for, published_ids
from simcore.models.reader import ModelConfigError
from simcore.models.spec import ModelSpec

__all__ = ["CONFIG_DIR", "MODEL_NAMES", "ModelConfigError", "ModelSpec", "closest_ids", "from_hf_config", "get_model",
           "model_summary", "preset_for", "published_ids"]
