"""nn.optim.lr_scheduler against torch.optim.lr_scheduler step by step, the torch-style optimizer surface
(param_groups, betas=, state_dict, zero_grad(set_to_none)), and learning rates that TinyJit replays never go stale."""
import math
import numpy as np
import pytest
import torch
from attograd import Tensor, TinyJit, nn, dtypes
from attograd.nn import optim
from attograd.nn.optim import lr_scheduler as ours_sched
from torch.optim import lr_scheduler as torch_sched

def _pair(opt="SGD", groups=1, **kw):
  """An attograd and a torch optimizer over the same parameters (groups param groups with lr 0.1, 0.05, ...)."""
  ps, tps = [Tensor.ones(2, requires_grad=True) for _ in range(groups)], [torch.ones(2, requires_grad=True) for _ in range(groups)]
  mk = lambda params: [{"params": [p], "lr": 0.1 / (i + 1)} for i, p in enumerate(params)]
  return getattr(optim, opt)(mk(ps), **kw), getattr(torch.optim, opt)(mk(tps), **kw)

SCHEDULERS = {
  "StepLR": lambda s, o: s.StepLR(o, step_size=3, gamma=0.5),
  "MultiStepLR": lambda s, o: s.MultiStepLR(o, milestones=[2, 5, 5, 9], gamma=0.3),
  "ExponentialLR": lambda s, o: s.ExponentialLR(o, gamma=0.9),
  "CosineAnnealingLR": lambda s, o: s.CosineAnnealingLR(o, T_max=7, eta_min=0.001),  # runs past T_max: cosine goes back up
  "LambdaLR": lambda s, o: s.LambdaLR(o, lambda e: 1 / (1 + e)),
  "MultiplicativeLR": lambda s, o: s.MultiplicativeLR(o, lambda e: 0.95),
  "LinearLR": lambda s, o: s.LinearLR(o, start_factor=0.25, end_factor=0.9, total_iters=6),
  "ConstantLR": lambda s, o: s.ConstantLR(o, factor=0.5, total_iters=4),
  "PolynomialLR": lambda s, o: s.PolynomialLR(o, total_iters=8, power=2.0),
  "CosineAnnealingWarmRestarts": lambda s, o: s.CosineAnnealingWarmRestarts(o, T_0=3, T_mult=2, eta_min=0.01),
  "OneCycleLR": lambda s, o: s.OneCycleLR(o, max_lr=[1.0, 0.5], total_steps=20, pct_start=0.25),
  "OneCycleLR-3phase-linear": lambda s, o: s.OneCycleLR(o, max_lr=1.0, epochs=4, steps_per_epoch=5, three_phase=True, anneal_strategy="linear"),
  "SequentialLR": lambda s, o: s.SequentialLR(o, [s.LinearLR(o, start_factor=0.1, total_iters=4), s.ExponentialLR(o, 0.8),
                                                  s.CosineAnnealingLR(o, T_max=5)], milestones=[4, 9]),
  "ChainedScheduler": lambda s, o: s.ChainedScheduler([s.ConstantLR(o, factor=0.5, total_iters=3), s.ExponentialLR(o, 0.9)]),
}

@pytest.mark.parametrize("opt,kw", [("SGD", dict(momentum=0.9)), ("Adam", {})])
@pytest.mark.parametrize("name", list(SCHEDULERS))
def test_matches_torch_step_by_step(name, opt, kw):
  o, t = _pair(opt, groups=2, **kw)
  s, ts = SCHEDULERS[name](ours_sched, o), SCHEDULERS[name](torch_sched, t)
  for step in range(20):
    want = [g["lr"] for g in t.param_groups]
    np.testing.assert_allclose([g["lr"] for g in o.param_groups], want, rtol=1e-12, err_msg=f"step {step}")
    np.testing.assert_allclose([g.t("lr").item() for g in o.param_groups], want, rtol=1e-6, err_msg=f"step {step}: the tensor")
    np.testing.assert_allclose(s.get_last_lr(), ts.get_last_lr(), rtol=1e-12)
    for key in ("momentum", "betas"):
      if key in t.param_groups[0]:
        np.testing.assert_allclose(np.array([g[key] for g in o.param_groups], dtype=float), np.array([g[key] for g in t.param_groups], dtype=float),
                                   rtol=1e-12, err_msg=f"step {step} {key}")
    o.step(); t.step()
    if step < 19: s.step(); ts.step()

