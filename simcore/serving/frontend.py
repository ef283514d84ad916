"""The server's frontend: the one process that streams a worker's tokens to its clients.

Each runtime hands a step's sampled tokens to a single host process that turns them into the response
stream: SGLang's ``TokenizerManager`` (fed by its ``DetokenizerManager``), vLLM's API server (its
``AsyncLLM`` output processor), ``trtllm-serve``. That process also takes each new request in. It
works through its jobs one at a time, in the order they come, at ``frontend_token_s`` of host time
per streamed token (:attr:`simcore.serving.runtime.RuntimeProfile.frontend_token_s`; 0: the frontend
keeps up with every step, the default of every shipped profile).

When the steps emit tokens faster than that, a backlog builds up:

- a token reaches its client when the frontend has worked through every token emitted before it, so
  the client sees the step's tokens later than the GPU made them;
- a new request waits behind the same backlog before its scheduler sees it;
- the scheduler's batch is smaller than the number of clients, because a request it has finished
  still waits in the backlog, from its client's point of view.

So the time a closed loop of clients waits grows with the output length and with how far the steps
outrun the frontend, while the step itself is not slowed. The queue is a single FIFO server, so each
job's end is ``max(previous end, arrival) + work`` (Lindley's recursion): :meth:`Frontend.emit`.
"""

from __future__ import annotations

__all__ = ["Frontend"]


class Frontend:
    """One worker's frontend queue (module doc). ``token_s``: host time per streamed token."""

    def __init__(self, token_s: float):
        if token_s < 0:
            raise ValueError(f"frontend_token_s must be >= 0, got {token_s}")
        self.token_s = token_s
        self.free_s = 0.0  # when it has worked through every job given so far
        self.busy_s = 0.0
        self.tokens = 0

    @property
    def active(self) -> bool:
        return self.token_s > 0

    def emit(self, now: float, tokens: int) -> float:
        """A step ending at ``now`` emits ``tokens`` tokens: when they reach their clients."""
        if not self.active or tokens <= 0:
            return now
        work = tokens * self.token_s
        self.free_s = max(self.free_s, now) + work
        self.busy_s += work
        self.tokens += tokens
        return self.free_s

    def backlog_s(self, now: float) -> float:
        """How long a job arriving at ``now`` waits before the frontend reaches it."""
        return max(0.0, self.free_s - now)
