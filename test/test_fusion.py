"""Fusion: how many kernels a graph becomes (GlobalCounters), and that the fused result is right."""
import numpy as np
import pytest
from attograd import Tensor, GlobalCounters, dtypes

rng = np.random.default_rng(0)
def rand(*shape): return rng.standard_normal(shape).astype(np.float32)
def tensors(*arrays): return [Tensor(a).realize() for a in arrays]  # inputs realized before counting

def run(t):
  """(kernels run, value) for realizing t (a view of a realized buffer needs .contiguous() to run anything)."""
  GlobalCounters.reset()
  t.realize()
  k = GlobalCounters.kernel_count
  return k, t.numpy()

def check(t, want, kernels, atol=1e-5):
  k, got = run(t)
  np.testing.assert_allclose(got, want, atol=atol, rtol=1e-5)
  assert k == kernels, f"expected {kernels} kernel(s), ran {k}"

def test_elementwise_is_one_kernel():
  na, nb, nc = rand(8, 5), rand(8, 5), rand(8, 5)
  a, b, c = tensors(na, nb, nc)
  check((a + b) * c, (na + nb) * nc, 1)
  check(((a + b) * c - a / (b.abs() + 1)).relu().exp(), np.exp(np.maximum((na + nb) * nc - na / (np.abs(nb) + 1), 0)), 1)

def test_broadcast_is_one_kernel():
  nr, nc = rand(6, 1), rand(1, 7)
  r, c = tensors(nr, nc)
  check(r * c + r, nr * nc + nr, 1)

def test_elementwise_then_reduce_is_one_kernel():
  na, nb, nc = rand(8, 5), rand(8, 5), rand(8, 5)
  a, b, c = tensors(na, nb, nc)
  check(((a + b) * c).sum(1), ((na + nb) * nc).sum(1), 1)
  check(((a + b) * c).sum(), ((na + nb) * nc).sum(), 1, atol=1e-4)
  check((a * b).max(axis=0), (na * nb).max(0), 1)

def test_permute_contiguous_is_one_kernel():
  na = rand(5, 7)
  (a,) = tensors(na)
  check(a.permute(1, 0).contiguous(), na.T, 1)
  check((a.reshape(5, 7, 1).permute(2, 1, 0) * 2).contiguous(), na.T[None] * 2, 1)

def test_matmul_relu_is_one_kernel():
  na, nb = rand(6, 9), rand(9, 4)
  a, b = tensors(na, nb)
  check((a @ b).relu(), np.maximum(na @ nb, 0), 1, atol=1e-4)
  assert GlobalCounters.global_ops >= 2 * 6 * 9 * 4

def test_reshape_expand_sum_has_no_copy_kernel():
  na = rand(4, 3)
  (a,) = tensors(na)
  check(a.reshape(12, 1).expand(12, 5).sum(), na.sum() * 5, 1, atol=1e-4)
  check(a.reshape(4, 1, 3).expand(4, 6, 3).sum(1), na * 6, 1, atol=1e-4)

def test_movement_chain_is_one_kernel():
  na = rand(5, 6)
  (a,) = tensors(na)
  want = np.pad(na, ((1, 2), (0, 3)))[::-1, 1:8][1:6, ::2]
  check(a.pad(((1, 2), (0, 3))).flip(0).shrink(((0, 8), (1, 8)))[1:6, ::2].contiguous(), want, 1)

def test_softmax_kernels():
  na = rand(6, 10)
  (a,) = tensors(na)
  e = np.exp(na - na.max(1, keepdims=True))
  k, got = run(a.softmax(1))
  np.testing.assert_allclose(got, e / e.sum(1, keepdims=True), atol=1e-6, rtol=1e-5)
  assert k <= 3, f"softmax ran {k} kernels"

def test_one_reduce_read_twice_is_computed_once():
  # logsumexp reads its row max inside the sum and again outside it: one kernel, with the max computed once
  from attograd.uop.ops import Ops
  na = rand(6, 10)
  (a,) = tensors(na)
  t = a.logsumexp(1)
  (si,) = t.schedule()
  assert sum(1 for u in si.ast.toposort if u.op is Ops.REDUCE) == 2  # the max, and the sum of exps
  m = na.max(1, keepdims=True)
  np.testing.assert_allclose(t.numpy(), (m + np.log(np.exp(na - m).sum(1, keepdims=True)))[:, 0], atol=1e-6, rtol=1e-6)

