"""TinyJit, the schedule cache and the memory planner: replays equal eager runs, wrong inputs raise,
Python reads inside raise, planned memory never aliases live buffers."""
import numpy as np
import pytest
from attograd import Tensor, TinyJit, JitError, GlobalCounters, Context, dtypes
from attograd.nn import optim
from attograd.engine.memory import plan_slots

def test_inference_replay_matches_eager():
  @TinyJit
  def f(a, b): return (a * b + 1).relu().sum(1)
  rng = np.random.default_rng(0)
  for _ in range(5):
    x, y = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(f(Tensor(x), Tensor(y)).numpy(), np.maximum(x * y + 1, 0).sum(1), rtol=1e-6)
  assert f.cnt == 2 and f.replay is not None

def test_replay_runs_only_kernels():
  @TinyJit
  def f(a): return (a + 1).exp().sum().realize()
  for _ in range(3): f(Tensor([1.0, 2.0]))
  GlobalCounters.reset()
  out = f(Tensor([3.0, 4.0]))
  assert GlobalCounters.kernel_count == len(f.replay.plan.items) and out.item() == pytest.approx(np.exp(4) + np.exp(5))

def test_eager_and_replay_run_through_one_loop(monkeypatch):
  # an eager schedule and a replay are both runs of an ExecPlan, the replay with the very runners (kernels and copies)
  # the eager run recorded: a new kind of step is added once, as a runner
  from attograd.engine.realize import ExecPlan, BufferCopy, CompiledKernel
  runs: list[tuple[int, list]] = []
  run = ExecPlan.__call__
  def spy(plan, var_vals):
    runs.append((plan.print_at, [ei.runner for ei in plan.items]))
    return run(plan, var_vals)
  monkeypatch.setattr(ExecPlan, "__call__", spy)
  @TinyJit
  def f(a): return ((a.to("PYTHON") * 2).to("CPU") + a).realize()
  for i in range(2): f(Tensor([1.0, 2.0]) + i)
  captured = [r for at, rs in runs if at == 1 for r in rs]
  runs.clear()
  GlobalCounters.reset()
  assert f(Tensor([5.0, 6.0])).tolist() == [15.0, 18.0]
  assert len(runs) == 1 and runs[0][0] == 2, "a replay is one run of one plan"
  replayed = runs[0][1]
  assert {type(r) for r in replayed} == {CompiledKernel, BufferCopy} and all(r in captured for r in replayed)
  assert GlobalCounters.kernel_count == len(replayed) and GlobalCounters.global_mem > 0 and GlobalCounters.time_sum > 0

def test_non_contiguous_input():
  @TinyJit
  def f(a): return a * 2
  base = np.arange(12, dtype=np.float32).reshape(3, 4)
  for i in range(4): np.testing.assert_equal(f(Tensor(base + i).T).numpy(), (base + i).T * 2)

def _mlp_params(rng):
  return [rng.standard_normal(s).astype(np.float32) * 0.3 for s in ((16, 8), (16,), (4, 16), (4,))]

def _train(opt_cls, jit: bool, steps: int = 6, lr_schedule: bool = False, **kw):
  rng = np.random.default_rng(0)
  ps = [Tensor(p, requires_grad=True) for p in _mlp_params(rng)]
  opt = opt_cls(ps, **kw)
  def step(x, y):
    opt.zero_grad()
    loss = x.linear(ps[0], ps[1]).relu().linear(ps[2], ps[3]).cross_entropy(y).backward()
    opt.step()
    return loss.realize()
  if jit: step = TinyJit(step)
  losses = []
  for i in range(steps):
    if lr_schedule: opt.lr.assign(0.1 * 0.5 ** i)  # assigned outside: the replay follows the new memory
    x, y = Tensor(rng.standard_normal((32, 8)).astype(np.float32)), Tensor(rng.integers(0, 4, 32))
    losses.append(step(x, y).item())
  return losses, [p.numpy() for p in ps]

@pytest.mark.parametrize("opt_cls,kw", [(optim.Adam, {"lr": 0.01}), (optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                                        (optim.LAMB, {"lr": 0.01}), (optim.AdamW, {"lr": 0.01})])
def test_training_replay_matches_eager(opt_cls, kw):
  eager, jitted = _train(opt_cls, False, **kw), _train(opt_cls, True, **kw)
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-5)
  for a, b in zip(jitted[1], eager[1]): np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

