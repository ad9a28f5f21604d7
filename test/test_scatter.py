"""A gather's gradient is a scatter-add (schedule.py's scatter_kernel): the table's gradient costs O(tokens x d), not
O(vocab x tokens x d), sums repeated indices, skips out-of-range ones, and gives the same bits on every run."""
import numpy as np
import pytest
import torch
from attograd import Tensor, TinyJit, nn, Context
from attograd.nn import optim
from attograd.codegen import to_program
from attograd.codegen.gpudims import launch_dims, eval_dims
from attograd.codegen.heuristic import gpu_opts
from attograd.codegen.opt import KernelOptError
from attograd.codegen.heuristic import cpu_opts
from attograd.engine import realize, search
from attograd.engine.realize import run_schedule, buffer_of, get_kernel
from attograd.runtime.device import Device
from attograd.runtime.ops_python import PythonProgram
from attograd.uop.ops import AxisKind, Ops
from attograd.uop.spec import verify_kernel
from helpers import DEVICES
from test_gpudims import GPU

rng = np.random.default_rng(0)

def indices(vocab: int, shape: tuple[int, ...]) -> np.ndarray:
  """Random rows, with the first and last row each hit several times and one row hit by every token of a column."""
  idx = rng.integers(0, vocab, shape)
  flat = idx.reshape(-1)
  flat[:3], flat[3:6], flat[6::7] = 0, vocab - 1, vocab // 2
  return idx

def scatter_kernels(t: Tensor) -> list:
  """The scatter-adds among t's kernels (their ASTs loop serially over the table's rows and the tokens)."""
  return [si for si in t.schedule() if si.ast.op is Ops.SINK and any(u.op is Ops.RANGE and u.arg[1] is AxisKind.SERIAL for u in si.ast.toposort)]

@pytest.mark.parametrize("vocab, d", [(90, 64), (50_000, 4)])
def test_embedding_gradient_matches_torch(vocab, d):
  idx, g = indices(vocab, (8, 48)), rng.standard_normal((8, 48, d)).astype(np.float32)
  emb = nn.Embedding(vocab, d)
  (emb(Tensor(idx)) * Tensor(g)).sum().backward()
  assert len(scatter_kernels(emb.weight.grad)) == 1
  ref = torch.nn.Embedding(vocab, d)
  (ref(torch.tensor(idx)) * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(emb.weight.grad.numpy(), ref.weight.grad.numpy(), atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("vocab", [90, 50_000])
def test_gather_gradient_matches_torch(vocab):
  x = rng.standard_normal((6, vocab)).astype(np.float32)
  i1, i0 = indices(vocab, (6, 40)), indices(6, (5, vocab))
  for dim, idx in ((1, i1), (0, i0)):
    a, t = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = a.gather(dim, Tensor(idx))
    (out * out).sum().backward()
    assert len(scatter_kernels(a.grad)) == 1
    out_t = t.gather(dim, torch.tensor(idx))
    (out_t * out_t).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("vocab", [90, 50_000])
def test_advanced_indexing_gradient_matches_torch(vocab):
  x = rng.standard_normal((vocab, 3)).astype(np.float32)
  rows, cols = indices(vocab, (4, 9)), rng.integers(-3, 3, (4, 9))  # negative indices count from the end
  g = rng.standard_normal((4, 9, 3)).astype(np.float32)
  cases = [(lambda w, r, c: w[r], g), (lambda w, r, c: w[r, c], g[..., 0]), (lambda w, r, c: w.T[:, r], g.transpose(2, 0, 1))]
  for f, gr in cases:
    a, t = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    (f(a, Tensor(rows), Tensor(cols)) * Tensor(gr)).sum().backward()
    assert len(scatter_kernels(a.grad)) == 1
    (f(t, torch.tensor(rows), torch.tensor(cols)) * torch.tensor(gr)).sum().backward()
    np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), atol=1e-5, rtol=1e-5)

@pytest.mark.parametrize("vocab", [90, 50_000])
def test_cross_entropy_gradient_matches_torch(vocab):
  logits, target = rng.standard_normal((8, vocab)).astype(np.float32), indices(vocab, (8,))
  a, t = Tensor(logits, requires_grad=True), torch.tensor(logits, requires_grad=True)
  a.cross_entropy(Tensor(target)).backward()
  torch.nn.functional.cross_entropy(t, torch.tensor(target)).backward()
  np.testing.assert_allclose(a.grad.numpy(), t.grad.numpy(), atol=1e-6, rtol=1e-4)

