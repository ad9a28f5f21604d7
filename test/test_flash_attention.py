"""Attention's forward as one kernel (schedule/flash.py): an online softmax over the keys, causal keys past the row never
visited. Values against torch on the C, LLVM, PYTHON and (where a driver is installed) OpenCL backends, and the cost
rule that keeps today's three kernels where the fused one is slower (rows shorter than FLASH_MIN_KEYS) or where a
backward reads the probabilities (a training step)."""
import math
import numpy as np
import pytest
from attograd import Tensor
from attograd import helpers
from attograd.helpers import GlobalCounters
from attograd.schedule import flash, schedule

torch = pytest.importorskip("torch")

@pytest.fixture
def fused(monkeypatch):
  """The fused kernel for rows of 8 keys and up (the rule's threshold is 2048: too slow for the PYTHON emulator), with
  no schedule remembered from the other setting."""
  monkeypatch.setattr(flash, "FLASH_MIN_KEYS", 8)
  monkeypatch.setattr(helpers.CACHELEVEL, "value", 1)
  schedule._schedule_cache.clear()
  yield
  schedule._schedule_cache.clear()

def _inputs(shape, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]

def _run(q, k, v, device=None, hand=False, **kw):
  tq, tk, tv = (Tensor(a, device=device).realize() for a in (q, k, v))
  mask = kw.pop("attn_mask", None)
  if mask is not None: mask = Tensor(mask, device=device).realize()
  GlobalCounters.reset()
  if hand:
    T, S = q.shape[-2], k.shape[-2]
    s = tq @ tk.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if kw.get("is_causal"): s = (Tensor.arange(T, device=device).unsqueeze(1) >= Tensor.arange(S, device=device).unsqueeze(0)).where(s, -math.inf)
    if mask is not None: s = s + mask
    o = (s.softmax(-1) @ tv).realize()
  else: o = tq.scaled_dot_product_attention(tk, tv, attn_mask=mask, **kw).realize()
  kernels = GlobalCounters.kernel_count
  return o.numpy(), kernels

def _torch(q, k, v, **kw):
  if kw.get("attn_mask") is not None: kw["attn_mask"] = torch.tensor(kw["attn_mask"])
  return torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(a) for a in (q, k, v)), **kw).numpy()

def _close(ours, ref):
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)

# a float mask whose rows start masked: the running max is -inf for their first keys (exp(-inf - -inf) must add 0, not NaN)
def _late_mask(T, S):
  m = np.zeros((T, S), np.float32)
  for i in range(T): m[i, : (i * 3) % S] = -np.inf
  m[:, -1] = 0.0
  return m

def _bool_mask(T, S):
  m = np.tril(np.ones((T, S), bool))
  m[3] = False  # a row with nothing to attend to: torch gives 0 there
  return m

# shape, sdpa's keywords, kernels (sdpa with a mask: its test for rows the mask leaves empty, max(s) == -inf, is the
# pass's own running max, no kernel or pass of its own)
CASES = {
  "causal": ((2, 3, 24, 8), {"is_causal": True}, 1),
  "plain": ((2, 3, 16, 8), {}, 1),
  "float_mask_rows_start_masked": ((1, 2, 16, 4), {"attn_mask": _late_mask(16, 16)}, 1),
  "bool_mask_empty_row": ((1, 2, 12, 4), {"attn_mask": _bool_mask(12, 12)}, 1),
  "odd_sizes": ((1, 2, 13, 5), {"is_causal": True}, 1),
  "causal_blocks_of_4": ((1, 2, 20, 8), {"is_causal": True}, 1),
}

@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("hand", [False, True], ids=["sdpa", "hand"])
def test_forward_one_kernel(fused, name, hand):
  shape, kw, kernels = CASES[name]
  if hand and "attn_mask" in kw and kw["attn_mask"].dtype == np.bool_: pytest.skip("the hand-written pattern here adds a float mask")
  q, k, v = _inputs(shape)
  ours, n = _run(q, k, v, hand=hand, **dict(kw))
  _close(ours, _torch(q, k, v, **dict(kw)))
  assert n == kernels

