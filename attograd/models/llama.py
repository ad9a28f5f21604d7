"""A LLaMA-family decoder (llama, qwen2, qwen3) from a GGUF file, over the public Tensor API.

RMSNorm, rotary positions, grouped-query attention with a KV cache, SwiGLU, tied or untied output.
Weights stay as the GGUF's raw (quantized) bytes in memory; each matmul decodes them inside its kernel.
The KV cache position is a bound Variable, so one TinyJit-captured decode step serves every position,
and the token id is one too: the embedding row is a symbolic slice of the table, not a one-hot product."""
from __future__ import annotations
import math, os
from dataclasses import dataclass
from typing import Any
from attograd import Tensor, TinyJit, Variable, dtypes
from attograd.uop.ops import UOp
from attograd.nn.state import gguf_load
import attograd.nn.functional as F

__all__ = ["LlamaConfig", "Llama"]

# how an architecture differs from llama: the rotary layout (llama.cpp's rope type: "norm" rotates adjacent pairs,
# as GGUF's permuted Q/K rows expect; "neox" rotates the two halves of each head)
ARCHITECTURES: dict[str, dict[str, Any]] = {
  "llama": {"rope": "norm"},
  "qwen2": {"rope": "neox"},
  "qwen3": {"rope": "neox"},
}