def _embedding_grad(vocab: int, d: int, idx: np.ndarray, g: np.ndarray, device: str = "CPU", lazy: bool = False) -> Tensor:
  emb = nn.Embedding(vocab, d)
  emb.weight = Tensor(np.zeros((vocab, d), np.float32), device=device, requires_grad=True)
  i = Tensor(idx, device=device)
  (emb(i + 0 if lazy else i) * Tensor(g, device=device)).sum().backward()
  return emb.weight.grad

def test_scatter_work_does_not_grow_with_vocab():
  # the same tokens into a table 100x bigger: the kernel adds the same rows (its op count counts float math in loops)
  idx, g = rng.integers(0, 100, (16, 64)), rng.standard_normal((16, 64, 32)).astype(np.float32)
  ops = []
  for vocab in (100, 10_000):
    (si,) = scatter_kernels(_embedding_grad(vocab, 32, idx, g))
    ops.append(get_kernel(si.ast, "CPU").ops)
  assert ops[0] == ops[1] == 16 * 64 * 32

def test_out_of_range_indices_raise():
  # nn.Embedding raises for a row outside the table, as torch does: an index in memory at the call, a lazy one at the realize
  vocab, d = 10, 4
  raw = np.array([[0, 3, 10, -1], [9, 12, 3, -5]])
  g = rng.standard_normal((2, 4, d)).astype(np.float32)
  with pytest.raises(IndexError): _embedding_grad(vocab, d, raw, g)
  with pytest.raises(IndexError, match="out of bounds"): _embedding_grad(vocab, d, raw, g, lazy=True).numpy()
  # advanced indexing with a lazy index tensor checks it with the realize, as torch raises
  w = Tensor(np.ones((vocab, d), np.float32), requires_grad=True)
  with pytest.raises(IndexError, match="out of bounds"): w[Tensor(raw) + 0].numpy()
  ok = np.where((raw >= -vocab) & (raw < vocab), raw, 0)
  (w[Tensor(ok) + 0] * Tensor(g)).sum().backward()
  want = np.zeros((vocab, d), np.float32)
  for i, v in np.ndenumerate(ok): want[v % vocab] += g[i]
  np.testing.assert_allclose(w.grad.numpy(), want, atol=1e-6)

def test_bit_identical_across_runs_and_cores():
  # big enough that the columns are split across cores; each column's tokens are added in one order
  vocab, d = 50_000, 64
  idx, g = indices(vocab, (16, 256)), rng.standard_normal((16, 256, d)).astype(np.float32)
  runs = []
  for threads in (2, 2, 1):
    realize._kernel_cache.clear()
    with Context(THREADS=threads):
      grad = _embedding_grad(vocab, d, idx, g)
      (si,) = scatter_kernels(grad)
      runs.append((grad.numpy(), get_kernel(si.ast, "CPU").threads))
  assert [t for _, t in runs] == [2, 2, 1], "the heuristics should thread a scatter this big"
  for grad, _ in runs[1:]: np.testing.assert_array_equal(grad, runs[0][0])
  want = np.zeros((vocab, d), np.float64)
  np.add.at(want, idx.reshape(-1), g.reshape(-1, d).astype(np.float64))
  np.testing.assert_allclose(runs[0][0], want, atol=1e-4)

@pytest.mark.parametrize("device, d", [("CPU", 48), ("CPU", 30), ("PYTHON", 30)])
def test_every_opt_search_tries_is_right(device, d):
  # BEAM may pick any legal action on a scatter's output axes; none may split the token loop or lose an add (a padded
  # axis must not read past the table either: the PYTHON device checks every address)
  vocab = 40
  idx, g = indices(vocab, (2, 24)), rng.standard_normal((2, 24, d)).astype(np.float32)
  want = np.zeros((vocab, d), np.float32)
  np.add.at(want, idx.reshape(-1), g.reshape(-1, d))
  grad = _embedding_grad(vocab, d, idx, g, device)
  *before, si = grad.schedule()
  run_schedule(before)
  bufs = [buffer_of(b).ensure_allocated() for b in si.bufs]
  tried = 0
  for opt in search.actions(si.ast, 2 if Device[device].renderer.has_threads else 1):
    try: ck = realize.compile_kernel(si.ast, device, [opt])
    except KernelOptError: continue
    ck([b._buf for b in bufs], {})
    got = np.frombuffer(bytes(bufs[0].as_bytes()), dtype=np.float32).reshape(vocab, d)
    np.testing.assert_allclose(got, want, atol=1e-5, err_msg=str(opt))
    tried += 1
  assert tried >= 4

