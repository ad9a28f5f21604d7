"""A training step without TinyJit: from the second step on, nothing is scheduled, rewritten, lowered or memory-planned
again (the schedule template and its memory plan are reused), and the values stay torch's step after step. A graph
that differs from an earlier one in anything the scheduler sees (which buffers are the same, a constant, a shape) is
never served the earlier schedule: the values show it."""
import numpy as np
import pytest
from attograd import Tensor, Variable, UOp, Ops, dtypes
from attograd import nn
from attograd.nn import optim
from attograd.engine import realize
from attograd.schedule import schedule as S

torch = pytest.importorskip("torch")

class _Counter:
  """Counts calls to the named functions of a module while in the with block."""
  def __init__(self, monkeypatch, **targets):
    self.calls = {name: 0 for name in targets}
    for name, mod in targets.items():
      f = getattr(mod, name)
      def counted(*a, _f=f, _name=name, **k):
        self.calls[_name] += 1
        return _f(*a, **k)
      monkeypatch.setattr(mod, name, counted)

def _models():
  torch.manual_seed(0)
  theirs = [torch.nn.Linear(6, 16), torch.nn.Linear(16, 4)]
  ours = [nn.Linear(6, 16), nn.Linear(16, 4)]
  for l, t in zip(ours, theirs): l.weight, l.bias = Tensor(t.weight.detach().numpy().copy()), Tensor(t.bias.detach().numpy().copy())
  return ours, theirs

def _training(clip: bool):
  """The MLP of _models trained by AdamW in both frameworks (clipping by global norm, by hand, when clip): (our
  parameters, torch's, our step, torch's step), each step taking a batch and giving the loss."""
  ours, theirs = _models()
  params = [p for l in ours for p in (l.weight, l.bias)]
  opt = optim.AdamW(params, lr=1e-2, weight_decay=0.1)
  tparams = [p for l in theirs for p in l.parameters()]
  topt = torch.optim.AdamW(tparams, lr=1e-2, weight_decay=0.1)
  def step(x: np.ndarray, y: np.ndarray) -> float:
    with Tensor.train():
      opt.zero_grad()
      loss = (ours[1](ours[0](Tensor(x)).gelu()) - Tensor(y)).square().mean().backward()
      if clip:
        norm = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
        scale = (1.0 / (norm + 1e-6)).minimum(1.0)
        for p in params: p.grad = p.grad * scale
      opt.step()
      return loss.item()
  def torch_step(x: np.ndarray, y: np.ndarray) -> float:
    topt.zero_grad()
    loss = (theirs[1](torch.nn.functional.gelu(theirs[0](torch.tensor(x)))) - torch.tensor(y)).square().mean()
    loss.backward()
    if clip: torch.nn.utils.clip_grad_norm_(tparams, 1.0)
    topt.step()
    return loss.item()
  return params, tparams, step, torch_step

def test_second_step_reuses_schedule_and_plan(monkeypatch):
  params, tparams, step, torch_step = _training(clip=True)
  rng = np.random.default_rng(0)
  data = [(rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)) for _ in range(4)]
  for x, y in data[:2]: np.testing.assert_allclose(step(x, y), torch_step(x, y), rtol=1e-5, atol=1e-6)
  counter = _Counter(monkeypatch, _template=S, graph_rewrite=S, _load_template=S, lower_kernel=realize, plan_slots=realize)
  for x, y in data[2:]: np.testing.assert_allclose(step(x, y), torch_step(x, y), rtol=1e-5, atol=1e-6)
  assert counter.calls == {"_template": 0, "graph_rewrite": 0, "_load_template": 0, "lower_kernel": 0, "plan_slots": 0}
  for p, t in zip(params, tparams):
    np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-4, atol=1e-6)

# (first graph, second graph, the second's value): each second graph differs from its first only in what a structure that
# forgot something would miss, and no constant appears twice (two equal constants are one node: the sharing would tell
# the graphs apart, whatever the key said about the values)
CHANGED = {
  "same buffer twice": (lambda a, b: (a * b * 3.0).sum(1), lambda c, b: (c * c * 3.0).sum(1), [3 * (4 + 9 + 16)]),
  "other constant": (lambda a, b: (a * b * 3.0).sum(1), lambda c, b: (c * b * 5.0).sum(1), [5 * (8 + 15 + 24)]),
  "negative zero": (lambda a, b: (1 / (a * 0.0)).sum(1), lambda c, b: (1 / (c * -0.0)).sum(1), [-np.inf]),  # 1 / -0.0 is -inf
  "other shape": (lambda a, b: (a * b * 3.0).sum(1), lambda c, b: (c[:, :2] * b[:, :2] * 3.0).sum(1), [3 * (8 + 15)]),
}

