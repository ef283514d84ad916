"""Speculative decoding: draft ``k`` tokens, verify them in one step of the target model, keep what agrees.

Serving runtimes launch it as TensorRT-LLM's ``speculative_config: {decoding_type: MTP,
num_nextn_predict_layers: k}``, vLLM's ``--speculative-config '{"method": "deepseek_mtp",
"num_speculative_tokens": k}'`` and SGLang's ``--speculative-algorithm EAGLE --speculative-num-steps k``
(DeepSeek's MTP module, or an EAGLE head, as the draft model). Each decode step of a sequence then is:

1. **draft**: ``k`` passes of the draft module, one after the other, each over one token of every
   decoding sequence (DeepSeek's MTP module: one decoder layer and the shared output head; DeepSeek-V3
   report, arXiv 2412.19437, sec. 2.2);
2. **verify**: the target model over ``1 + k`` tokens per decoding sequence (its last token and the
   ``k`` drafts), with logits at every position;
3. **accept**: the longest prefix of drafts the target agrees with, plus the target's own next token.

With ``a_i`` the chance that draft ``i`` is accepted given drafts ``1..i-1`` were, a step yields
``1 + sum_j prod_{i <= j} a_i`` tokens per sequence on average (aiconfigurator's
``calc_mtp_expectation``). The default rates are NVIDIA aiconfigurator's ``DEFAULT_NEXTN_ACCEPT_RATES``
(0.85, 0.3, 0, 0, 0; its default MTP depth for DeepSeek-V3-class models is 1), in line with the
DeepSeek-V3 report's 85-90% acceptance of the second token (sec. 5.4.3); acceptance depends on the text
generated, so a launch may give its own.

How the simulator runs it (:class:`~simcore.serving.worker.Worker`, :class:`~simcore.serving.step_cost.StepCost`):

- a decoding sequence is scheduled for ``1 + k`` tokens: they count against the step's token budget and
  the KV cache holds room for them (vLLM's lookahead slots), as the runtimes do;
- the step's GEMMs, output head and sampling run over those tokens; its attention reads each sequence's
  cache once (FlashMLA and TensorRT-LLM's XQA handle a sequence's query positions together; decode
  attention is bound by that read, and the extra positions' FLOPs are not priced);
- the draft passes cost ``k`` times one layer of the model over the step's decoding sequences (its MoE
  fixed time included), its attention at their mean context, and the output head; the MTP module's
  ``eh_proj`` (``2h x h`` per token) and the draft's own KV cache are not priced;
- tokens per step are deterministic: each sequence carries the fractional part of the expected count
  from step to step (:func:`emitted`), so over a request it emits the expected number exactly; the spread
  of acceptance between sequences is not simulated;
- CUDA graphs: TensorRT-LLM and SGLang capture decode graphs by batch size (sequences), vLLM by tokens
  (:meth:`StepCost.gpu_times`);
- the fast path that folds runs of identical decode steps is not taken (each step's token counts differ).
"""

from __future__ import annotations

import math

from simcore.serving.requests import Request, ServingInputError

__all__ = ["DEFAULT_ACCEPT", "tokens_per_step", "emitted", "check_accept"]

#: NVIDIA aiconfigurator's ``DEFAULT_NEXTN_ACCEPT_RATES`` (module doc)
DEFAULT_ACCEPT = (0.85, 0.3, 0.0, 0.0, 0.0)


def check_accept(spec_tokens: int, accept: tuple[float, ...], where: str) -> None:
    """Raise :class:`ServingInputError` naming ``where`` if the draft count or the rates are not usable."""
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or spec_tokens < 0:
        raise ServingInputError(f"{where}.spec_tokens must be an integer >= 0, got {spec_tokens!r}")
    if spec_tokens and len(accept) < spec_tokens:
        raise ServingInputError(f"{where}.spec_accept needs one acceptance rate per draft token ({spec_tokens}), "
                                f"got {len(accept)}")
    for a in accept:
        if not (isinstance(a, int | float) and 0 <= a <= 1 and math.isfinite(a)):
            raise ServingInputError(f"{where}.spec_accept: each rate must be in [0, 1], got {a!r}")


def tokens_per_step(spec_tokens: int, accept: tuple[float, ...]) -> float:
    """Expected tokens a decoding sequence gains per step (1 without speculation)."""
    total, prob = 1.0, 1.0
    for a in accept[:spec_tokens]:
        prob *= a
        total += prob
    return total


def emitted(req: Request, per_step: float) -> int:
    """Tokens ``req`` keeps from this decode step: the expected ``per_step`` carried over fractions,
    never more than it has left to generate and never fewer than one."""
    req.spec_credit += per_step
    n = max(int(req.spec_credit), 1)
    req.spec_credit -= n
    return min(n, req.output_len - req.generated)
