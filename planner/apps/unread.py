"""Keys typed on the command line that the run would not read: refused in one line, never dropped.

Hydra composes every node of an app's schema, so a key set for another kind of run composes fine and is
then read by nothing: ``serving.concurrency`` on a static run, ``strategy.tp`` or ``sim.contention`` on a
``workload=serving`` run (whose plan is ``serving.plan.*`` and whose steps the lowering prices),
``strategy.*`` beside ``plan=FILE``, ``serving.plan.*`` on ``shard-search`` (which searches the plan), the
pool a serving mode does not serve with. :func:`check_typed_keys` refuses those, naming the key and what to set
instead. Only what the user typed is checked (``typed``: :func:`planner.apps.common.typed_keys`, Hydra's task
overrides); values the config files set themselves, such as an experiment's ``workload.tpot_slo_ms``, are
not the user's and pass.
"""

from __future__ import annotations

import dataclasses

from planner.apps.common import UserError
from planner.serving.config import is_serving
from simcore.config import SpaceConfig

__all__ = ["check_typed_keys"]

#: workload fields a serving run does not read, and the serving field that says the same
_SERVING_FIELD = {"workload.input_len": "serving.isl", "workload.output_len": "serving.osl",
                  "workload.ttft_slo_ms": "serving.ttft_slo_ms", "workload.tpot_slo_ms": "serving.tpot_slo_ms"}


def _space_fields() -> set[str]:
    """The static search space's fields (``planner.batch``, ``planner.max_tp``, ...)."""

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


def _unread_serving_key(cfg, key: str, typed: set[str], app: str) -> str | None:
    """Why a ``serving.*`` key is not read by this serving run (``app``: ``shard-sim`` simulates one plan,
    ``shard-search`` searches them), with what to set instead; None if it is read. ``serving.search.*`` on
    ``shard-sim`` passes: a search's own command line, ``plan=`` its best plan added, replays that plan."""
    parts = key.split(".")
    s = cfg.serving
    if parts[1:2] == ["plan"]:
        if app == "shard-search":
            return "shard-search searches the plan (serving.search.* bounds it); serving.plan.* is shard-sim's"
        if cfg.get("plan"):
            return f"plan={cfg.plan} gives the plan; pass one of plan= and serving.plan.*"
        mode, part = str(s.plan.mode), parts[2] if len(parts) > 2 else ""
        if part == "pool" and mode != "agg":
            return f"serving.plan.mode={mode} serves with serving.plan.prefill and serving.plan.decode; pool is agg's"
        if part in ("prefill", "decode") and mode == "agg":
            return "serving.plan.mode=agg serves with serving.plan.pool; prefill and decode are disagg's and seesaw's"
        if part == "host_kv_bytes_per_gpu" and mode != "seesaw":
            return f"read only under serving.plan.mode=seesaw, got {mode}"
    if key == "serving.trace_requests" and app == "shard-search":
        return "the serving trace is shard-sim's (a search writes none); replay its best plan with shard-sim plan=..."
    if key == "serving.concurrency" and (s.get("trace") or s.get("rate") is not None):
        return "closed-loop clients are the arrivals only without serving.trace and serving.rate; set one of them"
    if key == "serving.spec_accept" and not int(s.spec_tokens) and (app == "shard-sim" or not any(s.search.spec_tokens or [])):
        return "acceptance rates of draft tokens, read only with serving.spec_tokens > 0 (or serving.search.spec_tokens)"
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


def check_typed_keys(cfg, typed: set[str], app: str) -> None:
    """Raise :class:`UserError` for the first key of ``typed`` (in sorted order) that the run ``cfg``
    describes would not read; ``app``: ``shard-sim`` or ``shard-search``."""
    for key in sorted(typed):
        if not is_serving(cfg):
            why = _unread_in_static_run(cfg, key, typed)
        elif key.partition(".")[0] == "serving":
            why = _unread_serving_key(cfg, key, typed, app)
        else:
            why = _unread_under_serving(key)
            why = why and f"not read under workload=serving ({why})"
        if why:
            raise UserError(f"{key}: {why}")
