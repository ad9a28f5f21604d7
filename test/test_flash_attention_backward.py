"""Attention's backward as flash attention's (schedule/flash.py): from FLASH_BWD_MIN_KEYS keys sdpa's gradients recompute
the probabilities from q, k and the rows' logsumexp inside their kernels (one kernel each for dQ, dK and dV, no T x S
buffer), and the forward stores that logsumexp from a one-pass kernel of its own. Values and gradients against torch's
scaled_dot_product_attention in float64, for causal and plain attention, bool and float masks (rows left empty, rows
whose first keys are masked), odd lengths and head dims; kernel counts; the cost rule. ATTOGRAD_FULL_FLASH=1 adds more
shapes, a learned mask and the PYTHON emulator (the default set takes ~40 s on 2 loaded cores, mostly compiling)."""
import os
import numpy as np
import pytest
from attograd import Tensor
from attograd import helpers
from attograd.helpers import GlobalCounters
from attograd.schedule import flash, schedule

torch = pytest.importorskip("torch")
full = pytest.mark.skipif(os.getenv("ATTOGRAD_FULL_FLASH") != "1", reason="ATTOGRAD_FULL_FLASH=1 runs it")
FULL_CASES = {"causal_more_keys", "causal_blocks_of_8", "learned_float_mask"}

@pytest.fixture
def flash_on(monkeypatch):
  """The flash forward and backward from 8 keys (the rules' thresholds are 2048: too slow for a unit test), with no
  schedule remembered from the other setting; counts the kernels each rewrite made."""
  monkeypatch.setattr(flash, "FLASH_MIN_KEYS", 8)
  monkeypatch.setattr(flash, "FLASH_BWD_MIN_KEYS", 8)
  monkeypatch.setattr(flash, "FLASH_BWD_MIN_BYTES", 0)
  monkeypatch.setattr(helpers.CACHELEVEL, "value", 1)
  fired = {"grad": 0, "lse": 0}
  for name, fn in (("grad", flash.grad_kernel), ("lse", flash.lse_kernel)):
    def spy(sink, fn=fn, name=name):
      out = fn(sink)
      fired[name] += out is not None
      return out
    monkeypatch.setattr(flash, f"{name}_kernel", spy)
  schedule._schedule_cache.clear()
  yield fired
  schedule._schedule_cache.clear()

def _bool_mask(T, S):
  m = np.tril(np.ones((T, S), bool))
  m[3] = False  # a row with nothing to attend to: torch's math kernel gives NaN there, its fused ones (and ours) 0
  return m

def _late_mask(T, S):
  # a float mask whose rows start masked: the running max is -inf for their first keys (exp(-inf - -inf) must add 0)
  m = np.random.default_rng(3).standard_normal((T, S)).astype(np.float32)
  for i in range(T): m[i, : (i * 3) % S] = -np.inf
  m[:, -1] = 0.0
  return m

# (B, H, T, S, head dim of q and k, of v), sdpa's keywords, kernels of a step (forward and backward realized together)
CASES = {
  # (the key counts pick the key block (8, 4, 2 or 1 keys a step) and whether rows are taken 4 at a time; small blocks
  # compile faster: 8 keys in the full set)
  "causal": ((2, 2, 12, 12, 8, 8), {"is_causal": True}, 6),
  "plain": ((1, 3, 18, 18, 8, 8), {}, 6),
  "odd_lengths_and_dims": ((2, 1, 13, 21, 5, 7), {}, 6),
  "causal_more_keys": ((1, 2, 12, 20, 8, 8), {"is_causal": True}, 6),
  "causal_blocks_of_8": ((1, 1, 24, 24, 16, 16), {"is_causal": True}, 6),
  "bool_mask_empty_row": ((1, 2, 13, 13, 8, 8), {"attn_mask": _bool_mask(13, 13)}, 8),
  "float_mask_rows_start_masked": ((1, 2, 10, 10, 4, 4), {"attn_mask": _late_mask(10, 10)}, 8),
  # a learned mask's gradient is dS summed over the batch and heads: dS keeps its buffer (values only)
  "learned_float_mask": ((1, 2, 16, 16, 4, 4), {"attn_mask": _late_mask(16, 16), "learned": True}, 10),
}

