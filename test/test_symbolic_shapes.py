"""Symbolic shapes: a bound Variable as a size. Results match numpy for every bound value, kernels and
schedules are built once per structure (the value is a kernel argument), buffers are sized for the
Variable's maximum, and TinyJit replays over changing values without capturing again."""
import numpy as np
import pytest
from attograd import Tensor, TinyJit, JitError, Variable, GlobalCounters
from attograd.uop.ops import UOp, Ops
from attograd.engine.realize import _kernel_cache, buffer_of
from attograd.schedule.schedule import _schedule_cache
from helpers import DEVICES

N = Variable("n", 0, 16)
rng = np.random.default_rng(0)
XN = rng.standard_normal((16, 4)).astype(np.float32)

def softmax(x: np.ndarray, axis: int) -> np.ndarray:
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)

def test_shape_holds_the_bound_variable():
  v = N.bind(5)
  x = Tensor(XN)
  for t in (x[:v], x.shrink(((0, v), None)), Tensor.zeros(v, 4), Tensor.ones(v, 4) * 2):
    assert t.shape == (v, 4) and t.shape[0].op is Ops.BIND and t.numel() is not None
  assert x[:v].T.shape == (4, v) and x[:v].reshape(v, 2, 2).shape == (v, 2, 2) and x[:v].sum(0).shape == (4,)
  assert "n=5" in repr(x[:v]) and x[:v].numpy().shape == (5, 4)

CASES = {
  "elementwise": (lambda t: (t * 2 + 1).exp(), lambda a: np.exp(a * 2 + 1)),
  "sum_symbolic_axis": (lambda t: t.sum(0), lambda a: a.sum(0)),
  "sum_other_axis": (lambda t: t.sum(1), lambda a: a.sum(1)),
  "sum_all": (lambda t: t.sum(), lambda a: a.sum()),
  "max": (lambda t: t.max(axis=0), lambda a: a.max(0) if len(a) else np.full(4, -np.inf, np.float32)),
  "min_keepdim": (lambda t: t.min(axis=1, keepdim=True), lambda a: a.min(1, keepdims=True)),
  "softmax_symbolic_axis": (lambda t: t.softmax(0), lambda a: softmax(a, 0)),
  "softmax_other_axis": (lambda t: t.T.softmax(0), lambda a: softmax(a.T, 0)),
  "reshape_split": (lambda t: t.reshape(t.shape[0], 2, 2) * 3, lambda a: a.reshape(len(a), 2, 2) * 3),
  "reshape_flatten": (lambda t: t.reshape(-1) + 1, lambda a: a.reshape(-1) + 1),
  "unsqueeze_expand": (lambda t: t.unsqueeze(1).expand(t.shape[0], 3, 4) + 0, lambda a: np.broadcast_to(a[:, None], (len(a), 3, 4))),
  "permute_pad": (lambda t: t.T.pad(((1, 0), (0, 2))), lambda a: np.pad(a.T, ((1, 0), (0, 2)))),
  "flip_slice": (lambda t: t.flip(0)[:, 1:3], lambda a: a[::-1, 1:3]),
  "matmul_outer": (lambda t: t @ Tensor(XN[:4, :3], device=t.device), lambda a: a @ XN[:4, :3]),
  "matmul_inner": (lambda t: t.T @ t, lambda a: a.T @ a),
}

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(CASES))
def test_ops_match_numpy(device, name):
  ours, theirs = CASES[name]
  x = Tensor(XN, device=device).realize()
  for n in (5, 1, 16):
    np.testing.assert_allclose(ours(x[:N.bind(n)]).numpy(), theirs(XN[:n]), rtol=1e-5, atol=1e-6, err_msg=f"n={n}")

@pytest.mark.parametrize("device", DEVICES)
def test_mean_and_var_divide_by_the_bound_count(device):
  x = Tensor(XN, device=device).realize()
  for n in (2, 7):
    v = N.bind(n)
    np.testing.assert_allclose(x[:v].mean(0).numpy(), XN[:n].mean(0), rtol=1e-5)
    np.testing.assert_allclose(x[:v].var(0).numpy(), XN[:n].var(0, ddof=1), rtol=1e-4)
    np.testing.assert_allclose((x[:v] * v).numpy(), XN[:n] * n, rtol=1e-6)  # a Variable is a value too

