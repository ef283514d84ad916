"""How a rewrites-study case is judged: win, loss or tie, and the one-line reason.

A case *wins* when the rewrite's simulated tokens/s/GPU beats its base plan's by more than
:data:`TOL` (relative), *loses* when it trails by more, and ties otherwise.
"""

from __future__ import annotations

__all__ = ["TOL", "TERMS", "outcome", "why"]

TOL = 1e-4
#: (name, case field) of the step-time terms a case's change splits into, in microseconds.
TERMS = (("latency", "d_alpha_us"), ("bandwidth", "d_beta_us"), ("compute", "d_compute_us"),
         ("bubble", "d_other_us"), ("overlap", "d_overlap_us"), ("contention", "d_contention_us"))


def outcome(ratio: float) -> str:
    return "win" if ratio > 1 + TOL else "loss" if ratio < 1 - TOL else "tie"


def why(r: dict) -> str:
    """One line: the outcome, the largest step-time terms, and the changed collectives' launches/bytes."""
    terms = sorted(((name, r[key]) for name, key in TERMS if abs(r[key]) >= 0.05), key=lambda t: -abs(t[1]))
    parts = ", ".join(f"{name} {value:+.1f} us" for name, value in terms[:3]) or "no step-time change"
    return (f"{outcome(r['sim_ratio'])} {r['sim_ratio'] - 1:+.2%}: {parts}; changed collectives "
            f"{r['base_launches']:.0f}->{r['rewrite_launches']:.0f} launches, "
            f"{r['base_bytes'] / 1e6:.3g}->{r['rewrite_bytes'] / 1e6:.3g} MB/GPU/step")
