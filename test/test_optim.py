"""Optimizers against torch.optim (LAMB against a numpy reference) over several steps of the same
small MLP; the learning rate is a Tensor (changing it compiles nothing); a step is one schedule."""
import numpy as np
import pytest
import torch
from attograd import Tensor, GlobalCounters
from attograd import nn
from attograd.nn import optim, lr_scheduler
from attograd.engine import realize
from attograd.schedule.schedule import is_view_of_buffer

RNG = np.random.default_rng(0)
X, Y = RNG.standard_normal((16, 4)).astype(np.float32), RNG.standard_normal((16, 3)).astype(np.float32)

def _mlp(seed=0):
  """The same 4-8-3 MLP for attograd and torch: its parameters, attograd's then torch's."""
  torch.manual_seed(seed)
  theirs = [torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)]
  ours = [nn.Linear(4, 8), nn.Linear(8, 3)]
  for l, t in zip(ours, theirs): l.weight, l.bias = Tensor(t.weight.detach().numpy().copy()), Tensor(t.bias.detach().numpy().copy())
  return ours, theirs

def _loss(layers, x, y):  # the same code for both frameworks
  return (layers[1](layers[0](x).relu()) - y).square().mean()

def _params(layers) -> list: return [p for l in layers for p in (l.weight, l.bias)]

def _close(ours, theirs, atol=1e-5, rtol=1e-4, what=""):
  for i, (p, t) in enumerate(zip(ours, theirs)):
    np.testing.assert_allclose(p.numpy(), t.detach().numpy(), atol=atol, rtol=rtol, err_msg=f"{what} param {i}")

def _train_both(opt, topt, ours, theirs, steps, atol=1e-5, rtol=1e-4):
  xa, ya, xt, yt = Tensor(X), Tensor(Y), torch.tensor(X), torch.tensor(Y)
  for s in range(steps):
    opt.zero_grad()
    _loss(ours, xa, ya).backward()
    opt.step()
    topt.zero_grad()
    _loss(theirs, xt, yt).backward()
    topt.step()
    _close(_params(ours), _params(theirs), atol, rtol, f"step {s}:")

TORCH_CASES = [  # (attograd optimizer, kwargs, torch optimizer, kwargs)
  (optim.SGD, dict(lr=0.1), torch.optim.SGD, dict(lr=0.1)),
  (optim.SGD, dict(lr=0.05, momentum=0.9), torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
  (optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.05), torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.05)),
  (optim.SGD, dict(lr=0.1, weight_decay=0.1), torch.optim.SGD, dict(lr=0.1, weight_decay=0.1)),
  (optim.Adam, dict(lr=0.01), torch.optim.Adam, dict(lr=0.01)),
  (optim.Adam, dict(lr=0.02, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.1), torch.optim.Adam, dict(lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)),
  (optim.AdamW, dict(lr=0.01), torch.optim.AdamW, dict(lr=0.01)),  # the same default weight decay, 0.01
  (optim.AdamW, dict(lr=0.02, b1=0.85, weight_decay=0.3), torch.optim.AdamW, dict(lr=0.02, betas=(0.85, 0.999), weight_decay=0.3)),
]
@pytest.mark.parametrize("opt,kw,topt,tkw", TORCH_CASES, ids=[f"{c[0].__name__}{i}" for i, c in enumerate(TORCH_CASES)])
def test_matches_torch(opt, kw, topt, tkw):
  ours, theirs = _mlp()
  _train_both(opt(_params(ours), **kw), topt(_params(theirs), **tkw), ours, theirs, steps=6)

# ***** LAMB against a numpy reference *****

class NumpyLAMB:
  """LAMB (You et al. 2019) as attograd's docstring states it: Adam's bias-corrected moments, the update
  r = m_hat / (sqrt(v_hat) + eps) + weight_decay * p, scaled per parameter by the trust ratio ||p|| / ||r||
  (1 when either norm is 0): p -= lr * trust * r."""
  def __init__(self, params, lr, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0):
    self.params, self.lr, self.b1, self.b2, self.eps, self.wd, self.t = params, lr, b1, b2, eps, weight_decay, 0
    self.m, self.v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
  def step(self, grads):
    self.t += 1
    for i, (p, g) in enumerate(zip(self.params, grads)):
      p64, g64 = p.astype(np.float64), g.astype(np.float64)
      self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g64
      self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g64 ** 2
      m_hat, v_hat = self.m[i] / (1 - self.b1 ** self.t), self.v[i] / (1 - self.b2 ** self.t)
      r = m_hat / (np.sqrt(v_hat) + self.eps) + self.wd * p64
      pn, rn = np.linalg.norm(p64), np.linalg.norm(r)
      trust = pn / rn if pn > 0 and rn > 0 else 1.0
      p[...] = p64 - self.lr * trust * r

