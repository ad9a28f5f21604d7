"""Data types and PyTorch's promotion rules. Imports nothing of attograd but helpers."""
from __future__ import annotations
import math, struct
from dataclasses import dataclass, fields
from typing import Any, Final, Literal

ConstType = float | int | bool

class _Interned(type):
  """Each DType value is made once: building an equal one returns the first. Equality is then identity and the hash
  object's own, both C code: every graph node's key holds a dtype, hashed when the node is built, when it dies (the
  hash-cons table's entry is dropped) and in each graph structure key, ~9,000 calls of a Python __hash__ in a small
  transformer's training step, and the front end compares dtypes on every op."""
  _by_args: dict[tuple, Any] = {}   # (class, arguments as given) -> the DType: the usual way back, no instance built
  _by_value: dict[tuple, Any] = {}  # (class, every field's value) -> the DType: the one instance per value
  def __call__(cls, *args: Any, **kwargs: Any) -> Any:
    if not kwargs and (d := _Interned._by_args.get((cls, args))) is not None: return d
    d = super().__call__(*args, **kwargs)
    d = _Interned._by_value.setdefault((cls, d._key), d)
    if not kwargs: _Interned._by_args[(cls, args)] = d
    return d

@dataclass(frozen=True, eq=False)
class DType(metaclass=_Interned):
  priority: int        # orders dtypes of one category (used only for sorting and display)
  itemsize: int        # bytes per element (of one lane for vectors)
  name: str
  fmt: str | None      # struct/memoryview format, None where Python has none (bfloat16)
  count: int = 1       # lanes: 1 for scalars
  # equal by value through interning (_Interned): == and hash are object's, identity
  def __post_init__(self): object.__setattr__(self, "_key", tuple(getattr(self, f.name) for f in fields(self)))
  def __reduce__(self): return type(self), self._key  # rebuilt, not restored: a string's hash differs between processes
  def __repr__(self) -> str: return f"dtypes.{self.name}" + (f".vec({self.count})" if self.count > 1 else "")
  def __lt__(self, o: DType) -> bool: return (self.priority, self.itemsize, self.name) < (o.priority, o.itemsize, o.name)
  @property
  def nbytes(self) -> int: return self.itemsize * self.count
  def vec(self, n: int) -> DType:
    assert self.count == 1, f"can't vectorize {self}"
    return self if n == 1 else DType(self.priority, self.itemsize, self.name, None, n)
  def scalar(self) -> DType: return DTYPES_BY_NAME[self.name] if self.count > 1 else self
  def ptr(self, size: int = -1, addrspace: Literal["global", "reg", "local"] = "global") -> PtrDType:
    return PtrDType(self.priority, self.itemsize, self.name, self.fmt, self.count, self, size, addrspace)

@dataclass(frozen=True, eq=False)
class PtrDType(DType):
  base: DType | None = None
  size: int = -1
  addrspace: str = "global"
  def __repr__(self) -> str: return f"{self.base!r}.ptr({self.size}, {self.addrspace!r})"

class dtypes:
  bool: Final[DType] = DType(0, 1, "bool", "?")
  int8: Final[DType] = DType(1, 1, "int8", "b")
  uint8: Final[DType] = DType(2, 1, "uint8", "B")
  int16: Final[DType] = DType(3, 2, "int16", "h")
  uint16: Final[DType] = DType(4, 2, "uint16", "H")
  int32: Final[DType] = DType(5, 4, "int32", "i")
  uint32: Final[DType] = DType(6, 4, "uint32", "I")
  int64: Final[DType] = DType(7, 8, "int64", "q")
  uint64: Final[DType] = DType(8, 8, "uint64", "Q")
  float16: Final[DType] = DType(9, 2, "float16", "e")
  bfloat16: Final[DType] = DType(10, 2, "bfloat16", None)
  float32: Final[DType] = DType(11, 4, "float32", "f")
  float64: Final[DType] = DType(12, 8, "float64", "d")
  void: Final[DType] = DType(-1, 0, "void", None)
  # aliases as PyTorch and numpy spell them
  char, uchar, short, ushort, int, uint, long, ulong = int8, uint8, int16, uint16, int32, uint32, int64, uint64
  half, float, double = float16, float32, float64
  default_float: DType = float32
  default_int: DType = int64  # as torch.tensor([1, 2]) gives

  @staticmethod
  def is_float(t: DType) -> bool: return t.scalar() in _FLOAT_SET
  @staticmethod
  def is_int(t: DType) -> bool: return t.scalar() in _INT_SET
  @staticmethod
  def is_unsigned(t: DType) -> bool: return t.scalar() in _UINT_SET
  @staticmethod
  def is_bool(t: DType) -> bool: return t.scalar() == dtypes.bool
  @staticmethod
  def from_py(x: Any) -> DType:
    if isinstance(x, bool): return dtypes.bool
    if isinstance(x, int): return dtypes.default_int
    if isinstance(x, float): return dtypes.default_float
    if isinstance(x, (list, tuple)): return max((dtypes.from_py(v) for v in x), default=dtypes.default_float, key=kind)
    raise TypeError(f"can't infer a dtype from {type(x).__name__} {x!r}")
  @staticmethod
  def min(t: DType) -> ConstType:
    if dtypes.is_bool(t): return False
    if dtypes.is_unsigned(t): return 0
    if dtypes.is_int(t): return -2 ** (8 * t.itemsize - 1)
    return -math.inf
  @staticmethod
  def max(t: DType) -> ConstType:
    if dtypes.is_bool(t): return True
    if dtypes.is_unsigned(t): return 2 ** (8 * t.itemsize) - 1
    if dtypes.is_int(t): return 2 ** (8 * t.itemsize - 1) - 1
    return math.inf
  @staticmethod
  def fields() -> dict[str, DType]: return dict(DTYPES_BY_NAME)

