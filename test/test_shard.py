"""Sharded tensors (issue 20): Tensor.shard over CPU devices gives the one-device result, forward and backward, for
elementwise ops, reductions along and across the split axis (an all-reduce), matmuls with either operand split on either
axis, softmax across the split axis, uneven parts, resharding and gathering; torch is the oracle."""
import numpy as np
import pytest
from attograd import Tensor, TinyJit, nn
from attograd.engine import allreduce
from attograd.nn import optim
from attograd.nn.state import get_parameters

torch = pytest.importorskip("torch")
D2 = ("CPU", "CPU:1")
D3 = ("CPU", "CPU:1", "CPU:2")

@pytest.fixture(autouse=True)
def side_by_side(monkeypatch):
  """Every plan here, however small, runs its devices side by side (engine/lanes.py), as a big one does."""
  from attograd.engine import realize
  monkeypatch.setattr(realize, "LANES_MIN_OPS", 0)
  monkeypatch.setattr(realize, "LANES_MIN_BYTES", 0)

def check(fn, shapes, shardings, devices=D2, rtol=1e-5, atol=1e-6, seed=0):
  """fn over inputs split as shardings (axis, None = replicated, "one" = not sharded) equals torch's, and so do the
  gradients of each input (a sum of the output times a fixed random tensor)."""
  rng = np.random.default_rng(seed)
  xs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
  ts = [Tensor(x, requires_grad=True) for x in xs]
  ins = [t if s == "one" else t.shard(devices, s) for t, s in zip(ts, shardings)]
  out = fn(*ins)
  tx = [torch.tensor(x, requires_grad=True) for x in xs]
  ref = fn(*tx)
  np.testing.assert_allclose(out.numpy(), ref.detach().numpy(), rtol=rtol, atol=atol)
  w = rng.standard_normal(ref.shape).astype(np.float32)
  (out * Tensor(w).to(out.device)).sum().backward()
  (ref * torch.tensor(w)).sum().backward()
  for t, r in zip(ts, tx):
    assert t.grad.device == "CPU"
    np.testing.assert_allclose(t.grad.numpy(), r.grad.numpy(), rtol=rtol, atol=atol)
  return out

@pytest.mark.parametrize("axis", [0, 1, None])
def test_elementwise(axis):
  out = check(lambda a, b: (a * b + 1).exp() - a / 3, [(5, 4), (5, 4)], [axis, axis])
  assert out.device == D2

@pytest.mark.parametrize("sa,sb", [(0, None), (None, 1), (0, 1), (1, "one")])
def test_elementwise_mixed_shardings(sa, sb):
  if sb == "one":  # a one-device operand must be moved first: a clear error, not a silent copy
    with pytest.raises(Exception, match="devices"): (Tensor.ones(5, 4).shard(D2, 0) + Tensor.ones(5, 4)).numpy()
    return
  check(lambda a, b: a * b - b, [(5, 4), (5, 4)], [sa, sb])

def test_broadcast_and_scalars():
  check(lambda a, b: (a + b) * 2, [(5, 4), (4,)], [0, None])
  check(lambda a, b: a.maximum(b), [(5, 4), (5, 1)], [0, 0])