def test_reduce_lr_on_plateau_matches_torch():
  o, t = _pair("SGD")
  s, ts = ours_sched.ReduceLROnPlateau(o, patience=2, factor=0.5, cooldown=1), torch_sched.ReduceLROnPlateau(t, patience=2, factor=0.5, cooldown=1)
  for m in [5, 4, 4, 4, 4, 3, 3, 3, 3, 3, 3, 2.9999, 1]:
    s.step(m); ts.step(m)
    assert o.param_groups[0]["lr"] == t.param_groups[0]["lr"]

# ***** training with a scheduler matches torch, eagerly and under TinyJit *****

def _train(jit: bool, opt_name: str, sched: str, steps=12):
  rng = np.random.default_rng(0)
  w0 = rng.standard_normal((4, 3)).astype(np.float32)
  X, Y = rng.standard_normal((steps, 8, 4)).astype(np.float32), rng.standard_normal((steps, 8, 3)).astype(np.float32)
  w, tw = Tensor(w0.copy(), requires_grad=True), torch.tensor(w0.copy(), requires_grad=True)
  kw = dict(momentum=0.9, nesterov=True, weight_decay=0.01) if opt_name == "SGD" else dict(betas=(0.8, 0.99), weight_decay=0.1)
  o, t = getattr(optim, opt_name)([w], lr=0.05, **kw), getattr(torch.optim, opt_name)([tw], lr=0.05, **kw)
  make = {"cos": lambda s, o: s.CosineAnnealingLR(o, T_max=steps), "onecycle": lambda s, o: s.OneCycleLR(o, max_lr=0.2, total_steps=steps)}[sched]
  s, ts = make(ours_sched, o), make(torch_sched, t)
  def step(x, y):
    o.zero_grad()
    loss = ((x @ w - y) ** 2).mean().backward()
    o.step()
    return loss.realize()
  if jit: step = TinyJit(step)
  for i in range(steps):
    loss = step(Tensor(X[i]), Tensor(Y[i])).item()
    t.zero_grad()
    tloss = ((torch.tensor(X[i]) @ tw - torch.tensor(Y[i])) ** 2).mean()
    tloss.backward()
    t.step()
    np.testing.assert_allclose(loss, tloss.item(), rtol=1e-5, err_msg=f"step {i}")
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {i}")
    s.step(); ts.step()

@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("opt_name,sched", [("SGD", "cos"), ("AdamW", "onecycle"), ("Adam", "cos"), ("SGD", "onecycle")])
def test_training_with_scheduler_matches_torch(jit, opt_name, sched): _train(jit, opt_name, sched)

def test_setting_lr_in_any_way_reaches_the_jitted_step():
  w = Tensor([1.0], requires_grad=True)
  o = optim.SGD([w], lr=0.5)
  @TinyJit
  def step():
    o.zero_grad()
    (w * 1.0).sum().backward()  # gradient 1: w drops by lr
    o.step()
    return w.realize()
  seen = []
  for lr in [0.5, 0.5, 0.25, 0.125, 0.1, 0.3]:
    if lr == 0.25: o.lr = 0.25                          # tinygrad-ish attribute
    elif lr == 0.125: o.param_groups[0]["lr"] = 0.125  # torch's dict
    elif lr == 0.1: o.lr.assign(0.1).realize()          # the tensor itself
    elif lr == 0.3: o.lr = Tensor(0.3)
    before = w.item()
    step()
    seen.append(round(before - w.item(), 6))
  assert seen == [0.5, 0.5, 0.25, 0.125, 0.1, 0.3]
  assert o.param_groups[0]["lr"] == pytest.approx(0.3)

# ***** the optimizer surface *****