@pytest.mark.parametrize("device", [d for d in DEVICES if d != "CPU"])
def test_scatter_on_other_devices(device):
  vocab, d = 30, 8
  idx, g = indices(vocab, (3, 20)), rng.standard_normal((3, 20, d)).astype(np.float32)
  w = Tensor(np.zeros((vocab, d), np.float32), device=device, requires_grad=True)
  (w[Tensor(idx, device=device)] * Tensor(g, device=device)).sum().backward()
  assert len(scatter_kernels(w.grad)) == 1
  want = np.zeros((vocab, d), np.float32)
  np.add.at(want, idx.reshape(-1), g.reshape(-1, d))
  np.testing.assert_allclose(w.grad.numpy(), want, atol=1e-5)

def test_scatter_on_an_emulated_gpu():
  # output columns become thread ids; the loops over the table's rows and the tokens stay loops in each thread
  vocab, d = 30, 8
  idx, g = indices(vocab, (3, 20)), rng.standard_normal((3, 20, d)).astype(np.float32)
  *before, si = _embedding_grad(vocab, d, idx, g, "PYTHON").schedule()  # the kernel writes the (vocab, d) gradient
  run_schedule(before)
  bufs = [buffer_of(b).ensure_allocated() for b in si.bufs]
  name, src, uops = to_program(si.ast, GPU, gpu_opts(si.ast, GPU))
  assert any(u.op is Ops.SPECIAL for u in uops) and any(u.op is Ops.RANGE and u.arg[1] is AxisKind.SERIAL for u in uops)
  verify_kernel(uops[-1])
  groups, local = launch_dims(uops)
  PythonProgram(name, src.encode())([b._buf for b in bufs], [], eval_dims(groups, {}), local)
  want = np.zeros((vocab, d), np.float32)
  np.add.at(want, idx.reshape(-1), g.reshape(-1, d))
  np.testing.assert_allclose(np.frombuffer(bytes(bufs[0].as_bytes()), dtype=np.float32).reshape(vocab, d), want, atol=1e-5)

def test_sgd_step_on_an_embedding_under_jit():
  # with plain SGD the gradient would fuse into the weight update (a dense sum per row): it is stored, as a scatter
  vocab, d = 50, 8
  w0 = rng.standard_normal((vocab, d)).astype(np.float32)
  emb, ref = nn.Embedding(vocab, d), torch.nn.Embedding(vocab, d)
  emb.weight.assign(Tensor(w0)).realize()
  with torch.no_grad(): ref.weight.copy_(torch.tensor(w0))
  opt, opt_t = optim.SGD([emb.weight], lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
  @TinyJit
  def step(i: Tensor) -> Tensor:
    opt.zero_grad()
    loss = (emb(i) ** 2).sum().backward()
    opt.step()
    return loss.realize()
  for _ in range(4):
    idx = indices(vocab, (4, 10))
    step(Tensor(idx))
    opt_t.zero_grad()
    (ref(torch.tensor(idx)) ** 2).sum().backward()
    opt_t.step()
  np.testing.assert_allclose(emb.weight.numpy(), ref.weight.detach().numpy(), atol=1e-5, rtol=1e-5)

def test_scatter_opts_are_chosen_for_the_scatter():
  idx, g = rng.integers(0, 100, (16, 64)), rng.standard_normal((16, 64, 64)).astype(np.float32)
  (si,) = scatter_kernels(_embedding_grad(100, 64, idx, g))
  opts = cpu_opts(si.ast, 2)
  assert opts and opts[0].op.name == "SIMD", "a token's row is added as a vector"
