"""The one IR: UOp, an immutable hash-consed node (op, dtype, src, arg), used at every level
from tensor graphs to linear kernel programs."""
from __future__ import annotations
import functools, math, operator, weakref
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Sequence
from attograd.dtype import DType, PtrDType, dtypes, ConstType, truncate
from attograd.helpers import cached_property

class Ops(Enum):
  # tensor level: storage, constants and the movement ops (which never reach a kernel)
  BUFFER = auto(); DEVICE = auto(); CONST = auto(); IOTA = auto()  # IOTA(n): 0..n-1, arange's primitive
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); FLIP = auto()
  REDUCE_AXIS = auto(); CONTIGUOUS = auto(); CONTIGUOUS_BACKWARD = auto(); ASSIGN = auto(); COPY = auto(); DETACH = auto()
  # WITH_DERIVATIVE(value, x, d, [x2, d2, ...]): value, whose derivative with respect to x (elementwise, same shape) autograd
  # takes to be d (and to x2 d2...): a function written as a polynomial approximation, or with branches for its special
  # points, differentiates as the function itself, in one expression. Scheduling keeps only the value. With a Vjp arg,
  # WITH_DERIVATIVE(value, x, [x2, ...]) instead: x's whole gradient (any shape x has) is the Vjp's function of the
  # gradient flowing into value, called by autograd (a vector-Jacobian product). Softmax's backward P * (g - sum(g * P))
  # reads P, its own output, where the chain rule through its exp and row sum made a backward pass recompute both;
  # attention's reads its probabilities and its output
  WITH_DERIVATIVE = auto()
  # CALL(x, ...): output arg.index of a graph built once over stand-ins for its sources (arg: a Call, its Template kept by
  # the front end per shape), this graph being that one over x, ... . Scheduling expands it (Call.expand) where it has no
  # schedule yet; where it has, the few CALL nodes are all the graph structure's walk sees of it: a sort of 100k is
  # thousands of nodes rebuilt and walked per call, a topk's hundreds, for a schedule found by its structure alone
  CALL = auto()
  BIND = auto()  # a DEFINE_VAR with its value for this run: BIND(var, CONST)
  # elementwise ALU, shared by every level
  # EXP (e**x) is a primitive so the graph holds one node and its derivative is itself; codegen expands it (uop/mathlib.py)
  NEG = auto(); EXP = auto(); EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); TRUNC = auto()
  ADD = auto(); SUB = auto(); MUL = auto(); FDIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto()
  CMPLT = auto(); CMPNE = auto(); CMPEQ = auto(); AND = auto(); OR = auto(); XOR = auto(); SHL = auto(); SHR = auto()
  WHERE = auto(); MULACC = auto(); CAST = auto(); BITCAST = auto()
  # kernel level. CORE_ID (CPU targets, the THREAD opt) is the slice of the kernel's work this call runs, 0..arg-1 (arg:
  # the number of slices), a kernel argument after the DEFINE_VARs: an op of its own, not a DEFINE_VAR of a reserved
  # name, so no user Variable can be taken for it. (Next to DEFINE_VAR, which it was: symbolic orders terms by op)
  SINK = auto(); PARAM = auto(); DEFINE_VAR = auto(); CORE_ID = auto(); DEFINE_REG = auto(); RANGE = auto(); END = auto()
  INDEX = auto(); LOAD = auto(); STORE = auto(); REDUCE = auto(); AFTER = auto(); NOOP = auto()
  # GPU targets (codegen/gpudims.py): SPECIAL(count) is a thread id, arg "gidx<d>" (work-group id in launch
  # dimension d) or "lidx<d>" (id within the work-group), valued 0..count-1; DEFINE_LOCAL is memory shared
  # by a work-group; BARRIER(stores) waits until every thread of the work-group has done its stores
  SPECIAL = auto(); DEFINE_LOCAL = auto(); BARRIER = auto()
  # scheduling: AT(value, gate, *idxs) is a shaped value read at the indices (one per axis), where gate holds. The
  # scheduler puts one at a kernel's store and pushes it down the tensor graph until it reaches buffers, where it becomes
  # a kernel's read: LOAD(INDEX(param, idx[, gate])) (schedule/indexing.py). None is left in a kernel
  AT = auto()
  # sharding (schedule/multi.py lowers these before scheduling). MULTI(part0, part1, ...) is one logical tensor held as
  # parts on devices (each part's own device): arg is the axis it is split along (the parts laid end to end), or None
  # when every part holds all of it (replicated). SHARD(x) is part arg[0] of x split as arg[1:] = (axis, bounds, devices),
  # bounds each part's (start, end) along axis. ALLREDUCE(part0, part1, ...) combines per-device parts of one shape with
  # the reduce op in arg (in place: each part's buffer then holds the result); MSELECT(x) is part arg of it
  MULTI = auto(); SHARD = auto(); ALLREDUCE = auto(); MSELECT = auto()
  def __repr__(self) -> str: return f"Ops.{self.name}"
  __hash__ = object.__hash__  # members are singletons; Enum's own hash is slow Python on the hot path

@functools.total_ordering
class AxisKind(Enum):
  """What a RANGE (arg: (id, kind, ...)) is a loop over. The scheduler makes GLOBAL (an output axis), REDUCE and SERIAL
  (a scatter-add's loops, which no Opt or thread id takes); Opts split off UPCAST/UNROLL (written out as copies by
  lowering), LANE (a reduce's SIMD accumulators), SIMD (a loop gcc vectorizes), LOCAL (a work-group's threads) and PACK
  (loops THREAD packs into one); lowering adds FOLD (the loops that fold a reduce's LANE accumulators into one after
  it). Printed as its word; ordered by it, so ranges sort as they did when kinds were words."""
  GLOBAL = "global"; REDUCE = "reduce"; SERIAL = "serial"; UPCAST = "upcast"; UNROLL = "unroll"; LANE = "lane"
  SIMD = "simd"; LOCAL = "local"; PACK = "pack"; FOLD = "fold"
  def __str__(self) -> str: return self.value
  def __lt__(self, other: AxisKind) -> bool: return self.value < other.value

class GroupOp:
  Unary = {Ops.NEG, Ops.EXP, Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIP, Ops.TRUNC}
  Binary = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.IDIV, Ops.MOD, Ops.MAX, Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ,
            Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR}
  Ternary = {Ops.WHERE, Ops.MULACC}
  Transcendental = {Ops.EXP, Ops.EXP2, Ops.LOG2, Ops.SIN}  # tens of instructions each once expanded
  ALU = Unary | Binary | Ternary
  Elementwise = ALU | {Ops.CAST, Ops.BITCAST}
  Commutative = {Ops.ADD, Ops.MUL, Ops.MAX, Ops.CMPNE, Ops.CMPEQ, Ops.AND, Ops.OR, Ops.XOR}
  Comparison = {Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ}
  Movement = {Ops.RESHAPE, Ops.PERMUTE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.FLIP}
  Sized = {Ops.RESHAPE, Ops.EXPAND, Ops.PAD, Ops.SHRINK, Ops.IOTA}  # ops whose arg holds sizes, which may be symbolic