def test_param_groups_and_keywords():
  a, b = Tensor.ones(3, requires_grad=True), Tensor.ones(2, requires_grad=True)
  o = optim.AdamW([{"params": [a]}, {"params": b, "lr": 0.5, "betas": (0.5, 0.6)}], lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.2)
  assert [g["lr"] for g in o.param_groups] == [0.01, 0.5] and o.param_groups[1]["betas"] == (0.5, 0.6) and o.param_groups[0]["eps"] == 1e-6
  assert o.params == [a, b]
  assert optim.Adam([a], b1=0.7).param_groups[0]["betas"] == (0.7, 0.999)  # tinygrad's spelling
  assert optim.SGD(nn.Linear(2, 2).named_parameters()).params[0].shape == (2, 2)  # torch's (name, tensor) pairs
  with pytest.raises(TypeError): optim.Adam([a], betas=(0.9, 0.99), b1=0.8)
  with pytest.raises(TypeError): optim.SGD([{"params": [a], "betas": (0.9, 0.9)}])
  with pytest.raises(ValueError): optim.SGD([{"params": [a]}, {"params": [a]}])
  with pytest.raises(ValueError): optim.Adam([a], betas=(1.0, 0.9))
  with pytest.raises(ValueError): optim.SGD([a], lr=-1)
  with pytest.raises(TypeError): o.param_groups[0]["lr"] = "fast"
  o.add_param_group({"params": [Tensor.ones(1, requires_grad=True)], "lr": 0.3})
  assert len(o.param_groups) == 3 and o.param_groups[2]["betas"] == (0.8, 0.9)

def test_two_groups_train_like_torch():
  rng = np.random.default_rng(3)
  w0, b0 = rng.standard_normal((4, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
  w, b, tw, tb = Tensor(w0), Tensor(b0), torch.tensor(w0, requires_grad=True), torch.tensor(b0, requires_grad=True)
  o = optim.SGD([{"params": [w], "weight_decay": 0.1}, {"params": [b], "lr": 0.3, "momentum": 0.5}], lr=0.1, momentum=0.9)
  t = torch.optim.SGD([{"params": [tw], "weight_decay": 0.1}, {"params": [tb], "lr": 0.3, "momentum": 0.5}], lr=0.1, momentum=0.9)
  x = rng.standard_normal((5, 4)).astype(np.float32)
  for _ in range(4):
    o.zero_grad(); t.zero_grad()
    (Tensor(x) @ w + b).square().sum().backward()
    (torch.tensor(x) @ tw + tb).square().sum().backward()
    o.step(); t.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), tb.detach().numpy(), rtol=1e-5)

@pytest.mark.parametrize("opt,kw", [("SGD", dict(lr=0.1, momentum=0.9, dampening=0.3)), ("Adam", dict(lr=0.01, amsgrad=True)),
                                    ("AdamW", dict(lr=0.01, weight_decay=0.1)), ("SGD", dict(lr=0.1, momentum=0.9, maximize=True))])
def test_state_dict_from_torch_resumes_identically(opt, kw):
  """Train torch 3 steps, load its optimizer state (as numpy) and parameters into ours, then both go on 3 steps."""
  rng = np.random.default_rng(0)
  w0 = rng.standard_normal((3, 2)).astype(np.float32)
  xs = rng.standard_normal((6, 4, 3)).astype(np.float32)
  tw = torch.tensor(w0, requires_grad=True)
  t = getattr(torch.optim, opt)([tw], **kw)
  tstep = lambda x: (t.zero_grad(), (torch.tensor(x) @ tw).square().sum().backward(), t.step())
  for x in xs[:3]: tstep(x)
  w = Tensor(tw.detach().numpy().copy(), requires_grad=True)
  o = getattr(optim, opt)([w], **kw)
  sd = t.state_dict()
  o.load_state_dict(sd if opt == "AdamW" else  # torch tensors as they are, or as numpy
                    {"state": {k: {n: v.numpy() for n, v in s.items()} for k, s in sd["state"].items()}, "param_groups": sd["param_groups"]})
  for x in xs[3:]:
    tstep(x)
    o.zero_grad(); (Tensor(x) @ w).square().sum().backward(); o.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)
  ours = o.state_dict()
  assert set(ours["state"][0]) == set(t.state_dict()["state"][0]) and ours["param_groups"][0]["params"] == [0]
  for n, v in t.state_dict()["state"][0].items(): np.testing.assert_allclose(ours["state"][0][n].numpy(), v.numpy(), rtol=1e-5, atol=1e-7)
  o2 = getattr(optim, opt)([Tensor(w.numpy())], **kw)
  o2.load_state_dict(ours)  # ours loads into ours
  if opt != "SGD": np.testing.assert_allclose(o2.state_dict()["state"][0]["step"].numpy(), 6)
  np.testing.assert_allclose(o2.state_dict()["state"][0]["exp_avg" if opt != "SGD" else "momentum_buffer"].numpy(),
                             t.state_dict()["state"][0]["exp_avg" if opt != "SGD" else "momentum_buffer"].numpy(), rtol=1e-5, atol=1e-7)