def test_state_assigned_outside_is_followed():
  eager, jitted = _train(optim.SGD, False, steps=8, lr_schedule=True, lr=0.1), _train(optim.SGD, True, steps=8, lr_schedule=True, lr=0.1)
  np.testing.assert_allclose(jitted[0], eager[0], rtol=1e-5)

def test_weight_assigned_outside_after_quiet_replays_is_followed():
  # replays with no assign in between skip the scan of the outside memory's forwarding notes; an assign after them must
  # still move the replay to the weight's new memory (and again after more quiet replays)
  w = Tensor.ones(4).contiguous().realize()
  @TinyJit
  def f(x): return (x * w).sum().reshape(1).realize()
  x = Tensor([1.0, 2.0, 3.0, 4.0]).realize()
  for _ in range(4): np.testing.assert_allclose(f(x).numpy(), [10.0])
  for k in (2.0, 3.0):
    w.assign(Tensor.full((4,), k)).realize()
    for _ in range(3): np.testing.assert_allclose(f(x).numpy(), [10.0 * k])

def test_counter_state_in_place_and_by_copy():
  # c += x is written in place; s = c.sum() of the old values read after the write needs the copy path
  c, s = Tensor.zeros(4).contiguous().realize(), Tensor.zeros(1).contiguous().realize()
  @TinyJit
  def f(x):
    old_total = c.sum().reshape(1)
    c.assign(c + x)
    s.assign(s + old_total + c[::-1].sum())  # reads c reversed: not where c is written
    return s.realize()
  for i in range(5): f(Tensor.full((4,), float(i)).contiguous())
  want_c, want_s = np.zeros(4), np.zeros(1)
  for i in range(5):
    old = want_c.sum(); want_c = want_c + i; want_s = want_s + old + want_c.sum()
  np.testing.assert_allclose(c.numpy(), want_c); np.testing.assert_allclose(s.numpy(), want_s)

def test_wrong_shape_or_dtype_raises():
  @TinyJit
  def f(a): return a + 1
  for _ in range(3): f(Tensor.ones(4))
  with pytest.raises(JitError, match=r"shape|\(4,\)"): f(Tensor.ones(5))
  with pytest.raises(JitError, match="int"): f(Tensor.ones(4, dtype=dtypes.int32))
  @TinyJit
  def g(a, k): return a * k
  for _ in range(3): g(Tensor.ones(2), 3)
  with pytest.raises(JitError, match="3"): g(Tensor.ones(2), 4)
  g.reset()
  assert g(Tensor.ones(2), 4).tolist() == [4.0, 4.0]

def test_python_read_inside_raises():
  @TinyJit
  def f(a):
    if a.sum().item() > 100: return a
    return a + 1
  f(Tensor.ones(3))  # the first call runs plainly
  with pytest.raises(JitError, match="Python"): f(Tensor.ones(3))

def test_random_inside_draws_new_numbers():
  def f(a): return (a + Tensor.rand(*a.shape)).realize()
  Tensor.manual_seed(4)
  eager = [f(Tensor.ones(3)).tolist() for _ in range(5)]
  Tensor.manual_seed(4)
  jf = TinyJit(f)
  assert [jf(Tensor.ones(3)).tolist() for _ in range(5)] == eager and len({tuple(e) for e in eager}) == 5

def test_jit_off():
  with Context(JIT=0):
    @TinyJit
    def f(a): return a + 1
    for _ in range(4): f(Tensor.ones(2))
    assert f.cnt == 0

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_memory_plan_never_aliases_live_buffers(seed):
  # 40 buffers with random overlapping lifetimes, some kept (alive after the last step): buffers alive
  # together never share a slot, and a kept one holds no more memory than its own
  rng = np.random.default_rng(seed)
  spans = [(a, a + int(rng.integers(0, 8))) for a in rng.integers(0, 30, 40)]
  steps = [[k for k, (a, b) in enumerate(spans) if i in (a, b)] for i in range(40)]
  internal = {k: ("CPU", int(rng.integers(1, 5)) * 64) for k in range(40)}
  kept = {int(k) for k in rng.choice(40, 8, replace=False)}
  slot_of, slots = plan_slots(steps, internal, kept)
  spans = [(a, 99 if k in kept else b) for k, (a, b) in enumerate(spans)]
  assert len({slot_of[k] for k in kept}) == len(kept)
  for i, (a, b) in enumerate(spans):
    assert slots[slot_of[i]][1] == internal[i][1] if i in kept else slots[slot_of[i]][1] >= internal[i][1]
    for j, (c, d) in enumerate(spans[:i]):
      if not (b < c or d < a): assert slot_of[i] != slot_of[j], f"buffers {i} and {j} overlap in steps {(a, b)} and {(c, d)}"
  assert any(slot_of[k] == slot_of[j] for k in kept for j in range(40) if j != k), "no kept buffer reused dead memory"

