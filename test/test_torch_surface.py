"""The Tensor surface a PyTorch user touches (issue 16): each test runs the same lines in torch and attograd."""
import numpy as np
import pytest
import torch
from attograd import Tensor, TinyJit, JitError, dtypes

def arange(*shape: int) -> np.ndarray: return np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
def both(a: np.ndarray) -> tuple[Tensor, torch.Tensor]: return Tensor(a).realize(), torch.tensor(a)
def same(t: Tensor, r: torch.Tensor, **kw) -> None:
  assert t.shape == tuple(r.shape), (t.shape, tuple(r.shape))
  np.testing.assert_allclose(t.numpy(), r.numpy(), **kw)

# ***** writes through views reach the base *****
@pytest.mark.parametrize("write", [
  lambda x: x[0].__setitem__(1, 5),                          # x[0][1] = 5
  lambda x: x[1].__iadd__(100),                              # v = x[1]; v += 100
  lambda x: x.reshape(4, 3).__setitem__((1, 2), -1),         # setitem on x.reshape(...)
  lambda x: x.T.__setitem__(0, 9),                           # a permuted view
  lambda x: x[:, 1:3][1].__setitem__(slice(None), 7),        # a view of a view
  lambda x: x.view(12)[::5].__imul__(-2),                    # a strided view
  lambda x: x.unsqueeze(0).squeeze(0).flatten()[3:].__isub__(1)])
def test_write_through_view(write):
  (x, r) = both(arange(3, 4))
  write(x); write(r)
  same(x, r)

def test_write_through_view_of_lazy_and_realized_view():
  x, r = Tensor.zeros(3, 3), torch.zeros(3, 3)
  row, trow = x[0], r[0]
  assert row.tolist() == trow.tolist()  # the view is realized on its own first
  row[1] = 7; trow[1] = 7
  same(x, r); same(row, trow)

def test_view_sees_base_written_before_inplace_op():
  (x, r) = both(arange(2, 3))
  v, tv = x[0], r[0]
  x += 1; r += 1
  v += 10; tv += 10
  same(x, r); same(v, tv)

@pytest.mark.parametrize("write", [
  lambda x: x.__setitem__((0, 0), 100.),        # the base written by index
  lambda x: x.add_(1),                          # in place on the base
  lambda x: x[1].mul_(-1),                      # through another view of the same base
  lambda x: x.copy_(x * 2),
])
def test_views_made_before_a_write_read_it(write):
  """torch's views share memory: a view made before its base was written reads the new values (and a sibling view's
  write reaches it), while a tensor computed from the view before the write keeps the old ones."""
  (x, r) = both(arange(2, 3))
  views, tviews = [x[0], x[:, 1], x.T, x.reshape(6)[2:]], [r[0], r[:, 1], r.T, r.reshape(6)[2:]]
  before, tbefore = views[0] * 1, tviews[0] * 1
  write(x); write(r)
  for v, tv in zip(views, tviews): same(v, tv)
  same(before, tbefore)

def test_write_to_expanded_view_raises():
  x = Tensor.ones(1, 3).contiguous().realize()
  with pytest.raises(RuntimeError, match="expanded"): x.expand(2, 3)[0] = 1.0

# ***** out-of-range indices raise *****
@pytest.mark.parametrize("bad", [10, -11])
def test_lookup_out_of_range_raises(bad):
  w = Tensor.randn(10, 4).realize()
  idx = Tensor([1, bad]) + 0  # lazy: checked with the realize
  with pytest.raises(IndexError, match="out of bounds"): w[idx].numpy()
  with pytest.raises(IndexError, match="out of bounds"): w.gather(0, Tensor([[1, bad]]) + 0).numpy()
  with pytest.raises(RuntimeError): w[idx].numpy()  # torch raises RuntimeError for gather/embedding
  assert w[Tensor([1, -1]) + 0].shape == (2, 4)  # negative in range still wraps

@pytest.mark.parametrize("target", [[0, 7, 1], [0, -1, 1]])
def test_cross_entropy_target_out_of_range_raises(target):
  logits = Tensor.randn(3, 3)
  with pytest.raises(IndexError): logits.cross_entropy(Tensor(target)).item()
  with pytest.raises(IndexError): torch.nn.functional.cross_entropy(torch.randn(3, 3), torch.tensor(target))

def test_cross_entropy_ignore_index_is_not_out_of_range():
  x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
  y = [0, -100, 4]
  same(Tensor(x).cross_entropy(Tensor(y)), torch.nn.functional.cross_entropy(torch.tensor(x), torch.tensor(y)), rtol=1e-5)

def test_jit_replay_reports_out_of_range_index():
  w = Tensor.randn(10, 4).realize()
  @TinyJit
  def f(i: Tensor) -> Tensor: return w[i].sum().realize()
  for _ in range(3): f(Tensor([1, 2]))
  with pytest.raises(IndexError): f(Tensor([1, 12]))
  f(Tensor([3, 4]))

# ***** TinyJit never replays stale values silently *****
def test_jit_raises_when_a_python_float_it_read_changes():
  w = Tensor.ones(3).contiguous().realize()
  class Opt: pass
  opt = Opt(); opt.lr = 0.1
  @TinyJit
  def step(x: Tensor) -> Tensor:
    w.assign(w - opt.lr * x)
    return w.sum().realize()
  for _ in range(3): step(Tensor.ones(3))
  opt.lr = 0.01
  with pytest.raises(JitError, match="opt.lr"): step(Tensor.ones(3))

