"""nn layers and nn functional ops against torch: forward values and the gradients of the input and of
every parameter, parameter layout (state dicts port both ways) and default initialization."""
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from attograd import Tensor, dtypes
from attograd import nn
from attograd.nn.state import get_state_dict, load_state_dict

@pytest.fixture(autouse=True)
def _seed():  # torch's init and attograd's RNG draw the same numbers whatever order xdist runs the tests in
  torch.manual_seed(0)
  Tensor.manual_seed(0)

def _np(t: torch.Tensor) -> np.ndarray: return t.detach().numpy().copy()

def _port(layer, mod, names=("weight", "bias")) -> list[str]:
  """Copy the torch module's parameters into the attograd layer; the names it has."""
  names = [n for n in names if getattr(mod, n, None) is not None]
  for n in names: setattr(layer, n, Tensor(_np(getattr(mod, n)), requires_grad=True))
  return names

def _close(pairs, atol, rtol) -> None:
  Tensor.realize_all([a for _, a, _ in pairs])  # one schedule for everything, as a training step would
  for what, a, t in pairs:
    assert a is not None, f"{what}: no gradient"
    assert a.shape == tuple(t.shape), f"{what}: shape {a.shape} != torch's {tuple(t.shape)}"
    np.testing.assert_allclose(a.numpy(), _np(t), atol=atol, rtol=rtol, err_msg=what)

def _check(layer, mod, x: np.ndarray, atol=1e-5, rtol=1e-4, names=("weight", "bias"), port=True, seed=1) -> None:
  """Same output, and the same gradients of a randomly weighted sum of it for the input and parameters."""
  names = _port(layer, mod, names) if port else [n for n in names if getattr(mod, n, None) is not None]
  grad_x = np.issubdtype(x.dtype, np.floating)
  xa, xt = Tensor(x, requires_grad=grad_x), torch.tensor(x, requires_grad=grad_x)
  out, ref = layer(xa), mod(xt)
  w = np.random.default_rng(seed).standard_normal(ref.shape).astype(np.float32)
  (out * Tensor(w)).sum().backward()
  (ref * torch.tensor(w)).sum().backward()
  _close([("output", out, ref)] + ([("input grad", xa.grad, xt.grad)] if grad_x else []) +
         [(f"{n} grad", getattr(layer, n).grad, getattr(mod, n).grad) for n in names], atol, rtol)

def _rand(*shape, seed=0, scale=1.0) -> np.ndarray: return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)

# ***** linear and convolutions *****

@pytest.mark.parametrize("shape,bias", [((5, 7), True), ((2, 3, 7), False), ((7,), True)])
def test_linear(shape, bias): _check(nn.Linear(7, 6, bias=bias), torch.nn.Linear(7, 6, bias=bias), _rand(*shape))

CONV2D = [  # (in, out, kernel, kwargs, input H, W)
  (3, 4, 3, {}, (8, 8)),
  (2, 3, (3, 2), dict(stride=(2, 1), padding=(1, 2)), (7, 6)),
  (2, 3, (3, 4), dict(padding="same", dilation=(2, 1)), (6, 7)),  # even kernel: torch pads one more on the right
  (2, 3, 3, dict(padding="valid", dilation=(2, 1), stride=(1, 2)), (9, 8)),
  (4, 6, 3, dict(groups=2, padding=1, stride=2), (6, 7)),
  (4, 4, 3, dict(groups=4, bias=False), (5, 5)),  # depthwise
]
@pytest.mark.filterwarnings("ignore:Using padding='same'")  # torch's note that it pads a copy
@pytest.mark.parametrize("cin,cout,k,kw,hw", CONV2D)
def test_conv2d(cin, cout, k, kw, hw):
  _check(nn.Conv2d(cin, cout, k, **kw), torch.nn.Conv2d(cin, cout, k, **kw), _rand(2, cin, *hw))

