"""Weight formats: the bytes a weight-only 4-bit routed expert occupies, its block scales included, and which
format a checkpoint stores its experts in.

A 4-bit expert weight is half a byte, plus the scale its block of weights shares, which the checkpoint
stores beside it and the GEMM reads with it (the weight-only kernels on Hopper, Marlin and Triton's
``matmul_ogs``, dequantize each block with its scale on the fly). Per weight element:

- ``mxfp4`` (the OCP Microscaling format): blocks of 32 FP4 (E2M1) values sharing one 8-bit E8M0 scale:
  0.5 + 1/32 = 0.53125 (the "4.25 bits per parameter" of the gpt-oss model card).
- ``nvfp4``: blocks of 16 FP4 values sharing one FP8 (E4M3) scale (plus one FP32 scale per tensor,
  negligible): 0.5 + 1/16 = 0.5625.
- ``int4_g32``: group-wise INT4 with a 16-bit scale per 32 weights (compressed-tensors ``pack-quantized``,
  ``strategy: group``, ``group_size: 32``, symmetric: no zero point): 0.5 + 2/32 = 0.5625.
- ``int4_g128``: the same with groups of 128, the GPTQ / AWQ / compressed-tensors default: 0.5 + 2/128.

Which format a row's experts are in is the checkpoint's, not the sample's label (aiconfigurator labels
gpt-oss-120b ``nvfp4``; its checkpoint is MXFP4): :data:`CHECKPOINT_FORMAT` names the published
checkpoints, each with its source; a checkpoint not named there takes its format from the label
(``mxfp4``, ``nvfp4``; any INT4 label: ``int4_g128``, the common default; :func:`expert_format`), or,
given no label, from its ``config.json``'s ``quantization_config`` (:func:`checkpoint_expert_format`).

A kernel may hold an expert's matrices padded to its tiles; the padding is loaded into HBM and read
with the weights. vLLM's Marlin MXFP4 MoE kernel (:func:`marlin_padding`; which deployments run it:
:mod:`simcore.serving.deployment.moe_kernels`): ``Mxfp4MoEMethod.create_weights`` pads for "n % 256 == 0 and k % 128 == 0" of both
GEMMs (gate/up: n = 2 x inter, k = hidden; down: n = hidden, k = inter), the intermediate size on one GPU
to a multiple of 128 and the hidden size to 256 (the same in the two vLLM versions read, one with and
one without the ``--mxfp4-backend`` option). gpt-oss (2880 both): 2944 x 3072 at TP 1, +9.0% of the
experts' elements; 360 -> 384 at TP 8 (and 720 -> 768, 1440 -> 1536), +13.8%. vLLM's other Hopper path,
``triton_kernels``' ``matmul_ogs``, pads less (the intermediate size to 64; its Hopper value layout to 64
values along K and 16 rows: none for gpt-oss at TP 1), and is not what these rows run.
"""

from __future__ import annotations

import json
from pathlib import Path

from simcore.models.ids import CONFIG_DIR, preset_for

__all__ = ["FORMAT_BYTES", "EXPERT_FORMATS", "CHECKPOINT_FORMAT", "expert_format", "expert_weight_bytes",
           "checkpoint_expert_format", "marlin_padding", "round_up"]

#: Bytes per weight element of each block-scaled 4-bit format (module doc): 4 bits plus the block's scale
FORMAT_BYTES = {
    "mxfp4": 0.5 + 1 / 32,
    "nvfp4": 0.5 + 1 / 16,
    "int4_g32": 0.5 + 2 / 32,
    "int4_g128": 0.5 + 2 / 128,
}