@pytest.mark.parametrize("case", list(CHANGED))
def test_changed_graph_gets_its_own_schedule(case):
  first, second, want = CHANGED[case]
  a, b = Tensor([[1.0, 2.0, 3.0]]).realize(), Tensor([[4.0, 5.0, 6.0]]).realize()
  first(a, b).realize()
  c = Tensor([[2.0, 3.0, 4.0]]).realize()
  np.testing.assert_allclose(second(c, b).realize().numpy(), want)

def test_memory_plan_is_kept_with_the_template():
  # the plan is made once per template (and set of buffers created and kept), and a second graph of the same structure
  # gets fresh memory laid out the same way: its values are its own, and the first's results are left alone
  x = Tensor.rand(32, 32).realize()
  def mlp(x: Tensor) -> Tensor:
    for _ in range(3): x = (x @ x.T).relu() * (1 / 32) + 1
    return x.sum()
  r1 = mlp(x).realize()
  v1 = r1.item()
  templates = [id(t) for t in S._schedule_cache.values() if t.plans]
  y = Tensor.rand(32, 32).realize()
  r2 = mlp(y).realize()
  assert [id(t) for t in S._schedule_cache.values() if t.plans] == templates
  assert all(len(t.plans) == 1 for t in S._schedule_cache.values() if t.plans)
  ref = y.numpy().astype(np.float64)
  for _ in range(3): ref = np.maximum(ref @ ref.T, 0) / 32 + 1
  np.testing.assert_allclose(r2.item(), ref.sum(), rtol=1e-5)
  assert r1.item() == v1

def test_changed_schedule_list_is_planned_afresh():
  # create_schedule's list knows its template; changed afterwards, it is no longer what the template's plans are for
  a = Tensor.rand(8, 8).realize()
  sched, _ = S.create_schedule([((a @ a).relu() @ a).sum().uop])
  assert realize._as_filled_in(sched)
  sched[0] = S.ScheduleItem(sched[0].ast, sched[0].bufs)  # an equal item, but not the one filled in: checked as changed
  assert not realize._as_filled_in(sched)
  sched[0] = sched.made[0]
  assert realize._as_filled_in(sched)
  sched.pop(0)
  assert not realize._as_filled_in(sched)

def test_later_steps_reuse_the_run(monkeypatch):
  # from the third run of a template's plan, the run is the second's ExecPlan over rebound memory, in the native run loop:
  # no ExecItem, ExecPlan or Buffer of an internal buffer is made, nor a ScheduleItem (no schedule is filled in) or a BUFFER
  # node but the result's; each result is its own memory (a later run doesn't write over an earlier one's) and the values
  # are numpy's
  w = Tensor.rand(16, 16).realize()
  def f(x: Tensor) -> Tensor:
    h = ((x @ w).relu() @ w).exp()  # internal buffers: the products
    return (h * 0.5).sum(1)
  xs = [np.random.default_rng(i).standard_normal((4, 16)).astype(np.float32) for i in range(5)]
  def want(x: np.ndarray) -> np.ndarray: return (np.exp(np.maximum(x @ w.numpy(), 0) @ w.numpy()) * 0.5).sum(1)
  outs = [f(Tensor(x)).realize() for x in xs[:2]]
  counter = _Counter(monkeypatch, ExecItem=realize, ExecPlan=realize, ScheduleItem=S, new_buffer=realize)
  made = [0]
  orig = realize.Buffer.__init__
  def counted(self, *a, **k): made[0] += 1; orig(self, *a, **k)
  monkeypatch.setattr(realize.Buffer, "__init__", counted)
  outs += [f(Tensor(x)).realize() for x in xs[2:]]
  assert counter.calls == {"ExecItem": 0, "ExecPlan": 0, "ScheduleItem": 0, "new_buffer": len(xs[2:])}
  # per run: the input's buffer, the result's and the memory of the result's slot (the products' memory is held)
  assert made[0] <= 3 * len(xs[2:])
  assert any(r.plan is not None and r.plan.native is not None for r in realize._holding.values())
  for o, x in zip(outs, xs): np.testing.assert_allclose(o.numpy(), want(x), rtol=1e-4)

