"""Measurement harnesses: what a benchmark adds to a collective's time on top of NCCL's own latency.

A published collective time is the kernel's time plus whatever the program that measured it spends per
call: nccl-tests enqueues back-to-back NCCL calls from C (the host cost hides behind the previous
kernel, so its times are NCCL's own latency model), the XLA GPU runtime dispatches a collective thunk,
and an eager ``torch.distributed`` loop goes through Python and c10d. Below ~1 MiB that per-call cost
is most of the time, and it differs by a factor of two between harnesses, so the collectives study
charges each row

    overhead = HARNESS_OVERHEAD_S[harness] + PER_DEVICE_LAUNCH_S x (GPUs one process drives - 1)

The second term is the host issuing the collective on each of its GPUs in turn (a kernel launch and
NCCL's enqueue per device): one process drives every GPU of the group under the XLA runtime
(single-host) and under ``nccl-tests -g N``, one GPU per process under ``torchrun`` or ``mpirun -np N``.
Harness and layout are read from the row's ``setting`` and ``note`` text (the harness can be forced
with ``--harness``); no parameter is per row.

The values are fitted by ``python -m validation.studies.collectives.fit`` on the rows below 1 MiB of each
harness that has some in the calibration CSV. nccl-tests has none there, so its base is a prior: 0,
i.e. NCCL's tuning-model latencies as NVIDIA fitted them to its own benchmark.
"""

from __future__ import annotations

import re

__all__ = ["HARNESSES", "DEFAULT_HARNESS", "HARNESS_OVERHEAD_S", "PER_DEVICE_LAUNCH_S", "harness_of",
           "check_harness", "devices_per_process", "overhead_s"]

#: Recognised harnesses, in the order :func:`harness_of` tries them.
HARNESSES = ("nccl-tests", "xla", "torch")
#: Used when a row's text names none of them: the schema is that of nccl-tests tables.
DEFAULT_HARNESS = "nccl-tests"

#: Seconds a harness adds to each collective call (``python -m validation.studies.collectives.fit``).
HARNESS_OVERHEAD_S: dict[str, float] = {
    "nccl-tests": 0.0,      # prior: NCCL's base + hop latencies are fitted to nccl-tests by NVIDIA
    "xla": 8.98e-6,         # 120 XLA rows < 1 MiB at 2, 4, 8 GPUs (OpenXLA sm_90 perf table)
    "torch": 22.24e-6,      # 5 torch.distributed eager rows < 1 MiB at 8 GPUs (stas00 all_reduce_bench)
}

#: Seconds the host spends issuing a collective on each further GPU it drives.
PER_DEVICE_LAUNCH_S = 2.006e-6

# Word patterns that identify a harness in free text; the first harness that matches wins, so a
# nccl-tests run inside a PyTorch container still counts as nccl-tests.
_PATTERNS = {
    "nccl-tests": re.compile(r"nccl[-_ ]tests|\b(all_reduce|all_gather|reduce_scatter|alltoall|sendrecv)_perf\b",
                             re.IGNORECASE),
    "xla": re.compile(r"\b(open)?xla\b|\bjax\b", re.IGNORECASE),
    "torch": re.compile(r"\b(py)?torch\b|torch\.distributed|\bc10d\b", re.IGNORECASE),
}


def harness_of(*texts: str) -> str:
    """The harness a row's descriptive text names (``setting``, ``note``); :data:`DEFAULT_HARNESS`
    when it names none."""
    joined = " ".join(t for t in texts if t)
    for name in HARNESSES:
        if _PATTERNS[name].search(joined):
            return name
    return DEFAULT_HARNESS


_DEVICES = re.compile(r"(?:^|\s)-g\s*(\d+)\b|one process driving (\d+) GPUs", re.IGNORECASE)


def devices_per_process(harness: str, text: str, gpus_per_node: int) -> int:
    """GPUs one host process issues the collective on: ``-g N`` or "one process driving N GPUs" in the
    text; else every GPU of the node's group for the (single-host) XLA runtime, and 1 otherwise."""
    match = _DEVICES.search(text or "")
    if match:
        return max(1, min(int(match.group(1) or match.group(2)), gpus_per_node))
    return gpus_per_node if harness == "xla" else 1


def overhead_s(harness: str, devices: int, base: dict[str, float] = HARNESS_OVERHEAD_S,
               per_device_s: float = PER_DEVICE_LAUNCH_S) -> float:
    """Seconds a harness adds to one collective call whose process drives ``devices`` GPUs."""
    return base[harness] + per_device_s * (devices - 1)


def check_harness(name: str) -> str:
    """``name`` if it is ``auto`` or a known harness; ``ValueError`` naming the choices otherwise."""
    if name != "auto" and name not in HARNESSES:
        raise ValueError(f"unknown harness {name!r}; choose one of: auto, {', '.join(HARNESSES)}")
    return name
