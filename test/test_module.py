"""nn.Module against torch.nn.Module: the same class written for both frameworks has the same state_dict keys,
parameter names, module tree and (with torch's weights loaded) the same outputs; train/eval, to, zero_grad,
hooks, containers, MultiheadAttention."""
import numpy as np
import pytest
import torch
import attograd.nn.functional as AF
import torch.nn.functional as TF
from attograd import Tensor, dtypes
from attograd import nn
from attograd.nn.state import get_parameters, get_state_dict

@pytest.fixture(autouse=True)
def _seed():
  torch.manual_seed(0)
  Tensor.manual_seed(0)

def make_net(nn, F, ones, zeros):
  """One model class, written once, for either framework."""
  class Block(nn.Module):
    def __init__(self, d):
      super().__init__()
      self.fc, self.norm, self.drop = nn.Linear(d, d), nn.LayerNorm(d), nn.Dropout(0.5)
    def forward(self, x): return x + self.drop(F.gelu(self.fc(self.norm(x))))
  class Net(nn.Module):
    def __init__(self):
      super().__init__()
      self.conv = nn.Conv2d(3, 4, 3, padding=1)
      self.bn = nn.BatchNorm2d(4)
      self.blocks = nn.ModuleList([Block(16), Block(16)])
      self.heads = nn.ModuleDict({"a": nn.Linear(16, 5), "b": nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 5))})
      self.emb = nn.Embedding(10, 16)
      self.scale = nn.Parameter(ones(5))
      self.register_buffer("offset", zeros(5) + 0.5)
      self.register_buffer("scratch", zeros(3), persistent=False)
      self.head = self.heads["a"]  # shared: listed under both names in the state dict, once in parameters()
    def forward(self, x, idx):
      h = F.max_pool2d(F.relu(self.bn(self.conv(x))), 2).flatten(1) + self.emb(idx)
      for b in self.blocks: h = b(h)
      return (self.heads["a"](h) + self.heads["b"](h)) * self.scale + self.offset
  return Net()

def _ours(): return make_net(nn, AF, lambda n: Tensor.ones(n), lambda n: Tensor.zeros(n))
def _theirs(): return make_net(torch.nn, TF, torch.ones, torch.zeros)
def _sd_numpy(m: torch.nn.Module) -> dict: return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}

def test_names_match_torch():
  ours, theirs = _ours(), _theirs()
  assert list(ours.state_dict()) == list(theirs.state_dict())
  assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
  assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
  assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
  assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
  assert {k: v.shape for k, v in ours.state_dict().items()} == {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
  assert len(list(ours.parameters())) == len(list(theirs.parameters()))
  assert ours.state_dict()["head.weight"] is ours.heads["a"].weight
  assert ours.state_dict()["bn.num_batches_tracked"].dtype == dtypes.int64
  assert "scratch" not in ours.state_dict() and any(n == "scratch" for n, _ in ours.named_buffers())

@pytest.mark.parametrize("mode", ["eval", "train"])
def test_torch_state_dict_loads_and_outputs_match(mode):
  ours, theirs = _ours(), _theirs()
  res = ours.load_state_dict(_sd_numpy(theirs))  # a torch checkpoint converted with .numpy()
  assert res.missing_keys == [] and res.unexpected_keys == []
  for d in (ours.blocks[0].drop, ours.blocks[1].drop, theirs.blocks[0].drop, theirs.blocks[1].drop): d.p = 0.0  # (random streams differ)
  getattr(ours, mode)(); getattr(theirs, mode)()
  assert ours.training == theirs.training == (mode == "train") and all(m.training == (mode == "train") for m in ours.modules())
  x = np.random.default_rng(0).standard_normal((4, 3, 4, 4)).astype(np.float32)
  idx = np.array([1, 9, 0, 3])
  out, ref = ours(Tensor(x), Tensor(idx)), theirs(torch.tensor(x), torch.tensor(idx))
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-4, rtol=1e-4)
  if mode == "train":  # batch statistics were used and the running ones updated, as torch does
    for k in ("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"):
      np.testing.assert_allclose(ours.state_dict()[k].numpy(), theirs.state_dict()[k].numpy(), atol=1e-5, rtol=1e-5)