@pytest.mark.parametrize("device", DEVICES)
def test_symbolic_start_and_cat(device):
  x = Tensor(XN, device=device).realize()
  m = Variable("m", 0, 8)
  for n in (0, 3, 8):
    v = m.bind(n)
    np.testing.assert_equal(x[v:].numpy(), XN[n:])
    np.testing.assert_equal(x[v:v + 2].numpy(), XN[n:n + 2])
    np.testing.assert_equal(Tensor.cat(x[:v], -x[:v]).numpy(), np.concatenate([XN[:n], -XN[:n]]))
    np.testing.assert_equal(x[:v].pad(((0, 8 - v), None)).numpy(), np.pad(XN[:n], ((0, 8 - n), (0, 0))))  # back to a static shape

def test_gradient_through_a_symbolic_slice():
  x = Tensor(XN, requires_grad=True)
  v = N.bind(5)
  loss = (x[:v] * Tensor(XN[:4, :4])[:1]).sum()
  assert loss.item() == pytest.approx(float((XN[:5] * XN[:1, :4]).sum()), rel=1e-5)  # realized first: backward follows its graph, values bound
  loss.backward()
  np.testing.assert_allclose(x.grad.numpy(), np.concatenate([np.broadcast_to(XN[:1, :4], (5, 4)), np.zeros((11, 4), np.float32)]))

def test_zero_length():
  x = Tensor(XN)
  v = N.bind(0)
  assert x[:v].numpy().shape == (0, 4) and x[:v].sum(0).tolist() == [0.0] * 4
  assert np.isnan(x[:v].mean(0).numpy()).all()  # 0/0, as torch's mean of nothing

def test_creation():
  for n in (3, 9):
    v = N.bind(n)
    assert Tensor.zeros(v, 4).numpy().shape == (n, 4) and Tensor.ones(2, v).sum().item() == 2 * n
    assert Tensor.full((v,), 7).tolist() == [7] * n and Tensor.arange(v).tolist() == list(range(n))
    r = Tensor.rand(v, 4).numpy()
    assert r.shape == (n, 4) and (0 <= r).all() and (r < 1).all() and len(np.unique(r)) == r.size
    assert Tensor.randn(v, 2).numpy().shape == (n, 2) and Tensor.empty(v, 4).shape == (v, 4)

def _attention(q: Tensor, k: Tensor, v: Tensor, pos: UOp) -> Tensor:
  return (q @ k[:pos].T / 2.0).softmax(-1) @ v[:pos]

def _attention_np(q, k, v, p):
  return softmax(q @ k[:p].T / 2.0, -1) @ v[:p]

