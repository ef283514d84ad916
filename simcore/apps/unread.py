"""Keys typed on the command line that the run would not read: refused in one line, never dropped.

Hydra composes every node of an app's schema, so a key set for another kind of run composes fine and is
then read by nothing: ``serving.concurrency`` on a static run, ``strategy.tp`` or ``sim.contention`` on a
``workload=serving`` run (whose plan is ``serving.plan.*`` and whose steps the lowering prices),
``strategy.*`` beside ``plan=FILE``. :func:`check_typed_keys` refuses those, naming the key and what to set
instead. Only what the user typed is checked (``typed``: :func:`simcore.apps.common.typed_keys`, Hydra's task
overrides); values the config files set themselves, such as an experiment's ``workload.tpot_slo_ms``, are
not the user's and pass.
"""

from __future__ import annotations

import dataclasses

from simcore.apps.common import UserError
from simcore.apps.serving import is_serving

__all__ = ["check_typed_keys"]

#: workload fields a serving run does not read, and the serving field that says the same
_SERVING_FIELD = {"workload.input_len": "serving.isl", "workload.output_len": "serving.osl",
                  "workload.ttft_slo_ms": "serving.ttft_slo_ms", "workload.tpot_slo_ms": "serving.tpot_slo_ms"}


def _space_fields() -> set[str]:
    """The static search space's fields (``planner.batch``, ``planner.max_tp``, ...)."""
    from simcore.config import SpaceConfig

    return {f.name for f in dataclasses.fields(SpaceConfig)}


def _unread_under_serving(key: str) -> str | None:
    """Why a static run's key is not read by a serving run, with what to set instead; None if it is read."""
    head, _, rest = key.partition(".")
    if key in _SERVING_FIELD:
        return f"requests carry their own lengths and SLOs; set {_SERVING_FIELD[key]}"
    if head == "strategy":
        return "the plan is serving.plan.* or plan=FILE"
    if head == "sim" and rest and not rest.startswith("routing"):
        return "a serving step is priced by the lowering, which reads sim.routing.* alone"
    if head == "planner" and rest.split(".")[0] in _space_fields():
        return "a serving search's space is serving.search.*: tp, ep, pp, max_num_seqs, modes"
    return None


def _unread_in_static_run(cfg, key: str, typed: set[str]) -> str | None:
    """Why a key is not read by a static run (``shard-sim``'s ``plan`` / ``strategy`` / Megatron search);
    None if it is read."""
    head, _, rest = key.partition(".")
    if head == "serving":
        return f"read only under workload=serving, got workload.phase {cfg.workload.phase}"
    has_strategy = any(k.partition(".")[0] == "strategy" for k in typed)
    if head == "strategy" and cfg.get("plan"):
        return f"plan={cfg.plan} gives the strategy; pass one of plan= and strategy.*"
    if head == "planner" and "plan" in cfg and (cfg.get("plan") or has_strategy) \
            and rest.split(".")[0] in _space_fields():
        return "bounds the Megatron search shard-sim runs only when neither plan= nor strategy.* is given"
    return None


def check_typed_keys(cfg, typed: set[str]) -> None:
    """Raise :class:`UserError` for the first key of ``typed`` (in sorted order) that the run ``cfg``
    describes would not read."""
    for key in sorted(typed):
        why = _unread_under_serving(key) if is_serving(cfg) else _unread_in_static_run(cfg, key, typed)
        if why:
            raise UserError(f"{key}: not read under workload=serving ({why})" if is_serving(cfg) else f"{key}: {why}")