@pytest.mark.parametrize("where", ["closure list", "global dict", "attribute list", "argument dict"])
def test_jit_raises_when_a_float_in_a_container_changes(where):
  """scale[0] = ... changes no name the function reads: the float inside the list or dict is watched too."""
  class Cfg: pass
  cfg, box = Cfg(), [0.5]
  cfg.scales, _GLOBAL_CFG["lr"] = [0.5], 0.5
  read = {"closure list": lambda _: box[0], "global dict": lambda _: _GLOBAL_CFG["lr"], "attribute list": lambda _: cfg.scales[0],
          "argument dict": lambda d: d["lr"]}[where]
  def set_value(v, d):
    if where == "closure list": box[0] = v
    elif where == "global dict": _GLOBAL_CFG["lr"] = v
    elif where == "attribute list": cfg.scales[0] = v
    else: d["lr"] = v
  @TinyJit
  def f(x: Tensor, d: dict) -> Tensor:
    return (x * {"closure list": box, "global dict": _GLOBAL_CFG, "attribute list": cfg.scales, "argument dict": d}[where]
            [0 if where in ("closure list", "attribute list") else "lr"]).realize()
  d = {"lr": 0.5}
  for _ in range(3): assert f(Tensor.ones(2), d).tolist() == [0.5, 0.5]
  set_value(0.25, d)
  assert read(d) == 0.25
  with pytest.raises(JitError, match="0.5"): f(Tensor.ones(2), d)
_GLOBAL_CFG: dict = {}

def test_jit_raises_when_training_mode_changes():
  @TinyJit
  def f(x: Tensor) -> Tensor: return x.dropout(0.5).realize()
  for _ in range(3): f(Tensor.ones(4))
  with Tensor.train():
    with pytest.raises(JitError, match="training"): f(Tensor.ones(4))

def test_jit_raises_for_numpy_data_made_inside_that_changes():
  rng = np.random.default_rng(0)
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x + Tensor(rng.random(3).astype(np.float32))).realize()
  f(Tensor.ones(3))
  with pytest.raises(JitError, match="numpy"): f(Tensor.ones(3))

def test_jit_allows_constant_data_made_inside():
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x + Tensor([1., 2., 3.]) + Tensor.rand(3) * 0).realize()
  for _ in range(4): assert f(Tensor.ones(3)).tolist() == [2., 3., 4.]

@pytest.mark.parametrize("make", [Tensor.zeros, Tensor.ones, lambda *s, **kw: Tensor.full(s, 2.0, **kw), Tensor.eye])
def test_creation_keeps_requires_grad(make):
  a, b = make(2, 3, requires_grad=True), make(2, 3, requires_grad=True)
  assert a.requires_grad and b.requires_grad
  (a * 2 + b * 3).sum().backward()
  assert a.grad.tolist() == [[2.] * 3] * 2 and b.grad.tolist() == [[3.] * 3] * 2

