"""A sharding strategy: parallel degrees, batch, and one sharding choice per searchable operator.

Ranks of one replica are numbered with ``tp`` fastest, then ``ep``, then ``pp``; replicas (``dp``)
are outermost. So a TP group is ``tp`` consecutive GPUs (inside one node when ``tp`` divides the
node), an EP group strides by ``tp``, and neighbouring pipeline stages are ``tp * ep`` GPUs apart.

Inside a pipeline stage, the ``tp * ep`` GPUs form ``ep`` attention groups of ``tp`` GPUs; each
group serves ``batch / ep`` of the replica's sequences (DP-attention), and the routed experts are
split ``ep`` ways across the groups and sharded over each group's ``tp`` GPUs by the expert
operators' choices. A dense model uses ``ep = 1``. ``redundant_experts`` replicas of hot experts
fill extra expert slots (``ceil((E + N) / ep)`` per GPU; :mod:`simcore.moe.placement`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from simcore.strategy.opgraph import CHOICES, SEARCHABLE_OPS, choice_code

__all__ = ["Strategy", "megatron_sharding", "megatron_strategy", "StrategyError"]

_DEGREES = ("tp", "ep", "pp", "dp", "batch", "microbatches")
_FIELDS = _DEGREES + ("redundant_experts",)


class StrategyError(ValueError):
    """A strategy that cannot even be represented (unknown operator, bad field)."""


def megatron_sharding() -> dict[str, str]:
    """Megatron-LM's per-operator sharding: column-parallel QKV/FFN1, row-parallel output/FFN2,
    vocab-parallel embedding and LM head, head-parallel attention, replicated router."""
    return {
        "embedding": "dim0", "qkv": "dim1", "attention": "dim1", "out_proj": "dim0", "router": "replicated",
        "dense_ffn1": "dim1", "dense_ffn2": "dim0", "shared_ffn1": "dim1", "shared_ffn2": "dim0",
        "expert_ffn1": "dim1", "expert_ffn2": "dim0", "lm_head": "dim1",
    }


@dataclass(frozen=True)
class Strategy:
    """Coarse degrees plus per-operator sharding (``"dim0" | "dim1" | "replicated"`` per operator);
    ``redundant_experts``: replicas of routed experts beyond one copy each (0 = none)."""

    tp: int = 1
    ep: int = 1
    pp: int = 1
    dp: int = 1
    batch: int = 1
    microbatches: int = 1
    sharding: dict[str, str] = field(default_factory=megatron_sharding)
    redundant_experts: int = 0

    def __post_init__(self) -> None:
        for name in _DEGREES:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise StrategyError(f"strategy.{name} must be a positive integer, got {value!r}")
        value = self.redundant_experts
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StrategyError(f"strategy.redundant_experts must be a non-negative integer, got {value!r}")
        unknown = sorted(set(self.sharding) - set(SEARCHABLE_OPS))
        if unknown:
            raise StrategyError(f"strategy.sharding: unknown operator(s) {', '.join(unknown)}; "
                                f"valid: {', '.join(SEARCHABLE_OPS)}")
        for op, choice in self.sharding.items():
            if choice not in CHOICES:
                raise StrategyError(f"strategy.sharding.{op}: {choice!r} is not one of {', '.join(CHOICES)}")
        missing = [op for op in SEARCHABLE_OPS if op not in self.sharding]
        if missing:  # fill the gaps with Megatron's choice so partial plans stay readable
            full = megatron_sharding() | dict(self.sharding)
            object.__setattr__(self, "sharding", {op: full[op] for op in SEARCHABLE_OPS})

    def __hash__(self) -> int:
        return hash(self.key())

    @property
    def gpus(self) -> int:
        return self.tp * self.ep * self.pp * self.dp

    def choice(self, op: str) -> int:
        return choice_code(self.sharding[op])

    def key(self) -> tuple[int, ...]:
        """A compact, hashable identity: degrees, choice codes in ``SEARCHABLE_OPS`` order, then
        ``redundant_experts`` (the last column; keys without it mean 0, see ``StrategyArrays``)."""
        return (tuple(getattr(self, d) for d in _DEGREES) + tuple(self.choice(op) for op in SEARCHABLE_OPS)
                + (self.redundant_experts,))

    def replace(self, **changes) -> Strategy:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """The degrees on one line: ``tp=8 ep=1 pp=1 dp=1 batch=64 mb=1`` (and ``redundant=N`` if any)."""
        text = (f"tp={self.tp} ep={self.ep} pp={self.pp} dp={self.dp} batch={self.batch} "
                f"mb={self.microbatches}")
        return text + (f" redundant={self.redundant_experts}" if self.redundant_experts else "")

    def to_dict(self) -> dict:
        out = {d: getattr(self, d) for d in _DEGREES} | {"sharding": dict(self.sharding)}
        if self.redundant_experts:  # plans without replicas keep their old form
            out["redundant_experts"] = self.redundant_experts
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Strategy:
        if not isinstance(data, dict):
            raise StrategyError(f"a strategy must be a mapping, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_FIELDS) - {"sharding"})
        if unknown:
            raise StrategyError(f"strategy: unknown field(s) {', '.join(unknown)}; "
                                f"valid: {', '.join(_FIELDS + ('sharding',))}")
        sharding = data.get("sharding") or {}
        if not isinstance(sharding, dict):
            raise StrategyError("strategy.sharding must be a mapping of operator to choice")
        return cls(**{k: v for k, v in data.items() if k != "sharding"}, sharding=dict(sharding))

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_yaml(cls, text_or_path: str | Path) -> Strategy:
        """Parse YAML text, or read a file (a plan file may nest the strategy under ``strategy:``)."""
        text = str(text_or_path)
        path = Path(text)
        if "\n" not in text and path.suffix in (".yaml", ".yml"):
            if not path.is_file():
                raise StrategyError(f"plan file not found: {path}")
            text = path.read_text()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise StrategyError(f"plan is not valid YAML: {str(exc).splitlines()[0]}") from None
        if isinstance(data, dict) and "strategy" in data:
            data = data["strategy"]
        return cls.from_dict(data)


def megatron_strategy(tp: int = 1, ep: int = 1, pp: int = 1, dp: int = 1, batch: int = 1,
                      microbatches: int = 1, redundant_experts: int = 0) -> Strategy:
    """The standard Megatron sharding at the given degrees."""
    return Strategy(tp=tp, ep=ep, pp=pp, dp=dp, batch=batch, microbatches=microbatches,
                    sharding=megatron_sharding(), redundant_experts=redundant_experts)
