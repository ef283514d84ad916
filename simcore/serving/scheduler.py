"""Scheduler policies: which tokens of which requests one attention group runs in the next step.

Three policies, after the runtimes' own schedulers (each a method of :class:`GroupScheduler`):

- ``vllm`` (vLLM v1 ``Scheduler.schedule``): one token budget (``max_num_batched_tokens``) per step;
  running requests first, in order (a decode takes 1 token, a partly prefilled prompt its next
  chunk), then waiting requests FCFS while budget, ``max_num_seqs`` and KV blocks last; prompts are
  chunked to the budget left. When a running request needs a block and none is free, the most
  recently admitted request is preempted and recomputed later.
- ``sglang`` (SGLang ``Scheduler.get_next_batch_to_run``): prefill and decode run in separate steps;
  a prefill step is formed whenever requests wait (the chunked request in progress first, then FCFS
  up to ``chunked_prefill_size`` tokens, admitting only prompts whose KV fits and, in an aggregated
  worker, only while the KV left covers an estimate of what the running requests will still generate:
  :mod:`.headroom`), else every running request decodes; on KV exhaustion during decode the newest
  requests are retracted (recomputed).
- ``trtllm`` (TensorRT-LLM in-flight batching, ``GUARANTEED_NO_EVICT`` capacity scheduler): decodes
  and context chunks share a step under ``max_num_tokens``; a request is admitted only when the KV of
  its whole prompt and output is free, so nothing is ever evicted. With batch waiting configured
  (``RuntimeProfile.batch_wait_timeout_iters`` / ``batch_wait_max_tokens_ratio``, see there), a step
  that would run context and generation requests together runs the generation requests alone until
  enough prompt tokens wait or the timeout passes (:meth:`GroupScheduler._batch_wait`).

A step's choice is a list of ``(request, new_tokens)``; the worker applies it when the step ends.

Across the attention groups of one worker, TensorRT-LLM's attention-DP balancing (:class:`AttentionDpBalance`)
may hold every group's context requests back for a step.
"""

from __future__ import annotations

from collections import deque

from simcore.serving.headroom import NewTokenRatio
from simcore.serving.kvcache import KvCache
from simcore.serving.requests import Request
from simcore.serving.runtime import SCHEDULERS

__all__ = ["GroupScheduler", "AttentionDpBalance"]


