"""Composites built once per signature and replayed (frontend/replay.py): a replay builds the very graph the composite
builds (the same nodes; a Vjp's products over this call's nodes), its gradients are this call's, and what a replay must
not take for the signature (another shape, aliasing arguments, grad mode, dropout, a view of an argument) is built as it is."""
import math
import numpy as np
import pytest
from attograd import Tensor, nn, no_grad
from attograd.uop.ops import UOp, UOpMeta, Vjp, Ops
from attograd.nn import functional as F
from attograd.frontend import replay
from attograd.frontend.replay import replayed

torch = pytest.importorskip("torch")

def _same(a: UOp, b: UOp, memo: dict | None = None) -> bool:
  """One graph: the same nodes, but for Vjp args (compared by identity), which must make the same products of
  nodes of the same graph, and a replay's CALL, which is the graph it expands to."""
  memo = {} if memo is None else memo
  if a is b: return True
  if a.op is Ops.CALL: return _same(a.arg.expand(a.src), b, memo)
  if b.op is Ops.CALL: return _same(a, b.arg.expand(b.src), memo)
  if (id(a), id(b)) in memo: return memo[(id(a), id(b))]
  ok = a.op is b.op and a.dtype == b.dtype and len(a.src) == len(b.src) and all(_same(x, y, memo) for x, y in zip(a.src, b.src))
  if ok and isinstance(a.arg, Vjp):
    ma, mb = a.arg.make.args[1], b.arg.make.args[1]  # (the front end's make: partial(_tensor_vjps, Tensor, make))
    ok = isinstance(b.arg, Vjp) and ma.func is mb.func and ma.args == mb.args and len(a.arg.captured) == len(b.arg.captured) and \
      all((x is None and y is None) or (x is not None and y is not None and _same(x, y, memo)) for x, y in zip(a.arg.captured, b.arg.captured))
  elif ok: ok = a.arg == b.arg
  memo[(id(a), id(b))] = ok
  return ok

def _rand(*shape, seed=0) -> Tensor: return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))

def _unreplayed(f):
  """f with every replayed composite built as it is (the graph to compare a replay with)"""
  saved = dict(replay._templates)
  replay._templates.clear()
  key_none = {}
  class Never(dict):
    def get(self, k, d=None): return None  # every signature: "can't be replayed", built as it is
    def __setitem__(self, k, v): key_none[k] = v
  replay._templates = Never()
  try: return f()
  finally: replay._templates = saved

CASES = {
  "linear": lambda x, y: x.linear(y[:24, :16], y[0, :24]),
  "matmul_broadcast": lambda x, y: x @ y[:16, :5],
  "layernorm_module": lambda x, y: _ln(x),
  "layer_norm_functional": lambda x, y: F.layer_norm(x, (16,), y[0, :16], None, 1e-3),
  "gelu": lambda x, y: x.gelu(),
  "gelu_tanh": lambda x, y: x.gelu(approximate="tanh"),
  "softmax": lambda x, y: x.softmax(-1),
  "softmax_axis0": lambda x, y: x.softmax(0),
  "log_softmax": lambda x, y: x.log_softmax(1),
  "sdpa_causal": lambda x, y: x.reshape(2, 2, 2, 16).scaled_dot_product_attention(x.reshape(2, 2, 2, 16) * 2, x.reshape(2, 2, 2, 16) + 1, is_causal=True),
  "sdpa_bool_mask": lambda x, y: x.reshape(1, 4, 2, 16).scaled_dot_product_attention(x.reshape(1, 4, 2, 16), y[:4, :16].reshape(1, 2, 2, 16).repeat(1, 2, 1, 1), y[:2, :2] > 0),
  "sdpa_additive_mask": lambda x, y: x.reshape(1, 2, 4, 16).scaled_dot_product_attention(y[:4, :16].reshape(1, 1, 4, 16), x.reshape(1, 2, 4, 16), y[:4, :4]),
  "cross_entropy": lambda x, y: x.reshape(-1, 16).cross_entropy(_target, label_smoothing=0.1, ignore_index=-100),
  "embedding": lambda x, y: _emb(_idx),
  "conv2d": lambda x, y: _conv(x.reshape(2, 4, 16)[None].reshape(2, 4, 4, 4)),
  "conv2d_functional": lambda x, y: x.reshape(1, 8, 4, 4).conv2d(y[:12, :8].reshape(3, 8, 2, 2).contiguous(), None, stride=2, padding=(1, 0)),
  "sigmoid": lambda x, y: x.sigmoid(), "tanh": lambda x, y: x.tanh(), "silu": lambda x, y: x.silu(), "mish": lambda x, y: x.mish(),
  "softplus": lambda x, y: x.softplus(2.0), "erf": lambda x, y: x.erf(),
  "rmsnorm_module": lambda x, y: _rms(x), "rms_norm_functional": lambda x, y: F.rms_norm(x, 16, y[1, :16]),
  "stack_of_norms": lambda x, y: Tensor.stack(*[x[i].square().sum() for i in range(4)], y.square().sum()).sum().sqrt(),
  "stack_dim": lambda x, y: Tensor.stack(x[0], x[1] * 2, x[0], dim=-1),
}
_ln, _emb, _conv, _rms = nn.LayerNorm(16), nn.Embedding(5, 16, padding_idx=3), nn.Conv2d(4, 6, 3, padding=1, groups=2), nn.RMSNorm(16)
_target, _idx = Tensor([1, 2, 15, -100, 0, 3, 4, 5]), Tensor([[1, 0, 2], [3, 3, 1]])