def test_run_another_thread_is_in_is_not_shared(monkeypatch):
  # a planned run's held memory and items belong to the thread running it: a realize of the same plan meanwhile (a
  # DataLoader worker's) is placed and run afresh
  w = Tensor.rand(8, 8).realize()
  def f(x: Tensor) -> Tensor: return ((x @ w).exp() @ w).sum(1)
  xs = [np.random.default_rng(i).standard_normal((4, 8)).astype(np.float32) for i in range(3)]
  for x in xs: f(Tensor(x)).realize()
  run = list(realize._holding.values())[-1]  # the most recently run: f's
  counter = _Counter(monkeypatch, ExecPlan=realize)
  f(Tensor(xs[1])).realize()
  assert counter.calls["ExecPlan"] == 0
  with run.lock:  # as if another thread were running it
    out = f(Tensor(xs[0])).realize()
  assert counter.calls["ExecPlan"] == 1
  out = out.numpy()
  np.testing.assert_allclose(out, (np.exp(xs[0] @ w.numpy()) @ w.numpy()).sum(1), rtol=1e-4)

def test_runs_holding_memory_are_few():
  # a planned run holds its internal buffers' memory between runs: only the last HOLDING_MAX do, so graphs of many
  # structures don't each keep theirs; one let go runs again (planned afresh) with the right values
  xs = [Tensor.rand(4, n).realize() for n in range(3, 3 + realize.HOLDING_MAX + 2)]
  def f(x: Tensor) -> Tensor: return (x.exp() @ x.T).sum(1)
  for _ in range(2):
    for x in xs: np.testing.assert_allclose(f(x).numpy(), (np.exp(x.numpy()) @ x.numpy().T).sum(1), rtol=1e-5)
  assert len(realize._holding) == realize.HOLDING_MAX

def test_subclass_update_reading_numbers_is_built_every_step():
  # a subclass's own _update may read a hyperparameter as a Python number: it is called every step, so a new lr counts
  class MySGD(optim.SGD):
    def _update(self, p, g, group, state): return p - float(group["lr"]) * g
  w = Tensor([1.0, 2.0], requires_grad=True)
  opt = MySGD([w], lr=0.5)
  for lr, want in ((0.5, [0.5, 1.5]), (0.25, [0.25, 1.25])):
    opt.param_groups[0]["lr"] = lr
    opt.zero_grad(); w.sum().backward(); opt.step()
    np.testing.assert_allclose(w.numpy(), want)

def test_attention_backward_is_built_only_by_backward(monkeypatch):
  # attention's vector-Jacobian products are functions autograd calls: a forward pass calls none, and they read the
  # inputs of the forward call even when the caller's tensor is written in place before backward()
  from attograd.uop import ops
  calls = [0]
  def counting(f):
    def g(x): calls[0] += 1; return f(x)
    return g
  fns = ops.Vjp.fns  # (the products, made from the Vjp's make when autograd asks: each one counted as it is called)
  monkeypatch.setattr(ops.Vjp, "fns", property(lambda self: tuple(counting(f) for f in fns.fget(self))))
  rng = np.random.default_rng(2)
  qn, kn, vn = (rng.standard_normal((1, 2, 5, 4)).astype(np.float32) for _ in range(3))
  q, k, v = (Tensor(a, requires_grad=True) for a in (qn, kn, vn))
  out = q.scaled_dot_product_attention(k, v, is_causal=True)
  assert calls[0] == 0
  v.assign(Tensor(np.zeros_like(vn)))  # the caller's value changes before backward: the gradient is of the forward's
  tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (qn, kn, vn))
  tout = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True)
  w = rng.standard_normal(out.shape).astype(np.float32)
  (out * Tensor(w)).sum().backward()
  (tout * torch.tensor(w)).sum().backward()
  # q's and k's only: not v's (no gradient is asked for it: its tensor now holds other values), nor the softmax's inside
  # (attention's own backward reads the probabilities)
  assert calls[0] == 2
  for ours, theirs in ((q, tq), (k, tk)):
    np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-5)

def _step_graph() -> UOp:
  """The SINK of everything a training step's opt.step() realizes (the MLP of _models, AdamW, clipping), built and not run."""
  ours, _ = _models()
  params = [p for l in ours for p in (l.weight, l.bias)]
  opt = optim.AdamW(params, lr=1e-2, weight_decay=0.1)
  rng = np.random.default_rng(1)
  x, y = Tensor(rng.standard_normal((8, 6)).astype(np.float32)), Tensor(rng.standard_normal((8, 4)).astype(np.float32))
  with Tensor.train():
    opt.zero_grad()
    (ours[1](ours[0](x).gelu()) - y).square().mean().backward()
    norm = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
    for p in params: p.grad = p.grad * (1.0 / (norm + 1e-6)).minimum(1.0)
    return UOp(Ops.SINK, dtypes.void, tuple(t.uop for t in opt.schedule_step()))