@pytest.mark.parametrize("device", ["LLVM", "PYTHON", "CL"])
def test_forward_other_backends(fused, device):
  q, k, v = _inputs((1, 2, 16, 4))
  try: ours, kernels = _run(q, k, v, device=device, is_causal=True)
  except (ImportError, RuntimeError, OSError) as e: pytest.skip(f"{device} unavailable: {e}")
  _close(ours, _torch(q, k, v, is_causal=True))
  assert kernels == 1

def test_causal_keys_skipped(fused):
  # the causal mask bounds the key loop: a row never visits a key past it (the loop's bound reads the row's counter)
  from attograd.uop.ops import Ops, AxisKind
  q, k, v = _inputs((1, 1, 16, 4))
  tq, tk, tv = (Tensor(a).realize() for a in (q, k, v))
  o = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (item,) = [i for i in schedule.create_schedule([o.uop])[0] if i.ast.op is Ops.SINK]
  loops = [u for u in item.ast.toposort if u.op is Ops.RANGE and u.arg[1] is AxisKind.SERIAL]
  assert any(u.src[0].op is not Ops.CONST for u in loops)

def test_cost_rule_keeps_three_kernels():
  # rows shorter than FLASH_MIN_KEYS: the three kernels' register tiles are faster on this CPU codegen
  schedule._schedule_cache.clear()
  q, k, v = _inputs((2, 2, 64, 16))
  ours, kernels = _run(q, k, v, is_causal=True)
  _close(ours, _torch(q, k, v, is_causal=True))
  assert kernels == 3

def _training_step_kernels(q, k, v) -> tuple[list[np.ndarray], int]:
  tq, tk, tv = (Tensor(a, requires_grad=True).realize() for a in (q, k, v))
  o = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  GlobalCounters.reset()
  out = [o, *o.sum().gradient(tq, tk, tv)]
  Tensor.realize_all(out)
  kernels = GlobalCounters.kernel_count
  return [t.numpy() for t in out], kernels

def test_training_keeps_probabilities(fused, monkeypatch):
  # a backward reads the probabilities: they keep their buffer, and the step its kernels, as with the rule off
  q, k, v = _inputs((1, 2, 16, 8))
  ours, kernels = _training_step_kernels(q, k, v)
  monkeypatch.setattr(flash, "FLASH_MIN_KEYS", 1 << 30)
  schedule._schedule_cache.clear()
  assert _training_step_kernels(q, k, v)[1] == kernels
  tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
  ot = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
  ot.sum().backward()
  for a, b in zip(ours, (ot, tq.grad, tk.grad, tv.grad)): _close(a, b.detach().numpy())

def test_softmax_weighted_sum(fused):
  # a softmax kept in its consumer's kernel (its row max and sum per row, inline) summed against weights: the same pass
  # applies (no output columns), and must give the same values
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((3, 40)).astype(np.float32), rng.standard_normal(40).astype(np.float32)
  ours = (Tensor(x).softmax(-1) * Tensor(w)).sum(-1).numpy()
  _close(ours, (torch.tensor(x).softmax(-1) * torch.tensor(w)).sum(-1).numpy())

def test_symbolic_keys_keep_their_kernels(fused):
  # a key count that is a Variable (a KV cache's length) is no loop the pass can block: today's kernels, right values
  from attograd.uop.ops import UOp
  q = _inputs((1, 2, 4, 8))[0]
  _, kk, vv = _inputs((1, 2, 12, 8), seed=2)
  n = UOp.variable("n", 1, 12).bind(6)
  tk, tv = (Tensor(a)[:, :, :n] for a in (kk, vv))
  ours = Tensor(q).scaled_dot_product_attention(tk, tv).numpy()
  _close(ours, _torch(q, kk[:, :, :6], vv[:, :, :6]))

def test_cost_rule_long_rows_fused(monkeypatch):
  # from FLASH_MIN_KEYS keys the fused kernel is taken (and P @ V is not split into partial sums first, which would hide
  # it): the T x T scores and probabilities are never allocated
  monkeypatch.setattr(helpers.CACHELEVEL, "value", 1)
  schedule._schedule_cache.clear()
  T = flash.FLASH_MIN_KEYS
  q, k, v = _inputs((1, 1, T, 8))
  ours, kernels = _run(q, k, v, is_causal=True)
  _close(ours, _torch(q, k, v, is_causal=True))
  assert kernels == 1