def _step(shape, kw, device=None, seed=0):
  """Ours and torch's (float64) output and gradients of sum(o * g), and our kernel count for the step realized at once."""
  B, H, T, S, D, Dv = shape
  rng = np.random.default_rng(seed)
  arrays = [rng.standard_normal(s) for s in ((B, H, T, D), (B, H, S, D), (B, H, S, Dv), (B, H, T, Dv))]
  kw = dict(kw)
  mask, learned = kw.get("attn_mask"), kw.pop("learned", False)
  q, k, v, g = (Tensor(a.astype(np.float32), device=device, requires_grad=True) for a in arrays)
  m = None if mask is None else Tensor(mask, device=device, requires_grad=learned)
  o = q.scaled_dot_product_attention(k, v, **{**kw, "attn_mask": m})
  wrt = [q, k, v] + ([m] if learned else [])
  GlobalCounters.reset()
  out = [o, *(o * g).sum().gradient(*wrt)]
  Tensor.realize_all(out)
  kernels = GlobalCounters.kernel_count
  tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
  tm = None if mask is None else torch.tensor(mask.astype(np.float64) if mask.dtype != np.bool_ else mask, requires_grad=learned)
  to = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **{**kw, "attn_mask": tm})
  if mask is not None and mask.dtype == np.bool_: to = torch.nan_to_num(to, nan=0.0)  # (the empty row: see _bool_mask)
  twrt = [tq, tk, tv] + ([tm] if learned else [])
  ref = [to, *torch.autograd.grad((to * torch.tensor(arrays[3])).sum(), twrt)]
  if mask is not None and mask.dtype == np.bool_:  # torch's math kernel's NaN row again, in the gradients that read it
    ref = [torch.nan_to_num(r, nan=0.0) for r in ref]
  return [t.numpy() for t in out], [r.detach().numpy() for r in ref], kernels

def _close(ours, ref):
  for a, b in zip(ours, ref): np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)

@pytest.mark.parametrize("name", [pytest.param(n, marks=full) if n in FULL_CASES else n for n in CASES])
def test_values_and_gradients(flash_on, name):
  shape, kw, count = CASES[name]
  ours, ref, kernels = _step(shape, kw)
  _close(ours, ref)
  # a step: the forward's pass (o), its logsumexp's pass (lse_kernel), rowsum(dO * O), one kernel each for dQ, dK and dV,
  # each recomputing the probabilities (grad_kernel); with a mask, its empty-row test and the masked scores the forward
  # stores (read by that test and the softmax); a learned mask's gradient reads a stored dS
  assert kernels == count
  assert flash_on == {"grad": 0 if kw.get("learned") else 3, "lse": 1}

def _schedule_sizes(shape, kw) -> list[int]:
  B, H, T, S, D, Dv = shape
  q, k, v = (Tensor(np.zeros(s, np.float32), requires_grad=True) for s in ((B, H, T, D), (B, H, S, D), (B, H, S, Dv)))
  mask = kw.get("attn_mask")
  o = q.scaled_dot_product_attention(k, v, **{**kw, "attn_mask": None if mask is None else Tensor(mask)})
  o.sum().backward()
  return [b.arg.size for si in Tensor.schedule(o, q.grad, k.grad, v.grad) for b in si.bufs[:1]]

# (a masked step's forward still stores its masked scores, which its empty-row test and the softmax both read: only its
# backward is T x S free)
@pytest.mark.parametrize("name", ["causal", pytest.param("plain", marks=full), pytest.param("odd_lengths_and_dims", marks=full)])
def test_no_scores_buffer(flash_on, name):
  # the step's kernels write nothing of B x H x T x S: the probabilities are recomputed where they are read
  shape, kw, _ = CASES[name]
  B, H, T, S = shape[:4]
  assert B * H * T * S not in _schedule_sizes(shape, kw)

def test_cost_rule_keeps_the_chain_rule(monkeypatch):
  # rows shorter than FLASH_BWD_MIN_KEYS: the backward reads the stored probabilities (the matmuls' register tiles are
  # faster there), with the same values
  monkeypatch.setattr(helpers.CACHELEVEL, "value", 1)
  schedule._schedule_cache.clear()
  shape, kw, _ = CASES["causal"]
  B, H, T, S = shape[:4]
  assert B * H * T * S in _schedule_sizes(shape, kw)
  ours, ref, _ = _step(shape, kw)
  _close(ours, ref)
  schedule._schedule_cache.clear()

@pytest.mark.parametrize("device", [pytest.param("LLVM", marks=full), pytest.param("PYTHON", marks=full)])
def test_other_backends(flash_on, device):
  try: ours, ref, _ = _step((1, 1, 8, 8, 4, 4), {"is_causal": True}, device=device)
  except (ImportError, RuntimeError, OSError) as e: pytest.skip(f"{device} unavailable: {e}")
  _close(ours, ref)