def test_runnable_structure_is_graph_structure_of_runnable():
  """realize's one walk (runnable_structure) gives what runnable and then graph_structure give, for a training step's
  graph (WITH_DERIVATIVE nodes, assigns, 0-d factors): the schedule cache sees the same key either way."""
  roots = _step_graph()
  found = realize.runnable_structure(roots)
  assert found is not None
  same, vals, sliced = realize.runnable(roots)
  assert same is roots and not vals and not sliced
  structure, inputs = S.graph_structure(roots)
  assert found[0] == structure and found[1] == inputs

def _realized_below() -> tuple[UOp, Tensor]:
  a = Tensor([1.0, 2.0, 3.0]).realize()
  b = a + 1
  c = b * 2  # reads b's lazy node, which the realize below memoizes (while b's buffer lives: b is returned too)
  b.realize()
  return c.uop, b

def _bound_variable() -> tuple[UOp, None]:
  v = Variable("n", 1, 8).bind(3)
  return (Tensor.ones(8).contiguous().realize()[:v] * 2).uop, None

def _sliced_data() -> tuple[UOp, None]: return (Tensor(np.arange(10, dtype=np.float32)).realize()[3:7] * 2).uop, None

CHANGED_BY_RUNNABLE = {"realized node below": (_realized_below, [4.0, 6.0, 8.0]), "bound variable": (_bound_variable, [2.0, 2.0, 2.0]),
                       "slice at offsets": (_sliced_data, [6.0, 8.0, 10.0, 12.0])}

@pytest.mark.parametrize("case", list(CHANGED_BY_RUNNABLE))
def test_runnable_structure_leaves_changed_graphs_to_runnable(case):
  """A graph runnable changes (a realized node read from its buffer, a Variable unbound, a slice of stored data given
  variable offsets) gets no structure from the one walk: realize takes runnable's path, and the values are right."""
  make, want = CHANGED_BY_RUNNABLE[case]
  u, _alive = make()
  roots = UOp(Ops.SINK, dtypes.void, (u,))
  assert realize.runnable(roots)[0] is not roots  # runnable changes it ...
  assert realize.runnable_structure(roots) is None  # ... so the one walk declines
  assert Tensor(u).numpy().tolist() == want

def test_front_end_nodes_keep_shape_and_device_in_slots():
  # a node's shape and device are computed once and kept in slots, not in a __dict__ made for them: every node of a
  # training step is asked both, and a dict each was one more object per node for the cycle collector to walk
  a = Tensor.rand(4, 3).realize()
  u = ((a + 1) * a.reshape(3, 4).permute(1, 0)).sum(0).uop
  nodes = [n for n in u.toposort if n is not u]
  for n in nodes: n.shape, n.device
  assert u.shape == (3,) and u.device == "CPU" and all(n.shape == (4, 3) for n in nodes if n.op is Ops.MUL)
  assert not any({"shape", "device"} & set(vars(n)) for n in nodes)
  assert all(n.shape is n.shape and n.device is n.device for n in nodes)  # computed once
  r = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 4),), 0)  # a kernel-level node has no device: None is kept too
  assert r.device is None and r.device is None

def test_training_step_leaves_no_reference_cycles():
  """A training step (embeddings with arange positions, attention, LayerNorm, cross_entropy, clipping, AdamW) frees
  everything it made by reference counting: nothing is left for the cycle collector, whose passes walk every live
  object (a full one 15-100 ms with a training step's graphs and torch loaded)."""
  import gc
  Tensor.manual_seed(0)
  tok, pos, ln, head = nn.Embedding(11, 16), nn.Embedding(8, 16), nn.LayerNorm(16), nn.Linear(16, 11)
  qkv = nn.Linear(16, 48)
  params = [tok.weight, pos.weight, ln.weight, ln.bias, head.weight, head.bias, qkv.weight, qkv.bias]
  opt = optim.AdamW(params, lr=1e-2, weight_decay=0.1)
  rng = np.random.default_rng(0)
  def step() -> float:
    x, y = Tensor(rng.integers(0, 11, (2, 8)).tolist()), Tensor(rng.integers(0, 11, (2, 8)).tolist())
    with Tensor.train():
      opt.zero_grad()
      h = tok(x) + pos(Tensor.arange(8))
      q, k, v = [t.reshape(2, 8, 2, 8).transpose(1, 2) for t in qkv(ln(h)).chunk(3, dim=-1)]
      h = h + q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(2, 8, 16)
      loss = head(h).reshape(-1, 11).cross_entropy(y.reshape(-1)).backward()
      norm = Tensor.stack(*[p.grad.square().sum() for p in params]).sum().sqrt()
      for p in params: p.grad = p.grad * (1.0 / (norm + 1e-6)).minimum(1.0)
      opt.step()
      return loss.item()
  step()
  gc.collect()
  gc.set_debug(gc.DEBUG_SAVEALL)
  try:
    for _ in range(2): step()
    gc.collect()
    garbage = [type(o).__name__ for o in gc.garbage]
  finally:
    gc.set_debug(0)
    gc.garbage.clear()
  assert garbage == []