@pytest.mark.parametrize("cin,cout,k,kw", [
  (3, 4, 3, dict(stride=2, padding=2)), (4, 6, 4, dict(padding="same", dilation=2, groups=2, bias=False)),
])
def test_conv1d(cin, cout, k, kw): _check(nn.Conv1d(cin, cout, k, **kw), torch.nn.Conv1d(cin, cout, k, **kw), _rand(2, cin, 11))

CONV_T = [
  (3, 2, 3, dict(stride=2), (4, 5)),
  (2, 3, (3, 2), dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2)), (3, 4)),
  (2, 2, 3, dict(dilation=2, padding=1, output_padding=1, stride=2), (4, 3)),
  (4, 6, (2, 3), dict(groups=2, stride=(1, 2), padding=(0, 2), bias=False), (3, 4)),
  # strided ones run as one conv per output phase, interleaved (Tensor._conv_transpose_phases): PP-OCR det's 2x2 stride
  # 2, kernels that the stride doesn't divide (taps padded with zeros), groups, output padding past the last input
  (4, 6, 2, dict(stride=2), (7, 5)),
  (4, 6, 5, dict(stride=3, padding=2, output_padding=2), (4, 3)),
  (4, 6, 4, dict(stride=2, padding=1, groups=2), (5, 4)),
  (3, 2, 1, dict(stride=2, output_padding=1), (3, 4)),
]
@pytest.mark.parametrize("cin,cout,k,kw,hw", CONV_T)
def test_conv_transpose2d(cin, cout, k, kw, hw):
  _check(nn.ConvTranspose2d(cin, cout, k, **kw), torch.nn.ConvTranspose2d(cin, cout, k, **kw), _rand(2, cin, *hw))

# ***** normalization *****

@pytest.mark.parametrize("shape,kw", [((8, 3, 4, 5), {}), ((6, 4), dict(momentum=0.3, eps=1e-3)), ((5, 3, 7), dict(affine=False)),
                                      ((6, 3, 2), dict(momentum=None))])
def test_batchnorm_train_then_eval(shape, kw):
  """Two training steps (batch statistics, running stats updated with the unbiased variance), then eval
  mode, which normalizes with the running statistics. The 3-D case leaves the first update pending
  (nothing reads it) under the second."""
  c, read_between = shape[1], len(shape) != 3
  ours, mod = nn.BatchNorm2d(c, **kw), torch.nn.BatchNorm2d(c, **kw) if len(shape) == 4 else torch.nn.BatchNorm1d(c, **kw)
  names = _port(ours, mod)
  for step in range(2):
    x = _rand(*shape, seed=step, scale=2.0) + step + np.arange(c, dtype=np.float32).reshape(1, c, *(1,) * (len(shape) - 2))
    mod.train()
    with Tensor.train():
      _check(ours, mod, x, port=False, names=names, seed=10 + step)
    for n in names: getattr(ours, n).grad, getattr(mod, n).grad = None, None
    if step == 0 and not read_between: continue
    np.testing.assert_allclose(ours.running_mean.numpy(), _np(mod.running_mean), atol=1e-6, rtol=1e-5)
    np.testing.assert_allclose(ours.running_var.numpy(), _np(mod.running_var), atol=1e-6, rtol=1e-5)
    assert ours.num_batches_tracked.dtype == dtypes.int64 and ours.num_batches_tracked.numpy() == step + 1 == mod.num_batches_tracked.item()
  mod.eval()
  assert not Tensor.training
  _check(ours, mod, _rand(*shape, seed=5), port=False, names=names)
  # eval doesn't touch the running statistics
  np.testing.assert_allclose(ours.running_mean.numpy(), _np(mod.running_mean), atol=1e-6, rtol=1e-5)
  assert ours.num_batches_tracked.numpy() == 2

def test_batchnorm_without_running_stats_uses_batch_stats_in_eval():
  ours, mod = nn.BatchNorm2d(3, track_running_stats=False), torch.nn.BatchNorm2d(3, track_running_stats=False).eval()
  _check(ours, mod, _rand(4, 3, 3, 3) * 3 + 1)