def test_zero_grad_set_to_none():
  w = Tensor.ones(2, requires_grad=True)
  o = optim.SGD([w], lr=0.1)
  (w * 2).sum().backward()
  o.zero_grad(set_to_none=False)
  assert w.grad is not None and w.grad.tolist() == [0.0, 0.0]
  o.zero_grad()
  assert w.grad is None

def test_non_float_parameters_are_skipped():
  """tinygrad's get_parameters(model) includes BatchNorm's int64 num_batches_tracked: an optimizer leaves it alone."""
  bn = nn.BatchNorm2d(3)
  ps = nn.state.get_parameters(bn)
  assert any(p.dtype == dtypes.int64 for p in ps)
  o = optim.Adam(ps)
  assert len(o.params) == 4 and all(dtypes.is_float(p.dtype) for p in o.params)
  assert bn.num_batches_tracked.requires_grad is None
  with Tensor.train():
    o.zero_grad()
    bn(Tensor.randn(4, 3, 2, 2)).sum().backward()
    o.step()
  assert bn.num_batches_tracked.item() == 1
  with pytest.raises(ValueError): optim.SGD([Tensor([1, 2])])

def test_optimizer_group_and_lars():
  a, b = Tensor([1.0, 1.0], requires_grad=True), Tensor([1.0, 1.0], requires_grad=True)
  g = optim.OptimizerGroup(optim.SGD([a], lr=0.1), optim.LARS([b], lr=0.1))
  g.zero_grad()
  (a.sum() + b.square().sum()).backward()
  g.step()
  assert a.tolist() == pytest.approx([0.9, 0.9]) and b.numpy().max() < 1 and len(g.param_groups) == 2
  g.zero_grad()
  assert a.grad is None and b.grad is None

def _numpy_muon(p, grads, lr, wd, mom, nesterov, coef, eps, steps):
  buf = np.zeros_like(p)
  for g in grads:
    buf = buf + (g - buf) * (1 - mom)
    x = g + (buf - g) * mom if nesterov else buf
    t = x.shape[0] > x.shape[1]
    x = x.T if t else x
    x = x / max(np.linalg.norm(x), eps)
    for _ in range(steps):
      gram = x @ x.T
      x = coef[0] * x + (coef[1] * gram + coef[2] * gram @ gram) @ x
    x = x.T if t else x
    p = p * (1 - lr * wd) - lr * math.sqrt(max(1, p.shape[0] / p.shape[1])) * x
  return p

@pytest.mark.parametrize("shape,nesterov", [((6, 4), True), ((3, 5), False)])
def test_muon_matches_a_numpy_reference_and_torch(shape, nesterov):
  rng = np.random.default_rng(0)
  p0 = rng.standard_normal(shape).astype(np.float32)
  grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
  w, tw = Tensor(p0.copy(), requires_grad=True), torch.tensor(p0.copy(), requires_grad=True)
  o, t = optim.Muon([w], lr=0.02, nesterov=nesterov), torch.optim.Muon([tw], lr=0.02, nesterov=nesterov)
  for g in grads:
    w.grad, tw.grad = Tensor(g), torch.tensor(g)
    o.step(); t.step()
  ref = _numpy_muon(p0.astype(np.float64), [g.astype(np.float64) for g in grads], 0.02, 0.1, 0.95, nesterov, (3.4445, -4.775, 2.0315), 1e-7, 5)
  np.testing.assert_allclose(w.numpy(), ref, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(w.numpy() - p0, tw.detach().numpy() - p0, atol=0.02 * 0.02 * 3, rtol=0.05)  # torch iterates in bfloat16
  with pytest.raises(ValueError): optim.Muon([Tensor.ones(3, requires_grad=True)])