@pytest.mark.parametrize("op", ["sum", "amax", "mean", "amin"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("dim", [0, 1, None])
def test_reductions(op, axis, dim):
  check(lambda a: getattr(a, op)(dim) if dim is not None else getattr(a, op)(), [(5, 6)], [axis])

def test_uneven_parts_and_three_devices():
  t = Tensor(np.arange(5 * 3, dtype=np.float32).reshape(5, 3)).shard(D2, 0)
  assert [p.shape for p in t.uop.src] == [(3, 3), (2, 3)]
  check(lambda a: a.sum(0) * a.max(), [(7, 5)], [0], devices=D3)
  check(lambda a, b: a @ b, [(4, 7), (7, 5)], [1, 0], devices=D3)

@pytest.mark.parametrize("sa", [None, 0, 1])
@pytest.mark.parametrize("sb", [None, 0, 1])
def test_matmul(sa, sb):
  if sa is None and sb is None: return
  check(lambda a, b: a @ b, [(5, 6), (6, 3)], [sa, sb], rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("axis", [0, 1])
def test_softmax(axis):
  check(lambda a: a.softmax(1), [(4, 7)], [axis])
  check(lambda a: a.log_softmax(1), [(4, 7)], [axis])

def test_reshape_permute_and_movement():
  check(lambda a: a.reshape(2, 3, 4).permute(2, 0, 1).reshape(4, 6) * 2, [(6, 4)], [0])
  check(lambda a: a.reshape(24) + 1, [(6, 4)], [1])  # no per-part reshape: gathered, then reshaped
  check(lambda a: a[1:4].flip(1).flip(0), [(5, 4)], [0])
  check(lambda a: Tensor.pad(a, (1, 2)) if isinstance(a, Tensor) else torch.nn.functional.pad(a, (1, 2)), [(5, 4)], [0])
  check(lambda a: a[:, 1:3], [(5, 4)], [0])

def test_gather_and_reshard():
  x = np.random.default_rng(3).standard_normal((5, 4)).astype(np.float32)
  t = Tensor(x).shard(D2, 0)
  one = t.to("CPU:1")
  assert one.device == "CPU:1"
  np.testing.assert_array_equal(one.numpy(), x)
  assert t.to(D2) is t  # already there (as torch's to)
  rep = t.shard(D2)  # resharded: replicated
  assert rep.device == D2 and rep.uop.arg is None
  np.testing.assert_array_equal(Tensor(rep.realize().uop.src[1]).numpy(), x)
  np.testing.assert_array_equal(rep.numpy(), x)
  np.testing.assert_array_equal(t.shard(D2, 1).numpy(), x)
  np.testing.assert_array_equal(Tensor(x, device=D2).numpy(), x)

@pytest.mark.parametrize("nbytes", ["direct", "ring"])
def test_allreduce_algorithms(nbytes, monkeypatch):
  monkeypatch.setattr(allreduce, "RING_MIN_BYTES", 1 << 40 if nbytes == "direct" else 0)
  monkeypatch.setattr(allreduce, "PARALLEL_MIN_BYTES", 0)  # a ring step's transfers on threads, even for a few bytes
  x = np.random.default_rng(4).standard_normal((6, 11)).astype(np.float32)
  for devs in (D2, D3):
    t = Tensor(x).shard(devs, 0)
    np.testing.assert_allclose(t.sum(0).numpy(), x.sum(0), rtol=1e-5, atol=1e-6)
    values, indices = t.max(0)
    np.testing.assert_array_equal(values.numpy(), x.max(0))
    np.testing.assert_array_equal(indices.numpy(), x.argmax(0))  # an argmax across the split axis
    parts = [p.numpy() for p in (Tensor(t.sum(0).realize().uop.src[i]) for i in range(len(devs)))]
    for p in parts[1:]: np.testing.assert_array_equal(p, parts[0])  # every device holds the same bits

class MLP:
  def __init__(self, d: int, h: int):
    self.up, self.down = nn.Linear(d, h), nn.Linear(h, d)
  def __call__(self, x: Tensor) -> Tensor: return self.down(self.up(x).gelu())

def test_tensor_parallel_mlp():
  """A transformer MLP block with its hidden axis split over two devices (the first layer's weight by rows, the second's
  by columns, Megatron-style): one all-reduce after the second matmul, and the one-device output."""
  Tensor.manual_seed(1)
  m = MLP(8, 32)
  x = Tensor(np.random.default_rng(5).standard_normal((2, 5, 8)).astype(np.float32))
  ref = m(x).numpy()
  m.up.weight.shard_(D2, 0); m.up.bias.shard_(D2, 0)
  m.down.weight.shard_(D2, 1); m.down.bias.shard_(D2, None)
  out = m(x.to(D2))
  assert out.device == D2
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)
  out.square().mean().backward()  # and it trains: the gradients of the split weights stay split
  assert m.up.weight.grad.device == D2

def _one_step(model, make_opt, X: Tensor, Y: Tensor, devices) -> tuple[list, list]:
  """One training step of model on (X, Y), with its parameters replicated and the batch split over devices (None: one
  device): the gradients, and the parameters after the step."""
  params = get_parameters(model)
  if devices:
    for p in params: p.shard_(devices)
  opt = make_opt(params)
  if devices: X, Y = X.shard(devices, 0), Y.shard(devices, 0)
  with Tensor.train():
    opt.zero_grad()
    model(X).cross_entropy(Y).backward()
    grads = [p.grad.numpy() for p in params]
    opt.step()
  return grads, [p.numpy() for p in params]

def _mlp_step(devices, opt_cls, seed=0):
  Tensor.manual_seed(seed)
  rng = np.random.default_rng(seed)
  x, y = rng.standard_normal((9, 6)).astype(np.float32), rng.integers(0, 6, 9)
  return _one_step(MLP(6, 16), lambda params: opt_cls(params, lr=0.1), Tensor(x), Tensor(y), devices)

@pytest.mark.parametrize("opt_cls", [optim.SGD, optim.Adam])
def test_data_parallel_step_equals_one_device(opt_cls):
  """The batch (9 rows: 5 and 4) split over two devices, the model replicated: the gradients and the parameters after
  one step equal one device's."""
  g1, p1 = _mlp_step(None, opt_cls)
  g2, p2 = _mlp_step(D2, opt_cls)
  for a, b in zip(g1, g2): np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  for a, b in zip(p1, p2): np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)

def test_jit_replays_allreduce():
  w = Tensor(np.ones((4, 3), np.float32)).to(D2).realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x @ w).sum(0).realize()
  rng = np.random.default_rng(6)
  for _ in range(4):
    x = rng.standard_normal((6, 4)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x).shard(D2, 0).realize()).numpy(), (x @ np.ones((4, 3))).sum(0), rtol=1e-5, atol=1e-5)