# ***** PyTorch's keyword names beside tinygrad's *****
X = np.random.default_rng(1).standard_normal((3, 4, 5)).astype(np.float32)
KW_CASES = [
  ("sum", dict(dim=0)), ("sum", dict(dim=-1, keepdim=True)), ("sum", dict(dim=(0, 2))), ("mean", dict(dim=-1, keepdim=True)),
  ("prod", dict(dim=1)), ("softmax", dict(dim=-1)), ("log_softmax", dict(dim=1)), ("argmax", dict(dim=-1)),
  ("argmin", dict(dim=0, keepdim=True)), ("var", dict(dim=-1, unbiased=False)), ("var", dict(dim=1, correction=0)), ("std", dict(dim=0)),
  ("std", dict(dim=2, keepdim=True, unbiased=True)), ("clamp", dict(min=0)), ("clamp", dict(max=0.5)), ("clamp", dict(min=-0.1, max=0.2)),
  ("clip", dict(min=0)), ("logsumexp", dict(dim=1)), ("cumsum", dict(dim=1)), ("cumprod", dict(dim=-1)), ("amax", dict(dim=1)),
  ("amin", dict(dim=(0, 1))), ("any", dict(dim=1)), ("all", dict(dim=0)),
]
@pytest.mark.parametrize("name,kw", KW_CASES, ids=[f"{n}-{'-'.join(kw)}" for n, kw in KW_CASES])
def test_torch_keyword_names(name, kw):
  x, r = both(X)
  if name in ("any", "all"): x, r = x > 0, r > 0
  same(getattr(x, name)(**kw), getattr(r, name)(**kw), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_with_dim_give_values_and_indices(name):
  x, r = both(X)
  for args, kw in [((), dict(dim=-1)), ((1,), {}), ((1, True), {}), ((2,), dict(keepdim=True)), ((), dict(dim=0, keepdim=False))]:
    out, ref = getattr(x, name)(*args, **kw), getattr(r, name)(*args, **kw)
    assert type(out).__name__ == "ValuesIndices" and len(out) == 2
    same(out.values, ref.values); same(out.indices, ref.indices)
    v, i = out  # unpacks as torch's namedtuple does
    same(v, ref[0]); same(i, ref[1])
  red = r.amax if name == "max" else r.amin
  same(getattr(x, name)(axis=1), red(1))  # tinygrad's keyword spelling stays a tensor
  same(getattr(x, name)(axis=-1, keepdim=True), red(-1, keepdim=True))
  same(getattr(x, name)((0, 2)), red((0, 2)))  # a tuple of dims: torch refuses, tinygrad reduces
  same(getattr(x, name)(), getattr(r, name)())
  same(getattr(x, name)(x * 0), getattr(r, name)(r * 0))  # with a tensor: elementwise, as torch.max(a, b)
  same(getattr(x, name)(np.int64(1)).values, getattr(r, name)(1).values)  # numpy's ints are a dim too

@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_int_bool_with_dim(name):
  a = np.random.default_rng(2).integers(-3, 4, (5, 6))
  for arr in (a.astype(np.int32), a > 0):
    x, r = Tensor(arr), torch.tensor(arr)
    out, ref = getattr(x, name)(1), getattr(r, name)(1)
    same(out.values, ref.values); same(out.indices, ref.indices)

@pytest.mark.parametrize("misuse", [
  lambda x: x - x.max(1, keepdim=True), lambda x: x.max(1) - x, lambda x: x.max(dim=1) * 2, lambda x: 2 * x.min(1),
  lambda x: x.max(1) + x.max(1), lambda x: x == x.max(1, True), lambda x: x.max(1) < 0, lambda x: -x.min(0)])
def test_values_indices_in_arithmetic_names_the_fix(misuse):
  x = Tensor(X)
  with pytest.raises(TypeError, match=r"\.values.*axis="): misuse(x)

def test_values_indices_as_tensor_names_the_fix():
  with pytest.raises(AttributeError, match=r"'exp'.*\.values.*axis="): Tensor(X).max(1).exp()
  with pytest.raises(TypeError, match="not both"): Tensor(X).max(1, axis=1)

def test_max_with_dim_gradient_matches_torch():
  x, r = both(X)
  x.requires_grad, r.requires_grad = True, True
  (x.max(1).values * Tensor(X[:, 0])).sum().backward(); (r.max(1).values * torch.tensor(X[:, 0])).sum().backward()
  same(x.grad, r.grad)

# ***** in-place ops, lazy like assign *****
INPLACE_CASES = [
  lambda x: x.add_(1), lambda x: x.add_(x, alpha=2), lambda x: x.sub_(0.5), lambda x: x.mul_(3).add_(1), lambda x: x.div_(4),
  lambda x: x.zero_(), lambda x: x.fill_(2.5), lambda x: x.clamp_(min=2, max=5), lambda x: x.clamp_(max=1), lambda x: x.abs_().sqrt_(),
  lambda x: x.masked_fill_(x > 3, -1), lambda x: x.exp_(), lambda x: x.neg_(), lambda x: x.pow_(2), lambda x: x.lerp_(x * 0, 0.25),
  lambda x: x.copy_(x.flip(0) * 2), lambda x: x.__setitem__(x > 4, 0.5), lambda x: x.__iadd__(1),
  lambda x: x.scatter_(0, idx(x, [[2, 0, 1, 2]]), x[:1] * 10),
  lambda x: x.index_add_(0, idx(x, [0, 2, 0]), x[:3] * 1), lambda x: x.index_add_(1, idx(x, [3, 3]), x[:, :2], alpha=-1),
]
def idx(x, v):  # an int64 index for whichever library x is from
  return Tensor(v) if isinstance(x, Tensor) else torch.tensor(v)
@pytest.mark.parametrize("op", INPLACE_CASES)
def test_inplace_ops(op):
  x, r = both(arange(3, 4) - 3)
  out, ref = op(x), op(r)
  same(x, r, rtol=1e-6)
  if out is not None: assert out is x and ref is r

def test_inplace_on_view_reaches_base():
  x, r = both(arange(3, 4))
  x[1].mul_(-1); r[1].mul_(-1)
  x[:, 0].zero_(); r[:, 0].zero_()
  same(x, r)

def test_inplace_rules():
  w = Tensor.ones(3, requires_grad=True)
  with pytest.raises(RuntimeError, match="leaf"): w.add_(1)
  i = Tensor([1, 2, 3]).realize()
  with pytest.raises(RuntimeError, match="can't be cast"): i.add_(0.5)
  with pytest.raises(RuntimeError, match="can't be cast"): torch.tensor([1, 2, 3]).add_(0.5)

# ***** autograd context *****
import attograd
@pytest.mark.parametrize("ctx", [attograd.no_grad, attograd.inference_mode])
def test_no_grad_allows_leaf_updates_and_cuts_the_graph(ctx):
  w = Tensor([1., 2., 3.], requires_grad=True)
  with ctx():
    w.mul_(2)
    ema = (w * 0.5).realize()
    assert not attograd.is_grad_enabled()
    with attograd.enable_grad(): assert attograd.is_grad_enabled()
  assert attograd.is_grad_enabled()
  assert w.tolist() == [2., 4., 6.]
  (w * ema).sum().backward()  # ema was computed under no_grad: no gradient flows through it
  assert w.grad.tolist() == [1., 2., 3.]

def test_grad_mode_spellings_as_torch():
  """@no_grad without parentheses, @enable_grad, and set_grad_enabled as a call, a context manager and a decorator."""
  for mod in (torch, attograd):
    @mod.no_grad
    def f(): return mod.is_grad_enabled()
    @mod.enable_grad
    def g(): return mod.is_grad_enabled()
    @mod.set_grad_enabled(False)
    def h(): return mod.is_grad_enabled()
    assert mod.is_grad_enabled() and f() is False and h() is False and mod.is_grad_enabled()
    with mod.no_grad(): assert g() is True and not mod.is_grad_enabled()
    with mod.set_grad_enabled(False): assert not mod.is_grad_enabled()
    assert mod.is_grad_enabled()
    mod.set_grad_enabled(False)
    assert not mod.is_grad_enabled()
    mod.set_grad_enabled(True)

def test_no_grad_decorator_and_requires_grad_detach():
  @attograd.no_grad()
  def f(): return attograd.is_grad_enabled()
  assert f() is False and attograd.is_grad_enabled()
  x = Tensor([1., 2.]).requires_grad_()
  assert x.requires_grad
  y = (x * 3)
  y.detach_()
  (y * 2 + x).sum().backward()
  assert x.grad.tolist() == [1., 1.]  # nothing flows through the detached y

@pytest.mark.parametrize("f", [lambda x: x.sort(1), lambda x: x.sort(dim=0, descending=True, stable=True), lambda x: x.topk(2),
                               lambda x: x.topk(2, dim=0, largest=False), lambda x: x.median(1), lambda x: x.cummax(1), lambda x: x.cummin(0)])
def test_value_index_pairs_have_values_and_indices(f):
  """torch.return_types: code reads x.topk(k).indices, x.sort(1).values."""
  x, r = both(np.array([[3., 1., 2., 1.5], [0., 5., -1., 4.], [2.5, 2., 7., 0.5]], np.float32))  # no ties: which one topk picks differs
  out, ref = f(x), f(r)
  same(out.values, ref.values); same(out.indices, ref.indices)
  v, i = out
  assert v is out.values and i is out.indices

# ***** methods PyTorch users reach for *****
MORE_METHODS = [  # (name, f(x, other, module)) on x of shape (2, 3, 4) with NaN/inf, other a positive (2, 3, 4) tensor
  ("mm", lambda x, o, m: x[0].mm(o[0].transpose(0, 1))), ("mv", lambda x, o, m: o[0].mv(o[1][0])),
  ("addcmul", lambda x, o, m: o.addcmul(o, o * 2, value=0.5)), ("addcdiv", lambda x, o, m: o.addcdiv(o, o + 1, value=-2)),
  ("clamp_min", lambda x, o, m: o.clamp_min(0.5)), ("clamp_max", lambda x, o, m: o.clamp_max(0.5)),
  ("remainder", lambda x, o, m: (o * 7 - 3).remainder(2)), ("view_as", lambda x, o, m: o.view_as(o.reshape(6, 4))),
  ("reshape_as", lambda x, o, m: o.reshape_as(o.transpose(0, 2))), ("expand_as", lambda x, o, m: o[:, :1].expand_as(o)),
  ("ravel", lambda x, o, m: o.ravel()), ("swapaxes", lambda x, o, m: o.swapaxes(0, 2)), ("swapdims", lambda x, o, m: o.swapdims(-1, 1)),
  ("movedim", lambda x, o, m: o.movedim(0, -1)), ("movedim-seq", lambda x, o, m: o.movedim((0, 1), (2, 0))), ("moveaxis", lambda x, o, m: o.moveaxis(2, 0)),
  ("narrow", lambda x, o, m: o.narrow(2, 1, 2)), ("narrow-neg", lambda x, o, m: o.narrow(-1, -3, 2)),
  ("unbind", lambda x, o, m: m.stack(o.unbind(1), 0)), ("cat-list-dim", lambda x, o, m: m.cat([o, o * 2], 1)),
  ("cat-tuple-neg-dim", lambda x, o, m: m.cat((o, o), -1)), ("stack-list-dim", lambda x, o, m: m.stack([o, o + 1], 2)), ("tile", lambda x, o, m: o[0].tile((2, 1, 2))), ("tile-short", lambda x, o, m: o.tile(2)),
  ("count_nonzero", lambda x, o, m: (o > 1).float().count_nonzero(dim=1)), ("nan_to_num", lambda x, o, m: x.nan_to_num()),
  ("nan_to_num-args", lambda x, o, m: x.nan_to_num(nan=1.5, posinf=9.0, neginf=-9.0)),
]
@pytest.mark.parametrize("name,f", MORE_METHODS, ids=[n for n, _ in MORE_METHODS])
def test_more_torch_methods(name, f):
  a = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
  a[0, 0, :3] = [np.nan, np.inf, -np.inf]
  o = np.abs(a[::-1].copy()) + 0.5
  o[~np.isfinite(o)] = 1.0
  (x, r), (ox, orr) = both(a), both(o)
  same(f(x, ox, Tensor), f(r, orr, torch), rtol=1e-5, atol=1e-6)

def test_more_torch_methods_in_place_predicates_and_errors():
  (x, r) = both(arange(3, 4))
  x.addcmul_(x, x, value=0.1).clamp_min_(1.0).addcdiv_(x, x + 1); r.addcmul_(r, r, value=0.1).clamp_min_(1.0).addcdiv_(r, r + 1)
  same(x, r, rtol=1e-6)
  assert x.is_floating_point() and not Tensor([1]).is_floating_point() and Tensor([1, 2]).equal(Tensor([1, 2])) and not Tensor([1, 2]).equal(Tensor([1, 3]))
  w = Tensor([1., 2.], requires_grad=True)
  assert w.is_leaf and not (w * 2).is_leaf and Tensor([1.]).is_leaf and (Tensor([1.]) * 2).is_leaf and (w * 2).detach().is_leaf
  with pytest.raises(IndexError): x.narrow(1, 3, 2)
  with pytest.raises(RuntimeError): x.mm(x)

def test_methods_against_torch():
  x, r = both(arange(2, 3) - 2)
  assert x.dim() == r.dim() == 2 and x.type() == r.type() == "torch.FloatTensor"
  same(x.mT, r.mT); same(x.cpu(), r.cpu()); same(x.type_as(Tensor([1])), r.type_as(torch.tensor([1])))
  assert x.bfloat16().dtype == dtypes.bfloat16 and x.to(dtypes.float16).dtype == dtypes.float16
  assert x.to("CPU", dtypes.float64).dtype == dtypes.float64 and x.to(Tensor([1])).dtype == dtypes.int64
  assert x.is_contiguous() and not x.T.is_contiguous() and x.T.contiguous().is_contiguous()
  same(x.new_zeros(2, 2), r.new_zeros(2, 2)); same(x.new_ones((3,)), r.new_ones((3,))); same(x.new_full((2,), 7.), r.new_full((2,), 7.))
  same(x.new_tensor([1, 2]), r.new_tensor([1, 2]))
  assert x.allclose(x + 1e-9) and not x.allclose(x + 1e-3) and r.allclose(r + 1e-9)
  same(x.isclose(x * 1.00001), r.isclose(r * 1.00001))
  for p in ("fro", 1, 3, float("inf"), -float("inf"), 0):
    same(x.norm(p), r.norm(p), rtol=1e-5); same(x.norm(p, dim=1, keepdim=True), r.norm(p, dim=1, keepdim=True), rtol=1e-5)
  same((x > 0).nonzero(), (r > 0).nonzero())
  same(Tensor.stack(x, x).bmm(Tensor.stack(x.T, x.T)), torch.stack([r, r]).bmm(torch.stack([r.T, r.T])))
  same(x[0].outer(x[1]), r[0].outer(r[1]))
  same(x.index_select(1, Tensor([2, 0, 2])), r.index_select(1, torch.tensor([2, 0, 2])))
  same(x.amax(1), r.amax(1)); same(x.amin(dim=0, keepdim=True), r.amin(dim=0, keepdim=True))
  same(Tensor.from_numpy(np.ones(3)), torch.from_numpy(np.ones(3)))
  v = Tensor.randint(3, 7, (200,))
  assert v.shape == (200,) and v.dtype == dtypes.int64 and set(v.tolist()) == {3, 4, 5, 6}
  assert set(Tensor.randint(5, size=(300,)).tolist()) == set(range(5)) and Tensor.randint(2, 3, high=4).shape == (2, 3)

# ***** 0-d tensors and indexing with Python sequences *****
ZERO_D = [lambda t: t.sum(0), lambda t: t.sum(-1), lambda t: t.sum(dim=0, keepdim=True), lambda t: t.log_softmax(0),
          lambda t: t.logsumexp(0), lambda t: t.softmax(-1), lambda t: t.mean(0), lambda t: t.amax(0), lambda t: t.argmax(0),
          lambda t: t.cumsum(0), lambda t: t.prod(-1)]
@pytest.mark.parametrize("op", ZERO_D)
def test_zero_d_reductions(op):
  same(op(Tensor(3.0)), op(torch.tensor(3.0)))

@pytest.mark.parametrize("op", [lambda t: t.sum(1), lambda t: t.sum(-2), lambda t: t.log_softmax(1), lambda t: t.logsumexp(2), lambda t: t.mean(dim=1)])
def test_zero_d_axis_out_of_range_raises_at_the_call(op):
  with pytest.raises(IndexError): op(torch.tensor(3.0))
  with pytest.raises(IndexError): op(Tensor(3.0))

def test_cat_of_zero_d_raises_like_torch():
  with pytest.raises(RuntimeError, match="zero-dim"): torch.cat([torch.tensor(1.), torch.tensor(2.)])
  with pytest.raises(RuntimeError, match="zero-dim"): Tensor.cat(Tensor(1.), Tensor(2.))

@pytest.mark.parametrize("index", [([0, 1], [1, 2]), ((0,), Ellipsis), ((0, 2),), (0, [1, 3]), ([2, 0], slice(1, 3)), ((1, 2), (0, 3))])
def test_index_with_python_sequences(index):
  x, r = both(arange(3, 4))
  same(x[index], r[index])
  x[index] = -1.0; r[index] = -1.0
  same(x, r)

# ***** errors are also RuntimeErrors, as torch's, raised at the call *****
@pytest.mark.parametrize("bad", [lambda T: T([1., 2.]) + T([1., 2., 3.]), lambda T: T([[1., 2.]]).reshape(3),
                                 lambda T: T([[1., 2.]]) @ T([[1., 2.]]), lambda T: T([1., 2.]).expand(3, 3)])
def test_shape_errors_are_runtime_errors(bad):
  with pytest.raises(RuntimeError): bad(torch.tensor)
  with pytest.raises(RuntimeError): bad(Tensor)
  with pytest.raises(ValueError): bad(Tensor)  # tinygrad's convention keeps working

# ***** small ops of issue 16, each against torch *****
SPECIAL = np.array([[0., -0., 1., -1., 2.5, -3.5], [np.inf, -np.inf, np.nan, 7., -7., 1e30]], np.float32)
SMALL_OPS = [
  ("copysign", lambda t, T: t.copysign(T(-SPECIAL))), ("copysign_scalar", lambda t, T: t.copysign(-2.0)),
  ("fmod", lambda t, T: t.fmod(2.0)), ("fmod_neg", lambda t, T: t.fmod(-1.5)),
  ("isfinite", lambda t, T: t.isfinite()), ("isinf_pos", lambda t, T: t.isinf(detect_positive=True, detect_negative=False) if isinstance(t, Tensor) else t.isposinf()),
  ("isinf_neg", lambda t, T: t.isinf(detect_positive=False, detect_negative=True) if isinstance(t, Tensor) else t.isneginf()),
  ("logaddexp", lambda t, T: t.logaddexp(T(SPECIAL[::-1].copy()))), ("softmin", lambda t, T: t[:1].softmin(dim=-1) if isinstance(t, Tensor) else torch.nn.functional.softmin(t[:1], dim=-1)),
  ("diagonal", lambda t, T: t.diagonal()), ("diagonal_off", lambda t, T: t.diagonal(2)), ("diagonal_neg", lambda t, T: t.diagonal(-1)),
  ("diag", lambda t, T: t.diag(1)), ("diag_vec", lambda t, T: t[0].diag(-2)), ("masked_select", lambda t, T: t.masked_select(T(SPECIAL > 0))),
  ("unfold", lambda t, T: t.unfold(1, 2, 2)), ("unfold_dim0", lambda t, T: t.unfold(0, 1, 1)),
]
@pytest.mark.parametrize("name,f", SMALL_OPS, ids=[n for n, _ in SMALL_OPS])
def test_small_ops_match_torch(name, f):
  out, ref = f(Tensor(SPECIAL), Tensor), f(torch.tensor(SPECIAL), torch.tensor)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6, atol=1e-6, equal_nan=True)
  assert out.shape == tuple(ref.shape)

