"""The Python cost of building one Tensor op's lazy graph: microseconds of this thread's CPU per call (medians of 7
rounds) for the ops and composites a training step uses, each call building its nodes anew (the last call's result
is dropped, so its nodes are gone), and the nodes each makes. Next to it torch eager's whole cost for the same op at one
thread (dispatch and compute: a yardstick for the overhead a user feels, not the same work). Shapes: the small
transformer's (bench/transformer.py): batch 16, context 64, d 64, 4 heads.

  python bench/op_cost.py          N=calls per round (default 300)
"""
from __future__ import annotations
import gc, os, statistics, time

def per_call_us(f, n: int) -> float:
  for _ in range(20): f()
  rounds = []
  for _ in range(7):
    st = time.thread_time()
    for _ in range(n): f()
    rounds.append((time.thread_time() - st) / n * 1e6)
  return statistics.median(rounds)

def main() -> None:
  n = int(os.getenv("N", 300))
  import numpy as np, torch
  torch.set_num_threads(1)
  from attograd import Tensor, nn
  from attograd.uop.ops import UOpMeta
  rng = np.random.default_rng(0)
  arr = lambda *s: rng.standard_normal(s).astype(np.float32)
  x, h, w, b, qkv = arr(16, 64, 64), arr(16, 4, 64, 16), arr(192, 64), arr(64), arr(16, 64, 192)
  idx, y = rng.integers(0, 90, (16, 64)), rng.integers(0, 90, (1024,))
  logits, big = arr(1024, 90), arr(16, 64, 256)
  ag = {k: Tensor(v).realize() for k, v in dict(x=x, h=h, w=w, b=b, qkv=qkv, idx=idx, y=y, logits=logits, big=big).items()}
  tt = {k: torch.tensor(v) for k, v in dict(x=x, h=h, w=w, b=b, qkv=qkv, idx=idx, y=y, logits=logits, big=big).items()}
  s0 = Tensor(np.float32(0.5)).realize()
  ln, emb, lin = nn.LayerNorm(64), nn.Embedding(90, 64), nn.Linear(64, 192)
  tln, temb, tlin = torch.nn.LayerNorm(64), torch.nn.Embedding(90, 64), torch.nn.Linear(64, 192)
  F = torch.nn.functional
  cases = [  # name, attograd, torch
    ("x * y", lambda: ag["x"] * ag["x"], lambda: tt["x"] * tt["x"]),
    ("x + bias (broadcast)", lambda: ag["x"] + ag["b"], lambda: tt["x"] + tt["b"]),
    ("x * 0-d tensor", lambda: ag["x"] * s0, lambda: tt["x"] * 0.5),
    ("x * 0.5", lambda: ag["x"] * 0.5, lambda: tt["x"] * 0.5),
    ("reshape", lambda: ag["x"].reshape(16, 64, 4, 16), lambda: tt["x"].reshape(16, 64, 4, 16)),
    ("transpose", lambda: ag["h"].transpose(1, 2), lambda: tt["h"].transpose(1, 2)),
    ("unsqueeze", lambda: ag["x"].unsqueeze(0), lambda: tt["x"].unsqueeze(0)),
    ("chunk(3)", lambda: ag["qkv"].chunk(3, -1), lambda: tt["qkv"].chunk(3, -1)),
    ("x[:, -1]", lambda: ag["x"][:, -1], lambda: tt["x"][:, -1]),
    ("x[3, 0, 0]", lambda: ag["x"][3, 0, 0], lambda: tt["x"][3, 0, 0]),
    ("sum()", lambda: ag["x"].sum(), lambda: tt["x"].sum()),
    ("mean(-1, keepdim)", lambda: ag["x"].mean(-1, keepdim=True), lambda: tt["x"].mean(-1, keepdim=True)),
    ("square", lambda: ag["x"].square(), lambda: tt["x"].square()),
    ("linear (nn.Linear)", lambda: lin(ag["x"]), lambda: tlin(tt["x"])),
    ("matmul 4-D", lambda: ag["h"] @ ag["h"].transpose(-1, -2), lambda: tt["h"] @ tt["h"].transpose(-1, -2)),
    ("LayerNorm", lambda: ln(ag["x"]), lambda: tln(tt["x"])),
    ("gelu", lambda: ag["big"].gelu(), lambda: F.gelu(tt["big"])),
    ("softmax", lambda: ag["x"].softmax(-1), lambda: tt["x"].softmax(-1)),
    ("sdpa causal", lambda: ag["h"].scaled_dot_product_attention(ag["h"], ag["h"], is_causal=True),
     lambda: F.scaled_dot_product_attention(tt["h"], tt["h"], tt["h"], is_causal=True)),
    ("Embedding", lambda: emb(ag["idx"]), lambda: temb(tt["idx"])),
    ("cross_entropy", lambda: ag["logits"].cross_entropy(ag["y"]), lambda: F.cross_entropy(tt["logits"], tt["y"])),
    ("stack of 30 sums", lambda: Tensor.stack(*[ag["x"].sum() for i in range(30)]),
     lambda: torch.stack([tt["x"].sum() for i in range(30)])),
  ]
  made = [0]
  real = UOpMeta.__call__
  def counting(cls, *a, **k):
    made[0] += 1
    return real(cls, *a, **k)
  gc.disable()
  print(f"{'op':24s} {'attograd us':>12s} {'nodes':>6s} {'torch eager us':>15s}")
  for name, ours, theirs in cases:
    t_ours = per_call_us(ours, n)
    with torch.no_grad(): t_theirs = per_call_us(theirs, n)
    UOpMeta.__call__ = counting
    made[0] = 0
    ours()
    UOpMeta.__call__ = real
    print(f"{name:24s} {t_ours:12.2f} {made[0]:6d} {t_theirs:15.2f}")
  gc.enable()

if __name__ == "__main__": main()