def test_mnist_convnet_data_parallel_gradients():
  """examples/mnist.py's ConvNet, one Adam step on a batch of 10 images split over two devices (5 and 5): the gradients
  and the updated parameters equal one device's (what `examples/mnist.py --devices 2` relies on)."""
  import importlib.util, pathlib
  spec = importlib.util.spec_from_file_location("mnist_example", pathlib.Path(__file__).parent.parent / "examples" / "mnist.py")
  mnist = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mnist)
  rng = np.random.default_rng(7)
  x, y = rng.integers(0, 256, (10, 1, 28, 28)).astype(np.uint8), rng.integers(0, 10, 10)
  def step(devices):
    Tensor.manual_seed(0)
    return _one_step(mnist.ConvNet(), lambda params: optim.Adam(params, lr=1e-3), mnist.normalize(x), Tensor(y), devices)
  (g1, p1), (g2, p2) = step(None), step(D2)
  for a, b in zip(g1, g2): np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
  for a, b in zip(p1, p2): np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)

def test_other_backends():
  """Parts on different backends (C and the Python reference interpreter): the all-reduce works on any host memory."""
  check(lambda a, b: (a @ b).softmax(0), [(4, 5), (5, 3)], [0, 0], devices=("CPU", "PYTHON:1"))

def test_jit_data_parallel_training_equals_one_device():
  """Three TinyJit steps of data-parallel SGD (the assigns to replicated parameters replayed in place on each device)
  give one device's parameters."""
  rng = np.random.default_rng(8)
  batches = [(rng.standard_normal((8, 6)).astype(np.float32), rng.integers(0, 6, 8)) for _ in range(3)]
  def train(devices):
    Tensor.manual_seed(2)
    m = MLP(6, 16)
    params = get_parameters(m)
    if devices:
      for p in params: p.shard_(devices)
    opt = optim.SGD(params, lr=0.1, momentum=0.9)
    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
      with Tensor.train():
        opt.zero_grad()
        loss = m(x).cross_entropy(y).backward()
        loss.realize(*opt.schedule_step())
      return loss
    for x, y in batches:
      X, Y = Tensor(x), Tensor(y)
      step(X.shard(devices, 0) if devices else X, Y.shard(devices, 0) if devices else Y)
    return [p.numpy() for p in params]
  for a, b in zip(train(None), train(D2)): np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)

def test_clear_errors():
  with pytest.raises(ValueError, match="at least one element"): Tensor.ones(1, 4).shard(D2, 0)
  with pytest.raises(RuntimeError, match="different devices"): (Tensor.ones(6).shard(D2, 0) + Tensor.ones(6).shard(D3, 0)).numpy()
  with pytest.raises(ValueError, match="distinct"): Tensor.ones(4).shard(("CPU", "CPU:0"))