# ***** Python semantics of every ALU op, with C's truncating division (DESIGN §4.4) *****

def _cdiv(a: int, b: int) -> int:
  if b == 0: return 0  # C leaves it undefined; the emulator and constant folding agree on 0
  q = abs(a) // abs(b)
  return q if (a >= 0) == (b > 0) else -q
def _cmod(a: int, b: int) -> int: return 0 if b == 0 else a - b * _cdiv(a, b)
def _safe(f: Callable[[float], float]) -> Callable[[float], float]:
  def g(x: float) -> float:
    try: return f(x)
    except (ValueError, OverflowError): return math.nan
  return g
def _exp2(x: float) -> float:
  try: return 2.0 ** x
  except OverflowError: return math.inf
def _exp(x: float) -> float:
  try: return math.exp(x)
  except OverflowError: return math.inf
def _log2(x: float) -> float: return -math.inf if x == 0 else math.nan if x < 0 or math.isnan(x) else math.log2(x)
def _sqrt(x: float) -> float: return math.nan if x < 0 or math.isnan(x) else math.sqrt(x)
def _recip(x: float) -> float: return (math.copysign(math.inf, x) if x == 0 else 1.0 / x)
def _fdiv(a: float, b: float) -> float:
  if b == 0: return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)
  return a / b
def _trunc(x: float) -> float: return x if math.isinf(x) or math.isnan(x) else float(math.trunc(x))
def _max(a: Any, b: Any) -> Any: return a if math.isnan(a) else b if math.isnan(b) else max(a, b)

python_alu: dict[Ops, Callable[..., Any]] = {
  Ops.NEG: operator.neg, Ops.EXP: _exp, Ops.EXP2: _exp2, Ops.LOG2: _log2, Ops.SIN: _safe(math.sin), Ops.SQRT: _sqrt,
  Ops.RECIP: _recip, Ops.TRUNC: _trunc,
  Ops.ADD: operator.add, Ops.SUB: operator.sub, Ops.MUL: operator.mul, Ops.FDIV: _fdiv, Ops.IDIV: _cdiv, Ops.MOD: _cmod,
  Ops.MAX: _max, Ops.CMPLT: operator.lt, Ops.CMPNE: operator.ne, Ops.CMPEQ: operator.eq,
  Ops.AND: operator.and_, Ops.OR: operator.or_, Ops.XOR: operator.xor,
  Ops.SHL: lambda a, b: a << b, Ops.SHR: lambda a, b: a >> b,
  Ops.WHERE: lambda c, a, b: a if c else b, Ops.MULACC: lambda a, b, c: a * b + c}

def exec_alu(op: Ops, dtype: DType, operands: Sequence[ConstType]) -> ConstType:
  """One ALU op on Python values, with the result as the dtype would store it."""
  # the IR's shifts take amounts in [0, bits) (C leaves others undefined; Tensor's shifts handle
  # them before building SHL/SHR): the Python semantics reduce the amount so both sides agree there
  if dtypes.is_int(dtype) and op in (Ops.SHL, Ops.SHR):
    return truncate(dtype, python_alu[op](operands[0], operands[1] % (8 * dtype.itemsize)))
  try: return truncate(dtype, python_alu[op](*operands))
  except OverflowError: return math.inf

@dataclass(frozen=True, init=False)
class BufferArg:
  """What a BUFFER node names: memory `uid` on a device. `offset` places the buffer at a byte offset
  of storage the device already holds (a tensor inside a file on DISK)."""
  uid: int
  device: str
  size: int
  offset: int = 0
  def __init__(self, uid: int, device: str, size: int, offset: int = 0):
    # the fields written into the instance's dict at once: a frozen dataclass's generated __init__ sets each through
    # object.__setattr__ (0.7-1.1 against 0.4-0.5 us), and each step's schedule makes a buffer for every kernel, 250 a training step's
    d = self.__dict__
    d["uid"], d["device"], d["size"], d["offset"] = uid, device, size, offset

# ***** the node *****

def arg_key(arg: Any) -> Any:
  """arg as a key: a float by its bits, so -0.0 is not 0.0 (1/x differs) and NaN equals itself (a graph holding one finds
  its node, and its schedule, again)."""
  return ("float", arg.hex()) if type(arg) is float else arg

class Vjp:
  """A WITH_DERIVATIVE's vector-Jacobian products: fns[i](g) is the gradient of its source i+1 for the gradient g of its
  value. Called by autograd only when a backward pass runs: a forward pass builds none of them (attention's were a third
  of its nodes), and the backward is built over the gradient itself, with no placeholder to substitute through the
  graph below. Compared by identity: each function call makes its own node.
  Given as `make` and the nodes it reads (`captured`, None for an absent one) rather than as functions, the products are
  make(*captured), made when autograd first asks: a Template rebuilding the node over other inputs makes a Vjp of the
  same make over its own nodes (functions closing over one call's tensors would give another call this call's gradient)."""
  __slots__ = ("_fns", "make", "captured")
  def __init__(self, fns: tuple[Callable[[UOp], UOp], ...] | None = None, make: Callable[..., tuple] | None = None,
               captured: tuple[UOp | None, ...] = ()):
    self._fns, self.make, self.captured = fns, make, captured
  @property
  def fns(self) -> tuple[Callable[[UOp], UOp], ...]:
    if self._fns is None: self._fns = self.make(*self.captured)  # type: ignore[misc]
    return self._fns
  def __repr__(self) -> str: return f"Vjp({len(self.fns)})"

_OP_BIT = {op: 1 << op.value for op in Ops}  # (Enum's .value is a Python property: a dict is 5x faster)

_UNSET: Any = object()  # a slot of UOp not computed yet

class _Entry(weakref.ref):
  """The hash-cons table's weak reference to a node, holding the node's key: when the node dies, _drop removes its entry
  by that key. (A plain ref with a functools.partial callback allocated two more objects per node, the partial and the
  bound dict.pop it holds, each one the cycle collector walked while the node lived: a training step builds thousands)"""
  __slots__ = ("key",)

def _drop(entry: _Entry) -> None:
  # (only this entry: a node built again with the key after this one died has an entry of its own, put back). One
  # lookup of the key, not two: hashing a key calls DType.__hash__, and a training step's thousands of nodes die each step
  cache = UOpMeta.ucache
  if (e := cache.pop(entry.key, None)) is not entry and e is not None: cache[entry.key] = e