@pytest.mark.parametrize("name", list(CASES))
def test_replay_builds_the_same_graph(name):
  f = CASES[name]
  for seed in (1, 2, 3):  # new inputs each time: the first call builds, the next ones replay
    x, y = _rand(4, 2, 16, seed=seed) * 1, _rand(32, 32, seed=seed + 10).realize()
    got = f(x, y)
    want = _unreplayed(lambda: f(x, y))
    assert _same(got.uop, want.uop), f"{name}: the replay's graph differs"
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)

def test_replay_builds_only_its_nodes():
  # a replayed linear makes one CALL node and nothing else (no Tensor method runs); expanded, the nodes of its template
  x, w, b = _rand(8, 16), _rand(24, 16), _rand(24)
  x.linear(w, b)
  x2 = _rand(8, 16, seed=5)
  made = []
  real = UOpMeta.__call__
  UOpMeta.__call__ = lambda cls, *a, **k: made.append(a[0]) or real(cls, *a, **k)
  try:
    out = x2.linear(w, b).uop
    assert made == [Ops.CALL]
    out.arg.expand(out.src)
  finally: UOpMeta.__call__ = real
  template = next(e[0] for k, e in replay._templates.items() if k[0] is Tensor.linear.__wrapped__ and e is not None and k[5][0] == (8, 16))
  assert len(made) == 1 + len(out.arg.body.steps) == 1 + len(template.steps)

@pytest.mark.parametrize("flash", [False, True])
def test_replayed_attention_gradients_are_this_calls(monkeypatch, flash):
  from attograd.schedule import flash as fl
  if flash:  # flash attention's backward (probabilities recomputed) at this small size
    monkeypatch.setattr(fl, "FLASH_BWD_MIN_KEYS", 8)
    monkeypatch.setattr(fl, "FLASH_BWD_MIN_BYTES", 0)
  rng = np.random.default_rng(0)
  for _ in range(3):  # the second and third calls replay: their gradients must be theirs, not the first call's
    q, k, v, g = (rng.standard_normal((2, 2, 8, 16)).astype(np.float32) for _ in range(4))
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    (tq.scaled_dot_product_attention(tk, tv, is_causal=True) * Tensor(g)).sum().backward()
    rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    (torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True) * torch.tensor(g)).sum().backward()
    for ours, theirs in ((tq, rq), (tk, rk), (tv, rv)): np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)

def test_replayed_softmax_gradients_are_this_calls():
  rng = np.random.default_rng(1)
  for _ in range(3):
    a, g = rng.standard_normal((2, 3, 8)).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)
    t = Tensor(a, requires_grad=True)
    (t.softmax(-1) * Tensor(g)).sum().backward()
    r = torch.tensor(a, requires_grad=True)
    (r.softmax(-1) * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=1e-5, atol=1e-6)

def test_argument_equal_to_a_constant_inside():
  # Tensor.ones(shape) is the node gelu's graph makes for its constant 1 of that shape: built over stand-ins, the
  # template keeps the two apart (built over the argument itself, a replay would put the next argument in the constant's place)
  for x in (Tensor.ones(3, 5), _rand(3, 5), Tensor.zeros(3, 5), _rand(3, 5, seed=4)):
    want = torch.nn.functional.gelu(torch.tensor(x.numpy()))
    np.testing.assert_allclose(x.gelu().numpy(), want.numpy(), rtol=1e-5, atol=1e-6)

def test_aliased_arguments():
  # x @ x and x @ y have one signature of shapes: which arguments are the same tensor is part of it
  x, y = _rand(6, 6), _rand(6, 6, seed=1)
  for a, b in ((x, x), (x, y), (y, y), (y, x)):
    np.testing.assert_allclose((a @ b).numpy(), a.numpy() @ b.numpy(), rtol=1e-5, atol=1e-5)

def _expanded(u: UOp) -> UOp: return _expanded(u.arg.expand(u.src)) if u.op is Ops.CALL else u

