"""Rewrite speed: the time to simplify the index math of a transformer block's kernels.

Schedules one pre-norm transformer block (attention with heads split by reshape/permute, then an MLP),
pushes each kernel's movement ops into index math (not timed) and times the cleanup pass that
simplifies it (symbolic rules + gate-aware index rules), counting every rule that fired.
Each round drops the bounds cached on the nodes (hash-consing hands back the same nodes), so every
round pays for bounds too.

  python bench/rewrite.py [rounds]"""
import sys, time
from attograd import Tensor, dtypes
from attograd.helpers import Context
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import PatternMatcher, graph_rewrite
import attograd.schedule.schedule as sched

class Counting(PatternMatcher):
  """The same rules, counting the rewrites that fired."""
  def __init__(self, pm: PatternMatcher):
    super().__init__(pm.rules)
    self.fired = 0
  def rewrite(self, u, ctx=None, steps=None):
    ret = super().rewrite(u, ctx, steps)
    if ret is not None: self.fired += 1
    return ret

def transformer_block(B=2, T=64, D=256, H=4) -> Tensor:
  x = Tensor.empty(B, T, D)
  wq, wk, wv, wo = (Tensor.empty(D, D) for _ in range(4))
  w1, w2 = Tensor.empty(D, 4 * D), Tensor.empty(4 * D, D)
  h = x.layernorm()
  def heads(t): return t.reshape(B, T, H, D // H).permute(0, 2, 1, 3)
  q, k, v = heads(h @ wq), heads(h @ wk), heads(h @ wv)
  att = ((q @ k.permute(0, 1, 3, 2)) * (1 / (D // H) ** 0.5)).softmax(-1)
  o = (att @ v).permute(0, 2, 1, 3).reshape(B, T, D) @ wo
  x = x + o
  return x + (x.layernorm() @ w1).relu() @ w2

def kernels_to_simplify() -> list[tuple]:
  """(value, shape, out_buf, idx dtype) of every kernel of the block, as _build_kernel_ast sees them."""
  captured = []
  orig = sched._build_kernel_ast
  def capture(value, shape, out_buf):
    captured.append((value, shape, out_buf))
    return orig(value, shape, out_buf)
  sched._build_kernel_ast, sched._ast_cache = capture, {}
  # (CACHELEVEL=1: a schedule template an earlier run left on disk would build no kernels here)
  try:
    with Context(CACHELEVEL=1): transformer_block().schedule()
  finally: sched._build_kernel_ast = orig
  return captured

def main(rounds: int = 5):
  ks = kernels_to_simplify()
  pm = Counting(sched.kernel_cleanup)
  times, fired, nodes = [], 0, 0
  for r in range(rounds):
    raws = []
    for value, shape, out_buf in ks:
      for u in value.toposort: u.__dict__.pop("_range", None)
      raws.append(sched._pushdown(value, shape, out_buf, dtypes.int32, cleanup=False)[0])
    for raw in raws:
      for u in raw.toposort: u.__dict__.pop("_range", None)
    pm.fired = 0
    st = time.perf_counter()
    outs = [graph_rewrite(raw, pm, name="kernel_cleanup") for raw in raws]
    times.append(time.perf_counter() - st)
    fired, nodes = pm.fired, sum(len(raw.toposort) for raw in raws)
  best = min(times)
  idx = sum(1 for o in outs for u in o.toposort if u.op is Ops.INDEX)
  print(f"transformer block: {len(ks)} kernels, {nodes} nodes before cleanup, {idx} indexed loads/stores after")
  print(f"cleanup: {fired} rewrites in {best * 1e3:.1f} ms (best of {rounds}, first {times[0] * 1e3:.1f} ms)"
        f" -> {fired / best:,.0f} rewrites/s, {nodes / best:,.0f} nodes/s")

if __name__ == "__main__": main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
