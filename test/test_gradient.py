"""Gradients of differentiable ops against torch: values and shapes, incl. broadcasting,
reductions and movement ops."""
import numpy as np
import pytest
import torch
from attograd import Tensor
from helpers import grad_check

def _check(fn, *shapes, positive=False, atol=1e-4, rtol=1e-3, seed=0):
  rng = np.random.default_rng(seed)
  data = [rng.uniform(0.5, 2.0, s) if positive else rng.standard_normal(s) for s in shapes]
  grad_check(fn, fn, data, atol=atol, rtol=rtol)

UNARY = {
  "neg": lambda x: -x, "exp": lambda x: x.exp(), "sqrt": lambda x: x.sqrt(), "log": lambda x: x.log(),
  "sin": lambda x: x.sin(), "cos": lambda x: x.cos(), "relu": lambda x: x.relu(), "sigmoid": lambda x: x.sigmoid(),
  "tanh": lambda x: x.tanh(), "reciprocal": lambda x: x.reciprocal(), "square": lambda x: x.square(),
  "abs": lambda x: x.abs(), "pow3": lambda x: x ** 3, "powf": lambda x: x ** 1.7, "rsqrt": lambda x: x.rsqrt(),
  "clip": lambda x: x.clip(0.7, 1.5),
}
@pytest.mark.parametrize("name", list(UNARY))
def test_unary(name): _check(UNARY[name], (3, 4), positive=name in ("sqrt", "log", "powf", "rsqrt", "reciprocal", "clip"))

BINARY = {
  "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "div": lambda a, b: a / b,
  "maximum": lambda a, b: a.maximum(b), "minimum": lambda a, b: a.minimum(b), "where": lambda a, b: torch.where(a > b, a, b * 2) if isinstance(a, torch.Tensor) else (a > b).where(a, b * 2),
  "matmul": lambda a, b: a @ b.transpose(-1, -2),
}
@pytest.mark.parametrize("name", list(BINARY))
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (1, 4)), ((2, 3, 4), (4,))])
def test_binary_broadcast(name, shapes):
  if name == "matmul" and len(shapes[1]) == 1: shapes = ((2, 3, 4), (5, 4))
  _check(BINARY[name], *shapes, positive=name == "div")

REDUCE = {
  "sum": lambda x: x.sum(), "sum1": lambda x: x.sum(1), "sum_keep": lambda x: x.sum(0, keepdim=True) * x,
  "max": lambda x: x.max(), "max1": lambda x: x.amax(1) if isinstance(x, torch.Tensor) else x.max(axis=1),
  "min0": lambda x: x.amin(0) if isinstance(x, torch.Tensor) else x.min(axis=0), "mean": lambda x: x.mean(1),
  "var": lambda x: x.var(1), "std": lambda x: x.std(), "prod": lambda x: x.prod(1),
  "softmax": lambda x: x.softmax(1) * torch.arange(4.) if isinstance(x, torch.Tensor) else x.softmax(1) * Tensor.arange(4.),
  "log_softmax": lambda x: x.log_softmax(1)[:, 1],
}
@pytest.mark.parametrize("name", list(REDUCE))
def test_reduce(name): _check(REDUCE[name], (3, 4), positive=name == "prod")

MOVEMENT = {
  "reshape": lambda x: x.reshape(4, 3) * torch.arange(3.) if isinstance(x, torch.Tensor) else x.reshape(4, 3) * Tensor.arange(3.),
  "permute": lambda x: x.permute(1, 0)[1:], "expand": lambda x: x.reshape(3, 1, 4).expand(3, 2, 4) * 2,
  "pad": lambda x: torch.nn.functional.pad(x, (1, 2, 0, 1)).exp() if isinstance(x, torch.Tensor) else x.pad((1, 2, 0, 1)).exp(),
  "shrink": lambda x: x[1:3, ::2] ** 2, "flip": lambda x: x.flip(0) * x, "transpose": lambda x: x.T @ x,
  "getitem_step": lambda x: x.flip(0)[::2, 1::2].exp(),
}
@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement(name): _check(MOVEMENT[name], (3, 4))