@pytest.mark.parametrize("shape,norm,kw", [((2, 3, 4, 5), (4, 5), {}), ((3, 5, 8), 8, dict(elementwise_affine=False, eps=1e-3))])
def test_layernorm(shape, norm, kw):
  mod = torch.nn.LayerNorm(norm, **kw)
  with torch.no_grad():  # non-trivial affine parameters
    if mod.weight is not None: mod.weight.uniform_(0.5, 1.5); mod.bias.uniform_(-1, 1)
  _check(nn.LayerNorm(norm, **kw), mod, _rand(*shape) * 2 + 1)

@pytest.mark.parametrize("groups,shape,kw", [(2, (2, 6, 4, 4), {}), (3, (3, 6, 5), dict(affine=False, eps=1e-3))])
def test_groupnorm(groups, shape, kw):
  mod = torch.nn.GroupNorm(groups, shape[1], **kw)
  with torch.no_grad():
    if mod.weight is not None: mod.weight.uniform_(0.5, 1.5); mod.bias.uniform_(-1, 1)
  _check(nn.GroupNorm(groups, shape[1], **kw), mod, _rand(*shape) * 2 + 1)

@pytest.mark.parametrize("shape,norm,kw,scale", [((2, 3, 8), 8, dict(eps=1e-5), 1.0), ((2, 4, 3), (4, 3), dict(elementwise_affine=False), 1.0),
                                                 ((3, 8), 8, {}, 1e-3)])  # tiny inputs: torch's default eps (float32's machine eps) shows
def test_rmsnorm(shape, norm, kw, scale):
  mod = torch.nn.RMSNorm(norm, **kw)
  with torch.no_grad():
    if mod.weight is not None: mod.weight.uniform_(0.5, 1.5)
  _check(nn.RMSNorm(norm, **kw), mod, _rand(*shape, scale=scale), atol=1e-5 * scale, names=("weight",))

def test_embedding():
  mod = torch.nn.Embedding(10, 5)
  idx = np.array([[1, 3, 3, 9], [0, 3, 7, 1]], dtype=np.int64)  # repeated rows accumulate their gradients
  _check(nn.Embedding(10, 5), mod, idx, names=("weight",))
  assert nn.Embedding(10, 5)(Tensor(idx.astype(np.int32))).shape == (2, 4, 5)
  with pytest.raises(TypeError): nn.Embedding(10, 5)(Tensor([1.0]))

# ***** parameter layout and default init *****