class UOpMeta(type):
  ucache: dict[tuple, _Entry] = {}
  def __call__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
    # (the hot path of every graph built: arg_key inlined, and the node made without type.__call__'s dispatch to __init__)
    key = (op, dtype, src, ("float", arg.hex()) if type(arg) is float else arg)
    if (ref := UOpMeta.ucache.get(key)) is not None and (node := ref()) is not None: return node
    node = cls.__new__(cls)
    node.op, node.dtype, node.src, node.arg = op, dtype, src, arg
    # the ops in this graph, a bit each (1 << op.value): a rewrite skips a graph holding no op its rules are for
    m = _OP_BIT[op]
    for s in src: m |= s.opmask
    node.opmask = m
    node._shape_memo = node._device_memo = _UNSET
    node.fixed = 0
    entry = UOpMeta.ucache[key] = _Entry(node, _drop)
    entry.key = key
    return node

def compact_node_table() -> None:
  """Rebuild the hash-cons table at the size of the nodes alive now. A dict never shrinks: the table grown to hold a big
  graph's nodes (tracing and scheduling a 30-layer LLM pass: 1.3 MiB of slots) stayed that big for the 9k nodes a
  captured model keeps (0.3 MiB rebuilt). A copy of an exact dict allocates once and runs no Python code, so no entry is
  dropped in the middle of it."""
  UOpMeta.ucache = dict(UOpMeta.ucache)