def test_memory_plan_gives_big_buffers_used_one_at_a_time_one_slot():
  # an LLM prompt pass's pattern: a big dequantized weight, the small product read two steps later, the next weight...
  # placed in step order, a small buffer took the free big slot and the third weight grew another (220 bytes); biggest
  # first, the three weights share one slot and the small ones their own (130)
  steps = [["B1"], ["B1", "s1"], ["B2"], ["B2", "s2"], ["s1", "s2", "s3"], ["B3"], ["B3", "s3"]]
  internal = {k: ("CPU", 100 if k[0] == "B" else 10) for k in ("B1", "s1", "B2", "s2", "s3", "B3")}
  slot_of, slots = plan_slots(steps, internal)
  assert slot_of["B1"] == slot_of["B2"] == slot_of["B3"] and sum(n for _, n in slots) == 130

def test_many_overlapping_lifetimes_match_jit_off():
  def f(x):
    outs = [x]
    for i in range(12): outs.append((outs[-1] @ outs[max(0, i - 3)].T + i).tanh().contiguous())  # reads 1 and 4 layers back
    return (outs[-1] + outs[-5]).realize()
  x = Tensor(np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)).realize()
  want = f(x).numpy()
  jf = TinyJit(f)
  for _ in range(4): np.testing.assert_allclose(jf(x).numpy(), want, rtol=1e-5, atol=1e-6)

def test_mlp_peak_memory():
  import gc
  x = Tensor.rand(64, 256).realize()
  w = Tensor.rand(256, 256).realize()
  gc.collect()  # earlier tests' garbage freed now, not in the middle of the measurement
  GlobalCounters.reset()
  before = GlobalCounters.mem_used
  y = x
  for _ in range(16): y = (y @ w).relu() * 0.01
  y.realize()
  layer = 64 * 256 * 4
  # two planned buffers, not 16: the output takes the memory of the layer two before it
  assert GlobalCounters.mem_peak - before <= 2 * layer

def test_mlp_with_a_big_shared_weight_holds_no_packed_copy():
  import gc
  x = Tensor.rand(256, 1024).realize()
  w = Tensor.rand(1024, 1024).realize()  # big enough for the matmul to pack its column panels
  gc.collect()
  GlobalCounters.reset()
  before = GlobalCounters.mem_used
  y = x
  for _ in range(4): y = (y @ w).relu() * (1 / 1024)
  y.realize()
  assert GlobalCounters.mem_peak - before <= 2 * 256 * 1024 * 4  # a packed weight would add 4 layers' worth

def test_schedule_cache_reuses_structure():
  from attograd.schedule.schedule import _schedule_cache
  a, b = Tensor.rand(5, 7).realize(), Tensor.rand(5, 7).realize()
  (a * 2 + b).sum(1).realize()
  n = len(_schedule_cache)
  c, d = Tensor.rand(5, 7).realize(), Tensor.rand(5, 7).realize()
  out = (c * 2 + d).sum(1).realize()
  assert len(_schedule_cache) == n  # random numbers and the sum: structures seen before
  np.testing.assert_allclose(out.numpy(), (c.numpy() * 2 + d.numpy()).sum(1), rtol=1e-6)

def test_capture_reuses_first_calls_schedule_with_index_checks():
  # a lookup by an input index tensor is checked at the call outside TinyJit (read back), and by a kernel inside it (a
  # replay gets new values): the first call checks with a kernel too, so the capture builds the same graph and schedules
  # nothing new (a training step's ~250 kernels scheduled once); a bad index in the first call still raises
  from attograd.schedule.schedule import _schedule_cache
  table = Tensor(np.arange(12, dtype=np.float32).reshape(6, 2)).realize()
  @TinyJit
  def f(i): return (table[i] * 2).sum(1).realize()
  idx = [np.array(v, dtype=np.int32) for v in ([1, 5, 0], [2, 2, 3], [4, 0, 1])]
  np.testing.assert_allclose(f(Tensor(idx[0])).numpy(), (table.numpy()[idx[0]] * 2).sum(1))
  n = len(_schedule_cache)
  for v in idx[1:]: np.testing.assert_allclose(f(Tensor(v)).numpy(), (table.numpy()[v] * 2).sum(1))
  # the capture found the first call's schedule, and forgot it once captured (a replay schedules nothing)
  assert f.cnt == 2 and len(_schedule_cache) == n - 1
  g = TinyJit(lambda i: table[i].sum().realize())
  with pytest.raises(IndexError, match="index 6 is out of bounds"): g(Tensor(np.array([0, 6], dtype=np.int32)))