@pytest.mark.parametrize("name", ["gelu", "erf", "erfc"])
def test_polynomial_functions_differentiate_as_the_function_to_every_order(name):
  # these are polynomial approximations that carry their exact derivative (WITH_DERIVATIVE): first and second derivatives
  # against torch's, including 0 (where the approximation's |x| has no slope) and the tails
  x = np.concatenate([np.linspace(-6, 6, 61), [0.0, -0.0, 1e-4, -1e-4, 20.0, -20.0]]).astype(np.float32)
  tf = torch.nn.functional.gelu if name == "gelu" else getattr(torch, name)
  t = torch.tensor(x, requires_grad=True)
  (t1,) = torch.autograd.grad(tf(t).sum(), t, create_graph=True)
  (t2,) = torch.autograd.grad(t1.sum(), t)
  a = Tensor(x, requires_grad=True)
  (a1,) = getattr(a, name)().sum().gradient(a)
  (a2,) = a1.sum().gradient(a)
  np.testing.assert_allclose(a1.numpy(), t1.detach().numpy(), atol=1e-6, rtol=1e-5)
  np.testing.assert_allclose(a2.numpy(), t2.numpy(), atol=1e-6, rtol=1e-4)

def test_gradient_is_functional_and_detach_stops():
  x = Tensor([1., 2., 3.], requires_grad=True)
  (g,) = (x * x).sum().gradient(x)
  assert g.tolist() == [2., 4., 6.] and x.grad is None
  (g,) = (x * x.detach()).sum().gradient(x)
  assert g.tolist() == [1., 2., 3.]

def test_backward_accumulates():
  x = Tensor([1., 2.], requires_grad=True)
  (x * 3).sum().backward()
  (x * x).sum().backward()
  assert x.grad.tolist() == [5., 7.]

def test_backward_needs_scalar_and_grad_tensors():
  x = Tensor([1., 2.], requires_grad=True)
  with pytest.raises(RuntimeError, match="shape"): (x * 2).backward()
  with pytest.raises(RuntimeError, match="requir"): Tensor([1., 2.]).sum().backward()
  with pytest.raises(TypeError, match="floating"): Tensor([1, 2], requires_grad=True)

def test_gradient_of_realized_parameter_after_update():
  w = Tensor([1., 2.], requires_grad=True)
  for _ in range(3):
    w.grad = None
    (w * w).sum().backward()
    w.assign(w - 0.25 * w.grad).realize()
  assert w.tolist() == [0.125, 0.25]

def test_contiguous_backward_is_identity_forward_and_realizes_the_gradient():
  x = Tensor([1., 2., 3.], requires_grad=True)
  y = (x.contiguous_backward() * 2).sum()
  assert y.item() == 12.0
  y.backward()
  assert x.grad.tolist() == [2., 2., 2.]

def test_conv_pool_gradients_match_torch():
  def f(x, w):
    if isinstance(x, torch.Tensor): return torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(x, w, padding=1).relu(), 2)
    return x.conv2d(w, padding=1).relu().max_pool2d(2)
  _check(f, (2, 3, 6, 6), (4, 3, 3, 3))

def test_backward_after_item_and_through_realized_intermediates():
  x, w = np.array([[1., 2.], [3., -4.]], np.float32), np.array([[.5, -1.], [2., .25], [-1., 1.]], np.float32)
  W = Tensor(w, requires_grad=True)
  h = (Tensor(x) @ W.T).relu().realize()   # a realized intermediate still passes gradients
  loss = (h * h).sum()
  loss.item()                              # reading the loss first, as training loops do
  loss.backward()
  tw = torch.tensor(w, requires_grad=True)
  ((torch.tensor(x) @ tw.T).relu() ** 2).sum().backward()
  np.testing.assert_allclose(W.grad.numpy(), tw.grad.numpy(), rtol=1e-6)