def test_small_op_gradients_match_torch():
  a = np.random.default_rng(3).standard_normal((4, 5)).astype(np.float32)
  for f in (lambda t: t.diagonal(1), lambda t: t.logaddexp(t * 2), lambda t: t.fmod(0.7), lambda t: t.unfold(1, 3, 1)):
    x, r = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    f(x).sum().backward(); f(r).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-6)

def test_int_fmod_and_scatter_reduce_names():
  a = np.array([-7, -3, 0, 3, 7], np.int32)
  assert Tensor(a).fmod(3).tolist() == torch.tensor(a).fmod(3).tolist()
  idx = np.array([[0, 1, 0], [2, 0, 1]])
  for red in ("add", "multiply"):
    base, src = np.arange(1., 10.).reshape(3, 3).astype(np.float32), np.full((2, 3), 2., np.float32)
    out = Tensor(base).scatter(0, Tensor(idx), Tensor(src), reduce=red)
    ref = torch.tensor(base).scatter(0, torch.tensor(idx), torch.tensor(src), reduce=red)
    np.testing.assert_allclose(out.numpy(), ref.numpy())
  with pytest.raises(ValueError, match="reduce"): Tensor(base).scatter(0, Tensor(idx), Tensor(src), reduce="max")

def test_reshape_none_keeps_size():
  x = Tensor.ones(2, 3, 4)
  assert x.reshape(2, None, 4).shape == (2, 3, 4)
  assert x.reshape(None, None, -1).shape == (2, 3, 4) and x.reshape((None, 4, 3)).shape == (2, 4, 3)
  with pytest.raises(ValueError, match="None keeps"): x.reshape(None, -1)