@pytest.mark.parametrize("device", DEVICES)
def test_kv_cache_attention_compiles_once(device):
  pos = Variable("pos", 1, 32)
  kn, vn = rng.standard_normal((32, 8)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
  k, v = Tensor(kn, device=device).realize(), Tensor(vn, device=device).realize()
  qn = rng.standard_normal((2, 8)).astype(np.float32)
  np.testing.assert_allclose(_attention(Tensor(qn, device=device), k, v, pos.bind(3)).numpy(), _attention_np(qn, kn, vn, 3), rtol=1e-5, atol=1e-6)
  kernels, schedules = len(_kernel_cache), len(_schedule_cache)
  for p in (4, 5, 17, 32, 1):
    qn = rng.standard_normal((2, 8)).astype(np.float32)
    out = _attention(Tensor(qn, device=device), k, v, pos.bind(p))
    np.testing.assert_allclose(out.numpy(), _attention_np(qn, kn, vn, p), rtol=1e-5, atol=1e-6, err_msg=f"pos={p}")
  # the bound value is data: no kernel compiled and no schedule built for another value
  assert len(_kernel_cache) == kernels and len(_schedule_cache) == schedules

def test_kernel_loops_to_the_variable():
  from attograd.schedule.schedule import create_schedule
  v = Variable("len", 1, 64)
  y = (Tensor(np.ones((64, 4), np.float32)).realize()[:v.bind(10)] * 2).sum(0)
  from attograd.engine.realize import runnable
  roots, var_vals, _ = runnable(UOp(Ops.SINK, src=(y.uop,)))
  (si,) = create_schedule(list(roots.src))[0]
  ranges = [u for u in si.ast.toposort if u.op is Ops.RANGE]
  # the kernel's reduce loop runs to the DEFINE_VAR (an argument), not to the value 10
  assert var_vals == {v: 10} and any(r.src[0] is v for r in ranges)
  assert all(not (u.op is Ops.CONST and u.arg == 10) for u in si.ast.toposort)

def test_buffers_sized_for_the_maximum():
  x = Tensor(XN).realize()
  y = (x[:N.bind(3)] + 1).realize()
  buf = y.uop.base
  assert buf.op is Ops.BUFFER and buf.arg.size == 16 * 4 and buffer_of(buf).size == 16 * 4
  np.testing.assert_allclose(y.numpy(), XN[:3] + 1)
  assert y.contiguous() is y  # the prefix of its buffer is already contiguous: reading it back copies nothing

@pytest.mark.parametrize("device", DEVICES)
def test_jit_replays_attention_over_positions(device):
  pos = Variable("pos", 1, 32)
  kn, vn = rng.standard_normal((32, 8)).astype(np.float32), rng.standard_normal((32, 8)).astype(np.float32)
  k, v = Tensor(kn, device=device).realize(), Tensor(vn, device=device).realize()
  @TinyJit
  def step(q: Tensor, p: UOp) -> Tensor:
    scores = (q @ k[:p].T / 2.0).softmax(-1)
    return (scores @ v[:p]).realize(), scores.realize()
  kernels = None
  for p in range(3, 12):
    qn = rng.standard_normal((1, 8)).astype(np.float32)
    out, scores = step(Tensor(qn, device=device), pos.bind(p))
    np.testing.assert_allclose(out.numpy(), _attention_np(qn, kn, vn, p), rtol=1e-5, atol=1e-6, err_msg=f"pos={p}")
    assert scores.shape == (1, pos.bind(p)) and scores.numpy().shape == (1, p)  # the output's shape follows the value
    if step.cnt == 2 and kernels is None: kernels = len(_kernel_cache)
  assert step.cnt == 2 and len(_kernel_cache) == kernels
  GlobalCounters.reset()
  step(Tensor(qn, device=device), pos.bind(20))
  assert GlobalCounters.kernel_count == len(step.replay.plan.items)  # a replay only runs the recorded kernels

def test_jit_symbolic_input_shapes():
  x = Tensor(XN).realize()
  @TinyJit
  def f(t: Tensor) -> Tensor: return (t * 2).sum(0).realize()
  for n in (3, 4, 9, 16, 1):
    np.testing.assert_allclose(f(x[:N.bind(n)]).numpy(), XN[:n].sum(0) * 2, rtol=1e-5)
  assert f.cnt == 2
  with pytest.raises(JitError, match="argument 0"): f(x[:5])  # a real shape change still raises
  with pytest.raises(JitError, match="argument 0"): f(x[:Variable("m", 0, 16).bind(5)])  # so does another Variable
  with pytest.raises(JitError, match="argument 0"): f(x[:N.bind(5), :2])

def test_jit_replay_reuses_memory_sized_for_the_maximum():
  pos = Variable("p", 1, 64)
  x = Tensor(rng.standard_normal((64, 4)).astype(np.float32)).realize()
  @TinyJit
  def f(p: UOp) -> Tensor: return (x[:p] * 3 + 1).realize()
  outs = [f(pos.bind(n)) for n in (1, 2, 64, 7)]
  assert outs[-1].uop.base.arg.size == 64 * 4  # the captured call bound 2, the replays need up to 64
  np.testing.assert_allclose(outs[-1].numpy(), x.numpy()[:7] * 3 + 1, rtol=1e-6)

def test_errors():
  x = Tensor(XN)
  with pytest.raises(ValueError, match="'n'"): N.bind(17)
  with pytest.raises(ValueError, match="'n'"): N.bind(-1)
  with pytest.raises(ValueError, match="not bound"): Tensor.zeros(N, 4)
  with pytest.raises(ValueError, match="can be negative"): x.pad(((0, N.bind(2) - 3), None))
  with pytest.raises(ValueError, match="out of bounds"): x[:Variable("big", 1, 32).bind(4)]  # 32 > 16 rows: a replay could read past them
  with pytest.raises(IndexError, match="step 1"): x[:N.bind(4):2]
  with pytest.raises(ValueError, match="cannot reshape"): x[:N.bind(4)].reshape(4, 4)
  with pytest.raises(TypeError, match="doesn't support symbolic sizes"): x[:N.bind(4)].cumsum(0)  # ops built on int-only window math refuse
  with pytest.raises(TypeError, match="Variable position"): x[:N.bind(4)] = 1.0
  with pytest.raises(ValueError, match="both 2 and 3"): (x[:N.bind(2)].sum() + x[:N.bind(3)].sum()).realize()

def test_slices_at_int_offsets_reuse_kernels():
  # a batch cut from a dataset at Python-int offsets (data[i:i+T], stacked) reads the data at variable offsets: the next
  # batch reuses the compiled kernels and the schedule
  from attograd.engine import realize
  from attograd.schedule import schedule
  data = Tensor(np.arange(5000, dtype=np.int64)).realize()
  rng = np.random.default_rng(0)
  def batch():
    ix = [int(i) for i in rng.integers(1, 5000 - 65, 4)]
    x, y = Tensor.stack(*[data[i:i + 64] for i in ix]), Tensor.stack(*[data[i + 1:i + 65] for i in ix])
    Tensor.realize_all([x, y])
    np.testing.assert_array_equal(x.numpy(), np.stack([np.arange(i, i + 64) for i in ix]))
    np.testing.assert_array_equal(y.numpy(), np.stack([np.arange(i + 1, i + 65) for i in ix]))
  batch()
  kernels, schedules = len(realize._kernel_cache), len(schedule._schedule_cache)
  for _ in range(3): batch()
  assert (len(realize._kernel_cache), len(schedule._schedule_cache)) == (kernels, schedules)
  # a slice's bounds still hold: the offset's variable runs over the positions that keep it inside the data
  assert data[4990:5000].numpy().tolist() == list(range(4990, 5000))
  assert (data[4990:] + 1).numpy().tolist() == list(range(4991, 5001))
  # a slice of a slice is a view: read as it is (no variable offsets bound into it), and as the input of a kernel
  n = np.arange(600, dtype=np.float32).reshape(20, 10, 3)
  x = Tensor(n).realize()
  np.testing.assert_array_equal(x.shrink(((5, 15), None, None)).shrink((None, (1, 8), None)).numpy(), n[5:15, 1:8])
  np.testing.assert_array_equal((x[5:15][2:4, 1:8] * 2).numpy(), n[5:15][2:4, 1:8] * 2)

def test_each_layers_slice_at_the_same_place_is_one_kernel():
  # layers that each slice their own stored weight at the same int offsets (a quantized block's second scale) read it at
  # one variable with one value: their kernels are one kernel, where a variable of its own per slice compiled one per layer
  from attograd.engine import realize
  rng = np.random.default_rng(0)
  ws = [rng.standard_normal((8, 3)).astype(np.float32) for _ in range(4)]
  stored = [Tensor(w).realize() for w in ws]
  x = Tensor(np.linspace(0, 1, 8, dtype=np.float32)).realize()
  before = len(realize._kernel_cache)
  h, ref = x, np.linspace(0, 1, 8, dtype=np.float32)
  for t, w in zip(stored, ws): h, ref = (h * t[:, 1:2].reshape(8) + 1).contiguous(), ref * w[:, 1] + 1
  np.testing.assert_allclose(h.numpy(), ref, rtol=1e-6)
  assert len(realize._kernel_cache) - before == 1
  # slices at different offsets of the same place in one graph stay apart
  a, b = (x * stored[0][:, 1:2].reshape(8)).contiguous(), (x * stored[1][:, 2:3].reshape(8)).contiguous()
  np.testing.assert_allclose((a + b).numpy(), np.linspace(0, 1, 8) * (ws[0][:, 1] + ws[1][:, 2]), rtol=1e-6)

def test_masked_softmax_over_a_symbolic_length_of_transposed_scores():
  # 8 queries a thread over a KV cache's symbolic length: gcc 12.2's loop vectorizer miscompiled this kernel (rows of
  # the softmax summed to 0.7), so kernels with a loop of variable count compile without it (renderer/cstyle.py)
  import math
  T, C = 8, 64
  sb = np.random.default_rng(0).standard_normal((2, C, T)).astype(np.float32)
  sbase = Tensor(sb).realize()
  for p in (0, 3):
    pos = Variable("pos", 0, C - T).bind(p)
    L = pos + T
    visible = Tensor.arange(L).reshape(1, 1, L) <= (Tensor.arange(T).reshape(1, T, 1) + pos)
    out = visible.where(sbase[:, :L].transpose(-1, -2), -math.inf).softmax(-1).numpy()
    s = np.where(np.arange(p + T)[None, None, :] <= np.arange(T)[None, :, None] + p, sb[:, :p + T].transpose(0, 2, 1), -np.inf)
    ref = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(out, ref / ref.sum(-1, keepdims=True), atol=1e-6)