def test_backward_after_realizing_a_tensor_with_nothing_to_compute():
  # a constant-based tensor "realizes" to itself: seeing through it must not loop
  c = Tensor.zeros(3).realize()
  x = Tensor([1., 2., 3.], requires_grad=True)
  (x * 2 + c).sum().backward()
  assert x.grad.tolist() == [2., 2., 2.]

def test_requires_grad_can_be_set_again():
  # as in torch: setting it twice (a model's init, then the user) is no error; the registry of such tensors doesn't compare
  # tensors with == (elementwise: its truth value is ambiguous)
  t = Tensor.ones(3, 3)
  t.requires_grad = True
  t.requires_grad = True
  t.requires_grad_(False); t.requires_grad_(False)
  t.requires_grad_(True)
  (t * 2).sum().backward()
  np.testing.assert_array_equal(t.grad.numpy(), np.full((3, 3), 2.0, np.float32))

# ***** a backward pass of a graph differentiated before: CALLs of the template kept for its structure (gradient.py) *****

def _attention_loss(lib, x, w, v):
  """a small attention-like graph with softmax (a Vjp whose closure holds tensors) and a matmul"""
  if lib is torch: return ((x @ w).softmax(-1) @ v).square().mean()
  return ((x @ w).softmax(-1) @ v).square().mean()

def test_backward_of_a_graph_seen_before_is_calls_of_its_template(monkeypatch):
  from attograd import gradient
  from attograd.uop.ops import Ops
  rng = np.random.default_rng(0)
  wn, vn = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
  w, v = Tensor(wn, requires_grad=True), Tensor(vn, requires_grad=True)
  tw, tv = torch.tensor(wn, requires_grad=True), torch.tensor(vn, requires_grad=True)
  ruled = [0]
  rules = gradient._rules_gradient
  monkeypatch.setattr(gradient, "_rules_gradient", lambda *a: (ruled.__setitem__(0, ruled[0] + 1), rules(*a))[1])
  for step in range(4):
    xn = rng.standard_normal((6, 4)).astype(np.float32)
    w.grad = v.grad = tw.grad = tv.grad = None
    _attention_loss(Tensor, Tensor(xn), w, v).backward()
    _attention_loss(torch, torch.tensor(xn), tw, tv).backward()
    # the first two passes run the rules (the second makes the template), the later ones only call it
    assert ruled[0] == min(step + 1, 2)
    assert (w.grad.uop.op is Ops.CALL) == (step >= 1)
    for ours, theirs in ((w, tw), (v, tv)): np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-5, atol=1e-6)
    # new values in place: the same structure over the same buffers, then other ones
    w.assign(w.detach() * 0.9).realize(); tw.data.mul_(0.9)

def test_backward_template_follows_requires_grad():
  rng = np.random.default_rng(1)
  a, b = Tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True), Tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)
  for step in range(6):
    frozen = step in (3, 4)
    b.requires_grad = not frozen
    a.grad = b.grad = None
    x = Tensor(rng.standard_normal((2, 3)).astype(np.float32))
    ((x @ a + b).exp()).sum().backward()
    ta, tb = torch.tensor(a.numpy(), requires_grad=True), torch.tensor(b.numpy(), requires_grad=not frozen)
    ((torch.tensor(x.numpy()) @ ta + tb).exp()).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)
    if frozen: assert b.grad is None
    else: np.testing.assert_allclose(b.grad.numpy(), tb.grad.numpy(), rtol=1e-5)