def test_load_state_dict_strict_and_errors():
  ours, sd = _ours(), _sd_numpy(_theirs())
  del sd["emb.weight"]
  sd["extra"] = np.zeros(2, np.float32)
  with pytest.raises(RuntimeError, match="Missing key.*emb.weight.*\n.*Unexpected key.*extra"): ours.load_state_dict(sd)
  before = ours.conv.weight.numpy()
  res = ours.load_state_dict(sd, strict=False)
  assert res.missing_keys == ["emb.weight"] and res.unexpected_keys == ["extra"]
  assert not np.array_equal(before, ours.conv.weight.numpy())
  theirs = _theirs()
  ours.load_state_dict(theirs.state_dict())  # torch tensors as they are
  np.testing.assert_array_equal(ours.conv.weight.numpy(), theirs.conv.weight.detach().numpy())
  sd2 = _sd_numpy(_theirs())
  sd2["conv.weight"] = np.zeros((1, 2), np.float32)
  w = ours.conv.weight.numpy()
  with pytest.raises(RuntimeError, match="size mismatch for conv.weight"): ours.load_state_dict(sd2)
  np.testing.assert_array_equal(ours.conv.weight.numpy(), w)  # nothing written on an error

def test_parameters_keep_identity_through_load_and_to():
  m = nn.Linear(3, 2)
  w = m.weight
  m.load_state_dict({"weight": np.ones((2, 3), np.float32), "bias": np.zeros(2, np.float32)})
  assert m.weight is w and isinstance(w, nn.Parameter) and w.requires_grad and w.tolist() == [[1.0] * 3] * 2
  m.to(dtypes.float16)
  assert m.weight is w and w.dtype == dtypes.float16 and m(Tensor.ones(1, 3, dtype=dtypes.float16)).dtype == dtypes.float16
  m2 = nn.Linear(3, 2)
  w2, ref = m2.weight, m2(Tensor.ones(1, 3)).numpy()
  m2.to("PYTHON")
  assert m2.weight is w2 and w2.device == m2.bias.device == "PYTHON"
  np.testing.assert_allclose(m2(Tensor.ones(1, 3, device="PYTHON")).numpy(), ref, rtol=1e-6)
  bn = nn.BatchNorm2d(3).to(dtypes.float64)
  assert bn.running_mean.dtype == dtypes.float64 and bn.num_batches_tracked.dtype == dtypes.int64  # ints aren't cast

def test_plain_tensor_over_a_parameter_keeps_its_role_and_unregistered_tensors_are_not_state():
  class M(nn.Module):
    def __init__(self):
      super().__init__()
      self.lin = nn.Linear(2, 2)
      self.const = Tensor([1.0, 2.0])  # torch doesn't register a plain tensor attribute: neither do we
  m = M()
  m.lin.weight = Tensor(np.eye(2, dtype=np.float32))  # tinygrad-style replacement of a parameter
  assert list(m.state_dict()) == ["lin.weight", "lin.bias"] and len(list(m.parameters())) == 2
  m.lin = None
  assert list(m.state_dict()) == []
  m.lin = nn.Linear(2, 3)
  del m.lin
  assert list(m.state_dict()) == [] and not hasattr(m, "lin")

def test_train_eval_and_global_training_flag():
  d = nn.Dropout(0.5)
  x = Tensor.ones(1000)
  assert d(x).tolist() == [1.0] * 1000  # never set: follows Tensor.training (off)
  with Tensor.train(): assert 300 < (d(x) == 0).sum().item() < 700
  d.eval()
  with Tensor.train(): assert d(x).tolist() == [1.0] * 1000  # its own mode wins once set
  d.train()
  assert 300 < (d(x) == 0).sum().item() < 700
  assert d.train() is d and d.eval() is d and d.training is False

def test_zero_grad_apply_hooks_and_requires_grad():
  m = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
  m(Tensor.ones(2, 3)).sum().backward()
  assert all(p.grad is not None for p in m.parameters())
  m.zero_grad(set_to_none=False)
  assert all(p.grad is not None and not p.grad.numpy().any() for p in m.parameters())
  m.zero_grad()
  assert all(p.grad is None for p in m.parameters())
  seen = []
  m.apply(lambda mod: seen.append(type(mod).__name__))
  assert seen == ["Linear", "Tanh", "Linear", "Sequential"]  # children first, as torch
  calls = []
  h = m[0].register_forward_hook(lambda mod, args, out: calls.append(out.shape) or out * 0)
  pre = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
  assert m(Tensor.ones(2, 3)).numpy().shape == (2, 1) and calls == [(2, 4)]
  np.testing.assert_allclose(m(Tensor.ones(2, 3)).numpy(), m[2](m[1](Tensor.zeros(2, 4))).numpy(), atol=1e-6)
  h.remove(); pre.remove()
  m.requires_grad_(False)
  assert all(p.requires_grad is False for p in m.parameters())