class GroupScheduler:
    """Waiting and running requests of one attention group, its KV cache and its policy."""

    def __init__(self, policy: str, kv: KvCache, max_num_seqs: int, max_tokens: int,
                 batch_wait: tuple[int, float] = (0, 0.0), reserve_output: bool = False, decode_q: int = 1):
        if policy not in SCHEDULERS:
            raise ValueError(f"serving.scheduler: {policy!r} is not one of {', '.join(SCHEDULERS)}")
        self.policy, self.kv = policy, kv
        self.max_num_seqs, self.max_tokens = max_num_seqs, max_tokens
        self.decode_q = decode_q  # tokens a decoding sequence runs per step: 1, or 1 + drafts (speculative)
        self.wait_iters, self.wait_ratio = batch_wait
        self.waited = 0  # steps the context requests have been held back (TensorRT-LLM batch waiting)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.preemptions = 0
        #: SGLang's admission headroom (:mod:`.headroom`), where the requests decode here (``reserve_output``)
        self.headroom = NewTokenRatio() if policy == "sglang" and reserve_output else None

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.release(req)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)

    def schedule(self, busy: set[int]) -> list[tuple[Request, int]]:
        """The next step's work; requests whose ids are in ``busy`` (in flight in a pipeline) wait."""
        return getattr(self, f"_{self.policy}")(busy)

    def decode_steps(self, n: int) -> None:
        """``n`` further pure-decode steps taken at once (a folded decode run, no retraction): what
        ``n`` calls of :meth:`schedule` would have done to the scheduler's own state."""
        if self.headroom is not None and n > 0:
            if self.running:
                self.headroom.decode_steps(n)
            else:
                self.headroom.reset()  # idle beside the groups that decode

    # ------------------------------------------------------------------ helpers
    def _preempt_newest(self, busy: set[int], keep: Request) -> Request | None:
        """Preempt (recompute) the newest running request not in flight and not ``keep``."""
        for victim in reversed(self.running):
            if victim is not keep and victim.rid not in busy:
                self.running.remove(victim)
                self.kv.release(victim)
                victim.reset_for_recompute()
                self.waiting.appendleft(victim)
                self.preemptions += 1
                return victim
        return None

    def _grow_or_preempt(self, req: Request, tokens: int, busy: set[int], chosen: list) -> bool:
        """Hold KV for ``tokens`` tokens of ``req``, preempting newer requests if needed."""
        while not self.kv.grow(req, tokens):
            victim = self._preempt_newest(busy, keep=req)
            if victim is None:
                return False
            chosen[:] = [(r, n) for r, n in chosen if r is not victim]
        return True

    def _admit(self, budget: int, chosen: list, whole_request: bool, chunk: bool) -> int:
        """FCFS admission from the waiting queue into ``chosen``; returns the budget left."""
        held_back = self.headroom.reserved_tokens(self.running) if self.headroom else 0.0
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            n = req.remaining_prefill if req.in_prefill else self.decode_q  # a decode arriving with its KV
            if n > budget:
                if not chunk or (chosen and self.policy == "sglang"):
                    break
                n = budget
            reserve = req.prefill_target + (req.output_len - req.generated) if whole_request else req.kv_tokens + n
            if self.kv.need(req, reserve) > self.kv.free_blocks:
                break
            if self.headroom is not None:  # its whole prompt and clipped output must fit the headroom
                out = self.headroom.output_tokens(req)
                if (self.kv.need(req, req.prefill_target) * self.kv.block_tokens + out
                        >= self.kv.free_blocks * self.kv.block_tokens - held_back):
                    break
                held_back += out
            self.kv.grow(req, reserve)
            self.waiting.popleft()
            self.running.append(req)
            chosen.append((req, n))
            budget -= n
        return budget

    # ------------------------------------------------------------------ policies
    def _vllm(self, busy: set[int]) -> list[tuple[Request, int]]:
        chosen: list[tuple[Request, int]] = []
        budget = self.max_tokens
        for req in list(self.running):
            if budget <= 0:
                break
            if req.rid in busy or req not in self.running:
                continue
            n = min(req.remaining_prefill, budget) if req.in_prefill else self.decode_q
            if not self._grow_or_preempt(req, req.kv_tokens + n, busy, chosen):
                self._preempt_self(req)
                continue
            chosen.append((req, n))
            budget -= n
        self._admit(budget, chosen, whole_request=False, chunk=True)
        return chosen

    def _sglang(self, busy: set[int]) -> list[tuple[Request, int]]:
        chosen: list[tuple[Request, int]] = []
        budget = self.max_tokens
        partial = [r for r in self.running if r.in_prefill and r.rid not in busy]
        for req in partial:  # the chunked request in progress comes first
            n = min(req.remaining_prefill, budget)
            if n > 0 and self.kv.grow(req, req.kv_tokens + n):
                chosen.append((req, n))
                budget -= n
        if not any(r.in_prefill for r in self.running if r.rid in busy):
            self._admit(budget, chosen, whole_request=False, chunk=True)
        if chosen:
            return chosen
        retracted = self.preemptions
        for req in list(self.running):
            if req.rid in busy or req not in self.running or req.in_prefill:
                continue
            if not self._grow_or_preempt(req, req.kv_tokens + self.decode_q, busy, chosen):
                self._preempt_self(req)
                continue
            chosen.append((req, self.decode_q))
        if self.headroom is not None:
            if self.preemptions > retracted:
                self.headroom.after_retract(self.running)
            elif chosen:
                self.headroom.decode_steps(1)
            elif not self.running:
                self.headroom.reset()  # idle
        return chosen

    def _trtllm(self, busy: set[int]) -> list[tuple[Request, int]]:
        chosen: list[tuple[Request, int]] = []
        budget = self.max_tokens
        for req in self.running:  # KV was reserved at admission: nothing to grow, nothing to evict
            if req.rid in busy or budget <= 0:
                continue
            n = min(req.remaining_prefill, budget) if req.in_prefill else self.decode_q
            chosen.append((req, n))
            budget -= n
        self._admit(budget, chosen, whole_request=True, chunk=True)
        return self._batch_wait(chosen)

    def _batch_wait(self, chosen: list[tuple[Request, int]]) -> list[tuple[Request, int]]:
        """TensorRT-LLM's batch waiting (``PyExecutor._waiting_requests``): with both context and
        generation requests in the step, the context requests run only once their prompt tokens (the
        whole prompt, as ``get_tokens(0)`` counts) plus one per generation request (one and its drafts) reach
        ``ratio x max_num_tokens``, or after ``timeout_iters`` steps of waiting; until then the step
        runs the generation requests alone. Admitted requests keep their KV while they wait."""
        if not (self.wait_iters > 0 or self.wait_ratio > 0):
            return chosen
        context = [r for r, _ in chosen if r.in_prefill]
        generation = [(r, n) for r, n in chosen if not r.in_prefill]
        if not context or not generation:
            return chosen
        tokens = sum(r.prefill_target for r in context) + sum(n for _, n in generation)  # n: 1 + drafts
        if self.waited >= self.wait_iters or tokens >= self.wait_ratio * self.max_tokens:
            self.waited = 0
            return chosen
        self.waited += 1
        return generation

    def _preempt_self(self, req: Request) -> None:
        """``req`` cannot grow even alone: give its blocks back and requeue it."""
        if req in self.running:
            self.running.remove(req)
            self.kv.release(req)
            req.reset_for_recompute()
            self.waiting.appendleft(req)
            self.preemptions += 1