LAYOUTS = {  # name: (attograd layer, torch module)
  "linear": (lambda: nn.Linear(40, 30), lambda: torch.nn.Linear(40, 30)),
  "conv2d": (lambda: nn.Conv2d(8, 12, (3, 2), groups=2), lambda: torch.nn.Conv2d(8, 12, (3, 2), groups=2)),
  "conv1d": (lambda: nn.Conv1d(6, 10, 5), lambda: torch.nn.Conv1d(6, 10, 5)),
  "conv_transpose2d": (lambda: nn.ConvTranspose2d(6, 8, 3, groups=2), lambda: torch.nn.ConvTranspose2d(6, 8, 3, groups=2)),
  "batchnorm": (lambda: nn.BatchNorm2d(7), lambda: torch.nn.BatchNorm2d(7)),
  "layernorm": (lambda: nn.LayerNorm((3, 4)), lambda: torch.nn.LayerNorm((3, 4))),
  "groupnorm": (lambda: nn.GroupNorm(2, 6), lambda: torch.nn.GroupNorm(2, 6)),
  "rmsnorm": (lambda: nn.RMSNorm(9), lambda: torch.nn.RMSNorm(9)),
  "embedding": (lambda: nn.Embedding(50, 20), lambda: torch.nn.Embedding(50, 20)),
}
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_state_dict_layout_matches_torch(name):
  """Same names, shapes and dtypes as torch's state dict, loading one works, and the init distribution
  matches: uniform layers stay inside torch's bound and fill it, constant ones equal torch's constants."""
  make, make_t = LAYOUTS[name]
  ours, mod = make(), make_t()
  sd, sd_t = get_state_dict(ours), mod.state_dict()
  assert {k: (v.shape, v.dtype) for k, v in sd.items()} == {k: (tuple(v.shape), {torch.float32: dtypes.float32, torch.int64: dtypes.int64}[v.dtype])
                                                            for k, v in sd_t.items()}
  for k, t in sd_t.items():
    v, ref = sd[k].numpy(), _np(t)
    if name == "embedding": assert abs(v.mean()) < 0.1 and abs(v.std() - 1) < 0.1, "torch inits embeddings from N(0, 1)"
    elif k in ("weight", "bias") and name.startswith(("linear", "conv")):
      # torch's bound for both is 1/sqrt(fan_in) (kaiming_uniform with a=sqrt(5)); the weights have enough samples to fill it
      bound = 1 / math.sqrt({"linear": 40, "conv2d": 4 * 6, "conv1d": 6 * 5, "conv_transpose2d": 4 * 9}[name])
      assert np.abs(v).max() <= bound and np.abs(ref).max() <= bound
      if k == "weight":
        assert np.abs(v).max() > 0.9 * bound and np.abs(ref).max() > 0.9 * bound
        assert abs(v.std() - ref.std()) < 0.15 * ref.std() and len(np.unique(v)) > v.size // 2
    else: np.testing.assert_array_equal(v, ref)
  load_state_dict(ours, {k: Tensor(_np(v)) for k, v in sd_t.items()})
  for k, t in sd_t.items(): np.testing.assert_array_equal(sd[k].numpy(), _np(t))

def test_layers_are_initialized_differently():
  a, b = nn.Linear(8, 8), nn.Linear(8, 8)
  assert not np.array_equal(a.weight.numpy(), b.weight.numpy())
  assert a.weight.requires_grad and a.bias.requires_grad

# ***** functional: dropout *****

def test_dropout_eval_is_identity_and_train_mode_restores():
  x = Tensor(_rand(4, 5))
  assert not Tensor.training and x.dropout(0.5) is x
  with Tensor.train():
    assert Tensor.training
    with Tensor.train(False): assert not Tensor.training and x.dropout(0.9) is x
    assert Tensor.training
  assert not Tensor.training

@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_dropout_train(p):
  x = Tensor(_rand(200, 100) + 5, requires_grad=True)  # nonzero values: zeros in the output are exactly the dropped ones
  with Tensor.train():
    out = x.dropout(p)
    out2 = x.dropout(p)
  out.sum().backward()
  o, xs, g = out.numpy(), x.numpy(), x.grad.numpy()
  kept = o != 0
  assert abs(kept.mean() - (1 - p)) < 0.02
  np.testing.assert_allclose(o[kept], xs[kept] / (1 - p), rtol=1e-6)
  np.testing.assert_allclose(g, kept / (1 - p), rtol=1e-6)  # the gradient flows through the kept ones, scaled
  assert not np.array_equal(kept, out2.numpy() != 0), "two dropouts drew the same mask"

def test_dropout_edges():
  x = Tensor(_rand(3, 4))
  with Tensor.train():
    np.testing.assert_array_equal(x.dropout(0.0).numpy(), x.numpy())
    np.testing.assert_array_equal(x.dropout(1.0).numpy(), np.zeros((3, 4), np.float32))
  with pytest.raises(ValueError): x.dropout(1.5)

# ***** functional: losses *****