@pytest.mark.parametrize("kw", [dict(lr=0.01), dict(lr=0.02, b1=0.8, b2=0.99, eps=1e-5, weight_decay=0.1)])
def test_lamb_matches_numpy_reference(kw):
  ours, theirs = _mlp()
  ours[1].bias = Tensor.zeros(3).contiguous()  # ||p|| = 0 on the first step: trust ratio 1
  extra = Tensor([[1.0, -2.0], [0.5, 3.0]])     # a zero gradient: ||update|| = 0 without weight decay, trust ratio 1, no NaN
  params = _params(ours) + [extra]
  ref = NumpyLAMB([np.array(p.numpy(), np.float64) for p in params], **kw)
  opt = optim.LAMB(params, **kw)
  xa, ya = Tensor(X), Tensor(Y)
  for s in range(5):
    opt.zero_grad()
    (_loss(ours, xa, ya) + (extra * 0).sum()).backward()
    grads = [p.grad.numpy() for p in params]  # the gradients themselves are tested against torch elsewhere
    opt.step()
    ref.step(grads)
    for i, (p, r) in enumerate(zip(params, ref.params)): np.testing.assert_allclose(p.numpy(), r, atol=1e-5, rtol=1e-4, err_msg=f"step {s} param {i}")
  if "weight_decay" not in kw: np.testing.assert_array_equal(extra.numpy(), [[1.0, -2.0], [0.5, 3.0]])

# ***** the learning rate is a Tensor *****

@pytest.mark.parametrize("opt,kw,topt,tkw", [TORCH_CASES[2], TORCH_CASES[7]], ids=["SGD", "AdamW"])
def test_changing_lr_compiles_nothing(opt, kw, topt, tkw):
  ours, theirs = _mlp()
  o, t = opt(_params(ours), **kw), topt(_params(theirs), **tkw)
  assert isinstance(o.lr, Tensor) and o.lr.shape == ()
  _train_both(o, t, ours, theirs, steps=2)
  o.lr.assign(Tensor(0.004)).realize()
  for g in t.param_groups: g["lr"] = 0.004
  n = len(realize._kernel_cache)
  _train_both(o, t, ours, theirs, steps=2)
  assert len(realize._kernel_cache) == n, "a new learning rate compiled new kernels"

def test_setting_lr_values_compiles_nothing():
  # a scheduler sets a new number every step: each is copied in from memory, not baked into a copy kernel of its own
  # (which compiled a kernel per value: examples/gpt.py's LambdaLR waited on the C compiler every step)
  ours, _ = _mlp()
  o = optim.AdamW(_params(ours), lr=0.01, betas=(0.9, 0.95))
  sched = lr_scheduler.LambdaLR(o, lambda step: 1 / (step + 1))
  o.param_groups[0]["lr"] = 0.02
  o.param_groups[0]["betas"] = (0.8, 0.9)
  n = len(realize._kernel_cache)
  for i in range(1, 4):
    o.param_groups[0]["lr"] = 0.02 + 0.001 * i
    assert o.lr.item() == np.float32(0.02 + 0.001 * i)
    o.param_groups[0]["betas"] = (0.8 + 0.01 * i, 0.9)
    assert o.param_groups[0].t("betas")[0].item() == np.float32(0.8 + 0.01 * i)
    sched.step()
    assert o.lr.item() == np.float32(0.01 / (sched.last_epoch + 1))
  assert len(realize._kernel_cache) == n, "a new hyperparameter value compiled a new kernel"

# ***** stepping *****

def test_zero_grad_and_accumulation_like_torch():
  ours, theirs = _mlp()
  o, t = optim.SGD(_params(ours), lr=0.1), torch.optim.SGD(_params(theirs), lr=0.1)
  xa, ya, xt, yt = Tensor(X), Tensor(Y), torch.tensor(X), torch.tensor(Y)
  for _ in range(2):  # without zero_grad, gradients add up
    _loss(ours, xa, ya).backward()
    _loss(theirs, xt, yt).backward()
  _close([p.grad for p in _params(ours)], [p.grad for p in _params(theirs)])
  o.step(); t.step()
  _close(_params(ours), _params(theirs))
  o.zero_grad(); t.zero_grad()
  assert all(p.grad is None for p in _params(ours)) and all(p.grad is None for p in _params(theirs))
  _loss(ours, xa, ya).backward()
  _loss(theirs, xt, yt).backward()
  _close([p.grad for p in _params(ours)], [p.grad for p in _params(theirs)])

