"""Time whole forward passes of a Llama-shaped model on one local GPU, as inference-schema rows.

``python -m validation.studies.inference.measure_decode --out PATH [--models a,b]``  (needs torch with CUDA)

Builds the decoder of a shipped ``simcore/models/configs/<name>.json`` (dense Llama-family models that fit
one GPU in BF16) with random weights and times, with CUDA graphs (no Python or scheduler cost between
kernels), one decode step (``batch`` sequences, one new token each over a KV cache of ``input_len``
tokens) and one prefill (``batch`` prompts of ``input_len`` tokens, causal). Each layer is what a
serving engine runs, kernel for kernel: RMSNorm, fused QKV GEMM, rotary embedding, flash attention (GQA)
reading and writing a preallocated KV cache, output GEMM, residual add, RMSNorm, fused gate/up GEMM,
SiLU x up, down GEMM, residual add; then the final norm and the LM head on the last token. Rows are in
the schema of ``inference_calibration.csv`` (metric ``tpot_ms`` for decode, ``ttft_ms`` for prefill),
so ``validation.studies.inference.compare_measured`` (and any inference tool) reads them. The output ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from simcore.files import dumps
from simcore.models import CONFIG_DIR
from validation.studies.kernels.measure import capture_graph, cuda_torch, hardware_of, source, write_rows

__all__ = ["main"]

FIELDS = ["source_url", "model", "hardware", "gpus", "tp", "pp", "ep", "dp", "precision", "scenario", "batch",
          "input_len", "output_len", "metric", "value", "unit", "note"]
DECODE = [(1, 1024), (4, 1024), (16, 1024), (64, 1024), (128, 2048), (256, 1024), (4, 8192), (32, 8192)]
KV_SHARE = 0.5  # of the GPU's memory for the KV cache; the rest holds weights and activations
PREFILL = [(1, 512), (1, 1024), (8, 1024), (1, 2048), (4, 2048), (1, 8192), (2, 8192)]


class Decoder:
    """Random-weight Llama decoder with a static KV cache; ``forward(x, pos)`` runs every layer."""

    def __init__(self, torch, cfg: dict, max_tokens: int, batch: int, fp8: bool = False):
        dev, dt = "cuda", torch.bfloat16
        self.t, self.fp8 = torch, fp8
        self.one = torch.ones((), device=dev, dtype=torch.float32)
        h, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.dim = cfg.get("head_dim", h // self.heads)
        ffn, layers = cfg["intermediate_size"], cfg["num_hidden_layers"]
        q, kv = self.heads * self.dim, self.kv_heads * self.dim

        def w(*shape):
            weight = torch.randn(*shape, device=dev, dtype=dt) * 0.02
            # FP8: e4m3 weights stored transposed (column-major, as _scaled_mm wants), per-tensor scales
            return weight.to(torch.float8_e4m3fn).t() if fp8 else weight.t()

        self.layers = [{"qkv": w(q + 2 * kv, h), "o": w(h, q), "up": w(2 * ffn, h), "down": w(h, ffn),
                        "n1": torch.ones(h, device=dev, dtype=dt), "n2": torch.ones(h, device=dev, dtype=dt),
                        "k": torch.zeros(batch, self.kv_heads, max_tokens, self.dim, device=dev, dtype=dt),
                        "v": torch.zeros(batch, self.kv_heads, max_tokens, self.dim, device=dev, dtype=dt)}
                       for _ in range(layers)]
        self.norm = torch.ones(h, device=dev, dtype=dt)
        self.head = (torch.randn(cfg["vocab_size"], h, device=dev, dtype=dt) * 0.02).t()  # BF16, as served
        self.q, self.kv, self.ffn, self.eps = q, kv, ffn, cfg.get("rms_norm_eps", 1e-5)
        inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, self.dim, 2, device=dev) / self.dim))
        angles = torch.outer(torch.arange(max_tokens, device=dev, dtype=torch.float32), inv)
        self.cos, self.sin = angles.cos().to(dt), angles.sin().to(dt)

    def _rope(self, x, pos):  # x: [b, heads, s, d]; pos: [s]
        half = x.shape[-1] // 2
        cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
        x1, x2 = x[..., :half], x[..., half:]
        return self.t.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def _linear(self, x, weight):
        """x @ weight (weight: [in, out]); FP8: x cast to e4m3 (static per-tensor scale), BF16 out."""
        if not self.fp8:
            return x @ weight
        flat = x.reshape(-1, x.shape[-1])
        rows = flat.shape[0]
        pad = -rows % 16  # cuBLASLt FP8 wants rows in multiples of 16, as runtimes pad a small decode batch
        flat = self.t.nn.functional.pad(flat, (0, 0, 0, pad)).to(self.t.float8_e4m3fn)
        out = self.t._scaled_mm(flat, weight, scale_a=self.one, scale_b=self.one, out_dtype=self.t.bfloat16)
        return out[:rows].view(*x.shape[:-1], weight.shape[1])

    def forward(self, x, pos, kv_len: int):
        """x: [b, s, hidden] at positions ``pos`` (s tokens); attends to cache positions < kv_len."""
        t, fn = self.t, self.t.nn.functional
        b, s, _ = x.shape
        for layer in self.layers:
            y = fn.rms_norm(x, (x.shape[-1],), layer["n1"], self.eps)
            qkv = self._linear(y, layer["qkv"])
            q, k, v = qkv.split([self.q, self.kv, self.kv], dim=-1)
            q = self._rope(q.view(b, s, self.heads, self.dim).transpose(1, 2), pos)
            k = self._rope(k.view(b, s, self.kv_heads, self.dim).transpose(1, 2), pos)
            layer["k"].index_copy_(2, pos, k)
            layer["v"].index_copy_(2, pos, v.view(b, s, self.kv_heads, self.dim).transpose(1, 2))
            att = fn.scaled_dot_product_attention(q, layer["k"][:, :, :kv_len], layer["v"][:, :, :kv_len],
                                                  is_causal=s > 1, enable_gqa=True)
            x = x + self._linear(att.transpose(1, 2).reshape(b, s, self.q), layer["o"])
            y = fn.rms_norm(x, (x.shape[-1],), layer["n2"], self.eps)
            gate, up = self._linear(y, layer["up"]).split([self.ffn, self.ffn], dim=-1)
            x = x + self._linear(fn.silu(gate) * up, layer["down"])
        last = fn.rms_norm(x[:, -1], (x.shape[-1],), self.norm, self.eps)
        return t.argmax(last @ self.head, dim=-1)


def _graph_time_s(torch, fn, repeats: int = 10) -> float:
    graph = capture_graph(torch, fn)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e-3)
    return statistics.median(samples)


def _row(model: str, phase: str, batch: int, input_len: int, seconds: float, note: str) -> dict[str, str]:
    """One inference-schema row; ``main`` fills in source_url, hardware and precision."""
    return {"model": model, "gpus": "1", "tp": "1", "pp": "1", "ep": "1", "dp": "1", "scenario": phase, "batch": str(batch),
            "input_len": str(input_len), "output_len": "1",
            "metric": "tpot_ms" if phase == "decode" else "ttft_ms", "value": f"{seconds * 1e3:.4f}", "unit": "ms",
            "note": note}


def measure(torch, model: str, note: str, fp8: bool = False):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cfg = json.loads((CONFIG_DIR / f"{model}.json").read_text())
    hidden = cfg["hidden_size"]
    with torch.no_grad(), sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        kv_per_token = cfg["num_hidden_layers"] * 4 * cfg.get("num_key_value_heads", cfg["num_attention_heads"]) * (
            cfg.get("head_dim", hidden // cfg["num_attention_heads"]))
        for batch, context in DECODE:
            kv_limit = KV_SHARE * torch.cuda.get_device_properties(0).total_memory
            if batch * (context + 1) * kv_per_token > kv_limit:
                print(f"{model}: decode batch {batch} x {context} skipped: KV cache over "
                      f"{kv_limit / 1e9:.0f} GB", file=sys.stderr)
                continue
            dec = Decoder(torch, cfg, context + 1, batch, fp8)
            x = torch.randn(batch, 1, hidden, device="cuda", dtype=torch.bfloat16)
            pos = torch.tensor([context], device="cuda")
            seconds = _graph_time_s(torch, lambda d=dec, x=x, p=pos, n=context + 1: d.forward(x, p, n))
            yield _row(model, "decode", batch, context, seconds, note + "; one decode step, CUDA graph")
            del dec
        for batch, length in PREFILL:
            dec = Decoder(torch, cfg, length, batch, fp8)
            x = torch.randn(batch, length, hidden, device="cuda", dtype=torch.bfloat16)
            pos = torch.arange(length, device="cuda")
            seconds = _graph_time_s(torch, lambda d=dec, x=x, p=pos, n=length: d.forward(x, p, n))
            yield _row(model, "prefill", batch, length, seconds, note + "; one prefill pass, CUDA graph")
            del dec
            torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="CSV to write (inference schema)")
    parser.add_argument("--models", default="llama-3.1-8b,llama-2-7b,mistral-7b")
    parser.add_argument("--fp8", action="store_true",
                        help="FP8 e4m3 linear layers (torch._scaled_mm, per-tensor scales) as FP8 checkpoints serve")
    args = parser.parse_args(argv)
    torch = cuda_torch()
    if torch is None:
        return 2
    props = torch.cuda.get_device_properties(0)
    weights = "FP8 e4m3 linear layers (static per-tensor scales), BF16 attention" if args.fp8 else "BF16"
    note = f"{props.name}, torch {torch.__version__}, random {weights} weights, no serving runtime"
    filled = {"source_url": source("validation.studies.inference.measure_decode", props.name), "hardware": hardware_of(props.name),
              "precision": "fp8" if args.fp8 else "bf16"}
    rows = []
    for model in args.models.split(","):
        if not (CONFIG_DIR / f"{model}.json").is_file():
            print(f"error: --models: no shipped config {model!r}", file=sys.stderr)
            return 2
        for row in measure(torch, model, note, args.fp8):
            row.update(filled)
            rows.append(row)
            print(f"{model:<14} {row['scenario']:<8} batch {row['batch']:>4} len {row['input_len']:>5} "
                  f"{row['metric']} {row['value']:>10}", flush=True)
    write_rows(args.out, FIELDS, rows)
    print(dumps({"device": props.name, "rows": len(rows), "out": str(args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