def test_scans_state_dicts_and_attention_schedules_make_no_reference_cycles():
  """Building long scans (blocked: a recursion), walking a model's state and scheduling attention at the flash sizes
  leave nothing for the cycle collector: each was a nested function that called itself, a cycle holding the tensor, the
  state dict or the graph's users map until the collector's next pass (which realize and lowering pause)."""
  import gc
  from attograd.nn.state import get_state_dict
  x = Tensor.rand(3, 300).realize()
  model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
  q = Tensor.rand(1, 1, 2048, 8, requires_grad=True)
  def build() -> None:
    x.cumsum(1).realize(); x.cummax(1)[1].realize()
    assert len(get_state_dict(model)) == 4
    q.scaled_dot_product_attention(q, q, is_causal=True).sum().backward()
    q.grad.schedule()
  gc.collect()
  gc.set_debug(gc.DEBUG_SAVEALL)
  try:
    build()
    gc.collect()
    garbage = sorted({type(o).__name__ for o in gc.garbage})
  finally:
    gc.set_debug(0)
    gc.garbage.clear()
  assert garbage == []

def test_no_nested_function_calls_itself():
  """A nested function that calls itself, or a sibling that calls it back, holds its own cell: each call of the function
  around it makes a reference cycle, which keeps all it closes over (a graph, a kernel's lines) until the cycle
  collector runs, and scheduling and lowering pause it. Recursion goes in module-level functions."""
  import ast, pathlib
  found = []
  for path in sorted((pathlib.Path(__file__).parent.parent / "attograd").rglob("*.py")):
    for outer in ast.walk(ast.parse(path.read_text())):
      if not isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef)): continue
      nested = {f.name: f for f in ast.walk(outer) if f is not outer and isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
      calls = {name: {n.id for n in ast.walk(f) if isinstance(n, ast.Name) and n.id in nested} for name, f in nested.items()}
      for name in nested:  # does name reach itself through the nested functions it names?
        seen, todo = set(), list(calls[name])
        while todo:
          if (n := todo.pop()) == name: found.append(f"{path.name}:{nested[name].lineno} {outer.name}.{name}"); break
          if n not in seen: seen.add(n); todo.extend(calls[n])
  assert found == []

# ***** a loop's graphs matched by their compiled structure (schedule/match.py) *****

def test_matcher_finds_a_step_graph_and_its_buffers():
  """A training step's graph compiled into a matcher accepts another step's graph (other buffers, same structure) and
  finds its buffers in graph_structure's order; the WITH_DERIVATIVE nodes it went through are handed back."""
  from attograd.schedule.match import StructureMatcher
  # (the third graph: a structure's backward is built by the rules, then from its second pass as CALLs of a template)
  _step_graph()
  recorded, other = _step_graph(), _step_graph()
  assert other is not recorded and S.graph_structure(other)[0] == S.graph_structure(recorded)[0]
  m = StructureMatcher(recorded)
  for g in (recorded, other):
    found = m(g)
    assert found is not None and found.bufs == S.graph_structure(g)[1]
    assert found.derivs and all(d.op is Ops.WITH_DERIVATIVE for d in found.derivs)
  assert m(UOp(Ops.SINK, dtypes.void, other.src[1:])) is None  # one target fewer

@pytest.mark.parametrize("case", list(CHANGED))
def test_matcher_declines_a_changed_graph(case):
  """Only a graph of the recorded structure is accepted: the same buffer twice where there were two, another constant, a
  negative zero, another shape are declined (and their structure does differ), the recorded structure over other buffers
  is accepted."""
  from attograd.schedule.match import StructureMatcher
  first, second, _ = CHANGED[case]
  a, b, c = (Tensor([[1.0 + i, 2.0, 3.0]]).realize() for i in range(3))
  recorded = UOp(Ops.SINK, dtypes.void, (first(a, b).uop,))
  m = StructureMatcher(recorded)
  same = UOp(Ops.SINK, dtypes.void, (first(c, b).uop,))
  assert (found := m(same)) is not None and found.bufs == S.graph_structure(same)[1] and {c.uop.base} <= set(found.bufs) <= {c.uop.base, b.uop.base}
  changed = UOp(Ops.SINK, dtypes.void, (second(c, b).uop,))
  assert S.graph_structure(changed)[0] != S.graph_structure(recorded)[0]
  assert m(changed) is None

def test_loop_steps_are_matched_without_a_walk(monkeypatch):
  """From a few runs of a template's kept plan on, a training step's graph is found by its matcher: no graph_structure
  walk, no structure key, and the values stay torch's."""
  params, tparams, step, torch_step = _training(clip=False)
  rng = np.random.default_rng(0)
  n = realize.MATCH_AFTER + 4
  data = [(rng.standard_normal((8, 6)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)) for _ in range(n + 3)]
  for x, y in data[:n]: np.testing.assert_allclose(step(x, y), torch_step(x, y), rtol=1e-5, atol=1e-6)
  counter = _Counter(monkeypatch, graph_structure=realize, runnable=realize)
  monkeypatch.setattr(S, "graph_structure", lambda *a: pytest.fail("a matched step walked its graph"))
  for x, y in data[n:]: np.testing.assert_allclose(step(x, y), torch_step(x, y), rtol=1e-5, atol=1e-6)
  # (loss.item()'s realize of the loss alone is a graph of another structure: walked)
  assert counter.calls["runnable"] == 0 and counter.calls["graph_structure"] <= len(data[n:])
  for p, t in zip(params, tparams):
    np.testing.assert_allclose(p.numpy(), t.detach().numpy(), rtol=1e-4, atol=1e-6)

def test_matched_graph_with_a_realized_node_takes_the_walk(monkeypatch):
  """A graph of a matcher's structure in which a node was realized since (read from its buffer by runnable) is left to
  the generic walk: runnable reads the buffer, and the values are right."""
  w = Tensor.rand(8, 8).realize()
  xs = [np.random.default_rng(i).standard_normal((4, 8)).astype(np.float32) for i in range(realize.MATCH_AFTER + 6)]
  def want(x: np.ndarray) -> np.ndarray: return (np.exp(x @ w.numpy()) * 2).sum(1)
  for x in xs[:-1]:
    h = Tensor(x) @ w
    np.testing.assert_allclose((h.exp() * 2).sum(1).numpy(), want(x), rtol=1e-4)
  assert realize._matchers
  counter = _Counter(monkeypatch, runnable=realize)
  h = Tensor(xs[-1]) @ w
  out = (h.exp() * 2).sum(1)
  h.realize()
  np.testing.assert_allclose(out.numpy(), want(xs[-1]), rtol=1e-4)
  assert counter.calls["runnable"] == 1

def test_update_calls_read_only_what_their_graph_reads():
  # a CALL's sources are its template's leaves that its graph reaches (Template.used): AdamW's update reads the group's
  # factors, not the lr, weight decay, step and bias-correction tensors they are computed from (each source is one more
  # node in every walk of the step's graph)
  w = Tensor([1.0, -2.0], requires_grad=True)
  opt = optim.AdamW([w], lr=0.1, weight_decay=0.1)
  tw = torch.tensor([1.0, -2.0], requires_grad=True)
  topt = torch.optim.AdamW([tw], lr=0.1, weight_decay=0.1)
  for step in range(4):
    opt.zero_grad(); (w * w * w).sum().backward()
    topt.zero_grad(); (tw * tw * tw).sum().backward()
    if step == 3:
      opt.schedule_step()
      call = w.uop.src[1]
      assert w.uop.op is Ops.ASSIGN and call.op is Ops.CALL
      g = opt.param_groups[0]
      assert all(g.t(k).uop not in call.src for k in ("lr", "weight_decay", "step"))
      assert len(call.src) == 7  # w, both moments as written, the factors decay, step_size, bc2_sqrt and eps (of 22 leaves)
      Tensor.realize_all([w, *opt.state_tensors()])
    else: opt.step()
    topt.step()
    np.testing.assert_allclose(w.numpy(), tw.detach().numpy(), rtol=1e-6)
