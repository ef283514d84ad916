"""What an export produces: the launch command, the gaps the target cannot express, and their price.

A :class:`Gap` is one per-operator choice (or one knob, such as the microbatch count) of the plan that
the target runs differently; :class:`Pricing` holds the plan's throughput and the throughput of the
strategy the target actually runs (every gap replaced by the target's default), in tokens/s/GPU.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from simcore.strategy.sharding import Strategy

__all__ = ["Gap", "Pricing", "ExportResult", "quote", "gap_lines", "relative_change"]

_PLACEHOLDER = re.compile(r"^\$\{?[A-Z_][A-Z0-9_]*\}?(:\d+)?$")


def quote(arg: str) -> str:
    """Shell-quote ``arg``, leaving ``$VAR``/``${VAR}`` placeholders for the shell to expand."""
    return arg if _PLACEHOLDER.match(arg) else shlex.quote(arg)


@dataclass(frozen=True)
class Gap:
    """One thing the target cannot express: ``item`` (operator or knob), the plan's value, the
    target's default (in our vocabulary), the relative throughput change (proxy, tokens/s/GPU) when
    only this item falls back (``None`` when not priced) and that fallback's invalidity reasons."""

    item: str
    ours: str
    target: str
    proxy_change: float | None = None
    invalid_reasons: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pricing:
    """Plan vs the target's fallback, tokens/s/GPU; simulator figures are ``None`` without a graph."""

    proxy_plan: float
    proxy_fallback: float
    fallback_valid: bool
    fallback_reasons: tuple[str, ...] = ()
    sim_plan: float | None = None
    sim_fallback: float | None = None

    @property
    def proxy_change(self) -> float:
        return relative_change(self.proxy_plan, self.proxy_fallback)

    @property
    def sim_change(self) -> float | None:
        if self.sim_plan is None or self.sim_fallback is None:
            return None
        return relative_change(self.sim_plan, self.sim_fallback)


def relative_change(before: float, after: float) -> float:
    """``after / before - 1`` (NaN when ``before`` is zero)."""
    return (after - before) / before if before else float("nan")


@dataclass(frozen=True)
class ExportResult:
    """Launch command of one target for one plan; ``replicas`` independent copies of it make the
    plan's ``dp`` replicas where the target cannot hold them in one launch."""

    target: str
    version: str
    program: tuple[str, ...]
    flags: tuple[str, ...]
    fallback: Strategy
    env: dict[str, str] = field(default_factory=dict)
    replicas: int = 1
    gaps: tuple[Gap, ...] = ()
    notes: tuple[str, ...] = ()
    pricing: Pricing | None = None

    @property
    def argv(self) -> list[str]:
        return [*self.program, *self.flags]

    def command(self, width: int = 100) -> str:
        """A copy-pasteable shell command, continued over lines of about ``width`` characters."""
        words = [f"{k}={quote(v)}" for k, v in self.env.items()] + [quote(a) for a in self.argv]
        lines, line = [], ""
        for i, word in enumerate(words):
            glue = " " if line else ""
            starts_flag = word.startswith("--") and i > 0
            if line and (starts_flag and len(line) + len(word) > width):
                lines.append(line)
                line, glue = "  ", ""
            line += glue + word
        lines.append(line)
        return " \\\n".join(lines)

    def to_dict(self) -> dict:
        p = self.pricing
        return {
            "target": self.target, "version": self.version, "argv": self.argv, "env": dict(self.env),
            "command": self.command(), "replicas": self.replicas, "notes": list(self.notes),
            "gaps": [{"item": g.item, "ours": g.ours, "target": g.target, "proxy_change": g.proxy_change,
                      "invalid_reasons": list(g.invalid_reasons)} for g in self.gaps],
            "fallback": self.fallback.to_dict(),
            "pricing": None if p is None else {
                "proxy_plan_tokens_per_s_per_gpu": p.proxy_plan, "proxy_fallback_tokens_per_s_per_gpu":
                p.proxy_fallback, "proxy_change": p.proxy_change, "fallback_valid": p.fallback_valid,
                "fallback_reasons": list(p.fallback_reasons), "sim_plan_tokens_per_s_per_gpu": p.sim_plan,
                "sim_fallback_tokens_per_s_per_gpu": p.sim_fallback, "sim_change": p.sim_change},
        }

    def to_text(self) -> str:
        """Plain text for ``export_<target>.txt``: command, gaps with their cost, notes."""
        out = [f"# {self.target}: {self.version}", self.command(), ""]
        if self.replicas > 1:
            out += [f"# launch {self.replicas} copies of this command (one per replica) behind a load balancer", ""]
        out += gap_lines(self)
        if self.notes:
            out += ["", "notes:"] + [f"- {n}" for n in self.notes]
        return "\n".join(out) + "\n"


def _pct(value: float | None) -> str:
    return "not priced" if value is None else f"{value:+.1%}"


def gap_lines(result: ExportResult) -> list[str]:
    """The gap table and the fallback summary as text lines."""
    if not result.gaps:
        return [f"every per-operator choice of the plan is expressible in {result.target}"]
    lines = [f"not expressible in {result.target} (falls back to its default):",
             f"  {'operator / knob':<16} {'plan':<11} {result.target + ' default':<18} proxy change alone"]
    for g in result.gaps:
        cost = _pct(g.proxy_change)
        if g.invalid_reasons:
            cost += f", invalid: {', '.join(g.invalid_reasons)}"
        lines.append(f"  {g.item:<16} {g.ours:<11} {g.target:<18} {cost}")
    p = result.pricing
    if p is None:
        lines.append("fallback not priced (no scenario given)")
        return lines
    verdict = "" if p.fallback_valid else f", invalid: {', '.join(p.fallback_reasons)}"
    lines.append(f"all gaps together: proxy {p.proxy_plan:,.1f} -> {p.proxy_fallback:,.1f} tokens/s/GPU "
                 f"({_pct(p.proxy_change)}{verdict})")
    if p.sim_change is not None:
        lines.append(f"                   simulator {p.sim_plan:,.1f} -> {p.sim_fallback:,.1f} tokens/s/GPU "
                     f"({_pct(p.sim_change)})")
    return lines