def _fcheck(fa, ft, *arrays, grad=(0,), atol=1e-5, rtol=1e-4, seed=3):
  """fa(*attograd tensors) vs ft(*torch tensors): the value, and gradients of the inputs listed in grad."""
  ta = [Tensor(a, requires_grad=i in grad) for i, a in enumerate(arrays)]
  tt = [torch.tensor(a, requires_grad=i in grad) for i, a in enumerate(arrays)]
  out, ref = fa(*ta), ft(*tt)
  w = np.random.default_rng(seed).standard_normal(ref.shape).astype(np.float32)
  (out * Tensor(w)).sum().backward()
  (ref * torch.tensor(w)).sum().backward()
  _close([("output", out, ref)] + [(f"grad {i}", ta[i].grad, tt[i].grad) for i in grad], atol, rtol)

def _targets(shape, c, ignore=None, seed=1):
  y = np.random.default_rng(seed).integers(0, c, shape).astype(np.int64)
  if ignore is not None: y.reshape(-1)[::3] = ignore
  return y

@pytest.mark.parametrize("reduction,smoothing,ignore", [("mean", 0.0, None), ("sum", 0.2, None), ("none", 0.2, 2), ("mean", 0.2, 2), ("mean", 0.0, -1),
                                                        ("sum", 0.0, -1)])
def test_cross_entropy_class_indices(reduction, smoothing, ignore):
  kw = dict(reduction=reduction, label_smoothing=smoothing, **({} if ignore is None else dict(ignore_index=ignore)))
  _fcheck(lambda x, y: x.cross_entropy(y, **kw), lambda x, y: F.cross_entropy(x, y, **kw), _rand(7, 5) * 3, _targets(7, 5, ignore))

def test_cross_entropy_spatial():
  kw = dict(reduction="mean", label_smoothing=0.1, ignore_index=0)
  _fcheck(lambda x, y: x.cross_entropy(y, **kw), lambda x, y: F.cross_entropy(x, y, **kw), _rand(2, 4, 3, 5), _targets((2, 3, 5), 4, 0))

def test_cross_entropy_unbatched():
  _fcheck(lambda x, y: x.cross_entropy(y), lambda x, y: F.cross_entropy(x, y), _rand(6) * 2, np.array(4, dtype=np.int64))

@pytest.mark.parametrize("shape,reduction,smoothing", [((6, 4), "mean", 0.0), ((6, 4), "none", 0.3), ((2, 4, 3), "sum", 0.1)])
def test_cross_entropy_probabilities(shape, reduction, smoothing):
  p = np.random.default_rng(2).random(shape).astype(np.float32)
  p /= p.sum(1, keepdims=True)
  kw = dict(reduction=reduction, label_smoothing=smoothing)
  _fcheck(lambda x, y: x.cross_entropy(y, **kw), lambda x, y: F.cross_entropy(x, y, **kw), _rand(*shape) * 2, p, grad=(0, 1))

@pytest.mark.parametrize("kw", [{}, dict(label_smoothing=0.1, reduction="none", ignore_index=3)])
def test_sparse_categorical_crossentropy(kw):
  """tinygrad's name and default ignore_index (-1); the values torch's cross_entropy gives."""
  tkw = dict(kw, ignore_index=kw.get("ignore_index", -1))
  y = _targets(9, 5, ignore=kw.get("ignore_index", -1))
  _fcheck(lambda x, y: x.sparse_categorical_crossentropy(y, **kw), lambda x, y: F.cross_entropy(x, y, **tkw), _rand(9, 5) * 2, y)

@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_binary_crossentropy(reduction):
  rng = np.random.default_rng(4)
  p, y = rng.uniform(0.02, 0.98, (5, 6)).astype(np.float32), rng.random((5, 6)).astype(np.float32)  # soft targets too
  _fcheck(lambda x, y: x.binary_crossentropy(y, reduction), lambda x, y: F.binary_cross_entropy(x, y, reduction=reduction), p, y)

def test_binary_crossentropy_at_zero_and_one():
  """torch clamps each log at -100, so a confident wrong answer costs 100, not infinity."""
  p, y = np.array([0.0, 1.0, 0.0, 1.0, 1e-30], np.float32), np.array([1.0, 0.0, 0.0, 1.0, 1.0], np.float32)
  ours = Tensor(p).binary_crossentropy(Tensor(y), reduction="none").numpy()
  np.testing.assert_allclose(ours, _np(F.binary_cross_entropy(torch.tensor(p), torch.tensor(y), reduction="none")), rtol=1e-6)