def test_grad_mode_is_part_of_the_signature():
  x = _rand(4, 8)
  with no_grad(): plain = x.softmax(-1)
  assert _expanded(plain.uop).op.name != "WITH_DERIVATIVE"
  assert _expanded(x.softmax(-1).uop).op.name == "WITH_DERIVATIVE"
  with no_grad(): assert _expanded(x.softmax(-1).uop).op.name != "WITH_DERIVATIVE"

def test_dropout_draws_each_call():
  q = _rand(1, 1, 16, 8)
  a = q.scaled_dot_product_attention(q, q, dropout_p=0.5).numpy()
  b = q.scaled_dot_product_attention(q, q, dropout_p=0.5).numpy()
  assert not np.array_equal(a, b)

def test_a_view_of_an_argument_is_not_replayed():
  # a composite handing back a view of its argument (a write to the argument shows in it) is built each call
  @replayed
  def flat(x): return x.reshape(-1)
  for _ in range(2):
    base = Tensor([[1.0, 2.0], [3.0, 4.0]]).contiguous().realize()
    v = flat(base)
    base.assign(Tensor([[5.0, 6.0], [7.0, 8.0]]))
    assert v.tolist() == [5.0, 6.0, 7.0, 8.0]

def test_errors_are_the_calls_own():
  x = _rand(4, 8)
  for _ in range(2):
    with pytest.raises(Exception, match="matmul"): x @ _rand(5, 3)

def test_cross_entropy_target_checked_at_the_call():
  # a target in memory is read where cross_entropy is called (torch raises there too), ignored entries skipped; no
  # check kernel is left for the next realize
  from attograd.errors import IndexOutOfRange
  from attograd.frontend.indexing import index_checks
  logits = _rand(4, 5)
  with pytest.raises(IndexOutOfRange, match="index 7 is out of bounds"): logits.cross_entropy(Tensor([1, 7, -100, 2]))
  with pytest.raises(IndexOutOfRange, match="index -3 is out of bounds"): logits.cross_entropy(Tensor([1, -3, 0, 2]), ignore_index=-1)
  loss = logits.cross_entropy(Tensor([1, -100, 4, -100]))
  assert not index_checks
  want = torch.nn.functional.cross_entropy(torch.tensor(logits.numpy()), torch.tensor([1, -100, 4, -100]))
  np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-5)
  # a lazy target is checked by the kernels at the next realize, as before
  lazy = Tensor([1, 9, 0, 2]) + 0
  with pytest.raises(IndexOutOfRange, match="index 9 is out of bounds"): logits.cross_entropy(lazy).item()

def test_stack_of_scalars_is_one_call():
  # clipping by global norm stacks every parameter's squared norm each step: one CALL over the norms, not a cat's 3 nodes each
  xs = [_rand(3, 4, seed=i) for i in range(6)]
  for _ in range(2):
    norms = [x.square().sum() for x in xs]
    got = Tensor.stack(*norms)
    assert got.uop.op is Ops.CALL and got.uop.src == tuple(n.uop for n in norms)
  np.testing.assert_allclose(got.numpy(), [(x.numpy() ** 2).sum() for x in xs], rtol=1e-6)
  np.testing.assert_allclose(Tensor.stack([xs[0], xs[1]], 1).numpy(), np.stack([xs[0].numpy(), xs[1].numpy()], 1))  # a list: as it is

def test_block_forward_is_calls():
  # a transformer block's forward pass as bench/transformer.py writes it: each composite one CALL, so the graph backward
  # and realize walk is 39 nodes (290 built without replays), and the CALLs expand to the graph built without replays
  ln1, ln2, qkv, proj, fc1, fc2 = nn.LayerNorm(16), nn.LayerNorm(16), nn.Linear(16, 48), nn.Linear(16, 16), nn.Linear(16, 64), nn.Linear(64, 16)
  from attograd.nn.state import get_parameters
  Tensor.realize_all(get_parameters([ln1, ln2, qkv, proj, fc1, fc2]))  # (their random initial values: buffers)
  def block(x):
    B, T, C = x.shape
    q, k, v = [t.reshape(B, T, 2, C // 2).transpose(1, 2) for t in qkv(ln1(x)).chunk(3, dim=-1)]
    x = x + proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
    return x + fc2(fc1(ln2(x)).gelu())
  for seed in (1, 2):
    x = _rand(2, 8, 16, seed=seed)
    got = block(x)
    calls = [u for u in got.uop.toposort if u.op is Ops.CALL]
    assert len(calls) == 8 and len(got.uop.toposort) < 60, (len(calls), len(got.uop.toposort))  # (built without replays: 290)
    assert _same(got.uop, _unreplayed(lambda: block(x)).uop)