def _allreduce_bits(op, dtype, parts: list[np.ndarray], devices=D3) -> list[np.ndarray]:
  """The all-reduce item run on these parts (16-bit patterns, one a device): what each device holds after."""
  from attograd.runtime.device import Buffer
  bufs = [Buffer(d, p.size, dtype).ensure_allocated() for d, p in zip(devices, parts)]
  for b, p in zip(bufs, parts): b.host_view()[:] = p.astype(np.uint16).tobytes()
  allreduce.AllReduce(op, dtype, devices[:len(parts)], parts[0].size)([b._buf for b in bufs], None)
  return [np.frombuffer(bytes(b.host_view()), np.uint16) for b in bufs]

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_allreduce_16bit_floats_round_once_like_torch(dtype, monkeypatch):
  """float16/bfloat16 parts are combined in float32 and rounded once to nearest even, as torch.sum of such a tensor
  accumulates: every 16-bit pattern survives a max with -inf, and sums of random pairs (normals, subnormals, overflow to inf)
  round as torch rounds the float32 sum."""
  from attograd.dtype import dtypes
  from attograd.uop.ops import Ops
  monkeypatch.setattr(allreduce, "PARALLEL_MIN_BYTES", 0)  # the chunks on threads, even for a few bytes
  dt, tdt = getattr(dtypes, dtype), getattr(torch, dtype)
  def as_torch(bits: np.ndarray) -> "torch.Tensor": return torch.from_numpy(bits.view(np.int16).copy()).view(tdt)
  every = np.arange(1 << 16, dtype=np.uint16)
  ninf = torch.full((1 << 16,), -float("inf"), dtype=tdt).view(torch.int16).numpy().view(np.uint16)
  for got in _allreduce_bits(Ops.MAX, dt, [every, ninf]):
    nan = torch.isnan(as_torch(every)).numpy()
    np.testing.assert_array_equal(got[~nan], every[~nan])
    assert torch.isnan(as_torch(got)[torch.from_numpy(nan)]).all()
  rng = np.random.default_rng(9)
  a, b, c = (rng.integers(0, 1 << 16, 100_000).astype(np.uint16) for _ in range(3))
  want = (as_torch(a).float() + as_torch(b).float() + as_torch(c).float()).to(tdt)
  for got in _allreduce_bits(Ops.ADD, dt, [a, b, c]):
    g = as_torch(got)
    assert torch.equal(torch.isnan(g), torch.isnan(want))
    np.testing.assert_array_equal(g[~torch.isnan(g)].float().numpy(), want[~torch.isnan(want)].float().numpy())

@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sharded_16bit_float_reductions(dtype):
  """A sum, a max (with its argmax) and a matmul across the split axis of float16/bfloat16 tensors, against torch's on one
  device: equal where each device holds one row (a part's reduce is the row itself), within the parts' own rounding else."""
  from attograd.dtype import dtypes
  x = np.random.default_rng(10).standard_normal((3, 37)).astype(np.float32)
  tx = torch.tensor(x).to(getattr(torch, dtype))
  t = Tensor(x).cast(getattr(dtypes, dtype)).shard(D3, 0)
  np.testing.assert_array_equal(t.sum(0).float().numpy(), tx.sum(0).float().numpy())
  values, indices = t.max(0)
  np.testing.assert_array_equal(values.float().numpy(), tx.max(0).values.float().numpy())
  np.testing.assert_array_equal(indices.numpy(), tx.max(0).indices.numpy())
  y = np.random.default_rng(11).standard_normal((9, 6)).astype(np.float32)
  ty = torch.tensor(y).to(getattr(torch, dtype))
  tol = 1e-2 if dtype == "float16" else 5e-2
  got = Tensor(y).cast(getattr(dtypes, dtype)).shard(D2, 0).sum(0).float().numpy()
  np.testing.assert_allclose(got, ty.sum(0).float().numpy(), rtol=tol, atol=tol)
  w = Tensor(np.ones((6, 2), np.float32)).cast(getattr(dtypes, dtype)).shard(D2, 0)
  got = (Tensor(y).cast(getattr(dtypes, dtype)).shard(D2, 1) @ w).float().numpy()
  np.testing.assert_allclose(got, (ty @ torch.ones(6, 2, dtype=ty.dtype)).float().numpy(), rtol=tol, atol=tol)

@pytest.mark.parametrize("devices,shape,src,dst", [(D2, (5, 4), 0, 1), (D3, (7, 6), 1, 0), (D3, (6, 8), 0, 1)])
def test_reshard_copies_only_what_each_device_lacks(devices, shape, src, dst, monkeypatch):
  """Split by rows to split by columns (and back): each device gets from each other only the block it lacks, by copies the
  schedule holds. Their bytes: the tensor's, less the blocks a device already had; an all-gather moved every part to every device."""
  from attograd.engine import realize
  from attograd.schedule.multi import split_bounds
  copied = []
  made = realize.NOT_KERNELS[realize.Ops.COPY]
  monkeypatch.setitem(realize.NOT_KERNELS, realize.Ops.COPY, lambda ast, bufs: copied.append(bufs[0].nbytes) or made(ast, bufs))
  x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
  t = Tensor(x).shard(devices, src).realize()
  copied.clear()
  r = t.shard(devices, dst).realize()
  # (what device i had already: its rows of m's split times its columns of the new one)
  had = sum((e - b) * (f - c) for (b, e), (c, f) in zip(split_bounds(shape[src], len(devices)), split_bounds(shape[dst], len(devices))))
  assert sum(copied) == (x.size - had) * 4, (copied, x.size, had)
  assert [p.shape for p in r.uop.src] == [tuple(e - b if a == dst else s for a, s in enumerate(shape)) for b, e in split_bounds(shape[dst], len(devices))]
  for p, (b, e) in zip(r.uop.src, split_bounds(shape[dst], len(devices))):
    np.testing.assert_array_equal(Tensor(p).numpy(), x[(slice(None),) * dst + (slice(b, e),)])
  np.testing.assert_array_equal(r.numpy(), x)
  check(lambda a, b: a * b + a, [shape, shape], [src, dst], devices=devices)  # mixed shardings, forward and backward