@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_binary_crossentropy_logits(reduction):
  rng = np.random.default_rng(5)
  x = (rng.standard_normal((4, 6)) * 4).astype(np.float32)
  x[0, :4] = [90.0, -90.0, 200.0, -200.0]  # stays finite where exp over/underflows
  y = rng.random((4, 6)).astype(np.float32)
  y[0, :4] = [0.0, 1.0, 1.0, 0.0]
  _fcheck(lambda x, y: x.binary_crossentropy_logits(y, reduction), lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), x, y,
          grad=(0, 1))

# ***** functional: pooling *****

MAXPOOL = [
  dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=2, ceil_mode=True),
  dict(kernel_size=(2, 3), stride=(1, 2)), dict(kernel_size=3, dilation=2, stride=1), dict(kernel_size=2, stride=3, ceil_mode=True),
  dict(kernel_size=(3, 2), stride=2, dilation=(1, 2), padding=(1, 0), ceil_mode=True),
]
@pytest.mark.parametrize("kw", MAXPOOL, ids=[str(i) for i in range(len(MAXPOOL))])
def test_max_pool2d(kw):
  _fcheck(lambda x: x.max_pool2d(**kw), lambda x: F.max_pool2d(x, **kw), _rand(2, 3, 7, 8))

AVGPOOL = [
  dict(kernel_size=3, stride=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
  dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
  dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 1)), dict(kernel_size=2, stride=3, ceil_mode=True),
]
@pytest.mark.parametrize("kw", AVGPOOL, ids=[str(i) for i in range(len(AVGPOOL))])
def test_avg_pool2d(kw):
  _fcheck(lambda x: x.avg_pool2d(**kw), lambda x: F.avg_pool2d(x, **kw), _rand(2, 3, 7, 8))

def test_pool1d():
  """An int kernel_size on a 1-D pool means one spatial axis, as in torch."""
  _fcheck(lambda x: x.max_pool1d(3, stride=2, padding=1), lambda x: F.max_pool1d(x, 3, stride=2, padding=1), _rand(2, 3, 9))
  _fcheck(lambda x: x.avg_pool1d(2), lambda x: F.avg_pool1d(x, 2), _rand(2, 3, 9))

def test_layers_built_alike_own_their_state():
  # Tensor.ones(n).contiguous() built twice is one graph node: two LayerNorms (or BatchNorms) must still get
  # parameters and running stats of their own, with gradients of their own
  from attograd import Tensor, nn
  a, b = nn.LayerNorm(4), nn.LayerNorm(4)
  assert a.weight.uop is not b.weight.uop and a.bias.uop is not b.bias.uop
  x, w = Tensor.randn(3, 4), Tensor.randn(3, 4)
  (b(a(x) * 2) * w).sum().backward()
  assert not (a.bias.grad.numpy() == b.bias.grad.numpy()).all()
  assert (abs(b.bias.grad.numpy() - w.numpy().sum(0)) < 1e-5).all()
  c, d = nn.BatchNorm2d(3), nn.BatchNorm2d(3)
  assert c.running_mean.uop is not d.running_mean.uop and c.num_batches_tracked.uop is not d.num_batches_tracked.uop

def test_parameters_assigned_alike_stay_apart():
  # an assign to an unrealized tensor takes the value's graph node: two biases zeroed alike must stay two tensors
  from attograd import Tensor, nn
  a, b = nn.Linear(3, 4), nn.Linear(4, 4)
  for m in (a, b): m.bias.assign(Tensor.zeros(4))
  x, w = Tensor.randn(2, 3), Tensor.randn(2, 4)
  (b(a(x)) * w).sum().backward()
  assert (abs(b.bias.grad.numpy() - w.numpy().sum(0)) < 1e-5).all()
