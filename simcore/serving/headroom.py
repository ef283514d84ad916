"""SGLang's admission headroom: the KV its scheduler keeps free for the tokens running requests will
still generate.

vLLM admits a prompt when its own KV fits and preempts when decodes run out of blocks. SGLang's
``PrefillAdder`` (``sglang/srt/managers/schedule_policy.py``) also holds back an estimate of the
running requests' future tokens, so that decodes rarely run out and retract: a waiting request is
admitted only if

    prompt + min(max_new_tokens, CLIP)  <  free KV tokens
                                           - sum over running requests of min(remaining, CLIP) x ratio
                                           - sum over requests admitted this step of their prompt + min(max_new, CLIP)

where ``ratio`` (the scheduler's ``new_token_ratio``) starts at ``INIT`` and falls by
``(INIT - MIN) / DECAY_STEPS`` each decode step to ``MIN = INIT x MIN_FACTOR``; after a retraction it
jumps to ``(tokens decoded + RETRACT_DECODE_STEPS x running) / sum of max_new_tokens`` of the requests
left (``ScheduleBatch.retract_decode``), and an idle scheduler starts again at ``INIT``. The constants are
SGLang's defaults (``sglang/srt/environ.py``: ``SGLANG_INIT_NEW_TOKEN_RATIO`` 0.7,
``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`` 0.14, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`` 600,
``SGLANG_RETRACT_DECODE_STEPS`` 20, ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` 4096), not fitted.

It binds only when KV is short (long outputs, many clients, small GPUs): with room to spare the
estimate never refuses anyone. A request's ``max_new_tokens`` is its output length (the benchmark
clients send ``max_tokens`` = the output length with ``ignore_eos``).
"""

from __future__ import annotations

from collections.abc import Iterable

from simcore.serving.requests import Request

__all__ = ["NewTokenRatio", "INIT", "MIN_FACTOR", "DECAY_STEPS", "RETRACT_DECODE_STEPS", "CLIP"]

INIT = 0.7
MIN_FACTOR = 0.14
DECAY_STEPS = 600
RETRACT_DECODE_STEPS = 20
CLIP = 4096


def _left(req: Request) -> int:
    """Tokens ``req`` may still generate, clipped as SGLang clips its estimate."""
    return min(max(req.output_len - req.generated, 0), CLIP)


class NewTokenRatio:
    """One scheduler's ``new_token_ratio`` and the headroom it reserves (module doc)."""

    def __init__(self) -> None:
        self.init = INIT
        self.min = INIT * MIN_FACTOR
        self.decay = (self.init - self.min) / DECAY_STEPS
        self.current = self.init

    def decode_steps(self, n: int = 1) -> None:
        """``n`` decode steps without a retraction (closed form of ``n`` single decays)."""
        self.current = max(self.current - n * self.decay, self.min)

    def reset(self) -> None:
        """The scheduler went idle."""
        self.current = self.init

    def after_retract(self, running: Iterable[Request]) -> None:
        """The estimate SGLang adopts after retracting requests, over the requests still running."""
        running = list(running)
        total_new = sum(r.output_len for r in running)
        if total_new <= 0:
            self.current = self.init
            return
        decoded = sum(r.generated for r in running)
        self.current = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(running)) / total_new)

    def reserved_tokens(self, running: Iterable[Request]) -> float:
        """KV tokens held back for the running requests' future outputs: ``ratio x`` what a decoding
        request may still generate; a request still in its prompt (a chunked prefill) is reserved its
        whole clipped output, as when it was admitted."""
        return sum(_left(r) if r.in_prefill else _left(r) * self.current for r in running)

    @staticmethod
    def output_tokens(req: Request) -> int:
        """The output KV a newly admitted request is charged in its step's budget."""
        return _left(req)