def test_sdpa_gqa_and_bce_pos_weight():
  rng = np.random.default_rng(4)
  q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 4, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)))
  out = Tensor(q).scaled_dot_product_attention(Tensor(k), Tensor(v), enable_gqa=True)
  ref = torch.nn.functional.scaled_dot_product_attention(*map(torch.tensor, (q, k, v)), enable_gqa=True)
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
  x, y, pw = rng.standard_normal((3, 4)).astype(np.float32), (rng.random((3, 4)) > 0.5).astype(np.float32), np.array([0.5, 1, 2, 3], np.float32)
  out = Tensor(x).binary_crossentropy_logits(Tensor(y), pos_weight=Tensor(pw))
  ref = torch.nn.functional.binary_cross_entropy_with_logits(torch.tensor(x), torch.tensor(y), pos_weight=torch.tensor(pw))
  np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-5)

# ***** max_pool(return_indices=True) and max_unpool *****
POOL_CASES = [((2, 3, 6, 7), dict(kernel_size=2)), ((1, 2, 7, 7), dict(kernel_size=3, stride=2, padding=1)),
              ((1, 1, 9, 8), dict(kernel_size=(3, 2), stride=(2, 3), dilation=(2, 1), ceil_mode=True))]
@pytest.mark.parametrize("shape,kw", POOL_CASES, ids=str)
def test_max_pool2d_return_indices_matches_torch(shape, kw):
  import attograd.nn.functional as F
  a = np.random.default_rng(5).integers(-3, 3, shape).astype(np.float32)  # small ints: many ties, torch takes the first
  v, i = F.max_pool2d(Tensor(a), return_indices=True, **kw)
  rv, ri = torch.nn.functional.max_pool2d(torch.tensor(a), return_indices=True, **kw)
  same(v, rv); same(i, ri); assert i.dtype == dtypes.int64
  if "dilation" not in kw:
    args = (kw["kernel_size"], kw.get("stride"), kw.get("padding", 0))
    same(F.max_unpool2d(v, i, *args, output_size=a.shape[-2:]), torch.nn.functional.max_unpool2d(rv, ri, *args, output_size=a.shape[-2:]))