def test_schedule_cache_sees_through_derivatives():
  # gelu carries its derivative (WITH_DERIVATIVE) for autograd; the scheduler reads it as its value, and a second graph of
  # the same structure finds its schedule without the derivative's nodes telling the two apart
  from attograd.schedule.schedule import _schedule_cache
  def run() -> tuple[Tensor, Tensor]:
    x = Tensor.randn(4, 8).realize()
    return x, (x.gelu() * 3).sum(1).realize()
  run()
  n = len(_schedule_cache)
  x, out = run()
  assert len(_schedule_cache) == n
  torch = pytest.importorskip("torch")
  np.testing.assert_allclose(out.numpy(), (torch.nn.functional.gelu(torch.tensor(x.numpy())) * 3).sum(1).numpy(), rtol=1e-5, atol=1e-6)

def test_variable_values_reuse_kernels():
  from attograd import Variable
  from attograd.engine.realize import _kernel_cache
  pos = Variable("pos", 0, 15)
  x = Tensor.arange(16).float().realize()
  masked = lambda p: (Tensor.arange(16) < p).where(x, 0).sum()
  assert masked(pos.bind(4)).item() == 6.0
  n = len(_kernel_cache)
  assert [masked(pos.bind(i)).item() for i in (0, 1, 16 - 1)] == [0.0, 0.0, 105.0]
  assert len(_kernel_cache) == n  # the value is an argument, not part of the kernel
  with pytest.raises(ValueError, match="pos"): pos.bind(16)
  with pytest.raises(ValueError, match="both"): (x * pos.bind(1) + x * pos.bind(2)).realize()

def test_variable_in_jit_replay():
  from attograd import Variable
  pos = Variable("pos", 0, 31)
  @TinyJit
  def f(x, p): return ((Tensor.arange(32) < p).where(x, 0).sum() + p).realize()
  x = Tensor(np.arange(32, dtype=np.float32))
  for i in range(8): assert f(x, pos.bind(i * 3)).item() == sum(range(i * 3)) + i * 3
  with pytest.raises(JitError): f(x, 3)

def test_nested_jit_is_captured_by_the_outer():
  inner = TinyJit(lambda a: (a * 2).realize())
  for _ in range(3): inner(Tensor.ones(4))  # inner is replaying by now
  @TinyJit
  def outer(a): return (inner(a) + 1).realize()
  for i in range(4): assert outer(Tensor.full((4,), float(i)).contiguous()).tolist() == [2.0 * i + 1] * 4

def test_replay_follows_an_input_assigned_inside_and_outside():
  # an input written inside (a KV cache) and also written by eager code between replays: each replay must read the
  # memory the tensor holds at the call, not the memory the capture saw
  from attograd import Variable
  c = Tensor.zeros(8).contiguous().realize()
  p = Variable("p", 0, 7)
  @TinyJit
  def step(pos, c):
    c[pos:pos + 1].assign(Tensor.ones(1).contiguous())
    return c[:pos + 1].sum().realize()
  for i in range(4):
    c[0:3].assign(Tensor.full((3,), float(i + 2)).contiguous()).realize()
    assert step(p.bind(3), c).item() == 3 * (i + 2) + 1
  assert c.tolist() == [5.0, 5.0, 5.0, 1.0, 0.0, 0.0, 0.0, 0.0]

def test_capture_keeps_no_graph_nor_moved_input_memory():
  # the captured outputs carry no graph (a replay refills them), and a replay binds the memory its input holds at the
  # call: memory the input held before it moved (an assign outside) is free once the next replay has run. Kept, an LLM's
  # prompt pass held its 30 layers' graph and a stale copy of its KV cache
  import gc, weakref
  from attograd.engine.realize import buffer_of
  from attograd.engine import registry
  @TinyJit
  def f(x): return (x * 2 + 1).sum(1).reshape(-1).realize()
  x = Tensor.rand(4, 8).realize()
  for _ in range(3): f(x)
  assert registry.sources.get(f.ret.uop) is None and f.ret._view_of is None
  old = weakref.ref(buffer_of(x.uop.base))
  x.assign(Tensor.rand(4, 8)).realize()
  assert buffer_of(x.uop.base) is not old()  # moved to new memory
  np.testing.assert_allclose(f(x).numpy(), (x.numpy() * 2 + 1).sum(1), rtol=1e-6)
  gc.collect()
  assert old() is None

