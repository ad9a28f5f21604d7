"""Training speed of a character transformer, attograd against the same model in torch eager, measured
in one run on the same batches: steps/s under TinyJit and without it, kernels per step, and the time to
finish the first 10 steps (cold: a fresh process with empty disk caches; warm: the caches it left behind), with the
kernels the cold process was slowest to lower and to compile.

  python bench/transformer.py               the small model (2 layers, d 64, 4 heads, context 64, batch 16)
  MODEL=large python bench/transformer.py   6 layers, d 384, 6 heads, context 256, batch 16
  STEPS=n  timed steps per measurement (medians; ranges printed)
"""
from __future__ import annotations
import json, math, os, statistics, subprocess, sys, tempfile, time

CONFIGS = {"small": dict(vocab=90, d=64, heads=4, layers=2, ctx=64, bs=16),
           "large": dict(vocab=90, d=384, heads=6, layers=6, ctx=256, bs=16)}

# ***** attograd, written as a user would *****

def attograd_model(cfg: dict):
  from attograd import Tensor, nn
  class Block:
    def __init__(self, d: int, heads: int):
      self.heads = heads
      self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
      self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
      self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
    def __call__(self, x: Tensor) -> Tensor:
      B, T, C = x.shape
      q, k, v = [t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1)]
      a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
      x = x + self.proj(a)
      return x + self.fc2(self.fc1(self.ln2(x)).gelu())
  class GPT:
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ctx: int, **_):
      self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
      self.blocks = [Block(d, heads) for _ in range(layers)]
      self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)
    def __call__(self, idx: Tensor) -> Tensor:
      x = self.tok(idx) + self.pos(Tensor.arange(idx.shape[1]))
      for b in self.blocks: x = b(x)
      return self.head(self.ln(x))
  return GPT(**cfg)

def attograd_step(cfg: dict, jit: bool):
  from attograd import Tensor, TinyJit
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  Tensor.manual_seed(0)
  model = attograd_model(cfg)
  params = get_parameters(model)
  opt = optim.AdamW(params, lr=3e-4, weight_decay=0.1)
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).reshape(-1, cfg["vocab"]).cross_entropy(y.reshape(-1)).backward()
      norm = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
      scale = (1.0 / (norm + 1e-6)).minimum(1.0)
      for p in params: p.grad = p.grad * scale
      opt.step()
      return loss.realize()
  return TinyJit(step) if jit else step

# ***** torch, the peer *****

def torch_step(cfg: dict):
  import torch
  import torch.nn as tnn
  torch.manual_seed(0)
  class Block(tnn.Module):
    def __init__(self, d: int, heads: int):
      super().__init__()
      self.heads = heads
      self.ln1, self.ln2 = tnn.LayerNorm(d), tnn.LayerNorm(d)
      self.qkv, self.proj = tnn.Linear(d, 3 * d), tnn.Linear(d, d)
      self.fc1, self.fc2 = tnn.Linear(d, 4 * d), tnn.Linear(4 * d, d)
    def forward(self, x):
      B, T, C = x.shape
      q, k, v = [t.reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, dim=-1)]
      a = tnn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
      x = x + self.proj(a)
      return x + self.fc2(tnn.functional.gelu(self.fc1(self.ln2(x))))
  class GPT(tnn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, ctx: int, **_):
      super().__init__()
      self.tok, self.pos = tnn.Embedding(vocab, d), tnn.Embedding(ctx, d)
      self.blocks = tnn.ModuleList([Block(d, heads) for _ in range(layers)])
      self.ln, self.head = tnn.LayerNorm(d), tnn.Linear(d, vocab)
    def forward(self, idx):
      x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
      for b in self.blocks: x = b(x)
      return self.head(self.ln(x))
  model = GPT(**cfg)
  opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
  def step(x, y):
    opt.zero_grad()
    loss = tnn.functional.cross_entropy(model(x).reshape(-1, cfg["vocab"]), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss
  return step

# ***** measuring *****

def batches(cfg: dict, n: int, seed: int = 0) -> list[tuple[list, list]]:
  import random
  rng = random.Random(seed)
  text = [rng.randrange(cfg["vocab"]) for _ in range(20000)]
  out = []
  for _ in range(n):
    ix = [rng.randrange(len(text) - cfg["ctx"] - 1) for _ in range(cfg["bs"])]
    out.append(([text[i:i + cfg["ctx"]] for i in ix], [text[i + 1:i + cfg["ctx"] + 1] for i in ix]))
  return out

def rate(step, data: list, to_tensor, item) -> list[float]:
  """steps/s of each timed step (data converted before timing, the loss read every step as a user would)"""
  xs = [(to_tensor(x), to_tensor(y)) for x, y in data]
  out = []
  for x, y in xs:
    st = time.perf_counter(); item(step(x, y)); out.append(1 / (time.perf_counter() - st))
  return out

def first_steps(model: str, cache: str, n: int = 10) -> dict:
  """A fresh process builds the model and finishes n jitted steps with its disk caches in `cache`: the seconds it
  took, and the kernels it was slowest to lower and to compile (none when every kernel came from the cache)."""
  code = f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); import transformer as t; t._first_steps({model!r}, {n})"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "ATTOGRAD_CACHE": cache, "PROGRESS": "0"})
  return json.loads(out.stdout.splitlines()[-1])