class AttentionDpBalance:
    """TensorRT-LLM's attention-DP context balancing (``attention_dp_config.enable_balance``;
    ``PyExecutor._balance_adp_requests``), decided once per step over all attention-DP ranks (groups).

    Context requests run when every rank has one and a free batch slot: then, if every rank also
    decodes, only after ``batching_wait_iters`` further steps (the ``batching`` count). Otherwise they
    are held, and a ``waiting`` count rises every such step, with or without context requests anywhere;
    they run when it reaches ``timeout_iters`` or some rank has nothing to decode (no dead waiting). A
    held step runs every rank's decodes alone.
    """

    def __init__(self, timeout_iters: int, batching_wait_iters: int):
        self.timeout, self.batching_iters = timeout_iters, batching_wait_iters
        self.waiting = 0
        self.batching = 0

    def apply(self, picks: list[list[tuple[Request, int]]], groups: list[GroupScheduler]) -> list:
        ctx = [sum(1 for r, _ in p if r.in_prefill) for p in picks]
        gen = [len(p) - c for p, c in zip(picks, ctx, strict=True)]
        all_gen = all(n > 0 for n in gen)
        hold = False
        if all(n < g.max_num_seqs for n, g in zip(gen, groups, strict=True)) and all(c > 0 for c in ctx):
            self.waiting = 0
            if all_gen:
                if self.batching < self.batching_iters:
                    self.batching += 1
                    hold = True
                else:
                    self.batching = 0
        else:
            self.waiting += 1
            hold = True
            if self.waiting >= self.timeout or not all_gen:
                self.waiting = 0
                hold = False
        if not hold:
            return picks
        return [[(r, n) for r, n in p if not r.in_prefill] for p in picks]

    def decode_steps(self, steps: int, all_gen: bool) -> None:
        """The count after ``steps`` steps with no context request anywhere (a folded decode run):
        :meth:`apply` ``steps`` times in closed form (test: fast path == step by step)."""
        if not all_gen or self.timeout <= 0:
            self.waiting = 0
        else:
            self.waiting = (self.waiting + steps) % self.timeout