def test_containers():
  seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), Tensor.sigmoid)  # a plain callable, as tinygrad's Tensor.sequential allows
  assert len(seq) == 3 and isinstance(seq[0], nn.Linear) and isinstance(seq[-2], nn.ReLU) and len(seq[:2]) == 2
  assert list(seq.state_dict()) == ["0.weight", "0.bias"]
  assert ((seq(Tensor.ones(1, 2)).numpy() > 0) & (seq(Tensor.ones(1, 2)).numpy() < 1)).all()
  ml = nn.ModuleList([nn.Linear(1, 1)])
  ml.append(nn.Linear(1, 2)); ml.extend([nn.Linear(2, 2)]); ml.insert(0, nn.Identity())
  assert [type(m).__name__ for m in ml] == ["Identity", "Linear", "Linear", "Linear"] and list(ml.state_dict())[0] == "1.weight"
  with pytest.raises(IndexError): ml[4]
  md = nn.ModuleDict({"x": nn.Linear(1, 1)})
  md["y"] = nn.Linear(1, 1)
  assert list(md) == ["x", "y"] and "y" in md and list(md.state_dict()) == ["x.weight", "x.bias", "y.weight", "y.bias"]
  del md["x"]
  assert list(md.keys()) == ["y"]
  od = nn.Sequential(__import__("collections").OrderedDict(first=nn.Linear(2, 2), act=nn.GELU()))
  assert list(od.state_dict()) == ["first.weight", "first.bias"] and isinstance(od.act, nn.GELU)

def test_get_parameters_of_plain_classes_holding_modules():
  class Plain:  # tinygrad style: no Module, layers in a list
    def __init__(self): self.layers, self.extra = [nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2)], Tensor.zeros(3)
  p = Plain()
  assert list(get_state_dict(p)) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "layers.1.running_mean",
                                     "layers.1.running_var", "layers.1.num_batches_tracked", "extra"]
  assert len(get_parameters(p)) == 8

def test_parameter():
  p = nn.Parameter(Tensor([1.0, 2.0]))
  assert p.requires_grad and isinstance(p, Tensor) and not isinstance(p * 2, nn.Parameter)
  assert nn.Parameter(Tensor([1, 2]), requires_grad=False).requires_grad is False
  with pytest.raises(TypeError, match="floating point"): nn.Parameter(Tensor([1, 2]))

def test_module_without_super_init_and_bad_names():
  class M(nn.Module):
    def __init__(self): self.lin = nn.Linear(1, 1)  # forgot super().__init__(): torch raises, we register anyway
    def forward(self, x): return self.lin(x)
  assert list(M().state_dict()) == ["lin.weight", "lin.bias"]
  with pytest.raises(KeyError): nn.Module().register_buffer("a.b", Tensor.zeros(1))
  with pytest.raises(NotImplementedError): nn.Module()(1)

# ***** MultiheadAttention *****

@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", ["plain", "bool_mask", "float_mask", "padding", "causal", "per_head", "kvdim", "unbatched"])
def test_multihead_attention_matches_torch(batch_first, case):
  E, H, L, S, B = 8, 2, 5, 6, 3
  kw = dict(kdim=5, vdim=7) if case == "kvdim" else {}
  theirs = torch.nn.MultiheadAttention(E, H, batch_first=batch_first, **kw)
  ours = nn.MultiheadAttention(E, H, batch_first=batch_first, **kw)
  assert list(ours.state_dict()) == list(theirs.state_dict())
  ours.load_state_dict(_sd_numpy(theirs))
  rng = np.random.default_rng(1)
  shape = lambda n, d: (B, n, d) if batch_first else (n, B, d)
  if case == "unbatched": shape = lambda n, d: (n, d)
  q = rng.standard_normal(shape(L, E)).astype(np.float32)
  k = rng.standard_normal(shape(S, kw.get("kdim", E))).astype(np.float32)
  v = rng.standard_normal(shape(S, kw.get("vdim", E))).astype(np.float32)
  args: dict = {}
  if case == "causal" or case == "bool_mask": args["attn_mask"] = np.triu(np.ones((L, S), bool), 1)
  if case == "float_mask": args["attn_mask"] = rng.standard_normal((L, S)).astype(np.float32)
  if case == "padding": args["key_padding_mask"] = np.array([[False] * 5 + [True], [False] * 6, [False, True] * 3])
  if case == "per_head": args["average_attn_weights"] = False
  out, w = ours(Tensor(q), Tensor(k), Tensor(v), **{k_: (Tensor(a) if isinstance(a, np.ndarray) else a) for k_, a in args.items()})
  ref, rw = theirs(torch.tensor(q), torch.tensor(k), torch.tensor(v), **{k_: (torch.tensor(a) if isinstance(a, np.ndarray) else a) for k_, a in args.items()})
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), atol=1e-5, rtol=1e-4)
  np.testing.assert_allclose(w.numpy(), rw.detach().numpy(), atol=1e-5, rtol=1e-4)
  if case == "causal":  # is_causal without a mask builds the causal one
    o2, _ = ours(Tensor(q), Tensor(k), Tensor(v), is_causal=True, need_weights=False)
    np.testing.assert_allclose(o2.numpy(), ref.detach().numpy(), atol=1e-5, rtol=1e-4)

