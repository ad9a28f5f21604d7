"""What the engine learns about nodes, kept beside them: UOps are hash-consed and immutable, so a fact about one
(the memory a BUFFER names, the view a lazy node became) lives in a registry here, never written onto the node.
Each registry says who writes it and who reads it. The nodes' own caches (shape, ancestors, ranges, the rewrite
engine's fixed-point marks) stay on the nodes: they are pure functions of the node, not state."""
from __future__ import annotations
import weakref
from typing import Generic, TypeVar
from attograd.uop.ops import UOp

V = TypeVar("V")

class _Slot(weakref.ref):
  """A NodeMap entry: a weak reference to the node, with the node's id (its key) and the value."""
  __slots__ = ("key", "value")

class NodeMap(Generic[V]):
  """node -> value while the node lives: the entry goes when the node dies (a value that held its own node would
  keep both forever). Keyed by id, each entry a weak reference to its node that carries the key and the value (one
  object an entry: a (reference, value) pair with a functools.partial callback was four, each walked by the cycle
  collector while it lived). A lookup is one dict probe: a WeakKeyDictionary builds a weak reference on every lookup
  (2x the time), and a JIT replay looks up every weight."""
  def __init__(self, doc: str):
    self.__doc__ = doc
    self._entries: dict[int, _Slot] = {}
    entries = self._entries
    def drop(slot: _Slot) -> None:  # (only this slot: a new node can have the dead one's id once it is gone)
      if entries.get(slot.key) is slot: del entries[slot.key]
    self._drop = drop
    self.writes = 0  # entries written so far: a reader that saw this count knows no entry was added or changed since
  def get(self, node: UOp) -> V | None: return e.value if (e := self._entries.get(id(node))) is not None else None
  @property
  def by_id(self) -> dict[int, _Slot]:
    """The entries as stored, id(node) -> entry, for a loop over a whole graph's nodes that can't afford a Python call
    per node (get's): `(e := m.by_id.get(id(n))) is not None` finds n's value as e.value."""
    return self._entries
  def __contains__(self, node: UOp) -> bool: return id(node) in self._entries
  def __len__(self) -> int: return len(self._entries)
  def __setitem__(self, node: UOp, value: V) -> None:
    self.writes += 1
    if (e := self._entries.get(key := id(node))) is None:
      e = self._entries[key] = _Slot(node, self._drop)
      e.key = key
    e.value = value
  def pop(self, node: UOp) -> V | None:
    # the entry's weak reference goes with it, and a dropped weak reference calls nothing
    return e.value if (e := self._entries.pop(id(node), None)) is not None else None

buffers: NodeMap = NodeMap("""BUFFER node -> its runtime Buffer (device memory), so memory lives exactly as long as a
graph names it. Written by engine/realize.py (buffer_of makes one on first use; run_schedule places the buffers a
schedule creates where the memory plan says); read through buffer_of by the run loop, jit.py, tensor.py, nn/state.py.""")

realized: NodeMap = NodeMap("""lazy node -> weakref to the buffer view it became. Written by engine/realize.py's
realize_graphs after a run; read through realized_view by its runnable (a later graph reads the buffer instead of
recomputing) and by tensor.py's _graph_for_gradient. Weak: the view remembers its graph (`sources`), and a strong
link back would be a cycle holding big buffers until a GC.""")

sources: NodeMap = NodeMap("""buffer view of a realized tensor -> the lazy graph it was computed from (with its
Variables bound), so backward() still works after the forward pass ran. Written by engine/realize.py's
realize_graphs; read by tensor.py's _graph_for_gradient.""")

assigned_to: NodeMap = NodeMap("""BUFFER node -> the BUFFER its tensor moved to when an assign over the whole buffer
was realized (a forwarding note; follow it to the end). Written by engine/realize.py's realize_graphs while a TinyJit
capture runs or a replay lives (jit_replays), removed by jit.py when a capture writes the assign back in place; read by
jit.py (_latest: a replay binds an assigned weight's new memory).""")

jit_replays: weakref.WeakSet = weakref.WeakSet()
"""The TinyJit replays alive (jit.py _Replay), assigned_to's readers. Without one, nothing reads a note: a replay made
later captures the memory its tensors have then, and follows only the moves after that (an eager training step's ~95
notes, each an entry that dies with the old buffer, were written for no one)."""
