"""The ``shard-sim workload=serving`` command line that reproduces one simulated row of the study.

The study maps a row onto a model, a plan, a runtime at its release, the weights' and KV cache's formats
and the harness's launch flags (:mod:`.mapping`, :mod:`.launch`); each of those is a field of the
``serving`` node of ``shard-sim`` (:class:`planner.serving.config.ServingAppConfig`), mapped onto the same
settings of :mod:`simcore.serving.deployment`. :func:`shard_sim_command` writes them out, so that the
``command`` column of ``rows.csv`` reruns the row's ``sim_ttft_ms`` and ``sim_tpot_ms`` with the product
(``tests/test_serving_command_column.py`` runs a sample of them):

- the model preset, the GPU's topology with as many 8-GPU nodes as the row's cluster
  (``topology=h200-ib-rail topology.num_nodes=N``), the plan (``serving.plan.*``);
- the runtime at the row's release where the release is a version (``serving.runtime=vllm
  serving.runtime_version=0.12.0``), else the profile the study gave it (``vllm-sync`` for the sample's
  unversioned vLLM runs);
- ``workload.precision``, ``serving.expert_format`` (4-bit experts), ``serving.kv_dtype``,
  ``serving.mamba_ssm_dtype`` where the launch sets the state's type;
- each launch flag the study set (``serving.mem_fraction``, ``serving.max_num_batched_tokens``,
  ``serving.cuda_graph_max_bs``, TensorRT-LLM's batch waiting and attention-DP balancing), and
  ``serving.deep_gemm_moe`` where the row's MoE TP degree gives the release another default than the
  plan's layout does; the MoE kernels of the experts' format on the GPU are the runtime's choice in both;
- the client: ``serving.concurrency``, ``serving.num_requests``, ``serving.isl`` / ``serving.osl`` drawn
  over ``serving.range_ratio``, ``serving.seed``; MoE routing sampled (``sim.routing.sampled=true``), KV
  hand-offs at idle-fabric time (``serving.network=false``, as the study simulates), no request tracks in
  the trace (``serving.trace_requests=0``: the results are the same).
"""

from __future__ import annotations

import shlex

from simcore.models import get_model
from simcore.models.quantization import expert_format
from simcore.serving.deployment import (
    parse_version,
    runtime_profile_name,
    version_defaults,
    vllm_moe_tp,
)
from simcore.serving.deployment.flags import PROFILE_FIELD, STATE_BYTES
from simcore.serving.deployment.moe_kernels import TRITON_MOE_FIELDS
from validation.studies.serving.mapping import NODE_GPUS, RowCase

__all__ = ["shard_sim_command", "TOPOLOGIES"]

#: the topology preset of each GPU the study maps a ``system`` onto (nodes of 8 GPUs on NVSwitch)
TOPOLOGIES = {"h100-sxm": "h100-ib-rail", "h200": "h200-ib-rail", "b200": "b200-ib-rail"}
#: the ``serving.*`` field of each runtime-profile field a launch sets (:data:`PROFILE_FIELD` inverted)
_FLAG_OF = {field: flag for flag, field in PROFILE_FIELD.items()} | {"mem_fraction": "mem_fraction"}


def shard_sim_command(case: RowCase, num_requests: int, range_ratio: float) -> str:
    """The command line that simulates ``case`` as the study does (module doc): ``num_requests`` requests
    with lengths drawn over ``range_ratio`` of the row's ``isl`` and ``osl``."""
    ctx, gpu = case.ctx, case.ctx.cluster.gpu.name
    args = ["shard-sim", "workload=serving", f"model={case.model}", f"topology={TOPOLOGIES[gpu]}",
            f"topology.num_nodes={ctx.cluster.num_gpus // NODE_GPUS}"]
    args += _plan_args(case)
    args += _runtime_args(case)
    args += _format_args(case)
    args += _flag_args(case)
    args += [f"serving.concurrency={case.concurrency}", f"serving.num_requests={num_requests}",
             f"serving.isl={case.isl}", f"serving.osl={case.osl}", f"serving.range_ratio={range_ratio}",
             "serving.seed=0", "serving.network=false", "serving.trace_requests=0"]
    if ctx.routing is not None and ctx.routing.sampled:
        args.append("sim.routing.sampled=true")
    return shlex.join(args)


def _plan_args(case: RowCase) -> list[str]:
    plan = case.plan
    args = [f"serving.plan.mode={plan.mode}"]
    for role, pool in plan.pools:
        key = "pool" if role == "both" else role
        s = pool.strategy
        fields = {"tp": s.tp, "ep": s.ep, "pp": s.pp, "workers": pool.workers, "max_num_seqs": pool.max_num_seqs,
                  "moe_ep": pool.moe_ep}
        args += [f"serving.plan.{key}.{k}={v}" for k, v in fields.items()]
    return args


def _runtime_args(case: RowCase) -> list[str]:
    """The runtime at its release where the row gives a version that names the same profile, else the profile."""
    backend = (case.row.get("backend") or "").strip()
    label = (case.row.get("backend_version") or "").strip()
    version = parse_version(label)
    if version is not None and runtime_profile_name(backend, version) == case.runtime:
        return [f"serving.runtime={backend}", f"serving.runtime_version={label}"]
    return [f"serving.runtime={case.runtime}"]


def _format_args(case: RowCase) -> list[str]:
    w, preset = case.ctx.workload, get_model(case.model)
    args = [f"workload.precision={w.precision}", f"serving.kv_dtype={w.kv_precision or w.precision}"]
    if w.expert_weight_bytes is not None:
        label = case.row.get("moe_quant_mode") or case.row.get("precision") or ""
        args.append(f"serving.expert_format={expert_format(case.row.get('model_path') or '', label)}")
    else:
        args.append(f"serving.expert_format={w.precision}" if preset.is_moe else "")
    state = case.ctx.model.linear_state_bytes
    if state != preset.linear_state_bytes:
        args.append(f"serving.mamba_ssm_dtype={next(k for k, v in STATE_BYTES.items() if v == state)}")
    return [a for a in args if a]


def _flag_args(case: RowCase) -> list[str]:
    """The launch flags of ``case.launch``; its MoE kernel fields are the runtime's choice in the app too."""
    args, launch = [], dict(case.launch)
    padded = launch.pop("moe_padded_rows", 0)
    for field in TRITON_MOE_FIELDS:
        launch.pop(field, None)
    for field, value in sorted(launch.items()):
        flag = _FLAG_OF.get(field, field)
        args.append(f"serving.{flag}={str(value).lower() if isinstance(value, bool) else value}")
    pool = case.plan.pools[-1][1]
    moe_tp = vllm_moe_tp(pool.strategy.tp, pool.strategy.ep * pool.moe_ep)
    w, model = case.ctx.workload, case.ctx.model
    backend = (case.row.get("backend") or "").strip()
    version = parse_version(_version_arg(case))
    default = version_defaults(backend, version, model.is_moe, w.precision, moe_tp).get("moe_padded_rows", 0)
    if padded != default:
        args.append(f"serving.deep_gemm_moe={'true' if padded else 'false'}")
    return args


def _version_arg(case: RowCase) -> str | None:
    """The ``serving.runtime_version`` :func:`_runtime_args` passes, or ``None``."""
    arg = next((a for a in _runtime_args(case) if a.startswith("serving.runtime_version=")), None)
    return arg.partition("=")[2] if arg else None
