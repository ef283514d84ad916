"""Which preset a published model id names: ``moonshotai/Kimi-K2.5`` is ``kimi-k2``.

Each preset's ``config.json`` in ``simcore/models/configs`` names its own Hugging Face id (``_source``);
the tables below add the published ids whose text model has the same architecture and shape (fine-tunes,
FP8 checkpoints, renamed organisations), and the ids of architectures the cost model refuses, so a
serving measurement's ``model_path`` maps to a preset or to a one-line refusal, never to a guess.

Examples
--------
>>> preset_for("moonshotai/Kimi-K2.5")
'kimi-k2'
>>> preset_for("Llama-3.3-70B-Instruct")
'llama-3.1-70b'
>>> preset_for("someone/unknown-model") is None
True
"""

from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

from simcore.models.reader import REJECTED, ModelConfigError

__all__ = ["MODEL_NAMES", "CONFIG_DIR", "preset_for", "published_ids", "closest_ids"]

#: Directory holding the preset ``<name>.json`` files.
CONFIG_DIR = Path(__file__).with_name("configs")

MODEL_NAMES: tuple[str, ...] = (
    "gpt-j-6b", "llama-2-7b", "llama-2-70b", "llama-3-8b", "llama-3-70b", "llama-3.1-8b",
    "llama-3.1-70b", "llama-3.1-405b", "mistral-7b", "falcon-180b", "mixtral-8x7b", "mixtral-8x22b",
    "deepseek-v3", "gpt-moe-1.2t", "gpt-moe-1.6t",
    "qwen3-32b", "qwen3-235b-a22b", "qwen2-57b-a14b", "deepseek-v2", "deepseek-v2-lite", "deepseek-r1",
    "gpt-oss-120b", "gpt-oss-20b", "llama-4-scout", "llama-4-maverick", "kimi-k2", "minimax-m2",
    "qwen3-next-80b-a3b", "qwen3.5-397b-a17b", "qwen3-30b-a3b", "qwen3-coder-480b-a35b", "qwen2.5-72b",
    "glm-4.5-air", "glm-5", "deepseek-v3.2",
)


# Published model ids whose text model has a preset's architecture and shape (beside each preset's own
# ``_source``), matched case-insensitively on the whole id or on the name after the last "/".
_SAME_SHAPE = {
    "kimi-k2": ("moonshotai/Kimi-K2.5", "moonshotai/Kimi-K2-Instruct-0905", "moonshotai/Kimi-K2-Base",
                "moonshotai/Kimi-K2-Thinking"),
    "minimax-m2": ("MiniMaxAI/MiniMax-M2.1", "MiniMaxAI/MiniMax-M2.5"),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-V3-Base", "deepseek-ai/DeepSeek-V3.1"),
    "deepseek-r1": ("deepseek-ai/DeepSeek-R1-0528",),
    "qwen3-235b-a22b": ("Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507",
                        "Qwen/Qwen3-235B-A22B-FP8"),
    "qwen3-32b": ("Qwen/Qwen3-32B-FP8",),
    "qwen2-57b-a14b": ("Qwen/Qwen2-57B-A14B-Instruct",),
    "llama-4-scout": ("meta-llama/Llama-4-Scout-17B-16E-Instruct",),
    "llama-4-maverick": ("meta-llama/Llama-4-Maverick-17B-128E-Instruct",
                         "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-Instruct-v0.1",),
    "mixtral-8x22b": ("mistralai/Mixtral-8x22B-Instruct-v0.1",),
    # nvidia/...-FP8: NVIDIA's ModelOpt FP8 checkpoint, the serving sample's (its KV cache FP8 by default:
    # simcore.serving.deployment.kv_dtype)
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B-Instruct",
                     "nvidia/Llama-3.1-8B-Instruct-FP8"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
                      "RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen/Qwen3-30B-A3B-Thinking-2507", "Qwen/Qwen3-30B-A3B-FP8"),
    "qwen3-coder-480b-a35b": ("Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8",),
    "qwen2.5-72b": ("Qwen/Qwen2.5-72B",),
    "glm-4.5-air": ("zai-org/GLM-4.5-Air-FP8",),
    "llama-3.1-405b": ("meta-llama/Llama-3.1-405B-Instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8"),
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B", "Qwen/Qwen3-Next-80B-A3B-Instruct-FP8",
                           "Qwen/Qwen3-Next-80B-A3B-Thinking", "Qwen/Qwen3-Next-80B-A3B-Thinking-FP8"),
    "qwen3.5-397b-a17b": ("Qwen/Qwen3.5-397B-A17B-FP8",),
    # zhipuai: zai-org's former name, the serving sample's
    "glm-5": ("zai-org/GLM-5-FP8", "zai-org/GLM-5.1", "zai-org/GLM-5.1-FP8", "zhipuai/GLM-5"),
    "deepseek-v3.2": ("deepseek-ai/DeepSeek-V3.2-Exp",),
}
# Published model ids of architectures the cost model refuses, with their model_type.
_REFUSED_IDS = {"MiniMaxAI/MiniMax-M1-80k": "minimax_m1"}


@functools.cache
def _ids() -> tuple[dict[str, str], dict[str, str]]:
    """(model id -> preset, model id -> refused model_type), keyed by the lower-case id and its name."""
    def keys(model_id: str) -> tuple[str, str]:
        return model_id.lower(), model_id.lower().rsplit("/", 1)[-1]

    presets: dict[str, str] = {}
    for name in MODEL_NAMES:
        source = json.loads((CONFIG_DIR / f"{name}.json").read_text()).get("_source", "")
        for model_id in (source, *_SAME_SHAPE.get(name, ())):
            if "/" in model_id:
                presets.update(dict.fromkeys(keys(model_id), name))
    refused = {key: kind for model_id, kind in _REFUSED_IDS.items() for key in keys(model_id)}
    return presets, refused


def preset_for(model_id: str) -> str | None:
    """The preset of a published model id (``moonshotai/Kimi-K2.5`` -> ``kimi-k2``), else ``None``;
    raises :class:`ModelConfigError` for the id of an architecture the cost model refuses."""
    presets, refused = _ids()
    key = model_id.lower()
    if key in MODEL_NAMES:
        return key
    if key in refused:
        kind = refused[key]
        raise ModelConfigError(f"model {model_id!r} is a {kind!r} model with {REJECTED[kind]}, "
                               "which the cost model does not express")
    return presets.get(key)


def published_ids() -> tuple[str, ...]:
    """Every published model id the catalog maps to a preset (each preset's own and its same-shape ids)."""
    ids = []
    for name in MODEL_NAMES:
        source = json.loads((CONFIG_DIR / f"{name}.json").read_text()).get("_source", "")
        ids += [i for i in (source, *_SAME_SHAPE.get(name, ())) if "/" in i]
    return tuple(dict.fromkeys(ids))


def closest_ids(name: str, n: int = 3) -> list[str]:
    """The presets and published ids closest to ``name`` (difflib, case-insensitive), for error messages."""
    known = {k.lower(): k for k in (*MODEL_NAMES, *published_ids())}
    close = difflib.get_close_matches(name.lower(), known, n=n, cutoff=0.4)
    if not close and "/" in name:  # an unknown organisation: match the model's own name
        tails = {k.rsplit("/", 1)[-1]: k for k in known}
        close = [tails[t] for t in difflib.get_close_matches(name.lower().rsplit("/", 1)[-1], tails, n=n, cutoff=0.4)]
    return [known[k] for k in close]
