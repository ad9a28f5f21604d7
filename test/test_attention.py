"""scaled_dot_product_attention and the hand-written softmax(q @ k^T * scale + mask) @ v against torch, values and
gradients, and the kernels one training step of attention takes (forward and backward realized together, as a
training step does)."""
import math
import numpy as np
import pytest
from attograd import Tensor
from attograd.helpers import GlobalCounters

torch = pytest.importorskip("torch")

def _inputs(shape_q, shape_kv, seed=0):
  rng = np.random.default_rng(seed)
  q = rng.standard_normal(shape_q).astype(np.float32)
  k, v = (rng.standard_normal(shape_kv).astype(np.float32) for _ in range(2))
  g = rng.standard_normal((*shape_q[:-1], shape_kv[-1])).astype(np.float32)
  return q, k, v, g

def _ours(q, k, v, g, hand=False, **kw):
  tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
  mask = kw.pop("attn_mask", None)
  if hand:  # the pattern written out, as a user would
    s = tq @ tk.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if kw.get("is_causal"): s = Tensor.ones(q.shape[-2], k.shape[-2]).tril().cast("bool").where(s, -math.inf)
    if mask is not None: s = Tensor(mask).where(s, -math.inf) if mask.dtype == np.bool_ else s + Tensor(mask)
    o = s.softmax(-1) @ tv
  else: o = tq.scaled_dot_product_attention(tk, tv, attn_mask=None if mask is None else Tensor(mask), **kw)
  (o * Tensor(g)).sum().backward()
  return [t.numpy() for t in (o, tq.grad, tk.grad, tv.grad)]

def _torch(q, k, v, g, **kw):
  tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
  if kw.get("attn_mask") is not None: kw["attn_mask"] = torch.tensor(kw["attn_mask"])
  o = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kw)
  (o * torch.tensor(g)).sum().backward()
  return [t.detach().numpy() for t in (o, tq.grad, tk.grad, tv.grad)]

CASES = {
  "plain": ((2, 3, 16, 8), (2, 3, 16, 8), {}),
  "causal": ((2, 3, 16, 8), (2, 3, 16, 8), {"is_causal": True}),
  "causal_odd": ((1, 2, 37, 5), (1, 2, 37, 5), {"is_causal": True}),
  "cross_odd": ((2, 1, 37, 7), (2, 1, 19, 7), {}),
  "bool_mask": ((2, 2, 13, 4), (2, 2, 11, 4), {"mask": "bool"}),
  "float_mask": ((2, 2, 13, 4), (2, 2, 11, 4), {"mask": "float"}),
  "scale": ((1, 2, 9, 6), (1, 2, 9, 6), {"scale": 0.3}),
}

@pytest.mark.parametrize("hand", [False, True], ids=["sdpa", "hand"])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_torch(case, hand):
  shape_q, shape_kv, kw = CASES[case]
  kw = dict(kw)
  if hand and "scale" in kw: pytest.skip("the hand-written pattern uses 1/sqrt(d)")
  q, k, v, g = _inputs(shape_q, shape_kv)
  rng = np.random.default_rng(1)
  if (m := kw.pop("mask", None)) == "bool":
    mask = rng.random((shape_q[-2], shape_kv[-2])) < 0.7
    mask[:, 0] = True  # no row fully masked (torch's math kernel gives NaN there, ours 0: tested elsewhere)
    kw["attn_mask"] = mask
  elif m == "float": kw["attn_mask"] = rng.standard_normal((shape_q[-2], shape_kv[-2])).astype(np.float32)
  ours, ref = _ours(q, k, v, g, hand=hand, **dict(kw)), _torch(q, k, v, g, **kw)
  for name, a, b in zip(("out", "dq", "dk", "dv"), ours, ref):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=name)

def test_softmax_second_derivative():
  # softmax's backward is written over its own output (a GRAD_IN template): that gradient must differentiate again
  rng = np.random.default_rng(2)
  x, w = (rng.standard_normal((3, 7)).astype(np.float32) for _ in range(2))
  t = torch.tensor(x, requires_grad=True)
  (t1,) = torch.autograd.grad((torch.softmax(t, -1) * torch.tensor(w)).sum(), t, create_graph=True)
  (t2,) = torch.autograd.grad((t1 * t1).sum(), t)
  a = Tensor(x, requires_grad=True)
  (a1,) = (a.softmax(-1) * Tensor(w)).sum().gradient(a)
  (a2,) = (a1 * a1).sum().gradient(a)
  np.testing.assert_allclose(a1.numpy(), t1.detach().numpy(), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(a2.numpy(), t2.numpy(), rtol=1e-4, atol=1e-6)