def _first_steps(model: str, n: int) -> None:
  st = time.perf_counter()
  from attograd import Tensor
  from attograd.engine.realize import slowest_kernels
  cfg = CONFIGS[model]
  step = attograd_step(cfg, jit=True)
  for x, y in batches(cfg, n): step(Tensor(x), Tensor(y)).item()
  out: dict = {"s": time.perf_counter() - st}
  if (worst := slowest_kernels()) is not None:
    out["lower"], out["compile"], out["both"] = [[ck.name, ck.lower_s * 1e3, ck.compile_s * 1e3] for ck in worst]
  print(json.dumps(out))

def kernels_per_step(cfg: dict) -> int:
  from attograd import Tensor
  from attograd.helpers import GlobalCounters
  step = attograd_step(cfg, jit=False)
  data = batches(cfg, 2, seed=1)
  step(Tensor(data[0][0]), Tensor(data[0][1])).item()
  GlobalCounters.reset()
  step(Tensor(data[1][0]), Tensor(data[1][1])).item()
  return GlobalCounters.kernel_count

def fmt(rates: list[float]) -> str: return f"{statistics.median(rates):7.1f} steps/s  ({min(rates):.1f}-{max(rates):.1f})"

def main() -> None:
  model, n = os.getenv("MODEL", "small"), int(os.getenv("STEPS", 30))
  cfg = CONFIGS[model]
  import torch
  from attograd import Tensor
  with tempfile.TemporaryDirectory() as cache:  # cold: empty disk caches; warm: what the cold run left there
    cold = first_steps(model, cache) if os.getenv("COLD", "1") != "0" else {"s": math.nan}
    warm = first_steps(model, cache)
  print(f"transformer '{model}' {cfg}: first 10 steps (TinyJit, new process) {cold['s']:.2f} s with empty caches, "
        f"{warm['s']:.2f} s with warm ones")
  if "lower" in cold:  # compile times are each kernel's share of its batch (one compiler call for several kernels)
    print("  slowest kernel to lower {} {:.0f} ms (compile {:.0f} ms); to compile {} {:.0f} ms (lower {:.0f} ms); "
          "both {} {:.0f} + {:.0f} ms".format(*(cold["lower"][i] for i in (0, 1, 2)), *(cold["compile"][i] for i in (0, 2, 1)),
                                            *cold["both"]))
  ours_jit, ours, theirs = attograd_step(cfg, jit=True), attograd_step(cfg, jit=False), torch_step(cfg)
  warmup, data = batches(cfg, 3, seed=2), batches(cfg, n, seed=3)
  to_ag, to_t = (lambda v: Tensor(v)), (lambda v: torch.tensor(v))
  rate(ours_jit, warmup, to_ag, lambda t: t.item()); rate(ours, warmup[:2], to_ag, lambda t: t.item()); rate(theirs, warmup, to_t, lambda t: t.item())
  r_jit, r_eager, r_torch = [], [], []
  for i in range(0, n, 5):  # interleave, so the machine's noise hits all three alike
    r_jit += rate(ours_jit, data[i:i + 5], to_ag, lambda t: t.item())
    r_torch += rate(theirs, data[i:i + 5], to_t, lambda t: t.item())
    r_eager += rate(ours, data[i:i + 2], to_ag, lambda t: t.item())
  print(f"  torch eager        {fmt(r_torch)}")
  print(f"  attograd TinyJit   {fmt(r_jit)}   {statistics.median(r_jit) / statistics.median(r_torch):.2f}x torch")
  print(f"  attograd no JIT    {fmt(r_eager)}   {statistics.median(r_eager) / statistics.median(r_torch):.2f}x torch")
  print(f"  kernels per step (no JIT): {kernels_per_step(cfg)}")

if __name__ == "__main__": main()