def test_lanes_run_devices_side_by_side_in_device_order():
  """engine/lanes.py: each device's items on a thread of its own, at once (two items of different devices meet at a
  barrier: run one after another, they would time out), each with its share of THREADS, in program order per device; an
  item on both devices waits for each one's earlier items, and their later ones wait for it. An error stops every lane."""
  import threading
  from attograd import Context
  from attograd.engine.lanes import Lanes, lane_cores
  devs = [("A",), ("B",), ("A",), ("B",), ("B", "A"), ("A",), ("B",)]
  meet, log, lock = threading.Barrier(2, timeout=10), [], threading.Lock()
  def call(i: int) -> None:
    if i in (0, 1): meet.wait()  # A's first item and B's first item run at the same time
    with lock: log.append((i, threading.get_ident(), lane_cores()))
  lanes = Lanes(devs)
  with Context(THREADS=4): lanes.run(call)
  order = [i for i, _, _ in log]
  assert sorted(order) == list(range(len(devs))) and {c for _, _, c in log} == {2}
  thread = {i: t for i, t, _ in log}
  assert thread[0] == thread[2] == thread[5] != thread[1] == thread[3] == thread[4] == thread[6]
  for before, after in [(0, 2), (2, 5), (1, 3), (3, 4), (4, 6), (2, 4), (4, 5)]: assert order.index(before) < order.index(after)
  def fails(i: int) -> None:
    if i == 3: raise ValueError("item 3")
  with pytest.raises(ValueError, match="item 3"): Lanes(devs).run(fails)

def test_side_by_side_devices_with_their_own_pools():
  """With 4 THREADS and two devices, each device's threaded kernels run on 2 cores of a pool of its own at once (engine/lanes.py,
  runtime/threadpool.py), and a data-parallel step still equals one device's; with LANES=0 too."""
  from attograd import Context
  with Context(THREADS=4):
    g1, p1 = _mlp_step(None, optim.SGD, seed=3)
    g2, p2 = _mlp_step(D2, optim.SGD, seed=3)
    with Context(LANES=0): g3, p3 = _mlp_step(D2, optim.SGD, seed=3)
  for a, b, c in zip(g1 + p1, g2 + p2, g3 + p3):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b, c)
  from attograd.engine import realize
  from attograd.runtime import threadpool
  x = np.random.default_rng(13).standard_normal((256, 256)).astype(np.float32)
  with Context(THREADS=4):
    a, b = Tensor(x).shard(D2, 0), Tensor(x).to(D2)
    for _ in range(3): np.testing.assert_allclose((a @ b).relu().numpy(), np.maximum(x @ x, 0), rtol=1e-4, atol=1e-4)
  assert any(ck.threads > 1 for (_, dev, *_), ck in realize._kernel_cache.items() if dev == "CPU:1")  # threaded kernels ran
  assert {"CPU", "CPU:1"} <= set(threadpool._pools)  # ... each device's in its own pool

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int32", "bool"])
def test_gather_and_reshard_are_bit_exact(dtype):
  """Parts laid together keep every value's bits: -0.0 stays -0.0 (an add of zero-padded parts gave 0.0), NaN stays NaN."""
  from attograd import dtypes
  x = np.array([[-0.0, 1], [2, -0.0], [-0.0, np.nan], [-3, -0.0], [np.inf, -np.inf]], np.float32)
  if dtype in ("int32", "bool"): x = np.nan_to_num(x, posinf=7, neginf=-7)
  want = torch.tensor(x).to(getattr(torch, dtype))
  t = Tensor(x).cast(getattr(dtypes, dtype)).shard(D2, 0)
  for got in (t.to("CPU:1"), t.shard(D2, 1), t.shard(D2)):
    g = torch.tensor(got.float().numpy()).to(want.dtype) if dtype == "bfloat16" else torch.tensor(got.numpy())
    assert g.dtype == want.dtype and torch.equal(torch.nan_to_num(g), torch.nan_to_num(want))
    if want.is_floating_point(): assert torch.equal(torch.signbit(g), torch.signbit(want)) and torch.equal(g.isnan(), want.isnan())