#: The routed experts' format of published 4-bit checkpoints, by Hugging Face id:
#: gpt-oss (``quantization_config.quant_method: mxfp4`` in its config.json, shipped here as
#: ``simcore/models/configs/gpt-oss-120b.json``); Kimi-K2.5 and Kimi-K2-Thinking (native INT4 from
#: quantization-aware training: compressed-tensors, ``num_bits 4``, ``group_size 32``, symmetric, the
#: routed experts only; the models' config.json, as ROCm ATOM's Kimi-K2.5 recipe also states)
CHECKPOINT_FORMAT = {
    "openai/gpt-oss-120b": "mxfp4",
    "openai/gpt-oss-20b": "mxfp4",
    "moonshotai/Kimi-K2.5": "int4_g32",
    "moonshotai/Kimi-K2-Thinking": "int4_g32",
}

#: Every format a routed expert may be stored in, bytes per weight element: the 4-bit formats above, and
#: FP8 (one byte; the block scales of a 128 x 128 FP8 checkpoint left out, as for every FP8 weight here)
#: and BF16 experts
EXPERT_FORMATS = FORMAT_BYTES | {"fp8": 1.0, "bf16": 2.0}

_LABELS = {"mxfp4": "mxfp4", "nvfp4": "nvfp4", "fp4": "nvfp4"}


def expert_format(model_path: str, label: str) -> str:
    """The routed experts' format of a 4-bit row (a :data:`FORMAT_BYTES` key): its checkpoint's where
    :data:`CHECKPOINT_FORMAT` knows it, else the row's precision label's (module doc)."""
    return CHECKPOINT_FORMAT.get(model_path.strip()) or _LABELS.get(label.strip().lower(), "int4_g128")


def expert_weight_bytes(model_path: str, label: str) -> float:
    """Bytes per routed-expert weight element of a 4-bit row, in its :func:`expert_format`."""
    return FORMAT_BYTES[expert_format(model_path, label)]


def checkpoint_expert_format(model: str) -> str | None:
    """The 4-bit format (a :data:`FORMAT_BYTES` key) a checkpoint stores its routed experts in, ``None``
    where it stores none in 4 bits: :data:`CHECKPOINT_FORMAT` for a published id it names, else its
    ``config.json``'s ``quantization_config`` (``model``: a preset, a published id or a ``config.json``
    path): ``quant_method: mxfp4`` (gpt-oss); compressed-tensors with 4-bit weight groups of 32 or 128
    (``int4_g32``, ``int4_g128``); ModelOpt ``quant_algo: NVFP4``."""
    text = str(model).strip()
    if text in CHECKPOINT_FORMAT:
        return CHECKPOINT_FORMAT[text]
    try:
        preset = None if text.endswith(".json") else preset_for(text)
    except ValueError:  # an architecture the catalog refuses (ModelConfigError): no config to read
        return None
    path = CONFIG_DIR / f"{preset}.json" if preset else Path(text)
    try:
        quant = json.loads(path.read_text()).get("quantization_config") or {}
    except (OSError, ValueError):
        return None
    return _config_format(quant) if isinstance(quant, dict) else None


def _config_format(quant: dict) -> str | None:
    """The 4-bit expert format a ``quantization_config`` declares (:func:`checkpoint_expert_format`)."""
    method = str(quant.get("quant_method", "")).lower()
    if method == "mxfp4":
        return "mxfp4"
    if str(quant.get("quant_algo", "")).upper() == "NVFP4":
        return "nvfp4"
    if method == "compressed-tensors":
        for group in (quant.get("config_groups") or {}).values():
            weights = (group or {}).get("weights") or {}
            if weights.get("num_bits") == 4 and weights.get("group_size") in (32, 128):
                return f"int4_g{weights['group_size']}"
    return None


def round_up(value: int, step: int) -> int:
    """``value`` rounded up to a multiple of ``step``."""
    return -(-value // step) * step


def marlin_padding(hidden: int, inter: int) -> float:
    """Padded over unpadded elements of one expert's gate/up (``2 inter x hidden``) and down (``hidden x
    inter``) matrices in vLLM's Marlin MXFP4 layout, ``inter`` the intermediate size on one GPU (module doc)."""
    if hidden < 1 or inter < 1:
        raise ValueError(f"hidden and inter must be positive, got {hidden} and {inter}")
    return round_up(inter, 128) * round_up(hidden, 256) / (inter * hidden)
