"""Serving-runtime profiles: what vLLM, SGLang and TensorRT-LLM add around the model's kernels.

A profile holds few physical numbers, each with its source:

- ``step_host_s``: host time of one scheduler step that no kernel covers (scheduling, input
  preparation, sampling bookkeeping, detokenization). Fitted per runtime by
  ``python -m validation.studies.serving.fit`` on the fit half of ``validation/data/serving_h200_measured.csv``.
- ``step_host_per_seq_s``: host time per sequence in the step (building its input, sampling
  bookkeeping, detokenizing and streaming its token): why a small model's TPOT stops improving with
  tensor parallelism at hundreds of running sequences. Fitted with ``step_host_s``.
- ``overlap_host``: whether that host time overlaps the previous step's GPU work. SGLang's overlap
  scheduler (on by default since v0.4, "zero-overhead batch scheduler") and TensorRT-LLM's PyTorch
  backend overlap scheduler (default on) do. vLLM v1 ran the step synchronously unless
  ``--async-scheduling`` was given, until async scheduling became its default (vllm-project/vllm PR
  #27614, tracked in issue #27679; on by default in the v0.14 releases of January 2026, where PR #31998
  extends the default to speculative decoding): profile ``vllm`` is today's vLLM (overlapped),
  ``vllm-sync`` vLLM up to v0.13 or ``--no-async-scheduling``. Same host work, fitted once.
- ``graph_max_tokens``: batches up to this many tokens replay CUDA graphs (no per-kernel launch cost);
  larger ones launch eagerly, each kernel costing ``launch_s`` of host time that the GPU waits on when
  the kernels are shorter. vLLM v1 captures piecewise graphs up to 512 tokens
  (``max_capture_size`` 512); SGLang ``cuda_graph_max_bs`` (up to 512 on H200-class GPUs, decode only);
  TensorRT-LLM captures its configured batch sizes (decode only).
- ``graph_kernel_s``: the fixed time of one kernel inside a replayed CUDA graph (no launch, only
  ramp-up and tail), where an isolated kernel costs ``GpuSpec.kernel_overhead_s`` (5.6 us, fitted on
  kernel timings taken one launch at a time). Graph replay removes the CPU launch and driver work,
  leaving ~1-2 us between dependent kernels (NVIDIA, "Getting Started with CUDA Graphs"); fitted with
  ``step_host_s`` by ``python -m validation.studies.serving.fit``. Measured on a lent H100
  (``python -m validation.studies.serving.measure_launch``): 1.0 us (in-place add) and 1.6 us (``F.silu``) per kernel in a
  replayed graph of 1,000, against 3.6 us back to back on a stream.
- ``custom_ar_s``, ``two_shot_ar_s``, ``custom_ar_max_bytes``: the runtimes' own all-reduce kernels for
  tensor-parallel messages up to 8 MiB inside one NVLink domain (vLLM's ``custom_all_reduce`` ``max_size``
  8 MiB, shared by SGLang, and since vllm-project/vllm PR #24111 PyTorch's symmetric-memory all-reduce;
  TensorRT-LLM's ``AllReduce`` one-shot/two-shot strategies), used where faster than NCCL: one-shot (one
  barrier, every GPU reads its peers' buffers) behind the fixed latency ``custom_ar_s``, two-shot or
  ``multimem`` (a reduce-scatter and an all-gather, a barrier each) behind ``two_shot_ar_s``, whichever is
  faster (:func:`simcore.serving.step_cost.custom_all_reduce_time_s`). vLLM's and SGLang's two latencies,
  6 and 12 us, are fitted on published H100 timings of these kernels (``python -m
  validation.studies.collectives.fit_custom_allreduce``), not on serving rows. TensorRT-LLM runs its own one-shot and two-shot
  ``AllReduce``, fused with the residual add and RMSNorm; the fit's SGLang source timed that kernel family
  (SGLang's custom all-reduce was TensorRT-LLM's, ported, from sgl-project/sglang PR #2511 until PR #5079),
  but TensorRT-LLM's serving fit rows score worse with the measured latencies (median |TPOT error| 5.5% at
  its fitted 14 us for both, 6.3% at 6 / 12 us, 7.3% and 7.5% with its MoE time or per-sequence host time then
  raised; ``python -m validation.studies.serving.score --backend trtllm --mode agg``, in sample), so its one
  latency stays a fitted knob (``fit_serving``), an open question.
- ``mixed_batches``: prefill chunks and decodes share a step (vLLM v1 chunked prefill, TensorRT-LLM
  in-flight batching); SGLang's default runs prefill and decode in separate steps
  (``--enable-mixed-chunk`` off), prefill first.
- ``max_num_batched_tokens``: the token budget of one step (vLLM 8192 for the OpenAI server on
  >= 70 GiB GPUs; SGLang ``chunked_prefill_size`` 8192 on H100/H200; TensorRT-LLM ``max_num_tokens``
  8192 in its serving defaults).
- ``eager_moe_layer_s``: host time an MoE decoder layer adds to a step that runs eagerly (outside CUDA
  graphs), beyond the ``launch_s`` of the kernels the lowering counts: the framework ops (routing,
  token sorting, per-token quantization, the fused-MoE launch wrappers, MLA's absorbed projections) a
  Python eager forward dispatches. From SGLang PR sgl-project/sglang#12160 (DeepSeek-V3, TP 8): a prefill
  of one new token took 82.6 ms eager and 23.1 ms replayed in a CUDA graph, so the eager forward is
  host-bound at 82.6 ms; the lowering's launches give 7.3 ms for it (727 x 10 us), so its 58 MoE layers
  add (82.6 - 7.3) / 58 = 1.30 ms each. SGLang and TensorRT-LLM (PyTorch backend, no ``torch.compile``
  by default) run every prompt step eagerly in Python modules; vLLM runs its steps above the capture size
  through ``torch.compile``'s generated code, not module-by-module Python, so it keeps 0. Not fitted on
  the serving sample.
- ``request_s``, ``tokenize_s_per_token``: the request path, what a request spends between the client
  sending it and the scheduler seeing it, plus its first token's way back, that no GPU step covers:
  ``request_s`` the fixed latency (the HTTP server, the hand-off to the scheduler process: vLLM's API
  server and engine core, SGLang's tokenizer manager, TensorRT-LLM's ``trtllm-serve``; detokenizing and
  streaming the first chunk), ``tokenize_s_per_token`` the tokenizer's time per prompt token (a fast
  tokenizer runs at ~0.2-2 us a token on one core), so that a longer prompt takes longer
  (:meth:`RuntimeProfile.request_path_s`). It adds to every TTFT, not to TPOT; simulated as the request
  reaching the router that long after it was sent, where it waits for the step in progress to end
  before a step can take it. Both fitted per runtime by ``python -m validation.studies.serving.fit`` on
  the fit set's TTFT, each on a grid bounded by what the mechanism can take (``GRID_REQUEST_S`` up to
  50 ms, ``GRID_TOKENIZE_S_PER_TOKEN`` up to 4 us a token): TTFT the path does not explain is left as the
  simulation's error, never absorbed by a longer path.
- ``kv_block_tokens``: KV-cache page size (vLLM 16, SGLang 1 (token-granular radix cache), TensorRT-LLM
  32 (``tokens_per_block``)); ``mem_fraction``: share of HBM the runtime may fill with weights,
  activations and KV cache (vLLM ``gpu_memory_utilization`` 0.9), or, where ``mem_fraction_static``,
  with weights and KV cache only, activations and CUDA graphs living in the rest (SGLang's
  ``--mem-fraction-static``; ``None``: SGLang's own default for the GPU and layout,
  :func:`simcore.serving.kvcache.sglang_mem_fraction`), or, where ``mem_fraction_of_free``, the share of
  the memory left after the weights and activations that goes to KV cache (TensorRT-LLM's
  ``KvCacheConfig.free_gpu_memory_fraction``, 0.9 by default: "the fraction of free GPU memory ... after
  the model is loaded").
- ``batch_wait_timeout_iters``, ``batch_wait_max_tokens_ratio``: TensorRT-LLM's batch waiting
  (``LlmArgs``; both 0, off, by default): without attention DP, a step that has both context and
  generation requests holds its context requests back (generation only) until their prompt tokens plus
  the generation tokens reach ``ratio x max_num_tokens`` or ``timeout_iters`` steps have waited
  (``PyExecutor._waiting_requests``; the count is the scheduler's, reset when the context requests run).
  Off in every profile; set per launch (InferenceX's Llama-3.3-70B TensorRT-LLM runs at 1k/1k below TP 8
  use 20 and 0.9, ``validation/studies/serving/launch.py``).
- ``moe_gemm_efficiency``: the runtime's grouped expert-GEMM kernel's tensor-core rate on its useful
  work (``2 m n k`` per expert) as a share of a dense GEMM's (``GpuSpec.gemm_efficiency``, fitted on
  cuBLAS/CUTLASS/DeepGEMM GEMMs): an expert GEMM takes at least that work at that rate
  (:func:`simcore.cost.lowering.expert_gemm_s`). At decode sizes the useful work is tiny and the weights'
  reads (or the padded tiles) set the time as before; a long prefill's experts are bound by it. vLLM and
  SGLang run MoE layers on Hopper through Triton's
  ``fused_moe`` (sorted-token gather, ``BLOCK_SIZE_M`` padding per expert, no warp specialization): the
  published timings of that kernel at 512-4096 tokens (``validation/data/kernels_fused_moe_published.csv``:
  vLLM's ``benchmark_moe.py`` and SGLang's tuning script on H100 and H200) reach ~0.35 of what a dense GEMM
  of the same shapes would (``python -m validation.studies.moe.fit_kernels``). TensorRT-LLM runs CUTLASS grouped
  GEMMs: this project's H100 timings of that kernel family (``torch._grouped_mm``, BF16, 8-128 experts x
  128-2,048 tokens at the serving sample's MoE expert shapes) reach ~0.70 (``python -m
  validation.studies.moe.fit_kernels --runtime trtllm``): short-``k`` down projections and partial tiles cost more
  in a grouped kernel than in one dense GEMM.
- ``moe_fp8_at_bf16_rate``: the grouped expert kernel runs FP8 experts at the BF16 tensor-core rate
  (``moe_gemm_efficiency`` of a dense BF16 GEMM's), not at FP8's. Triton's ``fused_moe`` (vLLM, SGLang),
  for block-quantized FP8 weights (128 x 128 scales), multiplies each K block's partial product by the
  activation and weight scales inside its K loop (``accumulator += tl.dot(a, b) * a_scale * b_scale``),
  so its FP8 tensor-core work is interleaved with scalar rescaling, as DeepGEMM's "promotion" discusses.
  Evidence: the only FP8 timings of that kernel at compute-bound sizes
  (``validation/data/kernels_fused_moe_published.csv``, Qwen3-30B-A3B at 1,024-4,096 tokens on an H100,
  with a default config the same pull request later replaced) reach 188 TFLOP/s at 4,096 tokens: 0.15 of
  a dense FP8 GEMM's rate, 0.24 of a BF16 one's. And the serving fit rows' prefill
  (``python -m validation.studies.serving.fit --moe-prefill``, vLLM's FP8 MoE rows' TTFT growth with the prompt)
  wants 0.18 of FP8's rate, i.e. 0.29 of BF16's, next to the 0.35 the BF16 kernel timings give.
  TensorRT-LLM's CUTLASS grouped GEMMs run FP8 on FP8 tensor cores (off).
- Profile ``sglang-deepep``: SGLang as the literature's large DeepSeek deployments launch it
  (``--moe-a2a-backend deepep``: DeepEP's dispatch and combine, DeepGEMM's grouped FP8 GEMMs; SGLang's
  "Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism" blog, May 2025), the
  rest SGLang's. DeepGEMM runs FP8 on FP8 tensor cores with its own promotion (``moe_fp8_at_bf16_rate``
  off), and its grouped GEMMs of the contiguous layout run at the rate of its dense GEMMs of the same
  ``n x k`` (median 1.03 over the README's four rows, ``validation/data/kernels_deepgemm_published.csv``):
  ``moe_gemm_efficiency`` 1.0. ``moe_a2a_backend`` ``deepep``: its steps price dispatch and combine with
  DeepEP's kernels (:mod:`simcore.moe.deepep`) whatever the context's routing says about the all-to-all,
  and its exported SGLang launch carries ``--moe-a2a-backend deepep``. Its static memory fraction is the
  0.8 such launches pass (SGLang's PD-disaggregation docs, DeepSeek multi-node: ``--tp-size 16 --dp-size 8
  --enable-dp-attention --moe-a2a-backend deepep --mem-fraction-static 0.8``): SGLang's own default
  reserves 4.5 x the CUDA-graph batch per DP rank and would leave DeepSeek's experts no room at DP 16.
- ``moe_memory_efficiency``, ``moe_layer_s``: the runtime's MoE block at decode sizes, where the
  expert GEMMs read weights rather than compute. ``moe_memory_efficiency``: its grouped kernels' HBM
  bandwidth on the active experts' weights as a share of a dense GEMM's (``GpuSpec.hbm_efficiency``): a
  grouped kernel splits its tiles over many small weight matrices, pads each expert's rows to its block
  (Triton ``fused_moe``'s ``BLOCK_SIZE_M``) and walks an index of sorted tokens. ``moe_layer_s``: its fixed
  GPU time per MoE layer and step that no GEMM covers: the top-k routing, the token alignment/sort
  (``moe_align_block_size``), the activation and the weighted combine, each a small kernel, and the
  grouped kernels' grids sized for every expert's padding whatever the tokens (Megatron-LM measured its
  decode MoE routing at ~32 us per layer under CUDA-graph replay on 48 layers, NVIDIA/Megatron-LM PR
  #6453). Both are fitted per runtime by ``python -m validation.studies.serving.fit --moe`` on the TPOT of the fit
  set's MoE rows (1.0 and 0 before that fit, the dense GEMM's pricing); a dense model never sees them.
- ``moe_padded_rows``: rows its FP8 grouped expert kernels compute for every local expert whatever the
  routing (0: only the routed rows). vLLM's DeepGEMM MoE path (``DeepGemmExperts``) lays the routed rows out
  contiguously with each expert's segment padded to DeepGEMM's 128-row block, ``M_sum = M * topk + E *
  (128 - 1)`` rows, and its grouped GEMM computes every one of them ("DeepGemm (Grouped Contiguous) kernel
  needs a valid B index for all rows of A", ``deep_gemm_moe.py``); ``TritonOrDeepGemmExperts`` takes that
  path at any batch once E8M0 scales are on (vllm-project/vllm PR #26197, the Hopper default from then
  on). So each FP8 MoE layer costs at least a dense FP8 GEMM over ``routed + E_local x 128`` rows, flat in
  the batch: MiniMax-M2 on H100 at 10 clients decodes at 32.2 ms TPOT with it and 16.4 ms without
  (vllm-project/recipes PR #112); vLLM turned it off by default at TP 8 (PR #29346) and users report
  v0.12-v0.14 slower than v0.11 on FP8 MoE models with it (vllm-project/llm-compressor issue #2292). No
  profile carries it: the study sets 128 on the rows whose vLLM version and layout take that path
  (:mod:`simcore.serving.deployment.versions`; ``serving.runtime_version`` / ``serving.deep_gemm_moe`` of
  ``shard-sim workload=serving``); a caller sets it with :meth:`RuntimeProfile.with_overrides`.
- ``attention_dp_balance``, ``attention_dp_timeout_iters``, ``attention_dp_batching_wait_iters``:
  TensorRT-LLM's attention-DP balancing (``attention_dp_config``: ``enable_balance`` off,
  ``timeout_iters`` 50, ``batching_wait_iters`` 10 by default), for workers with attention DP: context
  requests run when every rank has one, or after the timeout
  (:class:`~simcore.serving.scheduler.AttentionDpBalance`). InferenceX's DeepSeek-R1 runs with attention
  DP turn it on with 60 and 0 (``dsr1_fp8_h200_trt.sh``).
- ``reserved_bytes``: device memory the runtime holds on each GPU beside the weights, the KV cache and the
  activations of its largest forward step that :func:`simcore.cost.memory.memory_per_gpu_bytes` prices: what
  its start-up memory profile counts on top of those (vLLM's dummy sampler run over ``max_num_seqs``
  sequences of the whole vocabulary, its non-torch allocations: NCCL and custom all-reduce buffers, the
  allocator's slack), taken out of its KV cache. vLLM: 5 GiB (``VLLM_RESERVED_BYTES``, ``python -m
  validation.studies.serving.kv_capacity --fit`` on the fit source of ``validation/data/kv_capacity_published.csv``:
  llm-d-benchmark's reading of vLLM's start-up logs of six launches of five models on one or two H100s,
  whose profiles report 4.8-7.4 GiB of activation peak, growing with the vocabulary, and 0.1-0.6 GiB of
  non-torch memory, where the forward's own activations come to ~1 GiB; the test sources, vLLM 0.19's logs
  in llm-d-planner and logs in vLLM's issues, are scored out of sample). SGLang's static pool and
  TensorRT-LLM's fraction of the free memory keep 0: no fit rows (four SGLang logs, scored: 2.4%).
- ``frontend_token_s``: host time per streamed token of the frontend process that streams a worker's
  tokens and takes its new requests in, one job at a time (:mod:`simcore.serving.frontend`: SGLang's
  ``TokenizerManager``, vLLM's API server, ``trtllm-serve``). Where the steps emit tokens faster than it
  streams them, its backlog delays every token's way to the client and every new request's way in, and
  the scheduler's batch runs below the client count. 0 (it keeps up) in every profile: not fitted yet;
  set it per run (``--set frontend_token_s=...`` of ``python -m validation.studies.serving.score``).
- ``spec_tokens``, ``spec_accept``: speculative decoding (MTP, EAGLE; :mod:`simcore.serving.speculative`),
  off (0 draft tokens) in every profile, set per launch; ``spec_accept`` the conditional acceptance of each
  draft position (aiconfigurator's default rates unless the launch gives its own).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simcore.cost.host import GRAPH_KERNEL_S
from simcore.serving.requests import ServingInputError
from simcore.serving.speculative import DEFAULT_ACCEPT, check_accept, tokens_per_step

__all__ = ["RuntimeProfile", "RUNTIMES", "get_runtime", "SCHEDULERS"]

SCHEDULERS = ("vllm", "sglang", "trtllm")
#: the runtime's expert all-to-all: ``none`` (the context's routing decides; NCCL by default) or ``deepep``
MOE_A2A_BACKENDS = ("none", "deepep")

#: Host launch cost of one kernel outside a CUDA graph (cudaLaunchKernel plus framework dispatch).
#: Measured by this project on a lent H100's host (``python -m validation.studies.serving.measure_launch``,
#: ``validation/data/launch_h100_measured.csv``, torch 2.11): 7.3 us (``F.silu``), 9.9 us (in-place
#: add), 14.5 us (``F.linear``, through cuBLAS) per op back to back; 10 us is the median path. It was
#: 6 us, from PyTorch's "CUDA graphs" blog (2021: 5-10 us) before the measurement.
EAGER_LAUNCH_S = 10.0e-6
#: vLLM's and SGLang's own all-reduce kernels' fixed latencies, one-shot and two-shot (module doc,
#: ``custom_ar_s``): ``python -m validation.studies.collectives.fit_custom_allreduce`` on their published H100 timings
#: (``validation/data/allreduce_runtime_published.csv``; fit rows, median |log error| 0.054 on 31 points; the
#: test rows 0.173 on 13, an SM 9.0 symmetric-memory table at 8 GPUs running faster than the fit)
CUSTOM_AR_ONE_SHOT_S = 6.0e-6
CUSTOM_AR_TWO_SHOT_S = 12.0e-6
#: host time an MoE layer adds to an eager step in SGLang and TensorRT-LLM (module doc, ``eager_moe_layer_s``)
EAGER_MOE_LAYER_S = 1.30e-3
#: memory vLLM holds per GPU beside weights, KV cache and the forward's activations (module doc,
#: ``reserved_bytes``): ``python -m validation.studies.serving.kv_capacity --fit`` on its fit source, 5 GiB (median |log
#: error| of the KV size 0.021 on 6 start-ups; 0 GiB: 0.167), scored out of sample on 14 start-ups of other
#: sources, versions and runtimes: median |KV size error| 8.1% at 0 GiB, 4.3% at 5 GiB
VLLM_RESERVED_BYTES = 5.0 * 2**30


@dataclass(frozen=True)
class RuntimeProfile:
    """One serving runtime; see the module docstring for the meaning and source of each field."""

    name: str
    scheduler: str
    step_host_s: float
    overlap_host: bool
    graph_max_tokens: int
    graph_decode_only: bool
    mixed_batches: bool
    max_num_batched_tokens: int
    kv_block_tokens: int
    mem_fraction: float | None
    launch_s: float = EAGER_LAUNCH_S
    graph_kernel_s: float = GRAPH_KERNEL_S
    step_host_per_seq_s: float = 0.0
    custom_ar_s: float = 8.0e-6
    custom_ar_max_bytes: float = 8 * 2**20
    two_shot_ar_s: float = 8.0e-6
    request_s: float = 0.0
    tokenize_s_per_token: float = 0.0
    mem_fraction_of_free: bool = False
    mem_fraction_static: bool = False
    batch_wait_timeout_iters: int = 0
    batch_wait_max_tokens_ratio: float = 0.0
    attention_dp_balance: bool = False
    attention_dp_timeout_iters: int = 50
    attention_dp_batching_wait_iters: int = 10
    moe_gemm_efficiency: float = 1.0
    moe_fp8_at_bf16_rate: bool = False
    moe_memory_efficiency: float = 1.0
    moe_layer_s: float = 0.0
    eager_moe_layer_s: float = 0.0
    moe_a2a_backend: str = "none"
    moe_padded_rows: int = 0
    spec_tokens: int = 0
    spec_accept: tuple[float, ...] = DEFAULT_ACCEPT
    reserved_bytes: float = 0.0
    #: SGLang's two-batch overlap (``--enable-two-batch-overlap``): each step's expert dispatch and combine
    #: hidden behind the other micro-batch's compute (:func:`simcore.serving.step_cost.two_batch_overlap_s`)
    two_batch_overlap: bool = False
    #: host time per streamed token of the one frontend process a worker streams through
    #: (:mod:`simcore.serving.frontend`); 0: it keeps up with every step
    frontend_token_s: float = 0.0

    def host_s(self, seqs: int) -> float:
        """Host time of a step over ``seqs`` sequences."""
        return self.step_host_s + self.step_host_per_seq_s * seqs

    def request_path_s(self, input_len: int) -> float:
        """A request's path to the scheduler and its first token's way back, for a prompt of ``input_len``
        tokens: the fixed latency and the prompt's tokenization (module doc, ``request_s``)."""
        return self.request_s + self.tokenize_s_per_token * input_len

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ServingInputError(f"runtime.scheduler: {self.scheduler!r} is not one of {', '.join(SCHEDULERS)}")
        for f in ("step_host_s", "launch_s", "graph_kernel_s", "step_host_per_seq_s", "request_s",
                  "tokenize_s_per_token", "frontend_token_s", "moe_layer_s",
                  "eager_moe_layer_s", "custom_ar_s", "two_shot_ar_s", "reserved_bytes"):
            if getattr(self, f) < 0:
                raise ServingInputError(f"runtime {self.name}: {f} must be >= 0, got {getattr(self, f)}")
        if not isinstance(self.moe_padded_rows, int) or self.moe_padded_rows < 0:
            raise ServingInputError(f"runtime {self.name}: moe_padded_rows must be an integer >= 0, got "
                                    f"{self.moe_padded_rows!r}")
        if not isinstance(self.moe_fp8_at_bf16_rate, bool):
            raise ServingInputError(f"runtime {self.name}: moe_fp8_at_bf16_rate must be true or false, got "
                                    f"{self.moe_fp8_at_bf16_rate!r}")
        check_accept(self.spec_tokens, tuple(self.spec_accept), f"runtime {self.name}")
        if self.moe_a2a_backend not in MOE_A2A_BACKENDS:
            raise ServingInputError(f"runtime {self.name}: moe_a2a_backend must be one of "
                                    f"{', '.join(MOE_A2A_BACKENDS)}, got {self.moe_a2a_backend!r}")
        for f in ("moe_gemm_efficiency", "moe_memory_efficiency"):
            if not 0 < getattr(self, f) <= 1:
                raise ServingInputError(f"runtime {self.name}: {f} must be in (0, 1], got {getattr(self, f)}")
        if self.mem_fraction is None and not self.mem_fraction_static:
            raise ServingInputError(f"runtime {self.name}: mem_fraction must be given (only SGLang's static "
                                    f"fraction has a default of its own)")
        if self.mem_fraction is not None and not 0 < self.mem_fraction <= 1:
            raise ServingInputError(f"runtime {self.name}: mem_fraction must be in (0, 1], got {self.mem_fraction}")
        if self.mem_fraction_static and self.mem_fraction_of_free:
            raise ServingInputError(f"runtime {self.name}: mem_fraction_static and mem_fraction_of_free exclude "
                                    f"each other")
        if self.batch_wait_timeout_iters < 0 or not 0 <= self.batch_wait_max_tokens_ratio <= 1:
            raise ServingInputError(f"runtime {self.name}: batch_wait_timeout_iters must be >= 0 and "
                                    f"batch_wait_max_tokens_ratio in [0, 1]")
        if (self.batch_wait_timeout_iters or self.batch_wait_max_tokens_ratio) and self.scheduler != "trtllm":
            raise ServingInputError(f"runtime {self.name}: batch waiting is TensorRT-LLM's (scheduler trtllm), "
                                    f"not {self.scheduler}'s")
        if self.attention_dp_timeout_iters < 0 or self.attention_dp_batching_wait_iters < 0:
            raise ServingInputError(f"runtime {self.name}: attention_dp_timeout_iters and "
                                    f"attention_dp_batching_wait_iters must be >= 0")
        if self.attention_dp_balance and self.scheduler != "trtllm":
            raise ServingInputError(f"runtime {self.name}: attention_dp_balance is TensorRT-LLM's (scheduler "
                                    f"trtllm), not {self.scheduler}'s")
        for f in ("graph_max_tokens", "max_num_batched_tokens", "kv_block_tokens"):
            if getattr(self, f) < (0 if f == "graph_max_tokens" else 1):
                raise ServingInputError(f"runtime {self.name}: {f} must be positive, got {getattr(self, f)}")

    def expert_flops_per_s(self, gpu, precision: str) -> float | None:
        """The tensor-core rate of this runtime's grouped expert kernels on their useful work
        (``moe_gemm_efficiency`` of a dense GEMM's), or None where they run as dense GEMMs do."""
        if self.moe_gemm_efficiency == 1.0 and not self.moe_fp8_at_bf16_rate:
            return None
        if self.moe_fp8_at_bf16_rate and precision == "fp8":
            precision = "bf16"
        return gpu.peak_flops_per_s[precision] * gpu.gemm_efficiency[precision] * self.moe_gemm_efficiency

    def expert_bytes_per_s(self, gpu) -> float | None:
        """The HBM bandwidth of this runtime's grouped expert kernels on the experts' weights
        (``moe_memory_efficiency`` of a dense GEMM's), or None where they read as dense GEMMs do."""
        if self.moe_memory_efficiency == 1.0:
            return None
        return gpu.hbm_bandwidth_bytes_per_s * gpu.hbm_efficiency * self.moe_memory_efficiency

    @property
    def tokens_per_step(self) -> float:
        """Tokens a decoding sequence gains per step: 1, or more with speculative decoding."""
        return tokens_per_step(self.spec_tokens, tuple(self.spec_accept))

    def uses_graph(self, tokens: int, has_prefill: bool) -> bool:
        """Whether a step of ``tokens`` tokens replays a CUDA graph."""
        if has_prefill and self.graph_decode_only:
            return False
        return tokens <= self.graph_max_tokens

    def with_overrides(self, **changes) -> RuntimeProfile:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ServingInputError(f"runtime: unknown field(s) {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)


# step_host_s, step_host_per_seq_s, custom_ar_s: `python -m validation.studies.serving.fit --rows 20` on the fit set of
# the H200 serving sample (models in validation.studies.serving.FIT_MODELS; median |log error| of TPOT on its 20
# rows per runtime: vLLM 0.18, SGLang 0.11, TensorRT-LLM 0.08; vLLM's fit rows are all vllm-sync, v0.12 or
# unversioned, and ``vllm`` shares their values), with the study's earlier client (fixed lengths, 3 requests per
# client); not refitted since. moe_gemm_efficiency (vLLM, SGLang): `python -m validation.studies.moe.fit_kernels` on
# published Triton fused_moe timings at 512-4096 tokens (16 rows of two sources, median |log error| 0.148, 0.407
# at 1.0), not on serving rows; TensorRT-LLM: `--runtime trtllm` on this project's H100 CUTLASS grouped-GEMM
# timings (90 BF16 rows at >= 128 tokens per expert, 0.145, 0.265). request_s: `python -m validation.studies.serving.fit
# --only-request` on the fit rows InferenceX's client measured, with that client (10 requests per client), the
# harness's launch flags (validation/studies/serving/launch.py: TensorRT-LLM's batch waiting and attention-DP
# balancing included) and TensorRT-LLM's memory fraction of the free memory, each measurement once, with the MoE
# kernel rates above: vLLM 45 ms (`--runtimes vllm-sync trtllm`, 7 min; median |log error| of TTFT 0.104 on 40
# rows, 30 ms ties), TensorRT-LLM 30 ms (0.208 on 40; 45 ms before its grouped-GEMM rate was measured), SGLang
# 160 ms (`--runtimes sglang`, 2.6 min: 0.090 on its 15 rows; 200 ms since, below). 160 ms is still far more than an HTTP path and a
# tokenizer take: it absorbs TTFT the simulator does not explain on its DeepSeek rows (validation/reports/serving/history.md);
# TensorRT-LLM's rows split, Llama-70B's wanting ~45 ms and DeepSeek-R1's ~300 ms (the median lands at 30).
# moe_memory_efficiency, moe_layer_s, then request_s again: `python -m validation.studies.serving.fit --moe --rows 12
# --ttft-rows 24` (two processes, ~15 min) on each runtime's MoE fit rows with the runtimes' layout
# (simcore.serving.plan.runtime_sharding: two all-reduces per MoE layer, not Megatron's four collectives, whose
# extra NCCL latencies had stood in for this MoE time): joint grid 1/0.7/0.5/0.35 x 0-100 us, median |log error|
# of TPOT on 12 rows: vLLM 0.5 and 75 us (0.066; its MoE fit rows are Qwen3-235B's aiconfigurator sweeps),
# SGLang 1.0 and 75 us (0.048; 0.7 and 50 us within 0.001: the two trade off on these rows), TensorRT-LLM
# 0.7 and 50 us (0.068); request_s then vLLM 45 ms (0.078), SGLang 200 ms (0.084), TensorRT-LLM 30 ms (0.205).
# moe_gemm_efficiency (vLLM, SGLang), with moe_fp8_at_bf16_rate, and request_s: `python -m validation.studies.serving.fit
# --moe-prefill --ttft-rows 16` (one process per runtime, ~4 min each) on the TTFT of each runtime's 16 MoE fit rows
# (all FP8: Qwen3-235B's aiconfigurator sweeps; DeepSeek-V3's InferenceX runs for SGLang), each value scored at its
# own best request delay: grid 0.7/0.5/0.35/0.25/0.18/0.12, median |log error| vLLM 0.265/0.220/0.143/0.117/0.253/
# 0.590 (0.25), SGLang 0.100/0.118/0.129/0.112/0.055/0.059 (0.18); request_s then vLLM 45 ms (0.067 on 16
# harness rows, unchanged), SGLang 130 ms (0.087 on 15; 200 ms had absorbed the prefill the 0.35 rate left out).
# The BF16 kernel timings give 0.35 (above); the serving shapes (experts split 2-8 ways by tensor parallelism, so
# short K and N per GPU) run slower. TensorRT-LLM's rows do not tell (0.29-0.36 over the whole grid: its DeepSeek
# rows' TTFT is dominated by what the simulator does not explain, validation/reports/serving/history.md), so it keeps its measured 0.70.
# Then the MoE block again with these rates (`--moe --rows 12 --ttft-rows 24`, two processes, 7 min): vLLM 0.5 and
# 25 us (0.057; 75 us scores 0.119 now: it had carried part of the slower prefill in vLLM's mixed steps), SGLang
# 1.0 and 75 us unchanged (0.065), request_s unchanged (vLLM 45 ms, SGLang 130 ms).
# These fits priced every FP8 row's KV cache in FP8. With the KV type each row's launch used
# (simcore/serving/deployment/kv_dtype.py: BF16 for most vLLM and SGLang rows), SGLang's admission headroom
# and static memory pool, the host constants were refitted (`--runtimes vllm-sync --rows 24`, ~60 min;
# `--runtimes sglang --rows 24`, one pass, which had converged): vLLM step_host_s 4 ms (unchanged),
# step_host_per_seq_s 0 -> 10 us, custom_ar_s 6 -> 3 us (median |log error| of TPOT 0.102 -> 0.082 on its
# 24 rows; on all 132 aggregated vLLM fit rows 0.121 -> 0.107, each row simulated under both; 3 us is the
# grid's lowest value, so it also carries per-layer time the model overprices on these rows: a fitted
# knob, not a measured latency); request_s stays 45 ms. SGLang's fit preferred step_host_s 6 ms on its 24
# rows (TPOT 0.083 vs 0.126 at 2 ms), but on all 85 of its aggregated fit rows 2 / 4 / 6 ms score
# 0.132 / 0.131 / 0.131: no signal, so SGLang keeps 2 ms; request_s stays 130 ms.
# Then on every fit row rather than an evenly spread subset (the study's simulate_case, two processes, the
# criteria of `fit_serving`): vLLM's request_s on its 60 harness rows (Llama-3.1-70B): 45 ms -> 30 ms (median
# |rel error| of TTFT 0.099 -> 0.078; 15 ms 0.098; on all 132 aggregated vLLM fit rows 0.158 -> 0.117, TPOT
# unchanged); its MoE block stays (0.5 and 25 us score best on all 51 Qwen3-235B rows, TPOT 0.109, against
# 0.125-0.342 at 0.7/1.0 x 25-125 us). TensorRT-LLM's MoE block on all 53 of its MoE fit rows (DeepSeek-V3/R1;
# the earlier fit saw 12): 0.7 and 50 us -> 0.85 and 125 us (median |log error| of TPOT 0.140 -> 0.072; the
# best of 19 points of 0.7/0.85/1.0 x 50-200 us, on a rough surface: 100 us scores 0.111, 150 us 0.133, as the
# rows mix DeepSeek-V3 runs with DeepSeek-R1 runs that decode with MTP speculation, unrecorded: serving history); request_s
# then stays 30 ms (0.078 on its 72 harness Llama-70B rows, 0.166 on all 125). SGLang's MoE prefill rate and
# request path stay: on its 39 MoE fit rows 0.5 and 180 ms would score TTFT 0.176 against 0.188, but its two
# clients disagree (DeepSeek-V3's InferenceX rows 0.104 -> 0.056, Qwen3-235B's aiconfigurator sweeps 0.240 ->
# 0.327), and Triton's published fused_moe timings give 0.24-0.35.
# With eager_moe_layer_s (from SGLang's published log, not fitted here), SGLang's request path was fitted
# again (`python -m validation.studies.serving.fit --only-request --runtimes sglang`, 2 min): 130 ms still best
# (median |log error| of TTFT 0.132 on its 15 rows); TensorRT-LLM's and vLLM's were fitted on dense
# Llama-70B rows, which it does not touch. TensorRT-LLM's MoE block then refitted on its 32 DeepSeek rows that
# are not MTP runs (the 30 DeepSeek-V3 rows and DeepSeek-R1's two of 2026-01-28; serving history), scratch grid of 13
# points through the study's simulate_case: HBM efficiency 0.85 -> 1.0 at 125 us per layer (median |TPOT error|
# 5.3% -> 1.4%; 0.95 / 125 us 2.1%, 1.0 / 110 us 5.3%, 1.0 / 140 us 4.1%, 0.85 / 100 us 4.5%); on all 57 non-MTP
# DeepSeek TensorRT-LLM fit rows, disaggregated ones included, 5.2% -> 3.5% (full study; validation/reports/serving/history.md).
# Then the all-reduce: vLLM's 3 us (the grid's floor) and SGLang's 6 us had been fitted on serving rows for one
# latency of both the one-shot and the two-shot kernel, which priced a decode all-reduce of 0.5-1 MiB at 5-8 us
# where the kernels' published H100 timings take 11-17 us. Both runtimes now take the two latencies fitted on
# those timings (CUSTOM_AR_ONE_SHOT_S, CUSTOM_AR_TWO_SHOT_S above), and vLLM's host time per step was refitted
# with them on all 132 aggregated vLLM fit rows (`python -m validation.studies.serving.score --backend vllm --mode agg
# --set step_host_s=...`, in sample): 4 ms -> 3 ms, median |TPOT error| 9.7% (old all-reduce, 4 ms) -> 9.1%
# (11.7% at 4 ms, 10.7% at 2.5 ms; 9.8% at 3 ms without the per-sequence 10 us). SGLang's 85 aggregated fit rows
# score 14.1% -> 14.4% with its host constants as they were (30 us per sequence: 15.8%); they stay.
# TensorRT-LLM keeps its fitted 14 us for both kernels: its fit rows prefer it (module doc).
# The request path (2026-12-06): `python -m validation.studies.serving.fit --only-request --write
# validation/data/serving_request_path_fit.json` on the fit set's harness TTFT, each on its bounded grid:
# request_s 40 ms for all three (was 30 / 130 / 30 ms, one fixed path absorbing TTFT it does not explain),
# tokenize_s_per_token 4 / 0 / 1 us (vLLM's at its grid's top: it carries prefill time the model leaves out).
# Everything else: the sources above.
_VLLM_SYNC = RuntimeProfile("vllm-sync", "vllm", step_host_s=3.0e-3, overlap_host=False, graph_max_tokens=512,
                            graph_decode_only=False, mixed_batches=True, max_num_batched_tokens=8192,
                            kv_block_tokens=16, mem_fraction=0.90, step_host_per_seq_s=10e-6,
                            custom_ar_s=CUSTOM_AR_ONE_SHOT_S, two_shot_ar_s=CUSTOM_AR_TWO_SHOT_S,
                            request_s=40e-3, tokenize_s_per_token=4e-6, moe_gemm_efficiency=0.25, moe_fp8_at_bf16_rate=True,
                            moe_memory_efficiency=0.5, moe_layer_s=25e-6, reserved_bytes=VLLM_RESERVED_BYTES)

_SGLANG = RuntimeProfile("sglang", "sglang", step_host_s=2.0e-3, overlap_host=True, graph_max_tokens=512,
                         graph_decode_only=True, mixed_batches=False, max_num_batched_tokens=8192,
                         kv_block_tokens=1, mem_fraction=None, mem_fraction_static=True,
                         step_host_per_seq_s=40e-6, custom_ar_s=CUSTOM_AR_ONE_SHOT_S,
                         two_shot_ar_s=CUSTOM_AR_TWO_SHOT_S,
                         request_s=40e-3, tokenize_s_per_token=0.0, moe_gemm_efficiency=0.18, moe_fp8_at_bf16_rate=True,
                         moe_layer_s=75e-6, eager_moe_layer_s=EAGER_MOE_LAYER_S)

RUNTIMES: dict[str, RuntimeProfile] = {
    "vllm": dataclasses.replace(_VLLM_SYNC, name="vllm", overlap_host=True),
    "vllm-sync": _VLLM_SYNC,
    "sglang": _SGLANG,
    "sglang-deepep": dataclasses.replace(_SGLANG, name="sglang-deepep", mem_fraction=0.8, moe_gemm_efficiency=1.0,
                                         moe_fp8_at_bf16_rate=False, moe_a2a_backend="deepep"),  # module doc
    "trtllm": RuntimeProfile("trtllm", "trtllm", step_host_s=6.0e-3, overlap_host=True, graph_max_tokens=512,
                             graph_decode_only=True, mixed_batches=True, max_num_batched_tokens=8192,
                             kv_block_tokens=32, mem_fraction=0.90, step_host_per_seq_s=90e-6, custom_ar_s=14e-6,
                             two_shot_ar_s=14e-6,
                             request_s=40e-3, tokenize_s_per_token=1e-6, mem_fraction_of_free=True, moe_gemm_efficiency=0.70,
                             moe_memory_efficiency=1.0, moe_layer_s=125e-6, eager_moe_layer_s=EAGER_MOE_LAYER_S),
}


def get_runtime(name: str) -> RuntimeProfile:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ServingInputError(f"serving.runtime: unknown runtime {name!r}; choose one of: "
                                f"{', '.join(sorted(RUNTIMES))}") from None