def test_realized_tensor_runs_nothing():
  na, nb = rand(3, 4), rand(3, 4)
  a, b = tensors(na, nb)
  t = (a + b).realize()
  k, got = run(t)
  assert k == 0
  np.testing.assert_allclose(got, na + nb)
  GlobalCounters.reset()
  (t * 2).realize()  # t is a buffer now: a + b is not recomputed
  assert GlobalCounters.kernel_count == 1

def test_two_outputs_realized_together():
  na, nb = rand(3, 4), rand(3, 4)
  a, b = tensors(na, nb)
  x, y = a + b, (a * b).sum(0)
  GlobalCounters.reset()
  Tensor.realize(x, y)
  assert GlobalCounters.kernel_count == 2
  np.testing.assert_allclose(x.numpy(), na + nb, rtol=1e-6)
  np.testing.assert_allclose(y.numpy(), (na * nb).sum(0), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("name, ours, ref, kernels", [
  ("softmax_rows", lambda t: t.softmax(1), lambda a: np.exp(a - a.max(1, keepdims=True)) / np.exp(a - a.max(1, keepdims=True)).sum(1, keepdims=True), 1),
  ("log_softmax_rows", lambda t: t.log_softmax(1), lambda a: (a - a.max(1, keepdims=True)) - np.log(np.exp(a - a.max(1, keepdims=True)).sum(1, keepdims=True)), 1),
  ("layernorm_rows", lambda t: t.layernorm(1), lambda a: (a - a.mean(1, keepdims=True)) / np.sqrt(a.var(1, keepdims=True) + 1e-5), 1),
  # along columns the row loop is outside: keeping the reduce inline would recompute it per row
  ("center_columns", lambda t: t - t.mean(0, keepdim=True), lambda a: a - a.mean(0, keepdims=True), 2),
])
def test_row_reductions_stay_in_one_kernel(name, ours, ref, kernels):
  a = np.random.default_rng(1).standard_normal((33, 70)).astype(np.float32)
  t = Tensor(a).realize()
  GlobalCounters.reset()
  out = ours(t).realize()
  assert GlobalCounters.kernel_count == kernels
  np.testing.assert_allclose(out.numpy(), ref(a), atol=1e-5, rtol=1e-5)

def test_a_buffer_whose_reads_simplify_away_is_no_kernel_argument():
  b = Tensor(np.ones((2, 3), np.float32)).realize()
  padded = Tensor.empty(0, 3).pad(((0, 2), (0, 0)))  # all padding: the empty buffer is never read
  assert (padded + b).tolist() == [[1.0] * 3] * 2 and (b + padded).tolist() == [[1.0] * 3] * 2

def test_nested_reduces_share_one_accumulator():
  # sums over a padded window one axis at a time (a conv's backward) become one reduce over both axes
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  from attograd.codegen import lowered
  from attograd.runtime.device import Device
  na = rand(4, 6, 5)
  a, = tensors(na)
  t = a.pad(((0, 0), (1, 1), (0, 0))).sum(2).pad(((0, 0), (0, 2))).sum(1)
  asts = [si.ast for si in create_schedule([t.uop])[0]]
  assert len(asts) == 1 and sum(u.op is Ops.DEFINE_REG for u in lowered(asts[0], Device["CPU"].renderer).toposort) == 1
  check(t, na.sum((1, 2)), 1)
  m = a.max(axis=2).max(axis=1)
  assert sum(u.op is Ops.DEFINE_REG for u in lowered(create_schedule([m.uop])[0][0].ast, Device["CPU"].renderer).toposort) == 1
  check(m, na.max((1, 2)), 1)

def test_conv_backward_reads_its_output_gradient_from_one_buffer():
  # conv -> relu -> max_pool: the pool's gradient is elementwise (its windows don't overlap: no sum over the
  # window), and the gradient at the conv's output is computed once for the weight, input and bias gradients
  import torch
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  rng = np.random.default_rng(0)
  nx, nw, nb = rng.standard_normal((4, 3, 10, 10)).astype(np.float32), rng.standard_normal((5, 3, 3, 3)).astype(np.float32), \
    rng.standard_normal(5).astype(np.float32)
  x, w, b = (Tensor(v, requires_grad=True) for v in (nx, nw, nb))
  x.conv2d(w, b).relu().max_pool2d(2).sum().backward()
  sched = create_schedule([x.grad.uop, w.grad.uop, b.grad.uop])[0]
  pool_grad = [si for si in sched if si.ast.op is Ops.SINK and not any(u.op is Ops.REDUCE for u in si.ast.toposort)]
  assert len(pool_grad) == 1, "one elementwise kernel: the pool's and the relu's gradient at the conv's output"
  assert sum(pool_grad[0].bufs[0] in si.bufs[1:] for si in sched) == 3, "read by the weight, input and bias gradients"
  tx, tw, tb = (torch.tensor(v, requires_grad=True) for v in (nx, nw, nb))
  torch.nn.functional.max_pool2d(torch.nn.functional.conv2d(tx, tw, tb).relu(), 2).sum().backward()
  for ours, theirs in ((x, tx), (w, tw), (b, tb)): np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-4, rtol=1e-4)