@dataclass(frozen=True)
class LlamaConfig:
  arch: str
  n_layers: int
  dim: int
  hidden: int
  n_heads: int
  n_kv_heads: int
  head_dim: int
  vocab: int
  norm_eps: float
  rope_base: float
  rope: str
  context: int

  @staticmethod
  def from_metadata(meta: dict[str, Any], path: str = "<gguf>") -> LlamaConfig:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
      raise ValueError(f"{path}: general.architecture is {arch!r}; attograd's llama model reads {', '.join(ARCHITECTURES)}")
    def get(key: str, default: Any = None) -> Any:
      v = meta.get(f"{arch}.{key}", default)
      if v is None: raise ValueError(f"{path}: metadata {arch}.{key} is missing")
      return v
    dim, heads = get("embedding_length"), get("attention.head_count")
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", [])) or None
    if vocab is None: raise ValueError(f"{path}: neither {arch}.vocab_size nor tokenizer.ggml.tokens gives the vocabulary size")
    return LlamaConfig(arch, get("block_count"), dim, get("feed_forward_length"), heads, get("attention.head_count_kv", heads),
                       get("attention.key_length", dim // heads), vocab, get("attention.layer_norm_rms_epsilon"),
                       get("rope.freq_base", 10000.0), ARCHITECTURES[arch]["rope"], get("context_length"))

def rms_norm(x: Tensor, w: Tensor, eps: float) -> Tensor: return F.rms_norm(x, x.shape[-1], w, eps)  # (over the last axis)

class Llama:
  """model = Llama.from_gguf(path); logits = model(tokens, start_pos) gives the next-token logits (vocab,) after
  tokens (a list of ints) placed at positions start_pos...; the KV cache keeps what came before."""
  def __init__(self, cfg: LlamaConfig, weights: dict[str, Tensor], max_context: int = 2048):
    self.cfg, self.w = cfg, weights
    self.max_context = min(max_context, cfg.context)
    need = ["token_embd.weight", "output_norm.weight"] + [f"blk.{i}.{n}.weight" for i in range(cfg.n_layers)
            for n in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    if missing := [n for n in need if n not in weights]: raise ValueError(f"the model has no tensor {missing[0]!r} (and {len(missing) - 1} more missing)")
    self.output = weights.get("output.weight", weights["token_embd.weight"])  # tied when the file has no output
    kv_shape = (self.max_context, cfg.n_kv_heads, cfg.head_dim)
    # each its own buffer, zeroed: Tensor.zeros(...).contiguous() is one graph for all 60, realized as one shared buffer,
    # so the first prompt pass read one cache input where later ones read 60: a different graph, the 736-kernel pass
    # scheduled twice (its first call and its capture)
    self.cache = [(Tensor.empty(*kv_shape), Tensor.empty(*kv_shape)) for _ in range(cfg.n_layers)]
    for kv in self.cache:
      for t in kv: t.assign(Tensor.zeros(*kv_shape))
    Tensor.realize_all([t for kv in self.cache for t in kv])
    half = cfg.head_dim // 2
    freqs = Tensor.arange(self.max_context).float().unsqueeze(1) * (cfg.rope_base ** (-Tensor.arange(half).float() * 2 / cfg.head_dim)).unsqueeze(0)
    self.cos, self.sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    Tensor.realize_all([self.cos, self.sin])
    self._pos_vars: dict[int, UOp] = {}
    self.tok_var = Variable("tok", 0, cfg.vocab - 1)
    self._decode = TinyJit(self._decode_step)
    self._row = TinyJit(self._row_step)
    self._prefill: dict[int, TinyJit] = {}  # one captured pass per prompt chunk size

  @staticmethod
  def from_gguf(path: str | os.PathLike, max_context: int = 2048) -> tuple[Llama, dict[str, Any]]:
    """The model and the file's metadata (for the tokenizer and chat template)."""
    meta, weights = gguf_load(path, resident=True)
    return Llama(LlamaConfig.from_metadata(meta, os.fspath(path)), weights, max_context), meta

  # ***** the network *****
  def _rope(self, x: Tensor, start: int | UOp, T: int) -> Tensor:
    """x (T, heads, head_dim) rotated by its positions start...start+T-1."""
    cos = self.cos[start:start + T].reshape(T, 1, -1)
    sin = self.sin[start:start + T].reshape(T, 1, -1)
    H, D = x.shape[1], x.shape[2]
    if self.cfg.rope == "norm": a, b = x.reshape(T, H, D // 2, 2)[..., 0], x.reshape(T, H, D // 2, 2)[..., 1]
    else: a, b = x[..., :D // 2], x[..., D // 2:]
    ra, rb = a * cos - b * sin, a * sin + b * cos
    return Tensor.stack(ra, rb, dim=-1).reshape(T, H, D) if self.cfg.rope == "norm" else Tensor.cat(ra, rb, dim=-1)

  def _linear(self, x: Tensor, name: str) -> Tensor:
    y = x @ self.w[f"{name}.weight"].T
    return y + self.w[f"{name}.bias"] if f"{name}.bias" in self.w else y

  def _attention(self, x: Tensor, i: int, start: int | UOp, T: int) -> Tensor:
    c, p = self.cfg, f"blk.{i}"
    q = self._linear(x, f"{p}.attn_q").reshape(T, c.n_heads, c.head_dim)
    k = self._linear(x, f"{p}.attn_k").reshape(T, c.n_kv_heads, c.head_dim)
    v = self._linear(x, f"{p}.attn_v").reshape(T, c.n_kv_heads, c.head_dim)
    if f"{p}.attn_q_norm.weight" in self.w:  # qwen3 normalizes each head of q and k
      q, k = rms_norm(q, self.w[f"{p}.attn_q_norm.weight"], c.norm_eps), rms_norm(k, self.w[f"{p}.attn_k_norm.weight"], c.norm_eps)
    # stored before the rotation: fused, each rotated output pairs two outputs of the projection and computed both
    # dot products (twice the work, and two reductions in one kernel, which the heuristics don't tile as a matmul)
    q, k = self._rope(q.contiguous(), start, T), self._rope(k.contiguous(), start, T)
    ck, cv = self.cache[i]
    # assigned lazily: a write to a slice stores only the slice (schedule.region_of), so the rotation of k and the
    # projection of v are computed by the kernel that writes them into the cache (60 kernels a token fewer)
    ck[start:start + T].assign(k)
    cv[start:start + T].assign(v)
    L = start + T
    g = c.n_heads // c.n_kv_heads
    # grouped-query attention as (kv heads, group, ...) against keys broadcast over the group: no reshape merges a
    # dimension of the symbolic length L (that would index the cache by division and modulo by L, per element)
    qg = q.reshape(T, c.n_kv_heads, g, c.head_dim).permute(1, 2, 0, 3)          # (kv, g, T, D)
    if T > 1: qg = qg.contiguous()  # stored in this order, the scores kernel reads rows of q, not columns 576 apart
    keys, vals = ck[:L].permute(1, 0, 2).unsqueeze(1), cv[:L].permute(1, 0, 2).unsqueeze(1)  # (kv, 1, L, D)
    # (kv, g, T, L); several tokens: keys @ q^T, transposed, which the heuristics vectorize over the tokens (q @ keys^T
    # packs a key row and sums its 64 products in one scalar chain, ~10x slower). (The mask and softmax fused over it
    # were once wrong: gcc 12.2's loop vectorizer miscompiled the loop of symbolic length, now guarded by the renderer)
    if T > 1: scores = (keys @ qg.transpose(-1, -2)).transpose(-1, -2) * (1 / math.sqrt(c.head_dim))
    else: scores = (qg @ keys.transpose(-1, -2)) * (1 / math.sqrt(c.head_dim))
    if T > 1:  # causal: query t sees keys up to start + t
      visible = Tensor.arange(L).reshape(1, 1, 1, L) <= (Tensor.arange(T).reshape(1, 1, T, 1) + start)
      scores = visible.where(scores, -math.inf)
    out = (scores.softmax(-1) @ vals).permute(2, 0, 1, 3).reshape(T, c.n_heads * c.head_dim)
    return self._linear(out, f"{p}.attn_output")

  def _block(self, x: Tensor, i: int, start: int | UOp, T: int) -> Tensor:
    c, p = self.cfg, f"blk.{i}"
    h = x + self._attention(rms_norm(x, self.w[f"{p}.attn_norm.weight"], c.norm_eps), i, start, T)
    n = rms_norm(h, self.w[f"{p}.ffn_norm.weight"], c.norm_eps)
    gate, up = self._linear(n, f"{p}.ffn_gate"), self._linear(n, f"{p}.ffn_up")
    # several tokens: each product its own kernel, which the heuristics tile as a matmul (two reductions fused in one
    # kernel are not, and ran the prompt's feed-forward ~25x slower than a tiled matmul)
    if T > 1: gate, up = gate.contiguous(), up.contiguous()
    return h + self._linear(gate.silu() * up, f"{p}.ffn_down")

  def _embed_row(self, tok: int | UOp) -> Tensor:
    """Row tok of the embedding table as (1, dim): a slice (tok may be a bound Variable), so only its bytes are read."""
    return self.w["token_embd.weight"][tok:tok + 1]

  def _forward(self, x: Tensor, start: int | UOp, last_only: bool = True) -> Tensor:
    T = x.shape[0]
    for i in range(self.cfg.n_layers): x = self._block(x, i, start, T)
    if last_only: x = x[T - 1:T]
    return (rms_norm(x, self.w["output_norm.weight"], self.cfg.norm_eps) @ self.output.T)

  def _decode_step(self, tok: UOp, pos: UOp, *cache: Tensor) -> Tensor:
    # the cache tensors come in as arguments (they are self.cache): a replay then reads and writes the memory they
    # hold at the call, wherever a prefill outside the JIT moved them (an assign realizes into new memory)
    return self._forward(self._embed_row(tok), pos).reshape(-1).realize()

  def _prefill_step(self, x: Tensor, pos: UOp, *cache: Tensor) -> Tensor:
    return self._forward(x, pos).reshape(-1).realize()

  def _row_step(self, tok: UOp) -> Tensor: return self._embed_row(tok).contiguous().realize()

  def _embed(self, tokens: list[int], jit: bool) -> Tensor:
    """The embedding rows of tokens as one (T, dim) float tensor: each row by the captured one-row step (a slice at a
    Variable token id: one kernel serves every id), gathered on the host; scheduling each row anew cost ~4 ms."""
    if not jit:
      rows = [self._embed_row(self.tok_var.bind(t)).contiguous().realize() for t in tokens]
      return rows[0] if len(rows) == 1 else Tensor.cat(*rows, dim=0)
    out = bytearray()  # the rows' bytes in order (without numpy: the LLM path doesn't import it)
    for t in tokens: out += self._row(self.tok_var.bind(t))._raw()
    return Tensor(memoryview(out).cast("f", (len(tokens), self.cfg.dim)))

  def _pos(self, T: int, start: int) -> UOp:
    """start as a bound Variable whose range keeps start + T inside the cache (so slices of it are always in bounds)."""
    if T not in self._pos_vars: self._pos_vars[T] = Variable("pos", 0, self.max_context - T)
    return self._pos_vars[T].bind(start)

  # ***** public *****
  def discard_scratch(self) -> None:
    """Give back the pages of the prompt passes' internal buffers (a dequantized weight, the chunk's activations: 8 MiB for
    SmolLM2's 128 tokens) until the next prompt, which faults them in again; the decode step keeps its own."""
    for jit in self._prefill.values(): jit.discard_scratch()

  def __call__(self, tokens: list[int], start_pos: int, all_logits: bool = False, jit: bool = True) -> Tensor:
    """Logits (vocab,) for the token after `tokens` (or (len(tokens), vocab) with all_logits), which sit at positions
    start_pos.. start_pos+len-1; the cache must hold the tokens before start_pos. One token runs the captured decode step."""
    T = len(tokens)
    if T == 0: raise ValueError("no tokens")
    if start_pos + T > self.max_context: raise ValueError(f"positions up to {start_pos + T} exceed the context of {self.max_context}")
    if bad := [t for t in tokens if not 0 <= t < self.cfg.vocab]: raise ValueError(f"token id {bad[0]} is outside the vocabulary of {self.cfg.vocab}")
    if T == 1 and jit and not all_logits: return self._decode(self.tok_var.bind(tokens[0]), self._pos(1, start_pos), *[t for kv in self.cache for t in kv])
    # prefill: the embedding rows, then one pass over all tokens, captured once per chunk size (a replay schedules
    # nothing: scheduling the pass took longer than running it)
    x = self._embed(tokens, jit)
    start = self._pos(T, start_pos)  # a Variable even at 0: every chunk of a prompt runs the same kernels
    if all_logits: return self._forward(x, start, last_only=False).realize()
    if not jit: return self._forward(x, start).reshape(-1).realize()
    if T not in self._prefill: self._prefill[T] = TinyJit(self._prefill_step)
    return self._prefill[T](x, start, *[t for kv in self.cache for t in kv])