def test_max_pool_indices_other_ranks_module_and_gradient():
  import attograd.nn.functional as F
  from attograd import nn
  rng = np.random.default_rng(6)
  a1, a3 = rng.standard_normal((2, 3, 9)).astype(np.float32), rng.standard_normal((1, 2, 4, 5, 6)).astype(np.float32)
  for f, tf, a in ((F.max_pool1d, torch.nn.functional.max_pool1d, a1), (F.max_pool3d, torch.nn.functional.max_pool3d, a3)):
    v, i = f(Tensor(a), 2, return_indices=True); rv, ri = tf(torch.tensor(a), 2, return_indices=True)
    same(v, rv); same(i, ri)
  v, i = F.max_pool1d(Tensor(a1), 2, return_indices=True)
  same(F.max_unpool1d(v, i, 2, output_size=(9,)), torch.nn.functional.max_unpool1d(*torch.nn.functional.max_pool1d(torch.tensor(a1), 2, return_indices=True), 2, output_size=(9,)))
  a = rng.standard_normal((2, 2, 6, 6)).astype(np.float32)
  out = nn.MaxPool2d(2, return_indices=True)(Tensor(a))
  ref = torch.nn.MaxPool2d(2, return_indices=True)(torch.tensor(a))
  same(out[0], ref[0]); same(out[1], ref[1])
  x, r = Tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
  w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
  (F.max_pool2d(x, 2, return_indices=True)[0] * Tensor(w)).sum().backward()
  (torch.nn.functional.max_pool2d(r, 2, return_indices=True)[0] * torch.tensor(w)).sum().backward()
  same(x.grad, r.grad)
  with pytest.raises(ValueError, match="indices"): F.max_unpool2d(Tensor(a), Tensor.zeros(1, 2, dtype=dtypes.int64), 2)