class UOp(metaclass=UOpMeta):
  """An immutable node. Building the same node twice returns the same object, so `is` is equality."""
  # shape and device, asked of nearly every node the front end builds, are slots filled on first use: kept in the
  # __dict__ (as cached properties), they gave each node a dict, one more object for the cycle collector to walk
  # fixed: the PatternMatchers (a bit each, PatternMatcher.fixed_bit) this node is a fixed point of (graph_rewrite)
  __slots__ = ("op", "dtype", "src", "arg", "opmask", "fixed", "_shape_memo", "_device_memo", "__weakref__", "__dict__")
  def __init__(self, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None):
    raise AssertionError("UOpMeta.__call__ makes every node")  # (kept for the signature: UOp(op, dtype, src, arg))
  def __reduce__(self): return UOp, (self.op, self.dtype, self.src, self.arg)
  def replace(self, **kwargs: Any) -> UOp:
    new = (kwargs.get("op", self.op), kwargs.get("dtype", self.dtype), kwargs.get("src", self.src), kwargs.get("arg", self.arg))
    return self if new == (self.op, self.dtype, self.src, self.arg) else UOp(*new)
  def __repr__(self) -> str:  # a symbolic size reads as text in shapes and errors: (n=10, 4)
    return (_render(self)[1:-1] if self.op is Ops.BIND else _render(self)) if _is_sym_int(self) else pretty(self)
  def __bool__(self) -> bool:
    if _is_sym_int(self):  # a comparison of symbolic sizes reached an int-only path of the front end
      raise TypeError(f"{self!r} depends on the value of a Variable: this operation doesn't support symbolic sizes")
    raise TypeError(f"a UOp has no truth value; use .simplify() and check for CONST (got {self.op})")

  # ***** graph walking *****
  @property
  def toposort(self) -> dict[UOp, None]:
    """Every node this one depends on, children before parents, itself last (a fresh dict: callers may keep it)."""
    out = self.ancestors.copy()
    out[self] = None
    return out
  @cached_property
  def ancestors(self) -> dict[UOp, None]:
    """toposort without the node itself. Cached without it on purpose: a node that held itself would form a
    reference cycle, and a graph's buffers would then wait for the garbage collector instead of dying with
    their last tensor (each step would page-fault fresh memory in)."""
    # a depth-first walk, sources in order, each node after its sources; iterative (graphs can be deep), with one
    # iterator per open node (half the time of pushing every source)
    out: dict[UOp, None] = {}
    nodes, sources = [self], [iter(self.src)]
    while sources:
      for s in sources[-1]:
        if s not in out:
          nodes.append(s); sources.append(iter(s.src))
          break
      else:
        sources.pop()
        node = nodes.pop()
        if sources: out[node] = None
    return out
  def substitute(self, mapping: dict[UOp, UOp]) -> UOp:
    """Replace nodes by identity, rebuilding what depends on them."""
    new: dict[UOp, UOp] = {}
    for u in self.toposort:
      if u in mapping: new[u] = mapping[u]
      else: new[u] = u.replace(src=tuple(new[s] for s in u.src)) if u.src else u
    return new[self]

  # ***** constructors *****
  @staticmethod
  def const(dtype: DType, value: ConstType) -> UOp:
    if isinstance(value, UOp): return value
    return UOp(Ops.CONST, dtype, (), truncate(dtype.scalar(), value))
  def const_like(self, value: ConstType) -> UOp: return UOp.const(self.dtype, value)
  @staticmethod
  def variable(name: str, vmin: int, vmax: int, dtype: DType = dtypes.int32) -> UOp:
    if not (isinstance(vmin, int) and isinstance(vmax, int) and vmin <= vmax):
      raise ValueError(f"variable {name!r} needs integer bounds with min <= max, got [{vmin}, {vmax}]")
    return UOp(Ops.DEFINE_VAR, dtype, (), (name, vmin, vmax))
  def bind(self, value: int) -> UOp:
    """This variable with a value for the next run: the kernels are built for the variable, not the value."""
    if self.op is not Ops.DEFINE_VAR: raise TypeError(f"only a Variable can be bound, not {self.op}")
    name, vmin, vmax = self.arg
    if not isinstance(value, int) or not vmin <= value <= vmax: raise ValueError(f"variable {name!r} is in [{vmin}, {vmax}], can't bind {value!r}")
    return UOp(Ops.BIND, self.dtype, (self, UOp.const(self.dtype, value)))
  def alu(self, op: Ops, *src: UOp | ConstType, dtype: DType | None = None) -> UOp:
    srcs = (self, *(s if isinstance(s, UOp) else self.const_like(s) for s in src))
    if dtype is None: dtype = dtypes.bool if op in GroupOp.Comparison else srcs[-1].dtype
    return UOp(op, dtype, srcs)
  def cast(self, dtype: DType) -> UOp: return self if self.dtype == dtype else UOp(Ops.CAST, dtype, (self,))
  def bitcast(self, dtype: DType) -> UOp: return UOp(Ops.BITCAST, dtype, (self,))
  def where(self, a: UOp | ConstType, b: UOp | ConstType) -> UOp:
    x = a if isinstance(a, UOp) else b.const_like(a) if isinstance(b, UOp) else UOp.const(dtypes.from_py(a), a)
    y = b if isinstance(b, UOp) else x.const_like(b)
    return UOp(Ops.WHERE, x.dtype, (self, x, y))
  def index(self, *idx: UOp) -> UOp: return UOp(Ops.INDEX, self.dtype, (self, *idx))
  @property
  def gate(self) -> UOp | None:
    """An INDEX's validity gate: INDEX(buf, idx) reads always, INDEX(buf, idx, gate) only where gate holds."""
    return self.src[2] if len(self.src) > 2 else None
  def load(self, *src: UOp, dtype: DType | None = None) -> UOp:
    return UOp(Ops.LOAD, dtype or (self.dtype.base if isinstance(self.dtype, PtrDType) else self.dtype), (self, *src))
  def store(self, value: UOp) -> UOp: return UOp(Ops.STORE, dtypes.void, (self, value))
  def end(self, *ranges: UOp) -> UOp:
    ret = self
    for r in sorted(ranges, key=lambda r: r.arg, reverse=True): ret = UOp(Ops.END, dtypes.void, (ret, r))
    return ret
  def after(self, *deps: UOp) -> UOp: return UOp(Ops.AFTER, self.dtype, (self, *deps))
  def sink(self, *more: UOp) -> UOp: return UOp(Ops.SINK, dtypes.void, (self, *more))

  # ***** tensor-level constructors (no checks: the Tensor front end validates) *****
  def reshape(self, shape: tuple[int, ...]) -> UOp:
    return self if tuple(shape) == self.shape else UOp(Ops.RESHAPE, self.dtype, (self,), tuple(shape))
  def expand(self, shape: tuple[int, ...]) -> UOp:
    return self if tuple(shape) == self.shape else UOp(Ops.EXPAND, self.dtype, (self,), tuple(shape))
  def permute(self, order: tuple[int, ...]) -> UOp:
    return self if tuple(order) == tuple(range(len(order))) else UOp(Ops.PERMUTE, self.dtype, (self,), tuple(order))
  def pad(self, arg: tuple[tuple[int, int], ...]) -> UOp:
    return self if all(p == (0, 0) for p in arg) else UOp(Ops.PAD, self.dtype, (self,), tuple(arg))
  def shrink(self, arg: tuple[tuple[int, int], ...]) -> UOp:
    return self if all(a == (0, s) for a, s in zip(arg, self.shape)) else UOp(Ops.SHRINK, self.dtype, (self,), tuple(arg))
  def flip(self, axes: tuple[bool, ...]) -> UOp: return self if not any(axes) else UOp(Ops.FLIP, self.dtype, (self,), tuple(axes))
  def reduce_axis(self, op: Ops, axes: tuple[int, ...]) -> UOp:
    axes = tuple(a for a in axes if self.shape[a] != 1)
    return self if not axes else UOp(Ops.REDUCE_AXIS, self.dtype, (self,), (op, axes))
  def const_shaped(self, value: ConstType, shape: tuple[int, ...] | None = None) -> UOp:
    """A tensor-level constant on this node's device, broadcast to shape (default: this node's)."""
    shape = self.shape if shape is None else shape
    c = device_leaf(Ops.CONST, self.dtype, self.device, truncate(self.dtype, value))
    return c.reshape((1,) * len(shape)).expand(shape) if shape else c

  # ***** arithmetic (used for symbolic index math and by the front end) *****
  def _bin(self, op: Ops, x: UOp | ConstType, reverse: bool = False) -> UOp:
    y = x if isinstance(x, UOp) else self.const_like(x)
    return (y.alu(op, self) if reverse else self.alu(op, y))
  def __add__(self, x): return self._bin(Ops.ADD, x)
  def __radd__(self, x): return self._bin(Ops.ADD, x, True)
  def __sub__(self, x): return self._bin(Ops.SUB, x)
  def __rsub__(self, x): return self._bin(Ops.SUB, x, True)
  def __mul__(self, x): return self._bin(Ops.MUL, x)
  def __rmul__(self, x): return self._bin(Ops.MUL, x, True)
  def __floordiv__(self, x): return self._bin(Ops.IDIV, x)  # C truncation, the IR's one division (DESIGN §4.4)
  def __rfloordiv__(self, x): return self._bin(Ops.IDIV, x, True)
  def __mod__(self, x): return self._bin(Ops.MOD, x)
  def __rmod__(self, x): return self._bin(Ops.MOD, x, True)
  def __truediv__(self, x): return self._bin(Ops.FDIV, x)
  def __neg__(self): return self.alu(Ops.NEG)
  def __and__(self, x): return self._bin(Ops.AND, x)
  def __rand__(self, x): return self._bin(Ops.AND, x, True)
  def __or__(self, x): return self._bin(Ops.OR, x)
  def __ror__(self, x): return self._bin(Ops.OR, x, True)
  def __xor__(self, x): return self._bin(Ops.XOR, x)
  def __lshift__(self, x): return self._bin(Ops.SHL, x)
  def __rshift__(self, x): return self._bin(Ops.SHR, x)
  def __lt__(self, x): return self._bin(Ops.CMPLT, x)
  def __gt__(self, x): return self._bin(Ops.CMPLT, x, True)
  def __le__(self, x): return self._bin(Ops.CMPLT, x, True).logical_not()
  def __ge__(self, x): return self._bin(Ops.CMPLT, x).logical_not()
  def ne(self, x) -> UOp: return self._bin(Ops.CMPNE, x)
  def eq(self, x) -> UOp: return self._bin(Ops.CMPEQ, x)
  def logical_not(self) -> UOp: return self.alu(Ops.CMPNE, True)
  def maximum(self, x) -> UOp: return self._bin(Ops.MAX, x)
  def minimum(self, x) -> UOp: return -(-self).maximum(-x if isinstance(x, UOp) else -x)
  __hash__ = object.__hash__

  # ***** symbolic integers *****
  def _memo(self, key: str, compute: Callable[[UOp], Any]) -> Any:
    """compute(u), kept in u.__dict__[key], for this node and every node below it that hasn't it yet, children
    first. Iterative (graphs can be deeper than Python's recursion limit), and it stops where the value is known."""
    if key not in self.__dict__:
      stack: list[tuple[UOp, bool]] = [(self, False)]
      while stack:
        node, expanded = stack.pop()
        if key in node.__dict__: continue
        if expanded: node.__dict__[key] = compute(node)
        else:
          stack.append((node, True))
          stack.extend((s, False) for s in node.src if key not in s.__dict__)
    return self.__dict__[key]
  @property
  def bounds(self) -> tuple[ConstType, ConstType]: return self._memo("_range", _range_info)[:2]
  @property
  def vmin(self) -> ConstType: return self.bounds[0]
  @property
  def vmax(self) -> ConstType: return self.bounds[1]
  @property
  def exact(self) -> bool:
    """No integer operation in this expression wraps around, for any value in bounds: rules that
    reason about magnitudes (division, comparisons) may only use expressions that are exact."""
    return self._memo("_range", _range_info)[2]
  simplifier: Callable[[UOp], UOp] | None = None  # installed by uop.symbolic (ops must not import it)
  def simplify(self) -> UOp:
    assert UOp.simplifier is not None, "import attograd.uop to install the symbolic rules"
    return UOp.simplifier(self)
  def variables(self) -> list[UOp]: return sorted((u for u in self.toposort if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg)
  def render(self) -> str:
    """Index math as readable text (C semantics), e.g. '((r0*4)+r1)'."""
    return _render(self)

  @property
  def ranges(self) -> frozenset[UOp]:
    """Every RANGE this node depends on, ended or not (toposort's RANGEs, kept per node: each node unions its sources')."""
    return _and_self(self, self._memo("_ranges", _ranges_info))
  @property
  def live_ranges(self) -> frozenset[UOp]:
    """The loops this node lives in: RANGEs it depends on, less those closed by an END it depends on."""
    return _and_self(self, self._memo("_live", _live_info))

  # ***** tensor level: shape and device *****
  @property
  def shape(self) -> tuple[sint, ...]:
    if (s := self._shape_memo) is _UNSET: s = self._shape_memo = _shape(self)
    return s
  @property
  def symbolic_shape(self) -> bool: return not isinstance(math.prod(self.shape), int)  # one C call for static shapes
  @property
  def size(self) -> sint: return sym_prod(self.shape)
  @cached_property
  def sym_args(self) -> tuple[UOp, ...]:
    """The symbolic sizes (UOps) in this node's arg: a shape or a shrink/pad amount that is a Variable."""
    return tuple(x for x in _arg_sizes(self) if isinstance(x, UOp))
  @property
  def device(self) -> str:
    if (d := self._device_memo) is _UNSET: d = self._device_memo = _device(self)
    return d
  @property
  def base(self) -> UOp:
    """The node under any movement ops."""
    u = self
    while u.op in GroupOp.Movement: u = u.src[0]
    return u

def _device(self: UOp) -> str:
  if self.op is Ops.DEVICE: return self.arg
  if self.op is Ops.BUFFER: return self.arg.device
  if self.op is Ops.COPY: return self.src[1].arg
  # a sharded node's device is the tuple of its parts' devices
  if self.op is Ops.MULTI or self.op is Ops.ALLREDUCE: return tuple(s.device for s in self.src)
  if self.op is Ops.SHARD: return self.arg[3][self.arg[0]]
  if self.op is Ops.MSELECT: return self.src[0].device[self.arg]
  for s in self.src:
    if (d := s.device) is not None: return d
  return None  # type: ignore[return-value]

def device_leaf(op: Ops, dtype: DType, device: str | tuple[str, ...], arg: Any) -> UOp:
  """A CONST or IOTA on device; on a tuple of devices (a sharded tensor's), one on each: a replicated MULTI."""
  if isinstance(device, tuple): return UOp(Ops.MULTI, dtype, tuple(device_leaf(op, dtype, d, arg) for d in device), None)
  return UOp(op, dtype, (UOp(Ops.DEVICE, dtypes.void, (), device),), arg)

def _walk_to(root: UOp, stop: set[UOp]) -> dict[UOp, None]:
  """root's graph down to the nodes in stop, children first (as toposort, but the sources of a node in stop are not
  walked: a Template's leaf may be a graph that reads another leaf, an optimizer update's gradient its parameter)."""
  out: dict[UOp, None] = {}
  nodes, sources = [root], [iter(() if root in stop else root.src)]
  while sources:
    for s in sources[-1]:
      if s not in out:
        nodes.append(s); sources.append(iter(() if s in stop else s.src))
        break
    else:
      sources.pop()
      out[nodes.pop()] = None
  return out

class Template:
  """A graph built over stand-in leaves, kept as the steps that rebuild it over other nodes: only the nodes above the
  leaves are rebuilt (constants, aranges and their broadcasts stay as they are), each from a row of (op, dtype, source
  slots, arg), without the walk of the whole graph and the per-node replace() a substitute() does. `outputs`: the root's
  sources when it is a SINK (several results), else the root alone; `shapes` and `dtypes` theirs."""
  __slots__ = ("fixed", "steps", "n_leaves", "used", "outputs", "call_args", "rebinds", "opaque", "root_memo", "opmask", "__weakref__")
  def __init__(self, leaves: tuple[UOp, ...], root: UOp):
    above: dict[UOp, None] = {}
    leaf_set = set(leaves)
    walked = _walk_to(root, leaf_set)
    for u in walked:
      if u not in leaf_set and any(s in leaf_set or s in above for s in u.src): above[u] = None
    if root not in leaf_set and root not in above: raise AssertionError("a template's graph must depend on its inputs")
    # the leaves (distinct nodes) the graph reads, by place: a CALL's sources are those only (an optimizer update's inputs
    # hold group tensors only its factors read, a gradient's the forward pass's every buffer), each one more node in
    # every walk of the step's graph, and an input of its schedule the kernels don't read
    self.used = tuple(i for i, leaf in enumerate(leaves) if leaf in walked)
    leaves = tuple(leaves[i] for i in self.used)
    # slots: the fixed sources (nodes not above a leaf) first, then the leaves' replacements, then each rebuilt node.
    # A Vjp's captured nodes that don't depend on a leaf are fixed too (a causal mask attention's backward reads)
    captured = [c for u in above if isinstance(u.arg, Vjp) for c in u.arg.captured
                if c is not None and c not in leaf_set and c not in above and not any(n in leaf_set for n in c.toposort)]
    fixed = list(dict.fromkeys([*(s for u in above for s in u.src if s not in leaf_set and s not in above), *captured]))
    slot = {s: i for i, s in enumerate(fixed)}
    for i, leaf in enumerate(leaves): slot[leaf] = len(fixed) + i
    for i, u in enumerate(above): slot[u] = len(fixed) + len(leaves) + i
    self.fixed, self.n_leaves = fixed, len(leaves)
    self.steps = [(u.op, u.dtype, tuple(slot[s] for s in u.src), u.arg) for u in above]
    # the ops of the graph it builds but its leaves' (a CALL's opmask is its sources': this is what its expansion adds)
    self.opmask = functools.reduce(operator.or_, (u.opmask for u in above), 0)
    # a Vjp given by its make is made again over the rebuilt nodes it reads: (step, the slots of its captured nodes, -1
    # for None). `opaque`: a node the rebuilt graph can't have as it is, a Vjp of functions over this graph's nodes, or
    # of a make reading a node outside the slots or not below it (the rebuilt graph would take this one's gradients)
    self.rebinds: list[tuple[int, tuple[int, ...]]] = []
    self.opaque = False
    for i, u in enumerate(above):
      if isinstance(u.arg, Vjp):
        if u.arg.make is None or any(c is not None and (c not in slot or slot[c] >= slot[u]) for c in u.arg.captured): self.opaque = True
        else: self.rebinds.append((i, tuple(-1 if c is None else slot[c] for c in u.arg.captured)))
    self.outputs = tuple((u.shape, u.dtype) for u in (root.src if root.op is Ops.SINK else (root,)))
    self.call_args = tuple((Call(self, i, shape), dt) for i, (shape, dt) in enumerate(self.outputs))  # (made once)
    # a one-output root's shape and device, given to the rebuilt root (when the leaves have this graph's devices), so the
    # next op over it doesn't find them by walking down the rebuilt nodes, none of which had them asked
    self.root_memo = None if root.op is Ops.SINK else (root.shape, root.device, tuple(x.device for x in leaves))
  def __repr__(self) -> str: return f"Template({len(self.steps)} nodes over {self.n_leaves} input(s), {len(self.outputs)} output(s))"
  def __call__(self, *xs: UOp) -> UOp:
    """The graph over xs in place of the leaves (all of them, or those it reads: `used`, a CALL's sources), its root a
    SINK of the outputs when there are several."""
    if len(xs) != len(self.used): xs = tuple([xs[i] for i in self.used])
    slots = self.fixed.copy()
    slots += xs
    if not self.rebinds:
      for op, dtype, src, arg in self.steps: slots.append(UOp(op, dtype, tuple([slots[i] for i in src]), arg))
      return self._memo_root(slots[-1], xs)
    base, steps = len(slots), self.steps
    for i, cap in self.rebinds:  # (each Vjp's captured nodes are built before its node: they are its sources' graph)
      for op, dtype, src, arg in steps[len(slots) - base:i]: slots.append(UOp(op, dtype, tuple([slots[j] for j in src]), arg))
      op, dtype, src, arg = steps[i]
      arg = Vjp(make=arg.make, captured=tuple(None if j < 0 else slots[j] for j in cap))
      slots.append(UOp(op, dtype, tuple([slots[j] for j in src]), arg))
    for op, dtype, src, arg in steps[len(slots) - base:]: slots.append(UOp(op, dtype, tuple([slots[j] for j in src]), arg))
    return self._memo_root(slots[-1], xs)
  def _memo_root(self, root: UOp, xs: tuple[UOp, ...]) -> UOp:
    if (m := self.root_memo) is not None and root._shape_memo is _UNSET and m[2] == tuple([x.device for x in xs]):
      root._shape_memo, root._device_memo = m[0], m[1]
    return root
  def calls(self, *xs: UOp) -> tuple[UOp, ...]:
    """A CALL node per output, over xs in place of the leaves the template was made with (its sources: those it reads):
    the graph as a few nodes, expanded where it is scheduled."""
    if len(xs) != len(self.used): xs = tuple([xs[i] for i in self.used])
    return tuple(UOp(Ops.CALL, dt, xs, arg) for arg, dt in self.call_args)

@dataclass(frozen=True, eq=False)
class Call:
  """A CALL node's arg: output `index` of `body` (a Template), of this shape. Made once per output (Template.call_args),
  so compared and hashed by identity, in C: a CALL node's key is hashed when it is built, stored and dropped, and a
  dataclass's generated __hash__ was Python, 270 calls a training step's optimizer update."""
  body: Template
  index: int
  shape: tuple[int, ...]
  def expand(self, xs: tuple[UOp, ...]) -> UOp:
    """The graph output `index` stands for over xs. The outputs of one template over the same sources (a backward pass's
    30 gradients) share one expansion, kept by each of their CALL nodes alive: each expansion builds every output, and a
    Vjp rebuilt is a new node each time (with the graph above it), so 30 expansions were 30 copies of the graph to
    schedule (a training step's first schedule: +50 ms). Kept by the CALL node: it reads only the CALL's sources."""
    if len(self.body.call_args) == 1: return root.src[0] if (root := self.body(*xs)).op is Ops.SINK else root
    if (me := _alive((Ops.CALL, self.body.call_args[self.index][1], xs, self))) is not None and "_expansion" in me.__dict__:
      return me.__dict__["_expansion"]
    root = self.body(*xs)
    for (arg, dt), out in zip(self.body.call_args, root.src):
      if (n := _alive((Ops.CALL, dt, xs, arg))) is not None: n.__dict__["_expansion"] = out
    return root.src[self.index]

def _alive(key: tuple) -> UOp | None:
  """The node of this key (op, dtype, src, arg) if one is alive."""
  return None if (ref := UOpMeta.ucache.get(key)) is None else ref()

def _multi_shape(u: UOp) -> tuple:  # the logical shape: the parts laid end to end along the axis
  if u.arg is None: return u.src[0].shape
  return tuple(sym_sum(*(s.shape[i] for s in u.src)) if i == u.arg else n for i, n in enumerate(u.src[0].shape))
def _shard_shape(u: UOp) -> tuple:
  (i, axis, bounds, _), shape = u.arg, u.src[0].shape
  return shape if axis is None else tuple(bounds[i][1] - bounds[i][0] if a == axis else n for a, n in enumerate(shape))
def _first_src_shape(u: UOp) -> tuple: return u.src[0].shape

# each op's shape but the elementwise ones' (their sources' common shape): one dict lookup, where a chain of tests put
# the most common nodes, ALU ops, last (every new node's shape is asked for)
_SHAPE_OF: dict[Ops, Callable[[UOp], tuple]] = {
  Ops.BUFFER: lambda u: (u.arg.size,), Ops.IOTA: lambda u: (u.arg,), Ops.WITH_DERIVATIVE: _first_src_shape,
  **{op: lambda u: () for op in (Ops.CONST, Ops.DEVICE, Ops.DEFINE_VAR, Ops.BIND)},
  Ops.RESHAPE: lambda u: u.arg, Ops.EXPAND: lambda u: u.arg,
  Ops.PERMUTE: lambda u: tuple(u.src[0].shape[i] for i in u.arg),
  Ops.PAD: lambda u: tuple(sym_sum(s, b, a) for s, (b, a) in zip(u.src[0].shape, u.arg)),
  Ops.SHRINK: lambda u: tuple(sym_sum(e, sym_neg(b)) for b, e in u.arg),
  Ops.REDUCE_AXIS: lambda u: tuple(1 if i in u.arg[1] else s for i, s in enumerate(u.src[0].shape)),
  Ops.ASSIGN: _first_src_shape, Ops.MULTI: _multi_shape, Ops.SHARD: _shard_shape,
  Ops.MSELECT: _first_src_shape, Ops.ALLREDUCE: _first_src_shape,  # (an ALLREDUCE's: each part's)
  Ops.CALL: lambda u: u.arg.shape}

def _shape(u: UOp) -> tuple[int, ...]:
  if (f := _SHAPE_OF.get(u.op)) is not None: return f(u)
  shape = None
  for s in u.src:  # elementwise: every source has the node's shape (a plain loop: every new node passes here)
    if s.op is Ops.DEVICE: continue
    if shape is None: shape = s.shape
    elif s.shape != shape: raise AssertionError(f"{u.op} with mismatched source shapes {[s.shape for s in u.src if s.op is not Ops.DEVICE]}")
  assert shape is not None, f"{u.op} has no source with a shape"
  return shape

# ***** symbolic sizes: a size is an int or an integer UOp over (bound) Variables *****
# int-only shapes take the plain int paths of these helpers, so static shapes pay nothing for them

sint = int | UOp  # a size: an int, or an integer expression of Variables

_LEAVES = (Ops.BIND, Ops.DEFINE_VAR, Ops.CONST)
def sym_sum(*xs: sint) -> sint:
  """The sum of sizes, simplified only when two symbolic terms meet (x[:v] keeps v itself as its size)."""
  n, syms = 0, []
  for x in xs:
    if isinstance(x, int): n += x
    else: syms.append(x)
  if not syms: return n
  if len(syms) == 1 and n == 0 and syms[0].op in _LEAVES: return syms[0]
  ret = (functools.reduce(operator.add, syms) + n).simplify()
  return ret.arg if ret.op is Ops.CONST else ret  # (v+64) - v is the size 64, an int like any static size
def sym_neg(x: sint) -> sint: return -x if isinstance(x, int) else x * -1  # x*-1: the form sums simplify with
def smax(x: sint) -> int:
  """The largest value x can take (what memory is allocated for)."""
  return x if isinstance(x, int) else x.vmax
def smin(x: sint) -> int: return x if isinstance(x, int) else x.vmin
def sym_prod(xs) -> sint:
  """The product of sizes: an int when all are ints, else one simplified UOp (factors in a fixed order,
  so equal products are the same node)."""
  if isinstance(n := math.prod(xs := tuple(xs)), int): return n  # static sizes: one C call
  n, syms = 1, []
  for x in xs:
    if isinstance(x, int): n *= x
    else: syms.append(x)
  if not syms or n == 0: return n
  if len(syms) == 1 and syms[0].op in _LEAVES: return syms[0] * n if n != 1 else syms[0]  # already canonical: x*c
  ret = functools.reduce(operator.mul, sorted(syms, key=_render))
  return (ret * n if n != 1 else ret).simplify()
def sym_eq(a: sint, b: sint) -> bool:
  """Are two sizes equal for every value of their Variables?"""
  if a is b: return True
  if isinstance(a, int) and isinstance(b, int): return a == b
  d = (a - b if isinstance(a, UOp) else b - a).simplify()
  return d.op is Ops.CONST and d.arg == 0
def sym_le(a: sint, b: sint) -> bool:
  """Is a <= b for every value of the Variables? (b - a, simplified, is never negative)"""
  if isinstance(a, int) and isinstance(b, int): return a <= b
  return smax(a) <= smin(b) or (b - a if isinstance(b, UOp) else -(a - b)).simplify().vmin >= 0
def sym_value(x: sint) -> int:
  """A size with its Variables' bound values (the value to read back, to show in numpy)."""
  return x if isinstance(x, int) else int(sym_infer(x, {b.src[0]: b.src[1].arg for b in x.toposort if b.op is Ops.BIND}))

def _arg_sizes(u: UOp) -> tuple:
  if u.op not in GroupOp.Sized: return ()
  if u.op is Ops.IOTA: return (u.arg,)
  return tuple(x for p in u.arg for x in p) if u.op in (Ops.SHRINK, Ops.PAD) else u.arg

def _map_arg(u: UOp, f: Callable[[UOp], UOp]) -> Any:
  g = lambda x: f(x) if isinstance(x, UOp) else x
  if u.op is Ops.IOTA: return g(u.arg)
  if u.op in (Ops.SHRINK, Ops.PAD): return tuple((g(a), g(b)) for a, b in u.arg)
  return tuple(g(x) for x in u.arg)

def substitute_sym(root: UOp, mapping: dict[UOp, UOp], in_sizes: Callable[[UOp], UOp] | None) -> UOp:
  """root.substitute(mapping), with every symbolic size in a movement op's arg (sizes live in args,
  not in sources) mapped by in_sizes: binding or unbinding the Variables of shapes."""
  new: dict[UOp, UOp] = {}
  for u in root.toposort:
    if u in mapping: new[u] = mapping[u]; continue
    arg = _map_arg(u, in_sizes) if in_sizes is not None and u.sym_args else u.arg
    new[u] = u.replace(src=tuple(new[s] for s in u.src), arg=arg) if u.src or arg is not u.arg else u
  return new[root]

def _is_sym_int(u: UOp) -> bool:
  """Is u integer math (or a comparison) over Variables and constants: a symbolic size, not a tensor?"""
  return u.op in (Ops.DEFINE_VAR, Ops.BIND) and not (u.op is Ops.BIND and u.src[1].src) or \
    (u.op in GroupOp.ALU and (dtypes.is_int(u.dtype) or u.op in GroupOp.Comparison) and
     all(_is_sym_int(s) or (s.op is Ops.CONST and not s.src) for s in u.src))

# A RANGE is among its own ranges and live ranges, but its memo leaves it out (as ancestors does): a node that held itself
# would be a reference cycle, and every loop of every kernel lowered would wait for the cycle collector
def _and_self(u: UOp, ranges: frozenset[UOp]) -> frozenset[UOp]: return ranges | {u} if u.op is Ops.RANGE else ranges

def _ranges_info(u: UOp) -> frozenset[UOp]:
  return frozenset().union(*(_and_self(s, s.__dict__["_ranges"]) for s in u.src)) if u.src else frozenset()

def _live_info(u: UOp) -> frozenset[UOp]:
  live = frozenset().union(*(_and_self(s, s.__dict__["_live"]) for s in u.src)) if u.src else frozenset()
  return live - {u.src[1]} if u.op is Ops.END else live

def _range_info(u: UOp) -> tuple[ConstType, ConstType, bool]:
  """(vmin, vmax, exact) of a node from those of its sources."""
  exact = all(x.__dict__["_range"][2] for x in u.src if "_range" in x.__dict__)
  lo, hi, fits = _bounds(u)
  return lo, hi, exact and fits

def _bounds(u: UOp) -> tuple[ConstType, ConstType, bool]:
  """vmin, vmax and whether the integer result never wrapped."""
  dt = u.dtype
  if u.op is Ops.CONST: return u.arg, u.arg, True
  if u.op is Ops.DEFINE_VAR: return u.arg[1], u.arg[2], True
  if u.op is Ops.BIND: return u.src[0].arg[1], u.src[0].arg[2], True  # the value is data: any value in range can come
  if u.op is Ops.RANGE or u.op is Ops.SPECIAL: return 0, u.src[0].vmax - 1, True
  if u.op is Ops.CORE_ID: return 0, u.arg - 1, True
  if not (dtypes.is_int(dt) or dtypes.is_bool(dt)) or dt.count > 1: return dtypes.min(dt), dtypes.max(dt), True
  lo, hi = dtypes.min(dt), dtypes.max(dt)
  s = u.src
  if u.op is Ops.ADD: return _clip(s[0].vmin + s[1].vmin, s[0].vmax + s[1].vmax, lo, hi)
  if u.op is Ops.SUB: return _clip(s[0].vmin - s[1].vmax, s[0].vmax - s[1].vmin, lo, hi)
  if u.op is Ops.MUL:
    p = [a * b for a in (s[0].vmin, s[0].vmax) for b in (s[1].vmin, s[1].vmax)]
    return _clip(min(p), max(p), lo, hi)
  if u.op is Ops.NEG: return _clip(-s[0].vmax, -s[0].vmin, lo, hi)
  if u.op is Ops.CAST and (dtypes.is_int(s[0].dtype) or dtypes.is_bool(s[0].dtype)):
    return _clip(int(s[0].vmin), int(s[0].vmax), lo, hi)
  return (*_bounds_no_wrap(u, lo, hi), True)

def _bounds_no_wrap(u: UOp, lo: ConstType, hi: ConstType) -> tuple[ConstType, ConstType]:
  dt, s = u.dtype, u.src
  if u.op is Ops.IDIV and s[1].op is Ops.CONST and s[1].arg != 0:
    q = (_cdiv(s[0].vmin, s[1].arg), _cdiv(s[0].vmax, s[1].arg))
    return _clip(min(q), max(q), lo, hi)[:2]
  if u.op is Ops.MOD and s[1].op is Ops.CONST and s[1].arg != 0:
    c = abs(s[1].arg)
    if s[0].vmin >= 0: return (s[0].vmin % c, s[0].vmax % c) if s[0].vmin // c == s[0].vmax // c else (0, c - 1)
    if s[0].vmax <= 0: return -(c - 1), 0
    return -(c - 1), c - 1
  if u.op is Ops.MAX: return max(s[0].vmin, s[1].vmin), max(s[0].vmax, s[1].vmax)
  if u.op is Ops.WHERE: return min(s[1].vmin, s[2].vmin), max(s[1].vmax, s[2].vmax)
  if u.op is Ops.AND and dtypes.is_int(dt) and s[1].op is Ops.CONST and s[1].arg >= 0: return 0, s[1].arg
  if u.op is Ops.SHR and s[1].op is Ops.CONST and s[0].vmin >= 0: return s[0].vmin >> s[1].arg, s[0].vmax >> s[1].arg
  if dtypes.is_bool(dt):
    if u.op is Ops.CMPLT:
      if s[0].vmax < s[1].vmin: return True, True
      if s[0].vmin >= s[1].vmax: return False, False
    if u.op is Ops.CMPNE or u.op is Ops.CMPEQ:
      disjoint = s[0].vmax < s[1].vmin or s[1].vmax < s[0].vmin
      same = s[0].vmin == s[0].vmax == s[1].vmin == s[1].vmax
      if disjoint or same: return (disjoint,) * 2 if u.op is Ops.CMPNE else (same,) * 2
    if u.op is Ops.AND: return s[0].vmin and s[1].vmin, s[0].vmax and s[1].vmax
    if u.op is Ops.OR: return s[0].vmin or s[1].vmin, s[0].vmax or s[1].vmax
    return False, True
  return lo, hi

def _clip(a: int, b: int, lo: int, hi: int) -> tuple[int, int, bool]:
  # an overflowing result wraps in the dtype: then nothing is known about the value
  return (a, b, True) if lo <= a and b <= hi else (lo, hi, False)

def sym_infer(expr: UOp | int, var_vals: dict[UOp, int]) -> ConstType:
  """Evaluate a symbolic expression with the given variable values, with C semantics."""
  if isinstance(expr, int): return expr
  vals: dict[UOp, ConstType] = {}
  for u in expr.toposort:
    if u.op is Ops.CONST: vals[u] = u.arg
    elif u.op is Ops.BIND: vals[u] = u.src[1].arg
    elif u.op is Ops.DEFINE_VAR:
      if u not in var_vals: raise KeyError(f"no value given for variable {u.arg[0]!r}")
      vals[u] = var_vals[u]
    elif u.op in GroupOp.ALU: vals[u] = exec_alu(u.op, u.dtype, [vals[s] for s in u.src])
    elif u.op is Ops.CAST: vals[u] = truncate(u.dtype, vals[u.src[0]])
    else: raise ValueError(f"can't evaluate {u.op} symbolically")
  return vals[expr]

_infix = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<", Ops.CMPNE: "!=",
          Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>", Ops.FDIV: "/"}
def _render(u: UOp) -> str:
  if u.op is Ops.CONST: return str(u.arg)
  if u.op is Ops.DEFINE_VAR: return u.arg[0]
  if u.op is Ops.BIND: return f"({u.src[0].arg[0]}={u.src[1].arg})"
  if u.op is Ops.RANGE: return f"r{u.arg[0]}"
  if u.op is Ops.SPECIAL: return u.arg
  if u.op is Ops.CORE_ID: return "core_id"
  if u.op in _infix: return f"({_render(u.src[0])}{_infix[u.op]}{_render(u.src[1])})"
  if u.op is Ops.NEG: return f"(-{_render(u.src[0])})"
  if u.op is Ops.MAX: return f"max({_render(u.src[0])}, {_render(u.src[1])})"
  if u.op is Ops.WHERE: return f"({_render(u.src[0])}?{_render(u.src[1])}:{_render(u.src[2])})"
  if u.op is Ops.CAST: return f"({u.dtype.name})({_render(u.src[0])})"
  return f"<{u.op.name}>"

def pretty(u: UOp, limit: int = 200) -> str:
  """A readable multi-line dump: shared nodes are printed once and referred to by number."""
  names: dict[UOp, str] = {}
  lines = []
  for i, n in enumerate(u.toposort):
    names[n] = f"%{i}"
    srcs = ", ".join(names[s] for s in n.src)
    lines.append(f"%{i} = {n.op.name} {n.dtype!r} ({srcs}) {n.arg!r}" if n.arg is not None else f"%{i} = {n.op.name} {n.dtype!r} ({srcs})")
  if len(lines) > limit: lines = lines[:limit // 2] + [f"... {len(lines) - limit} more ..."] + lines[-limit // 2:]
  return "\n".join(lines)
