"""VIZ's recorder (uop/trace.py): every graph_rewrite a named pass with the rules that fired and where they are written,
steps that replay to the pass's output, kernels with their passes and source, one timeline event per launch; and
nothing recorded (nor any recording code run) when it is off."""
import linecache, pathlib
import numpy as np
from attograd import Tensor
from attograd.codegen import PASSES, to_program
from attograd.runtime.device import Device
from attograd.uop import patterns, trace
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import PatternMatcher, UPat, graph_rewrite
from attograd.uop.symbolic import symbolic
from attograd.dtype import dtypes

def _program(n: int):
  # each test its own shapes: kernels lowered earlier in the process are not lowered (nor recorded) again
  a, b = Tensor.rand(n, 8), Tensor.rand(8, 4)
  return (a @ b).relu().sum(1).softmax(0).numpy()

def test_records_kernels_passes_and_launches():
  with trace.recording() as tr: _program(16)
  kernels = [g for g in tr.groups if g.kind == "kernel"]
  assert kernels and all(g.info["name"] and "void" in g.info["src"] or g.info["src"] for g in kernels)
  for k in kernels:
    mine = [p.name for p in tr.passes if p.group == tr.groups.index(k) and p.parent == -1]
    assert mine == [n for n, _ in PASSES], mine  # every named pass of lowering, in order, even those that did nothing
  assert any(g.kind == "schedule" for g in tr.groups)
  # one event per launch, each linked to the kernel it ran
  assert tr.events and all(tr.groups[e.group].info["name"] == e.name for e in tr.events)
  # a kernel's steps name real rules: the line at file:line is the rule's code
  fired = {(r, p.name) for p in tr.passes for s in p.steps if (r := s.rule) >= 0}
  assert fired
  for r, _ in fired:
    pm, i = tr.rules[r]
    file, line = pm.locations[i].rsplit(":", 1)
    assert pathlib.Path(file).exists() and linecache.getline(file, int(line)).strip()

def test_rule_location_and_steps():
  here = __file__
  pm = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: x),  # x + 0 -> x
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: x),  # x * 1 -> x
  ])
  x = UOp.variable("x", 0, 10)
  g = UOp(Ops.MUL, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (x, UOp.const(dtypes.int32, 0))), UOp.const(dtypes.int32, 1)))
  with trace.recording() as tr: out = graph_rewrite(g, pm, name="my_pass")
  assert out is x
  (p,) = [p for p in tr.passes if p.name == "my_pass"]
  assert p.input is g and p.output is x and len(p.steps) == 2
  locs = [tr.rules[s.rule][0].locations[tr.rules[s.rule][1]] for s in p.steps]
  assert [linecache.getline(here, int(l.rsplit(":", 1)[1])).strip().split("#")[1].strip() for l in locs] == ["x + 0 -> x", "x * 1 -> x"]
  assert all(l.startswith(here + ":") for l in locs)
  # the graph after the first step: the ADD is gone, the MUL is not
  mid = trace.replay(p.input, p.steps[:1])
  assert mid.op is Ops.MUL and mid.src[0] is x

def test_steps_replay_to_each_pass_output():
  with trace.recording() as tr: _program(24)
  checked = 0
  for p in tr.passes:
    if not p.rewrite: continue
    assert trace.replay(p.input, p.steps) is p.output, p.name
    checked += bool(p.steps)
  assert checked > 5

def test_recording_changes_no_result():
  """The recording copy of the rewrite loop gives what the engine gives: the same sources for the same kernels."""
  ast = (Tensor.empty(16, 32) @ Tensor.empty(32, 8)).exp().sum(1).schedule()[-1].ast
  r = Device["CPU"].renderer
  plain = to_program(ast, r)[1]
  with trace.recording(): traced = to_program(ast, r)[1]
  assert traced == plain
  expr = (UOp.variable("a", 0, 7) * 4 + UOp.variable("b", 0, 3)) // 4 % 8
  with trace.recording() as tr: got = graph_rewrite(expr, symbolic, name="s")
  assert got is graph_rewrite(expr, symbolic, name="s") and tr.passes

def test_off_records_nothing():
  assert trace.current is None and patterns.tracker is None
  out = _program(40)
  assert np.isfinite(out).all() and trace.current is None
  with trace.recording(): pass
  assert patterns.tracker is None  # switched back off