def test_exp_broadcast_into_a_matmul_is_computed_once():
  # exp(a) @ b would redo each exp once per output column tile: the exp gets its own kernel, the matmul reads it
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  na, nb = rand(16, 10), rand(10, 40)
  a, b = tensors(na, nb)
  t = a.exp() @ b
  mm = create_schedule([t.uop])[0][-1].ast
  assert not any(u.op is Ops.EXP2 for u in mm.toposort), "the matmul recomputes the exp"
  check(t, np.exp(na) @ nb, 2, atol=1e-4)
  # an exp that is not broadcast stays fused
  check((a.exp() * 2).sum(1), (np.exp(na) * 2).sum(1), 1, atol=1e-4)

def test_gathers_read_one_row_per_output():
  # an embedding lookup, gather and cross entropy's pick are one-hot sums over the table's rows: indexing reads the one
  # row each output needs, so their work doesn't grow with the vocabulary
  from attograd import nn
  ops = []
  for vocab in (100, 50_000):
    emb = nn.Embedding(vocab, 64)
    nidx = rng.integers(0, vocab, (16, 64))
    emb.weight.realize()
    idx = Tensor(nidx).realize()
    k, got = run(emb(idx))
    assert k == 1
    np.testing.assert_array_equal(got, emb.weight.numpy()[nidx])
    ops.append(GlobalCounters.global_ops)
  assert ops[0] == ops[1] <= 16 * 64 * 64
  nx = rand(64, 1000)
  (x,) = tensors(nx)
  nidx = rng.integers(0, 1000, (64, 3))
  k, got = run(x.gather(1, Tensor(nidx)))
  np.testing.assert_array_equal(got, np.take_along_axis(nx, nidx, 1))
  assert GlobalCounters.global_ops < 64 * 1000, "the gather reads 3 values per row, not the row"

@pytest.mark.parametrize("dtype", ["uint8", "int64", "float16", "bool"])
def test_gathers_of_every_dtype_read_one_row_per_output(dtype):
  # a sum of small ints widens (to int64): the pick of an image set (tinygrad's X_train[samples] on uint8 MNIST) was a
  # loop over all 60,000 images per output, 40 s a batch; every dtype's pick is a gather: one kernel, no loop
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  nx = rng.integers(0, 2 if dtype == "bool" else 100, (5000, 3, 8)).astype(dtype)
  x, nidx = Tensor(nx).realize(), rng.integers(-5000, 5000, (32,))
  y = x[Tensor(nidx)]
  sched = create_schedule([y.uop])[0]
  assert len(sched) == 1 and not any(u.op is Ops.REDUCE for u in sched[0].ast.toposort), "the pick loops over the table"
  np.testing.assert_array_equal(y.numpy(), nx[nidx])

