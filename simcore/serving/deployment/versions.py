"""What a runtime's release does by default, where releases of one runtime profile differ.

- **Host step overlapped with the GPU.** vLLM v1 ran its step synchronously unless ``--async-scheduling``
  was given, until async scheduling became its default (vllm-project/vllm PR #27614, tracked in issue
  #27679; on by default in the v0.14 releases of January 2026): profile ``vllm`` is v0.14 and later,
  ``vllm-sync`` v0.13 and earlier (:func:`runtime_profile_name`; :mod:`simcore.serving.runtime`).
- **DeepGEMM's padded MoE rows.** vLLM v0.12 to v0.14 run a block-FP8 MoE model's experts through
  DeepGEMM's contiguous grouped GEMM at any batch (``moe_padded_rows`` 128; :mod:`simcore.serving.runtime`):
  E8M0 scales, on by default on Hopper since vllm-project/vllm PR #26197, make ``TritonOrDeepGemmExperts``
  take DeepGEMM whatever the batch; v0.12 turned DeepGEMM's MoE off by default when the experts are split
  8 ways by tensor parallelism (PR #29346); users measure v0.12-v0.14 slower than v0.11 on FP8 MoE models
  until they turn it off (vllm-project/llm-compressor issue #2292). The serving sample's v0.16 and v0.18
  rows show none of it (their low-load gap closes by 16 clients; a padded GEMM costs the same at every
  load). :func:`version_defaults`.
- **The KV cache's type** without a flag: :mod:`.kv_dtype`.

A version is its leading ``MAJOR.MINOR`` (``0.12.0``, ``0.5.6.post2``, ``1.1.0rc2.post2``); a label
with none (a container tag such as ``gpt-oss-dev``) is no version (:func:`parse_version`).
"""

from __future__ import annotations

import re

__all__ = ["parse_version", "runtime_profile_name", "version_defaults", "vllm_moe_tp", "ASYNC_SCHEDULING_SINCE",
           "DEEPGEMM_MOE_VERSIONS", "DEEPGEMM_BLOCK_ROWS"]

#: the first vLLM release whose host step overlaps the GPU by default (module doc)
ASYNC_SCHEDULING_SINCE = (0, 14)
#: vLLM releases [first, last) that run block-FP8 experts through DeepGEMM's padded layout (module doc)
DEEPGEMM_MOE_VERSIONS = ((0, 12), (0, 15))
#: rows of DeepGEMM's contiguous-layout block, each local expert's segment padded to it
DEEPGEMM_BLOCK_ROWS = 128


def parse_version(text: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a release's label, ``None`` where it starts with none (module doc)."""
    found = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(found.group(1)), int(found.group(2))) if found else None


def runtime_profile_name(name: str, version: tuple[int, int] | None) -> str:
    """The runtime profile that prices profile ``name`` at ``version`` (``None``: the profile as it is):
    ``vllm`` before v0.14 is ``vllm-sync`` (module doc); every other profile is itself."""
    if name == "vllm" and version is not None and version < ASYNC_SCHEDULING_SINCE:
        return "vllm-sync"
    return name


def vllm_moe_tp(tp: int, expert_ranks: int) -> int:
    """vLLM's MoE tensor-parallel degree: 1 once the experts are split expert-parallel (``expert_ranks`` > 1,
    ``--enable-expert-parallel``), else the tensor-parallel degree ``tp``."""
    return 1 if expert_ranks > 1 else tp


def version_defaults(scheduler: str, version: tuple[int, int] | None, moe: bool, precision: str, moe_tp: int) -> dict:
    """Runtime-profile fields runtime ``scheduler`` at ``version`` sets by default for a model (``moe``:
    whether it has routed experts; ``precision``: its weights', ``Workload.precision``) whose experts its
    MoE layers split ``moe_tp`` ways by tensor parallelism (:func:`vllm_moe_tp`); empty: the profile's.
    vLLM v0.12-v0.14, FP8 experts not split 8 ways: DeepGEMM's padded rows (module doc)."""
    first, last = DEEPGEMM_MOE_VERSIONS
    if scheduler != "vllm" or not moe or precision != "fp8" or version is None or not first <= version < last:
        return {}
    return {} if moe_tp == 8 else {"moe_padded_rows": DEEPGEMM_BLOCK_ROWS}