def test_backward_template_keys_what_a_vjp_holds():
  # the same forward graph every time, but the vjp's closure holds a number that changes, and (second case) reads a tensor
  # outside the graph whose values change: each pass's gradient is its own
  x = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  e = np.exp([1.0, 2.0, 3.0])
  for scale in (1.0, 2.0, 2.0, 3.0, 3.0, 3.0, 0.5):
    x.grad = None
    y = x.exp()
    y._with_vjp((x,), lambda s=scale: (lambda g: g * y * s,)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), e * scale, rtol=1e-6)
  outside = Tensor([1.0, 1.0, 1.0]).realize()
  for k in range(5):
    outside.assign(Tensor([k, 2.0 * k, 1.0])).realize()
    x.grad = None
    y = x.exp()
    y._with_vjp((x,), lambda: (lambda g: g * y * outside,)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), e * [k, 2.0 * k, 1.0], rtol=1e-6)

def _rules_only(monkeypatch):
  from attograd import gradient
  monkeypatch.setattr(gradient, "_structure", lambda *a: None)

def test_gradient_penalty_reaches_parameters_through_templated_gradients():
  # d/dx of tanh(x @ w), then the square of that differentiated for w, step after step: from the second step on the first
  # gradient is a template's CALL, whose sources must hold w's node (a view of its buffer), or the second pass finds no
  # tensor requiring grad in it (it raised on main); the values as torch's double backward
  rng = np.random.default_rng(3)
  wn = rng.standard_normal((3, 4)).astype(np.float32)
  w = Tensor(wn, requires_grad=True)
  tw = torch.tensor(wn, requires_grad=True)
  for _ in range(4):
    xn = rng.standard_normal((5, 3)).astype(np.float32)
    x = Tensor(xn, requires_grad=True)
    (gx,) = (x @ w).tanh().sum().gradient(x)
    w.grad = None
    gx.square().sum().backward()
    tx = torch.tensor(xn, requires_grad=True)
    (tgx,) = torch.autograd.grad((tx @ tw).tanh().sum(), tx, create_graph=True)
    (tg,) = torch.autograd.grad(tgx.square().sum(), tw)
    np.testing.assert_allclose(w.grad.numpy(), tg.numpy(), rtol=1e-4, atol=1e-5)

def test_second_order_gradient_through_templated_gradients(monkeypatch):
  # a gradient penalty: the gradients of a templated backward pass are differentiated again, step after step; the first
  # pass's vjp calls softmax, so its gradient holds a Vjp of its own, which the second pass calls: it must be this step's
  rng = np.random.default_rng(2)
  w = Tensor(rng.standard_normal((3, 4)).astype(np.float32), requires_grad=True)
  def penalty(xn: np.ndarray) -> np.ndarray:
    x = Tensor(xn, requires_grad=True)
    y = (x @ w).tanh()
    (gx,) = y._with_vjp((x,), lambda: (lambda g: ((g * y) @ w.T).softmax(-1),)).sum().gradient(x)
    w.grad = None
    gx.square().sum().backward()
    return w.grad.numpy()
  xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(4)]
  got = [penalty(xn) for xn in xs]
  _rules_only(monkeypatch)
  for g, xn in zip(got, xs): np.testing.assert_allclose(g, penalty(xn), rtol=1e-5, atol=1e-7)

def test_gradient_with_respect_to_a_replayed_output():
  # h = x.linear(w) is a replay's CALL node: the rules differentiate its expansion, a template keeps its place; both give
  # the gradient with respect to h itself (as torch's retain_grad) and to w, step after step
  rng = np.random.default_rng(4)
  wn = rng.standard_normal((4, 3)).astype(np.float32)
  w = Tensor(wn, requires_grad=True)
  for _ in range(4):
    xn = rng.standard_normal((5, 3)).astype(np.float32)
    h = Tensor(xn).linear(w)
    gh, gw = (h.gelu() * h).sum().gradient(h, w)
    tw = torch.tensor(wn, requires_grad=True)
    th = torch.tensor(xn) @ tw.T
    th.retain_grad()
    (torch.nn.functional.gelu(th) * th).sum().backward()
    np.testing.assert_allclose(gh.numpy(), th.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-5)