# ***** the native run loop: a replay's CPU kernels run by one native call per run of them (threadpool.Steps) *****

def _parts(f) -> list[str]: return [type(p).__name__ for p in f.replay.plan.native]

def test_native_replay_follows_variables_inputs_outside_and_copies():
  # two Variables (numbered in the plan's table in the order kernels name them), a new input each call, a weight moved by
  # an assign outside, a copy to another device between kernels (which splits the native runs), a threaded matmul
  from attograd import Variable
  from attograd.engine.realize import CompiledKernel
  a, b = Variable("a", 1, 16), Variable("b", 0, 7)
  w = Tensor.ones(256, 256).contiguous().realize()
  rng = np.random.default_rng(0)
  @TinyJit
  def f(x, m, pa, pb):
    h = (x @ w).relu()  # ~33M ops: threaded when the pool has cores
    s = (Tensor.arange(16) < pa).where(h[0, :16], 0).sum() + pb * 2  # both Variables in the kernels
    t = ((s.to("PYTHON") * 3).to("CPU") + (Tensor.arange(8) < pb).where(m, 0).sum() + pa).reshape(1)
    return t.cat(h.sum(0)[:3]).realize()
  with Context(THREADS=2):
    for i in range(7):
      if i == 5: w.assign(Tensor.full((256, 256), 0.5)).realize()  # moved to new memory outside the function
      x, m = rng.standard_normal((4, 256)).astype(np.float32), rng.standard_normal(8).astype(np.float32)
      va, vb = 1 + (i * 5) % 16, (i * 3) % 8
      got = f(Tensor(x), Tensor(m), a.bind(va), b.bind(vb)).numpy()
      h = np.maximum(x @ w.numpy(), 0)
      want = [(h[0, :va].sum() + vb * 2) * 3 + m[:vb].sum() + va, *h.sum(0)[:3]]
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-4)
  assert _parts(f).count("Steps") >= 2 and "ExecItem" in _parts(f), _parts(f)
  assert len(f.replay.plan.variables) == 2
  assert any(isinstance(ei.runner, CompiledKernel) and ei.runner.threads > 1 for ei in f.replay.plan.items), "no threaded kernel"

def test_native_replay_equals_the_python_loop():
  # the same plan run by the Python loop (DEBUG at the replay's print level runs each item by itself) and natively
  from attograd import Variable
  p = Variable("p", 1, 64)
  w = Tensor(np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)).realize()
  @TinyJit
  def f(x, p): return ((x @ w).softmax(1)[:, :p].sum(1) * p).realize()
  x = Tensor(np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)).realize()
  for i in range(3): f(x, p.bind(5))
  for v in (3, 64, 17):
    with Context(DEBUG=2): by_python = f(x, p.bind(v)).numpy()
    natively = f(x, p.bind(v)).numpy()
    np.testing.assert_array_equal(natively, by_python)
  assert f.replay.plan.native is not None and "Steps" in _parts(f)

def test_native_replay_still_prints_each_kernel_at_debug2(capsys):
  @TinyJit
  def f(x): return ((x + 1).contiguous() * 2).sum().realize()
  for _ in range(4): f(Tensor.ones(8).contiguous())
  assert f.replay.plan.native is not None
  x = Tensor.ones(8).contiguous().realize()  # (an eager run prints its kernels too)
  capsys.readouterr()
  with Context(DEBUG=2): f(x)
  lines = [l for l in capsys.readouterr().out.splitlines() if l.startswith("***")]
  assert len(lines) == len(f.replay.plan.items) >= 2

def test_native_replay_items_on_the_viz_timeline():
  from attograd.uop import trace
  @TinyJit
  def f(x): return ((x - 1).contiguous() * 3).sum().realize()
  for _ in range(4): f(Tensor.ones(8).contiguous())
  assert f.replay.plan.native is not None
  with trace.recording() as tr: f(Tensor.ones(8).contiguous())
  assert len([e for e in tr.events if e.jit]) == len(f.replay.plan.items)