def test_multihead_attention_gradients_match_torch():
  theirs, ours = torch.nn.MultiheadAttention(8, 4, batch_first=True), nn.MultiheadAttention(8, 4, batch_first=True)
  ours.load_state_dict(_sd_numpy(theirs))
  x = np.random.default_rng(2).standard_normal((2, 5, 8)).astype(np.float32)
  (ours(Tensor(x), Tensor(x), Tensor(x))[0] ** 2).sum().backward()
  (theirs(torch.tensor(x), torch.tensor(x), torch.tensor(x))[0] ** 2).sum().backward()
  for (n, p), (_, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
    np.testing.assert_allclose(p.grad.numpy(), tp.grad.numpy(), atol=1e-5, rtol=1e-4, err_msg=n)

def test_activation_modules_match_torch():
  x = np.linspace(-4, 4, 24, dtype=np.float32).reshape(2, 3, 4)
  for name, args in [("ReLU", ()), ("GELU", ()), ("GELU", ("tanh",)), ("Tanh", ()), ("Sigmoid", ()), ("SiLU", ()), ("LeakyReLU", (0.2,)),
                     ("ELU", (0.5,)), ("Softplus", (2.0,)), ("Hardswish", ()), ("Softmax", (1,)), ("LogSoftmax", (-1,)), ("Mish", ()),
                     ("Identity", ()), ("Flatten", ()), ("Flatten", (0, 1)), ("GLU", (1,)) if False else ("GLU", (-1,)), ("ReLU6", ()),
                     ("Hardtanh", (-2.0, 2.0)), ("Softmin", (0,))]:
    np.testing.assert_allclose(getattr(nn, name)(*args)(Tensor(x)).numpy(), getattr(torch.nn, name)(*args)(torch.tensor(x)).numpy(),
                               atol=1e-5, rtol=1e-4, err_msg=f"{name}{args}")
  img = np.random.default_rng(0).standard_normal((2, 3, 7, 9)).astype(np.float32)
  for name, args in [("MaxPool2d", (2,)), ("MaxPool2d", (3, 2, 1)), ("AvgPool2d", (2,)), ("AvgPool2d", (3, 2, 1)), ("AdaptiveAvgPool2d", ((3, 4),)),
                     ("AdaptiveAvgPool2d", (1,)), ("Upsample", (None, 2)), ("Unflatten", (1, (3, 1)))]:
    np.testing.assert_allclose(getattr(nn, name)(*args)(Tensor(img)).numpy(), getattr(torch.nn, name)(*args)(torch.tensor(img)).numpy(),
                               atol=1e-5, rtol=1e-4, err_msg=f"{name}{args}")

def test_deepcopy_gives_independent_parameters():
  import copy
  m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
  m2 = copy.deepcopy(m)
  assert m2[0].weight is not m[0].weight and isinstance(m2[0].weight, nn.Parameter) and list(m2.state_dict()) == list(m.state_dict())
  np.testing.assert_array_equal(m2[0].weight.numpy(), m[0].weight.numpy())
  m2[0](Tensor.ones(1, 2)).sum().backward()
  assert m2[0].weight.grad is not None and m[0].weight.grad is None  # the copy's gradient lands on the copy only
  m2[0].weight.assign(Tensor.zeros(2, 2)).realize()
  assert m[0].weight.numpy().any()

def test_batchnorm_takes_torchs_positional_order():
  bn, tbn = nn.BatchNorm2d(3, 1e-3, 0.3, False), torch.nn.BatchNorm2d(3, 1e-3, 0.3, False)
  assert (bn.eps, bn.momentum, bn.weight) == (tbn.eps, tbn.momentum, tbn.weight) == (1e-3, 0.3, None)
  assert nn.BatchNorm(3, 1e-3, False).weight is None  # tinygrad's: (sz, eps, affine, track_running_stats, momentum)