INTS = (dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64)
UINTS = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
# membership by hash (a set finds a dtype by identity first): a tuple's `in` called DType.__eq__ per element, a
# million times in lowering a transformer's kernels
_INT_SET, _UINT_SET, _FLOAT_SET = frozenset(INTS), frozenset(UINTS), frozenset(FLOATS)
DTYPES_BY_NAME: dict[str, DType] = {t.name: t for t in (dtypes.bool, *INTS, *FLOATS)}
# the names users type (torch / numpy spelling) to the dtype
DTYPE_ALIASES: dict[str, DType] = {**DTYPES_BY_NAME, **{k: v for k, v in vars(dtypes).items()
                                                        if isinstance(v, DType) and v != dtypes.void and not k.startswith('default')}}

def to_dtype(x: DType | str) -> DType:
  if isinstance(x, DType): return x
  if isinstance(x, str) and x in DTYPE_ALIASES: return DTYPE_ALIASES[x]
  # a torch dtype (torch.float64, torch.long) by its name, so code passing torch's dtypes runs; torch isn't imported
  if type(x).__module__ == "torch" and (name := str(x).removeprefix("torch.")) in DTYPE_ALIASES: return DTYPE_ALIASES[name]
  raise TypeError(f"unknown dtype {x!r}; expected a DType or one of {sorted(DTYPE_ALIASES)}")

def kind(t: DType) -> int:
  """bool < integer < floating point: the order PyTorch's weak (scalar) operands respect."""
  return 2 if dtypes.is_float(t) else 1 if dtypes.is_int(t) else 0

# PyTorch's promotion as a lattice: the result of two dtypes is the least type above both.
# PyTorch refuses uint16/32/64 mixed with other integers; we extend it as numpy does (the
# smallest signed type holding both), and refuse uint64 with a signed type, where no integer fits.
_PARENTS: dict[DType, tuple[DType, ...]] = {
  dtypes.bool: (dtypes.int8, dtypes.uint8), dtypes.int8: (dtypes.int16,), dtypes.uint8: (dtypes.int16, dtypes.uint16),
  dtypes.int16: (dtypes.int32,), dtypes.uint16: (dtypes.int32, dtypes.uint32), dtypes.int32: (dtypes.int64,),
  dtypes.uint32: (dtypes.int64, dtypes.uint64), dtypes.int64: (dtypes.float16, dtypes.bfloat16),
  dtypes.uint64: (dtypes.float16, dtypes.bfloat16), dtypes.float16: (dtypes.float32,), dtypes.bfloat16: (dtypes.float32,),
  dtypes.float32: (dtypes.float64,), dtypes.float64: ()}

def _ancestors(t: DType) -> set[DType]:
  out = {t}
  for p in _PARENTS[t]: out |= _ancestors(p)
  return out

def least_upper_dtype(*ts: DType) -> DType:
  """The dtype PyTorch gives a binary op on tensors of these dtypes."""
  if all(t is ts[0] for t in ts) and ts[0].count == 1: return ts[0]
  ts = tuple(t.scalar() for t in ts)
  if len(set(ts)) == 1: return ts[0]
  uppers = set.intersection(*(_ancestors(t) for t in ts))
  lub = min(uppers, key=lambda t: len(_ancestors(t)) * -1)
  if dtypes.is_float(lub) and not any(dtypes.is_float(t) for t in ts):
    raise TypeError(f"no integer dtype holds both {' and '.join(map(repr, ts))}; cast one of them explicitly")
  return lub

_F32 = struct.Struct("f")
_INT_BOUNDS = {dt: (dtypes.min(dt), dtypes.max(dt)) for dt in INTS}
def truncate(dtype: DType, x: ConstType) -> ConstType:
  """A Python value as the dtype stores it: C-style wrap for ints, rounding for floats."""
  if dtype is dtypes.float32 and type(x) is float:  # every scalar of float code comes here first
    try: return _F32.unpack(_F32.pack(x))[0]
    except OverflowError: return math.copysign(math.inf, x)
  if type(x) is int and (bounds := _INT_BOUNDS.get(dtype)) is not None and bounds[0] <= x <= bounds[1]: return x  # most index math
  if dtypes.is_bool(dtype): return bool(x)
  if dtypes.is_int(dtype):
    if isinstance(x, float):
      if math.isnan(x) or math.isinf(x): return 0
      x = int(x)
    bits = 8 * dtype.itemsize
    x = int(x) & ((1 << bits) - 1)
    return x - (1 << bits) if not dtypes.is_unsigned(dtype) and x >= 1 << (bits - 1) else x
  x = float(x)
  if dtype == dtypes.float64: return x
  if dtype == dtypes.bfloat16:
    from attograd.helpers import float_to_bf16_bits, bf16_bits_to_float
    return bf16_bits_to_float(float_to_bf16_bits(x))
  try: return struct.unpack(dtype.fmt, struct.pack(dtype.fmt, x))[0]
  except OverflowError: return math.copysign(math.inf, x)