def test_cross_entropy_gradient_does_not_loop_over_the_vocabulary():
  # its row sum of (a row constant + a one-hot) is the constant times the vocabulary plus the target's pick, not a loop
  # over the vocabulary adding the same value (written out 128 rows wide: half a second of gcc for a 25 us kernel)
  import torch
  for vocab in (90, 5000):
    nx, nt = rand(64, vocab), rng.integers(0, vocab, (64,))
    x = Tensor(nx, requires_grad=True)
    x.cross_entropy(Tensor(nt)).backward()
    k, got = run(x.grad)
    tx = torch.tensor(nx, requires_grad=True)
    torch.nn.functional.cross_entropy(tx, torch.tensor(nt)).backward()
    np.testing.assert_allclose(got, tx.grad.numpy(), atol=1e-6, rtol=1e-5)
  n, v = rand(64, 1), rand(64, 1)
  a, b = tensors(n, v)
  hit = Tensor.arange(90).reshape(1, 90) == Tensor(rng.integers(0, 90, (64, 1))).realize()
  s = (a.expand(64, 90) + hit.where(b.expand(64, 90), 0)).sum(1)
  _, got = run(s)
  np.testing.assert_allclose(got, 90 * n[:, 0] + v[:, 0], rtol=1e-5)
  assert GlobalCounters.global_ops < 64 * 90, "the sum is a multiply and a pick per row, no loop over the 90"

def test_transformer_block_kernel_ceiling():
  # a pre-norm transformer block (layernorm, qkv, causal attention, projection, layernorm, GELU MLP) forward and backward:
  # the cost model stores what fusing would repeat and fuses the rest
  from attograd import nn
  Tensor.manual_seed(0)
  ln1, ln2, qkv, proj, fc1, fc2 = nn.LayerNorm(64), nn.LayerNorm(64), nn.Linear(64, 192), nn.Linear(64, 64), nn.Linear(64, 256), nn.Linear(256, 64)
  params = [p for m in (ln1, ln2, qkv, proj, fc1, fc2) for p in (m.weight, m.bias)]
  Tensor.realize_all(params)
  x = Tensor.randn(16, 64, 64).realize()
  q, k, v = [t.reshape(16, 64, 4, 16).transpose(1, 2) for t in qkv(ln1(x)).chunk(3, dim=-1)]
  h = x + proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(16, 64, 64))
  out = h + fc2(fc1(ln2(h)).gelu())
  loss = out.square().mean()
  grads = loss.gradient(*params)
  GlobalCounters.reset()
  Tensor.realize_all([loss, *grads])
  assert GlobalCounters.kernel_count <= 48, GlobalCounters.kernel_count  # 45

def test_gelu_forward_and_gradient_share_one_stored_cdf():
  # a GELU before a matmul, forward and backward: its normal cdf (which both compute) is stored once, the forward
  # multiplies it by x, the input gradient is fused after its matmul as (cdf + x*pdf) * grad, not the chain rule
  # through every step of the cdf's polynomial (which took 8 kernels of partial sums)
  import torch
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  nx, nw, ng = rand(256, 64), rand(64, 32), rand(256, 32)
  x, w, g = tensors(nx, nw, ng)
  x.requires_grad_(); w.requires_grad_()
  ((x.gelu() @ w) * g).sum().backward()
  sched = create_schedule([x.grad.uop, w.grad.uop])[0]
  assert not any(u.op is Ops.WITH_DERIVATIVE for si in sched for u in si.ast.toposort)
  GlobalCounters.reset()
  Tensor.realize_all([x.grad, w.grad])
  assert GlobalCounters.kernel_count == 4, GlobalCounters.kernel_count
  tx, tw = torch.tensor(nx, requires_grad=True), torch.tensor(nw, requires_grad=True)
  ((torch.nn.functional.gelu(tx) @ tw) * torch.tensor(ng)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), atol=1e-4, rtol=1e-5)

def test_tanh_gelu_stores_its_tanh_not_one_plus_it():
  # a tanh-GELU before a matmul, forward and backward: 1 + tanh(u) is shared by the forward and the gradient, and got a
  # buffer of its own before tanh(u) did; with tanh(u) stored, adding 1 is cheaper to repeat than a kernel that only adds 1
  # (1M elements a layer of a d=128 GPT): 4 kernels, not 5
  import torch
  nx, nw, ng = rand(256, 64), rand(64, 32), rand(256, 32)
  x, w, g = tensors(nx, nw, ng)
  x.requires_grad_(); w.requires_grad_()
  ((x.gelu("tanh") @ w) * g).sum().backward()
  GlobalCounters.reset()
  Tensor.realize_all([x.grad, w.grad])
  assert GlobalCounters.kernel_count == 4, GlobalCounters.kernel_count
  tx, tw = torch.tensor(nx, requires_grad=True), torch.tensor(nw, requires_grad=True)
  ((torch.nn.functional.gelu(tx, approximate="tanh") @ tw) * torch.tensor(ng)).sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), atol=1e-4, rtol=1e-5)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), atol=1e-4, rtol=1e-5)

