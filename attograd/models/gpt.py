"""A GPT-2 architecture to train from scratch: learned token and position embeddings, pre-LayerNorm blocks of causal
self-attention (scaled_dot_product_attention) and a GELU MLP, a final LayerNorm, and an output head tied to the
token embedding. GPT-2's initialization: weights N(0, 0.02), the residual projections N(0, 0.02 / sqrt(2 * layers)).

  from attograd.models.gpt import GPT, GPTConfig
  model = GPT(GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128))
  loss = model(idx, targets)          # idx, targets (B, T) int: the mean cross entropy
  text_ids = model.generate([0], 100)  # sampled continuation (list of ids)

examples/gpt.py trains it character by character on Shakespeare."""
from __future__ import annotations
import dataclasses, math, random
from attograd.tensor import Tensor
from attograd.jit import TinyJit
from attograd.dtype import dtypes
from attograd import nn

__all__ = ["GPTConfig", "GPT"]

@dataclasses.dataclass(frozen=True)
class GPTConfig:
  vocab_size: int
  block_size: int = 64  # the context: the most tokens the model sees at once
  n_layer: int = 4
  n_head: int = 4
  n_embd: int = 128
  bias: bool = True
  def __post_init__(self) -> None:
    if self.n_embd % self.n_head: raise ValueError(f"n_embd {self.n_embd} is not a multiple of n_head {self.n_head}")
    for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
      if getattr(self, k) < 1: raise ValueError(f"GPTConfig.{k} must be positive, got {getattr(self, k)}")

class Block(nn.Module):
  def __init__(self, cfg: GPTConfig):
    super().__init__()
    d, self.n_head = cfg.n_embd, cfg.n_head
    self.ln_1, self.ln_2 = nn.LayerNorm(d, bias=cfg.bias), nn.LayerNorm(d, bias=cfg.bias)
    self.c_attn, self.attn_proj = nn.Linear(d, 3 * d, bias=cfg.bias), nn.Linear(d, d, bias=cfg.bias)
    self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=cfg.bias), nn.Linear(4 * d, d, bias=cfg.bias)
  def forward(self, x: Tensor) -> Tensor:
    B, T, C = x.shape
    q, k, v = (t.reshape(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).chunk(3, dim=-1))
    a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
    x = x + self.attn_proj(a)
    return x + self.mlp_proj(self.c_fc(self.ln_2(x)).gelu("tanh"))  # GPT-2's tanh GELU

class GPT(nn.Module):
  def __init__(self, cfg: GPTConfig):
    super().__init__()
    self.cfg = cfg
    self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
    self.h = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)])
    self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
    for name, p in self.named_parameters():
      if name.endswith("bias"): p.assign(Tensor.zeros(*p.shape))
      elif p.ndim == 2:  # LayerNorm weights stay ones
        std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("_proj.weight") else 0.02
        p.assign(Tensor.randn(*p.shape) * std)
    Tensor.realize_all(list(self.parameters()))

  def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor:
    """Logits (B, T, vocab) for token ids idx (B, T); with targets (B, T), the mean cross entropy instead."""
    B, T = idx.shape
    if T > self.cfg.block_size: raise ValueError(f"{T} tokens: the model's context (block_size) is {self.cfg.block_size}")
    x = self.wte(idx) + self.wpe.weight[:T]
    for block in self.h: x = block(x)
    logits = self.ln_f(x) @ self.wte.weight.T  # the head shares the token embedding (weight tying)
    if targets is None: return logits
    return logits.reshape(B * T, -1).cross_entropy(targets.reshape(B * T))

  def optimizer_groups(self, weight_decay: float) -> list[dict]:
    """AdamW groups as GPT-2 training uses them: weight decay on matrices and embeddings only, not biases or norms."""
    ps = list(self.parameters())
    return [{"params": [p for p in ps if p.ndim >= 2], "weight_decay": weight_decay},
            {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}]

  def generate(self, prompt: list[int], n: int, temperature: float = 1.0, top_k: int | None = None, seed: int = 0) -> list[int]:
    """prompt followed by n sampled tokens. The window is always block_size long (the newest tokens first, padding
    after them, which causal attention never reads), so every step runs the same kernels."""
    if not prompt: raise ValueError("generate needs a prompt of at least one token")
    if temperature <= 0: raise ValueError(f"temperature must be positive, got {temperature}")
    rng, out, T = random.Random(seed), list(prompt), self.cfg.block_size
    forward = TinyJit(lambda x: self(x).realize())  # one window shape: after two calls, replays of the same kernels
    with Tensor.test():
      for _ in range(n):
        ctx = out[-T:]
        logits = forward(Tensor([ctx + [0] * (T - len(ctx))], dtype=dtypes.int32))[0, len(ctx) - 1]
        if top_k is not None: logits = (logits < logits.topk(top_k)[0][-1]).where(-math.inf, logits)
        probs = (logits / temperature).softmax().tolist()
        out.append(rng.choices(range(len(probs)), weights=probs)[0])
    return out