# ***** interpolate: 5-D, nearest-exact, integer inputs, tinygrad's 'linear' on any rank *****
INTERP_CASES = [((1, 2, 3, 4, 5), dict(scale_factor=2, mode="nearest")), ((1, 2, 3, 4, 5), dict(size=(5, 3, 7), mode="trilinear")),
                ((1, 2, 3, 4, 5), dict(size=(2, 6, 4), mode="trilinear", align_corners=True)), ((2, 1, 5, 7), dict(size=(8, 3), mode="nearest-exact")),
                ((2, 3, 11), dict(scale_factor=1.7, mode="nearest-exact")), ((1, 1, 4, 6), dict(size=(9, 5), mode="nearest"))]
@pytest.mark.parametrize("shape,kw", INTERP_CASES, ids=str)
def test_interpolate_more_modes_match_torch(shape, kw):
  import attograd.nn.functional as F
  a = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
  np.testing.assert_allclose(F.interpolate(Tensor(a), **kw).numpy(), torch.nn.functional.interpolate(torch.tensor(a), **kw).numpy(), rtol=1e-5, atol=1e-6)

def test_interpolate_linear_any_rank_and_ints():
  import attograd.nn.functional as F
  a = np.random.default_rng(8).standard_normal((1, 2, 3, 4)).astype(np.float32)
  for nd, torch_mode in ((4, "bilinear"), (5, "trilinear")):  # tinygrad's mode="linear" on 4-D / 5-D is torch's bi/trilinear
    x = a if nd == 4 else a[..., None].repeat(2, -1)
    ref = torch.nn.functional.interpolate(torch.tensor(x), scale_factor=2, mode=torch_mode)
    np.testing.assert_allclose(Tensor(x).interpolate(scale_factor=2, mode="linear").numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
  ints = np.random.default_rng(9).integers(0, 255, (1, 2, 4, 5)).astype(np.uint8)
  for mode in ("nearest", "nearest-exact"):
    out = F.interpolate(Tensor(ints), size=(7, 3), mode=mode)
    assert out.dtype == dtypes.uint8
    np.testing.assert_array_equal(out.numpy(), torch.nn.functional.interpolate(torch.tensor(ints), size=(7, 3), mode=mode).numpy())
  big = np.array([[[2 ** 30 + 1, -(2 ** 30) - 3]]], np.int32)  # exact: nearest is a gather, not a float matmul
  assert F.interpolate(Tensor(big), scale_factor=2).tolist() == [[[2 ** 30 + 1] * 2 + [-(2 ** 30) - 3] * 2]]
  with pytest.raises(ValueError, match="bilinear"): F.interpolate(Tensor(a[0]), scale_factor=2, mode="bilinear")

def test_nn_datasets_is_an_attribute():
  from attograd import nn
  assert callable(nn.datasets.mnist)  # tinygrad's spelling after `from tinygrad import nn`

def test_jit_of_a_fresh_layer_matches_eager():
  """A never-realized parameter (a lazy rand().contiguous()) used to stay lazy after use: TinyJit captured its rand
  kernel and each replay re-drew the weights, a silent wrong answer. Parameters now realize with the next realize."""
  from attograd import nn
  Tensor.manual_seed(0)
  layer = nn.Linear(3, 2)
  eager = [layer(Tensor.ones(1, 3) * i).tolist() for i in range(4)]
  jitted = TinyJit(lambda x: layer(x).realize())
  assert [jitted(Tensor.ones(1, 3) * i).tolist() for i in range(4)] == eager

# ***** shifts: torch's integer semantics (negative and too-wide amounts), floats refused with torch's exception type *****
_SHIFT_DTYPES = [(dtypes.int8, torch.int8), (dtypes.uint8, torch.uint8), (dtypes.int16, torch.int16), (dtypes.int32, torch.int32),
                 (dtypes.int64, torch.int64)]
@pytest.mark.parametrize("dt,tdt", _SHIFT_DTYPES)
def test_integer_shifts_match_torch(dt, tdt):
  vals = [1, 3, 100, 127, 0] if dt == dtypes.uint8 else [1, -3, 100, -128, 0]
  amounts = [-1, 0, 7, 8, 70]
  x, s = Tensor(vals, dtype=dt), Tensor(amounts, dtype=dt)
  tx, ts = torch.tensor(vals, dtype=tdt), torch.tensor(amounts, dtype=tdt)
  for f in (lambda a, b: a << b, lambda a, b: a >> b, lambda a, b: a << 3, lambda a, b: a >> 9, lambda a, b: 5 << b,
            lambda a, b: 64 >> b, lambda a, b: a.bitwise_left_shift(b), lambda a, b: a.bitwise_right_shift(b)):
    ours, theirs = f(x, s), f(tx, ts)
    assert ours.tolist() == theirs.tolist() and ours.dtype.name == str(theirs.dtype).split(".")[1], (ours.tolist(), theirs.tolist())
  y, ty = Tensor(vals, dtype=dt), torch.tensor(vals, dtype=tdt)
  y <<= 2; ty <<= 2
  y.bitwise_right_shift_(1); ty.bitwise_right_shift_(1)
  assert y.tolist() == ty.tolist()
  assert (Tensor([True, False]) << 1).tolist() == (torch.tensor([True, False]) << 1).tolist()

@pytest.mark.parametrize("f", [lambda m: m.tensor([1.5, -2.0]) << 1, lambda m: m.tensor([1.5]) >> m.tensor([1]),
                               lambda m: m.tensor([1, 2]) << 1.5, lambda m: m.tensor([2.0]) & 1, lambda m: 1 << m.tensor([1.0])])
def test_float_shifts_raise_torch_exception_type(f):
  class T:  # attograd's spelling of torch.tensor
    tensor = staticmethod(lambda v: Tensor(v))
  with pytest.raises(NotImplementedError): f(torch)
  with pytest.raises(NotImplementedError, match="not implemented for"): f(T)
  with pytest.raises(TypeError): f(T)  # tinygrad-style code catching TypeError keeps working

def test_torch_dtypes_by_name():
  # torch's dtype objects where a dtype is taken (sum(dtype=torch.float64), prod(dtype=torch.long), cast, the constructor)
  x = Tensor([1.5, 2.0])
  assert x.sum(dtype=torch.float64).dtype == dtypes.float64 and x.prod(dtype=torch.long).dtype == dtypes.int64
  assert x.sum(dtype=torch.float64).item() == torch.tensor([1.5, 2.0]).sum(dtype=torch.float64).item()
  assert x.cast(torch.half).dtype == dtypes.float16 and Tensor([1, 2], dtype=torch.int16).dtype == dtypes.int16
  with pytest.raises(TypeError, match="unknown dtype"): x.cast(torch.complex64)


def test_data_and_detach_share_values_as_torch():
  """x.data and x.detach() are views without the graph: in-place writes to them reach x (init code, manual updates),
  and tinygrad's x.data() memoryview keeps working."""
  for mod, make in ((torch, lambda v: torch.tensor(v, requires_grad=True)), (None, lambda v: Tensor(v, requires_grad=True))):
    p = make([1., 2., 3.])
    p.data.mul_(2)
    p.detach().add_(1)
    p.data.copy_(p.data * 10) if mod is None else p.data.copy_(p.data * 10)
    assert p.tolist() == [30., 50., 70.] and p.requires_grad
    (p * p).sum().backward()
    p.grad.data.zero_()
    assert p.grad.tolist() == [0., 0., 0.]
  assert bytes(Tensor([1., 2.]).data()) == np.array([1., 2.], np.float32).tobytes()
  w = Tensor.zeros(200, 100).contiguous().realize()
  w.data.normal_(0.5, 0.02)
  assert abs(w.numpy().mean() - 0.5) < 0.01 and abs(w.numpy().std() - 0.02) < 0.002
  w[0].data.uniform_(-1, 1)
  assert w.numpy()[0].min() >= -1 and w.numpy()[0].max() <= 1 and abs(w.numpy()[0].mean()) < 0.2 and abs(w.numpy()[1].mean() - 0.5) < 0.01
  w.bernoulli_(0.25)
  assert set(np.unique(w.numpy())) <= {0., 1.} and abs(w.numpy().mean() - 0.25) < 0.02
  with pytest.raises(RuntimeError): Tensor([1., 2.], requires_grad=True).normal_()  # a leaf requiring grad, outside no_grad


def test_requires_grad_of_computed_tensors():
  """torch code checks y.requires_grad on results: True when it depends on a tensor requiring grad; a leaf never set
  stays None (tinygrad), which reads as False."""
  w, c = Tensor([1., 2.], requires_grad=True), Tensor([3., 4.])
  tw = torch.tensor([1., 2.], requires_grad=True)
  y, ty = (w * c).sum(), (tw * torch.tensor([3., 4.])).sum()
  assert y.requires_grad is ty.requires_grad is True and (w[0] + 1).requires_grad and w.T.requires_grad
  assert not (c * 2).requires_grad and c.requires_grad is None and w.detach().requires_grad is not True
  y.item()  # realized: still connected, and backward still works
  assert y.requires_grad
  y.backward()
  assert w.grad.tolist() == [3., 4.]
  with attograd.no_grad():
    z = (w * 2).realize()  # realized under no_grad: it forgot its graph
  assert not z.requires_grad

@pytest.mark.parametrize("make", [lambda T: T(object()), lambda T: T([1.0, 2.0]).gather(0, T([0.0, 1.0]))], ids=["object", "float_index"])
def test_what_no_dtype_takes_raises_torchs_type(make):
  # torch raises RuntimeError here (code written against it catches that); Python's convention, a TypeError, works too
  with pytest.raises(RuntimeError): make(torch.tensor)
  with pytest.raises(RuntimeError): make(Tensor)
  with pytest.raises(TypeError): make(Tensor)