def test_a_wide_tanh_gelu_computes_its_sigmoid_in_both_kernels(monkeypatch):
  # a d=128 GPT's MLP, forward and backward: past what L2 keeps ((2048, 512), 4 MiB) the sigmoid the GELU's forward and
  # its gradient share is computed by each, not stored: stored, the forward was two kernels (the sigmoid, then x * it)
  # and the gradient read it back (12 kernels of the GPT's step 15.4 -> 9.8 ms, one core). One kernel fewer
  import torch
  import attograd.schedule.schedule as sched
  nx, n1, n2, ng = rand(2048, 128), rand(128, 512) * 0.1, rand(512, 128) * 0.1, rand(2048, 128)
  def kernels() -> tuple[int, list]:
    x, w1, w2, g = tensors(nx, n1, n2, ng)
    w1.requires_grad_(); w2.requires_grad_()
    (((x @ w1).gelu("tanh") @ w2) * g).sum().backward()
    GlobalCounters.reset()
    Tensor.realize_all([w1.grad, w2.grad])
    return GlobalCounters.kernel_count, [w1.grad.numpy(), w2.grad.numpy()]
  monkeypatch.setattr(sched, "CACHELEVEL", 1)  # schedules made here, with the switch below, not read from the disk cache
  sched._schedule_cache.clear()
  ours, grads = kernels()
  monkeypatch.setattr(sched, "WIDE_PASS_FACTOR", 1)
  sched._schedule_cache.clear()
  stored, _ = kernels()
  assert ours == stored - 1, (ours, stored)
  tx, t1, t2 = torch.tensor(nx), torch.tensor(n1, requires_grad=True), torch.tensor(n2, requires_grad=True)
  ((torch.nn.functional.gelu(tx @ t1, approximate="tanh") @ t2) * torch.tensor(ng)).sum().backward()
  np.testing.assert_allclose(grads[0], t1.grad.numpy(), atol=2e-3, rtol=1e-4)
  np.testing.assert_allclose(grads[1], t2.grad.numpy(), atol=2e-3, rtol=1e-4)

def test_costly_values_are_not_repeated_inside_other_kernels():
  from attograd.uop.ops import Ops
  from attograd.schedule.schedule import create_schedule
  na, nb = rand(64, 32), rand(32, 48)
  a, b = tensors(na, nb)
  # a GELU feeding a matmul would be computed once per output tile: it gets a kernel of its own
  t = a.gelu() @ b
  mm = create_schedule([t.uop])[0][-1].ast
  assert not any(u.op is Ops.EXP for u in mm.toposort), "the matmul recomputes the GELU"
  import torch
  check(t, (torch.nn.functional.gelu(torch.tensor(na)) @ torch.tensor(nb)).numpy(), 2, atol=1e-4)
  # a reduce one kernel would compute in two loop nests (attention's dP = dO @ V^T, read by the softmax gradient's row
  # sum and again per output) is stored: every kernel computes each dot product once
  ng, nv, np_ = rand(4, 16, 8), rand(4, 16, 8), rand(4, 16, 16)
  g, v, p = tensors(ng, nv, np_)
  dp = g @ v.transpose(-1, -2)
  ds = p * (dp - (dp * p).sum(-1, keepdim=True))
  sched = create_schedule([ds.uop])[0]
  assert len(sched) == 2 and all(sum(u.op is Ops.REDUCE for u in si.ast.toposort) <= 1 for si in sched)
  ndp = ng @ nv.transpose(0, 2, 1)
  check(ds, np_ * (ndp - (ndp * np_).sum(-1, keepdims=True)), 2, atol=1e-4)

