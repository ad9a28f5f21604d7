"""No hidden state on hash-consed UOps: what the engine learns about a node lives in engine/registry.py, and an entry
dies with its node."""
import gc
import numpy as np
from attograd import Tensor, TinyJit, GlobalCounters, UOp
from attograd.dtype import dtypes
from attograd.uop.ops import Ops
from attograd.helpers import cached_property
from attograd.engine import registry
from attograd.engine.registry import NodeMap

# what a node may keep in its __dict__: caches that are pure functions of the node (cached properties, the symbolic
# ranges of uop/ops.py's _memo)
PURE_CACHES = {k for k, v in vars(UOp).items() if isinstance(v, cached_property)} | {"_range", "_ranges", "_live"}

def test_nodes_hold_no_engine_state():
  w = Tensor.rand(8, 8, requires_grad=True).realize()
  m = Tensor.zeros(8, 8).contiguous().realize()
  @TinyJit
  def step(x: Tensor) -> Tensor:
    loss = (x @ w).relu().sum()
    loss.backward()
    m.assign(m * 0.9 + w.grad)  # an assign over a whole buffer: the replay follows it
    return loss.realize()
  for _ in range(4): step(Tensor.rand(4, 8)).item()
  m.assign(m + 1).realize()  # an assign outside while the replay lives: a forwarding note for it
  step(Tensor.rand(4, 8)).item()
  kept = (w * 2).sum()
  kept.item()  # realized values, a graph kept for backward (a TinyJit's outputs keep none: a replay refills them)
  found = {k for u in gc.get_objects() if type(u) is UOp for k in vars(u)} - PURE_CACHES
  assert not found, f"state written onto UOps: {found}"
  assert len(registry.buffers) and len(registry.realized) and len(registry.sources) and len(registry.assigned_to)

def test_forwarding_notes_only_while_a_replay_lives():
  # assigned_to's readers are TinyJit replays: an eager assign with none alive leaves no note (an eager training step's
  # ~95 were written for no one), one while a replay lives does, and the replay reads the new memory
  saved = list(registry.jit_replays)
  registry.jit_replays.clear()  # (replays other tests of this process left alive)
  try:
    w = Tensor.ones(4).contiguous().realize()
    old = w.uop.base
    w.assign(w + 1).realize()
    assert registry.assigned_to.get(old) is None and w.tolist() == [2.0] * 4
    @TinyJit
    def f(x: Tensor) -> Tensor: return (x * w).realize()
    for _ in range(3): f(Tensor.ones(4).contiguous().realize())
    assert len(registry.jit_replays) == 1
    old = w.uop.base
    w.assign(w * 5).realize()
    assert registry.assigned_to.get(old) is w.uop.base
    assert f(Tensor.ones(4).contiguous().realize()).tolist() == [10.0] * 4
  finally:
    for r in saved: registry.jit_replays.add(r)

def test_registry_entries_die_with_their_nodes():
  gc.collect()
  counts = [len(r) for r in (registry.buffers, registry.realized, registry.sources)]
  used = GlobalCounters.mem_used
  a = Tensor.rand(64, 64).realize()
  b = (a @ a + 1).realize()
  assert b.sum().item() != 0 and GlobalCounters.mem_used > used
  assert all(len(r) > n for r, n in zip((registry.buffers, registry.realized, registry.sources), counts))
  del a, b  # no gc.collect(): the buffers and their entries go by reference counting alone
  assert [len(r) for r in (registry.buffers, registry.realized, registry.sources)] == counts
  assert GlobalCounters.mem_used == used

def test_node_map():
  m: NodeMap = NodeMap("test")
  keep, gone = UOp(Ops.CONST, dtypes.int32, (), 12345), UOp(Ops.CONST, dtypes.int32, (), 12346)
  m[keep], m[gone] = "a", np.zeros(3)
  assert m.get(keep) == "a" and gone in m and len(m) == 2
  del gone
  assert len(m) == 1
  m[keep] = "b"  # a new value for a node keeps its one weak reference
  assert m.pop(keep) == "b" and m.get(keep) is None and len(m) == 0

def test_hash_cons_entry_dies_with_its_node():
  # the table's entry is the weak reference itself (it carries the key): the node's death removes exactly its entry
  from attograd.uop.ops import UOpMeta
  u = UOp(Ops.CONST, dtypes.float32, (), 12345.5)
  key = (Ops.CONST, dtypes.float32, (), ("float", (12345.5).hex()))
  assert UOpMeta.ucache[key]() is u and UOp(Ops.CONST, dtypes.float32, (), 12345.5) is u
  n = len(UOpMeta.ucache)
  del u  # reference counting alone
  assert key not in UOpMeta.ucache and len(UOpMeta.ucache) == n - 1
  v = UOp(Ops.CONST, dtypes.float32, (), 12345.5)  # built again: a node and an entry of its own
  assert UOpMeta.ucache[key]() is v

def test_hash_cons_entry_of_a_newer_node_stays():
  # a dead node's entry is removed only if it is still the table's entry for the key: a newer one stays (put back)
  from attograd.uop.ops import UOpMeta, _Entry, _drop
  u = UOp(Ops.CONST, dtypes.float32, (), 23456.5)
  key = (Ops.CONST, dtypes.float32, (), ("float", (23456.5).hex()))
  old, other = UOpMeta.ucache[key], UOp(Ops.CONST, dtypes.float32, (), 23457.5)
  newer = UOpMeta.ucache[key] = _Entry(other, _drop)
  newer.key = key
  n = len(UOpMeta.ucache)
  del u  # old's callback runs: newer is the table's entry, and stays
  assert old() is None and UOpMeta.ucache[key] is newer and len(UOpMeta.ucache) == n
  del UOpMeta.ucache[key]

def test_node_map_entry_dies_with_its_node():
  m: NodeMap = NodeMap("test")
  u = UOp(Ops.CONST, dtypes.float32, (), 6789.25)
  m[u] = "a"; m[u] = "b"  # one entry, the value replaced
  assert len(m) == 1 and m.get(u) == "b" and u in m and m.by_id[id(u)].value == "b"
  del u
  assert len(m) == 0