def test_params_without_grad_are_left_alone():
  a, b, c = Tensor([1.0, 2.0]), Tensor([3.0]), Tensor([4.0], requires_grad=False)
  opt = optim.SGD([a, b, c], lr=0.5)
  assert a.requires_grad and b.requires_grad and len(opt.params) == 2 and opt.params[0] is a and opt.params[1] is b
  (a * a).sum().backward()  # b gets no gradient: step skips it, as torch does for grad None
  opt.step()
  assert a.tolist() == [0.0, 0.0] and b.tolist() == [3.0] and c.tolist() == [4.0]
  with pytest.raises(ValueError): optim.SGD([c])

@pytest.mark.parametrize("opt,kw", [(optim.SGD, dict(lr=0.05, momentum=0.9)), (optim.Adam, dict(lr=0.01)), (optim.LAMB, dict(lr=0.01, weight_decay=0.01))],
                         ids=["SGD", "Adam", "LAMB"])
def test_step_is_one_schedule_with_a_steady_kernel_count(opt, kw, monkeypatch):
  """All parameter and optimizer-state updates run from one schedule; every step after the first runs as
  many kernels (nothing pending piles up from step to step) and leaves no lazy graph behind."""
  ours, _ = _mlp()
  o = opt(_params(ours), **kw)
  schedules = []
  # every realize that runs a schedule asks for its template's kept run (found by structure, or by a matcher)
  fresh = realize._fresh_run
  monkeypatch.setattr(realize, "_fresh_run", lambda template: schedules.append(template) or fresh(template))
  xa, ya = Tensor(X).realize(), Tensor(Y).realize()
  counts = []
  for _ in range(4):
    o.zero_grad()
    _loss(ours, xa, ya).backward()
    GlobalCounters.reset()
    schedules.clear()
    o.step()
    counts.append(GlobalCounters.kernel_count)
    assert len(schedules) == 1, f"step() ran {len(schedules)} schedules"
    assert all(is_view_of_buffer(t.uop) for t in o.params + o.state_tensors()), "step() left updates pending"
  assert counts[1] == counts[2] == counts[3] > 0, counts

# ***** end to end *****

def test_mlp_learns_a_separable_problem():
  """Three classes cut by the two diagonals (kept 0.1 away from them): > 95% on held-out points in 50 steps."""
  x = np.random.default_rng(1).uniform(-1, 1, (1024, 2)).astype(np.float32)
  x = x[(np.abs(x[:, 0] + x[:, 1]) > 0.1) & (np.abs(x[:, 0] - x[:, 1]) > 0.1)]
  y = (x[:, 0] + x[:, 1] > 0).astype(np.int64) + (x[:, 0] - x[:, 1] > 0)
  Tensor.manual_seed(3)
  l1, l2 = nn.Linear(2, 32), nn.Linear(32, 3)
  opt = optim.Adam([l1.weight, l1.bias, l2.weight, l2.bias], lr=0.05)
  xa, ya = Tensor(x[:256]), Tensor(y[:256])
  for _ in range(50):
    opt.zero_grad()
    l2(l1(xa).relu()).cross_entropy(ya).backward()
    opt.step()
  acc = (l2(l1(Tensor(x[256:])).relu()).argmax(1).numpy() == y[256:]).mean()
  assert acc > 0.95, acc

def test_update_is_called_from_its_templates_after_the_first_step():
  # each kind of parameter's update is built by _update once and then made as CALL nodes of its templates (realize walks
  # a few nodes for each parameter); the values stay torch's with amsgrad (a state write that reads another) and a
  # learning rate changed between steps
  from attograd import Ops
  ours, theirs = _mlp()
  opt = optim.Adam(_params(ours), lr=0.01, amsgrad=True, weight_decay=0.1)
  topt = torch.optim.Adam(_params(theirs), lr=0.01, amsgrad=True, weight_decay=0.1)
  xa, ya, xt, yt = Tensor(X), Tensor(Y), torch.tensor(X), torch.tensor(Y)
  for s, lr in enumerate((0.01, 0.02, 0.005)):
    opt.param_groups[0]["lr"] = lr
    for g in topt.param_groups: g["lr"] = lr
    opt.zero_grad()
    _loss(ours, xa, ya).backward()
    targets = opt.schedule_step()
    called = [p.uop.op is Ops.ASSIGN and p.uop.src[1].op is Ops.CALL for p in _params(ours)]
    Tensor.realize_all(targets)
    assert called == [s > 0] * len(called)
    topt.zero_grad()
    _loss(theirs, xt, yt).backward()
    topt.step()
    _close(_params(ours), _params(theirs), what=f"step {s}:")