def test_loops_that_read_as_one_are_merged():
  # a linear layer over (batch, tokens, features): every index reads batch and token as b*T + t, so they are one loop of
  # B*T rows (a matmul tiles all of them under each weight panel it packs); a transposed read keeps its axes apart
  from attograd.codegen.opt import global_ranges
  x, w = Tensor.empty(16, 64, 32), Tensor.empty(48, 32)
  (si,) = (x @ w.T).schedule()
  assert [r.src[0].arg for r in global_ranges(si.ast)] == [16 * 64, 48]
  (si,) = (x.transpose(0, 1) @ w.T).contiguous().schedule()
  assert [r.src[0].arg for r in global_ranges(si.ast)] == [64, 16, 48]
  nx, nw = rand(4, 8, 6), rand(5, 6)
  a, b = tensors(nx, nw)
  check(a @ b.T, nx @ nw.T, 1)
  check((a.transpose(0, 1) @ b.T).contiguous(), nx.transpose(1, 0, 2) @ nw.T, 1)

def test_signed_zero_and_nan_constants():
  # a constant is its bits: -0.0 is not 0.0 (1/(x*c) is -inf, not inf, though the two graphs look alike), and a graph
  # with a NaN finds its schedule again
  from attograd.schedule import schedule as S
  x = tensors(np.array([1.0, 2.0], np.float32))[0]
  assert (1 / (x * 0.0)).tolist() == [np.inf, np.inf] and (1 / (x * -0.0)).tolist() == [-np.inf, -np.inf]
  (x + float("nan")).realize()
  n = len(S._schedule_cache)
  (x + float("nan")).realize()
  assert len(S._schedule_cache) == n

def test_a_long_sum_into_many_outputs_is_summed_in_chunks():
  # a weight gradient over 4096 tokens: partial sums over 4 chunks of 1024, then the partials (2 kernels); over 1024 tokens,
  # or into few outputs (a bias gradient), one kernel
  na, nb = rand(4096, 64), rand(4096, 1024)
  a, b = tensors(na, nb)
  check(a.T @ b, na.T.astype(np.float64) @ nb, 2, atol=2e-3)
  check(a[:1024].T @ b[:1024], na[:1024].T.astype(np.float64) @ nb[:1024], 1, atol=1e-3)
  check(b.sum(0), nb.astype(np.float64).sum(0), 1, atol=1e-3)
  # an embedding lookup over a 4096-row table into 65536 outputs is a gather (no loop over the table), not a long sum
  from attograd import nn
  emb, nw = nn.Embedding(4096, 128), rand(4096, 128)
  emb.weight = Tensor(nw).realize()
  idx = Tensor(rng.integers(0, 4096, (8, 64)).astype(np.int32)).realize()
  check(emb(idx), nw[idx.numpy()], 1)

def test_a_long_sums_chunk_keeps_its_narrower_operand_in_l2():
  # chunks of 1024 where the narrower operand's chunk fits half of L2 (a d=128 model's 128-wide one: 0.5 MiB), else 512
  # (a d=384 model's 384-wide one, 1.5 MiB a chunk of 1024: one core, (4096, 1536)^T @ (4096, 384) 138 -> 83 ms)
  from attograd.schedule.schedule import split_chunk
  assert [split_chunk(n, kept, 4) for n, kept in ((4096, [1536, 384]), (4096, [384, 1536]), (4096, [384, 384]), (2048, [512, 128]),
                                                  (4096, [384, 1, 384]), (4096, [1 << 16]), (2560, [384, 384]))] == [512, 512, 512, 1024, 512, 1024, None]
  # a d=384 weight gradient over 4096 tokens: 8 partials of 512, then their sum (2 kernels), equal to the product
  na, nb = rand(4096, 384), rand(4096, 512)
  a, b = tensors(na, nb)
  assert (a.T @ b).schedule()[0].bufs[0].arg.size == 8 * 384 * 512
  check(a.T @ b, na.T.astype(np.float64) @ nb, 2, atol=2e-3)