def test_same_tensors_again_skip_the_checks_and_a_change_does_not(monkeypatch):
  # a decode loop passes the very same cache tensors every call: the replay takes them as they were, without describing
  # the arguments again; a new tensor, a reassigned one, another shape or another value still takes the checked path
  import attograd.jit as jit
  from attograd import Variable
  @TinyJit
  def f(x, cache, v): return (x + cache[v:v + 1].sum()).realize()
  cache = Tensor(np.arange(8, dtype=np.float32)).realize()
  x = Tensor([1.0]).realize()
  var = Variable("i", 0, 7)
  for i in range(3): f(x, cache, var.bind(i))
  described = []
  real = jit._describe
  monkeypatch.setattr(jit, "_describe", lambda a, k: described.append(1) or real(a, k))
  assert f(x, cache, var.bind(5)).item() == 6.0 and not described  # same tensors: the quick path, the Variable's new value
  cache.assign(cache + 10).realize()  # reassigned outside: new memory, which the replay must read
  assert f(x, cache, var.bind(5)).item() == 16.0 and len(described) == 1
  assert f(x, cache, var.bind(2)).item() == 13.0 and len(described) == 1  # (unchanged since: quick again)
  y = Tensor([2.0]).realize()
  assert f(y, cache, var.bind(2)).item() == 14.0 and len(described) == 2  # a new tensor
  x.uop = Tensor([3.0]).realize().uop  # the same object holding other memory
  assert f(x, cache, var.bind(2)).item() == 15.0 and len(described) == 3
  with pytest.raises(JitError, match="captured for other inputs"): f(Tensor([1.0, 2.0]), cache, var.bind(2))  # another shape
  with pytest.raises(JitError, match="captured for other inputs"): f(x, cache, 3)  # a value for the Variable
  x2 = x + 1  # a lazy input is realized first
  assert f(x2, cache, var.bind(2)).item() == 16.0

def test_discard_scratch_gives_back_internal_pages_and_replays_still_right():
  # a prompt pass called now and then (an LLM's) gives its internal buffers' pages back between calls: on the CPU they
  # read as zeros afterwards (the pages were dropped, not kept), the output keeps its values, the next replay is right
  w = Tensor.rand(256, 256).realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return ((x @ w).relu() @ w).sum(1).realize()
  xs = [Tensor.rand(128, 256).realize() for _ in range(4)]
  for x in xs[:3]: out = f(x).numpy()
  ref = ((xs[2].numpy() @ w.numpy()).clip(0) @ w.numpy()).sum(1)
  np.testing.assert_allclose(out, ref, rtol=1e-4)
  scratch = f.replay.scratch
  assert scratch and sum(b.nbytes for b in scratch) >= 128 * 256 * 4
  if Tensor(1).device.split(":")[0] == "CPU": assert any(any(b.host_view()) for b in scratch)
  y = f(xs[3])
  f.discard_scratch()
  np.testing.assert_allclose(y.numpy(), ((xs[3].numpy() @ w.numpy()).clip(0) @ w.numpy()).sum(1), rtol=1e-4)
  if Tensor(1).device.split(":")[0] == "CPU": assert not any(any(b.host_view()) for b in scratch if b.nbytes >= 1 << 16)
  np.testing.assert_allclose(f(xs[0]).numpy(), ((xs[0].numpy() @ w.numpy()).clip(0) @ w.numpy()).sum(1), rtol=1e-4)

def test_capture_sizes_the_node_table_down():
  # a dict never shrinks: the hash-cons table grown for a traced graph's nodes (an LLM pass: 1.3 MiB of slots) stayed
  # that big after the graph died. A capture rebuilds it at the size of the nodes still alive
  import sys
  from attograd.uop.ops import UOpMeta
  @TinyJit
  def f(x: Tensor) -> Tensor:
    held = [x.reshape(1, 2).expand(i + 1, 2) for i in range(12000)]  # 12k nodes alive while tracing, dropped when it returns
    return (x * 2 + len(held)).realize()
  for _ in range(3): out = f(Tensor([1.0, 2.0]))
  assert out.tolist() == [12002.0, 12004.0]
  assert sys.getsizeof(UOpMeta.ucache) < 100 * len(UOpMeta.ucache) + (1 << 16), (sys.getsizeof(UOpMeta.ucache), len(UOpMeta.ucache))
