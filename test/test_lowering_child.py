"""Kernels lowered in a forked child (engine/forked.py, engine/realize.py): a realize with LOWER_CHILD kernels to lower
sends them to a child process and compiles the programs it answers with; its garbage never enters this process."""
import os, signal
import numpy as np
import pytest
from attograd import Tensor, Context
from attograd.engine import realize, forked

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this system: kernels are lowered in the process")

@pytest.fixture
def cold(tmp_path, monkeypatch):
  """An empty program cache, nothing compiled in memory, and a note of each lowering this process does and each child."""
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(realize, "_kernel_cache", {})
  here: list[str] = []
  lower = realize.lower_program
  monkeypatch.setattr(realize, "lower_program", lambda ast, *a, **k: here.append(os.getpid()) or lower(ast, *a, **k))
  children: list[forked.ForkedWorker] = []
  init = forked.ForkedWorker.__init__
  def spy(self, *a, **k):
    init(self, *a, **k)
    children.append(self)
  monkeypatch.setattr(forked.ForkedWorker, "__init__", spy)
  return here, children

def _graphs(seed: int) -> tuple[list[Tensor], list[np.ndarray]]:
  # (shapes of each test's own: a graph realized before runs its kept plan, with the kernels it compiled then)
  rng = np.random.default_rng(seed)
  a, b = rng.standard_normal((24 + seed, 40)).astype(np.float32), rng.standard_normal((40, 16 + seed)).astype(np.float32)
  ta, tb = Tensor(a), Tensor(b)
  e = np.exp(a - a.max(1, keepdims=True))
  outs = [(ta @ tb).relu(), ta.softmax(1), (ta * 3).sum(0), ta.T.contiguous().cumsum(1), (tb * tb + 1).sqrt().amax(1)]
  want = [np.maximum(a @ b, 0), e / e.sum(1, keepdims=True), (a * 3).sum(0), np.cumsum(a.T, 1), np.sqrt(b * b + 1).max(1)]
  return outs, want

def _check(outs: list[Tensor], want: list[np.ndarray]) -> None:
  Tensor.realize_all(outs)
  for got, w in zip(outs, want): np.testing.assert_allclose(got.numpy(), w, rtol=1e-4, atol=1e-5)

def test_a_realize_of_many_kernels_lowers_them_in_a_child(cold):
  here, children = cold
  outs, want = _graphs(0)
  _check(outs, want)
  assert len(children) == 1 and here == []  # every kernel lowered in the child, none here
  built = [ck for ck in realize._kernel_cache.values()]
  assert len(built) >= 5 and all(ck.lower_s > 0 and ck.name in ck.src for ck in built)
  # the realize sent all it had: the child answers, exits, and is waited for
  with children[0].cond: assert children[0].cond.wait_for(lambda: children[0].ended, timeout=30)

def test_a_realize_of_a_few_kernels_lowers_them_here(cold):
  here, children = cold
  x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
  out = [(x * 2).sum(1), (x + 1).exp().amax(0)]
  Tensor.realize_all(out)
  np.testing.assert_allclose(out[0].numpy(), np.arange(12).reshape(3, 4).sum(1) * 2)
  assert children == [] and len(here) >= 2  # below LOWER_CHILD: a fork costs more than it saves
  with Context(LOWER_CHILD=0):
    outs, want = _graphs(1)
    _check(outs, want)
  assert children == []

def test_what_the_child_cant_lower_is_lowered_here(cold, monkeypatch):
  # an error in the child (here: every request) goes back as its text, and the kernel is lowered in this process, where
  # a real error would be raised with its traceback
  here, children = cold
  monkeypatch.setattr(realize, "_lower_request", lambda request: 1 / 0)
  outs, want = _graphs(2)
  _check(outs, want)
  assert len(children) == 1 and len(here) >= 5

def test_a_child_that_dies_is_not_waited_for(cold, monkeypatch):
  # a child killed mid-way (out of memory, a signal): the kernels it didn't answer are lowered here
  here, children = cold
  def die(request):
    os.kill(os.getpid(), signal.SIGKILL)
  monkeypatch.setattr(realize, "_lower_request", die)
  outs, want = _graphs(3)
  _check(outs, want)
  assert len(children) == 1 and children[0].ended and len(here) >= 5

def test_a_big_new_graph_is_scheduled_in_the_child(cold, monkeypatch):
  # the child is forked with the graph in its memory and answers with its template (the disk cache's data); the kernels
  # then go to the same child
  from attograd.schedule import schedule
  here, children = cold
  monkeypatch.setattr(realize, "SCHEDULE_CHILD_NODES", 50)  # (a test's graph is small)
  made_here: list[int] = []
  template = schedule._template
  monkeypatch.setattr(schedule, "_template", lambda *a: made_here.append(os.getpid()) or template(*a))
  outs, want = _graphs(4)
  _check(outs, want)
  assert len(children) == 1 and made_here == [] and here == []  # scheduled and lowered there
  assert children[0].sent == 1  # (each kernel lowered as the child made it, and told of: no request for it)

def test_the_childs_template_is_the_one_made_here(cold, monkeypatch):
  from attograd.uop.ops import UOp, Ops
  from attograd.dtype import dtypes
  from attograd.uop.patterns import graph_rewrite
  from attograd.schedule import schedule
  monkeypatch.setattr(realize, "SCHEDULE_CHILD_NODES", 50)
  outs, _ = _graphs(5)
  sink = graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(o.uop for o in outs)), schedule.values_only, name="values_only")
  _, inputs = schedule.graph_structure(sink)
  try: there = realize._schedule_in_child(sink, inputs, 7)
  finally:
    child = realize._child
    realize._end_lowering_child()
  for _, binary in child.made.values(): binary.result()  # (the kernels it told of compile on: none is left running)
  here = schedule._template(sink, inputs, 7)
  assert there is not None and len(here.items) >= 5
  assert schedule.template_data(there) == schedule.template_data(here) and there.key == here.key == 7