def test_a_conv_weight_gradient_over_a_batch_is_summed_in_chunks_of_images():
  # dW (16, 16, 5, 5) over 96 images of 20x20: partial sums over chunks of 6 images (the image axes whole), then the 16
  # partials (one kernel more; over the whole batch a tile streamed the batch through the caches once per tile:
  # beautiful_mnist's 5x5 gradient 611 -> 269 ms a core); a short sum (8 images) or few outputs (a bias gradient) don't
  torch = pytest.importorskip("torch")
  nx, ng = rand(96, 16, 24, 24), rand(96, 16, 20, 20)
  def dw(nx: np.ndarray, ng: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
    x, g = tensors(nx, ng)
    w = Tensor.zeros(16, 16, 5, 5).contiguous().realize().requires_grad_()
    x.conv2d(w).backward(g)
    tw = torch.zeros(16, 16, 5, 5, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(nx, dtype=torch.float64), tw).backward(torch.tensor(ng, dtype=torch.float64))
    return *run(w.grad), tw.grad.numpy()
  (k96, got96, want96), (k8, got8, want8) = dw(nx, ng), dw(nx[:8], ng[:8])
  np.testing.assert_allclose(got96, want96, atol=2e-3, rtol=1e-5)
  np.testing.assert_allclose(got8, want8, atol=1e-3, rtol=1e-5)
  assert k96 == k8 + 1, (k96, k8)
  g = tensors(ng)[0]
  check(g.sum((0, 2, 3)), ng.astype(np.float64).sum((0, 2, 3)), 1, atol=1e-3)

def test_a_small_weight_gradient_of_a_one_channel_conv_is_summed_in_chunks_too():
  # dW (32, 1, 5, 5): 800 outputs, fewer than a split sum's 4096, but a product summed (g * x): in chunks of 4 images
  # it gets its channel tile packed per chunk (beautiful_mnist's first conv, one core: 43-55 -> 24-25 ms); a sum of one
  # read into as many outputs (g.sum over images and rows, 800 = 32 x 25 columns) is not split
  torch = pytest.importorskip("torch")
  nx, ng = rand(32, 1, 28, 28), rand(32, 32, 24, 24)
  def dw(nx: np.ndarray, ng: np.ndarray) -> int:
    x, g = tensors(nx, ng)
    w = Tensor.zeros(32, 1, 5, 5).contiguous().realize().requires_grad_()
    x.conv2d(w).backward(g)
    tw = torch.zeros(32, 1, 5, 5, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.conv2d(torch.tensor(nx, dtype=torch.float64), tw).backward(torch.tensor(ng, dtype=torch.float64))
    k, got = run(w.grad)
    np.testing.assert_allclose(got, tw.grad.numpy(), atol=2e-3, rtol=1e-5)
    return k
  assert dw(nx, ng) == dw(nx[:4], ng[:4]) + 1, "partial sums over chunks of images, then their sum (4 images: one chunk)"
  ns = rand(32, 24, 800)
  check(tensors(ns)[0].sum((0, 1)), ns.astype(np.float64).sum((0, 1)), 1, atol=1e-3)

def test_a_conv_under_a_pool_keeps_its_own_kernel():
  # PP-OCR rec: a 1x1 conv + hardswish under a 3x2 average pool. Fused, the conv's sum over 64 channels was one loop of
  # the pool's nest, with no register tile (24 ms at 4 GFLOPS a core): the conv gets a buffer, the pool reads it (3
  # kernels with the pool's count of window elements; 2 fused). A short sum under a reduce (a window) and a row mean under its variance (read through an expand) stay fused
  torch = pytest.importorskip("torch")
  nx, nw = rand(1, 64, 3, 16), rand(48, 64, 1, 1)
  x, w = tensors(nx, nw)
  want = torch.nn.functional.avg_pool2d(torch.nn.functional.hardswish(torch.nn.functional.conv2d(torch.tensor(nx), torch.tensor(nw))), (3, 2)).numpy()
  check(x.conv2d(w).hardswish().avg_pool2d((3, 2)), want, 3, atol=1e-4)
  na = rand(8, 256)
  a = tensors(na)[0]
  check(a.layernorm(1), (na - na.mean(1, keepdims=True)) / np.sqrt(na.var(1, keepdims=True) + 1e-5), 1, atol=1e-4)

def test_a_concatenation_of_reductions_computes_each_in_its_own_kernel():
  # gradients laid end to end: each matmul keeps its own loops (and register tile), the cat only copies; as one kernel
  # every piece was a gated reduce over the padded output (an MLP's 4 gradients: 154 ms)
  na, nb, nc = rand(64, 96), rand(96, 80), rand(64, 32)
  a, b, c = tensors(na, nb, nc)
  k, got = run(Tensor.cat((a @ b).flatten(), c.sum(0), (a.T @ c).flatten()))
  want = np.concatenate([(na @ nb).ravel(), nc.sum(0), (na.T @ nc).ravel()])
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)
  assert k == 4, k

def test_weights_dequantized_from_bytes_stay_in_the_matmul():
  # a matmul over many rows reads each weight once per row, as it reads a conv's input: but a value wider than all it is
  # computed from (floats from bytes and half-precision scales) stays in its readers, the weights quantized in memory
  # (SmolLM2's decode step wrote its whole tied embedding table as floats every token: 2.3x slower, 100 MiB more)
  rng = np.random.default_rng(0)
  q, d = rng.integers(0, 16, (2048, 64), dtype=np.uint8), rng.standard_normal((2048, 1)).astype(np.float16)
  x = rng.standard_normal((256, 64)).astype(np.float32)  # 256 rows: each weight computed 256 times
  tq, td, tx, tw = Tensor(q).realize(), Tensor(d).realize(), Tensor(x).realize(), Tensor(q.astype(np.float32)).realize()
  def kernels(out: Tensor) -> int:
    GlobalCounters.reset()
    out.realize()
    return GlobalCounters.kernel_count
  out = tx @ (tq.cast(dtypes.float32) * td.cast(dtypes.float32)).T
  assert kernels(out) == kernels(tx @ tw.T), "as many kernels as the matmul of float weights: none for the dequantization"
  np.testing.assert_allclose(out.numpy(), x @ (q.astype(np.float32) * d.astype(np.float32)).T, rtol=1e-4, atol=1e-3)
  # the scales kept as float32 (nn.quant.split_fields): a block's scale is broadcast over its elements, so the
  # elements still come from bytes (it stored the whole table again, 50 ms a token)
  td32 = Tensor(d.astype(np.float32)).realize()
  out = tx @ (tq.reshape(2048, 2, 32).cast(dtypes.float32) * td32.reshape(2048, 1, 1)).reshape(2048, 64).T
  assert kernels(out) == kernels(tx @ tw.T), "float32 scales: none for the dequantization either"
  np.testing.assert_allclose(out.numpy(), x @ (q.astype(np.float32) * d.astype(np.float32)).T, rtol=1e-4, atol=1e-3)

def test_a_relu_read_under_a_conv_window_is_stored_once():
  # conv -> relu -> conv in training: the second conv's forward and weight gradient read relu(conv1 + bias) once per
  # output channel and window element (144 times an element here); recomputed there it kept the weight gradient's loop
  # scalar (beautiful_mnist's 5x5 dW: 330-440 -> 133 ms, one core): it gets an elementwise kernel of its own, read by both
  import torch
  from attograd.uop.ops import UOp
  from attograd.uop.patterns import graph_rewrite
  from attograd.schedule.schedule import realize_points, values_only
  rng = np.random.default_rng(0)
  nx, nw1, nb1, nw2 = (rng.standard_normal(s).astype(np.float32) for s in ((8, 8, 34, 34), (16, 8, 3, 3), (16,), (16, 16, 3, 3)))
  x, w1, b1, w2 = (Tensor(v, requires_grad=True) for v in (nx, nw1, nb1, nw2))
  x.conv2d(w1, b1).relu().conv2d(w2).square().mean().backward()
  sink = graph_rewrite(UOp.sink(w1.grad.uop, b1.grad.uop, w2.grad.uop), values_only, name="values_only")
  stored = [p for p, why in realize_points(sink).items() if why == "repeated"]
  assert [p.shape for p in stored] == [(8, 16, 32, 32)], "the relu of the first conv gets a buffer of its own"
  tx, tw1, tb1, tw2 = (torch.tensor(v, requires_grad=True) for v in (nx, nw1, nb1, nw2))
  torch.nn.functional.conv2d(torch.nn.functional.conv2d(tx, tw1, tb1).relu(), tw2).square().mean().backward()
  for ours, theirs in ((w1, tw1), (b1, tb1), (w2, tw2)):
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), atol=1e-3, rtol=1e-3)
