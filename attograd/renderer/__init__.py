"""Renderers turn a linear list of UOps into source text. They hold no optimization logic."""
from __future__ import annotations
from attograd.uop.ops import AxisKind, UOp, Ops
from attograd.uop.patterns import PatternMatcher

# the IR's defined results that hardware may lack (codegen/semantics.py writes each out for a target without it)
IR_SEMANTICS = frozenset({"divmod", "nan_max", "shift_mask", "bool_math", "bool_compare", "float_to_int"})

class Renderer:
  device: str = ""
  has_threads: bool = False  # the runtime can run one kernel on several cores (the THREAD opt)
  # floats in one vector register of the target: a register tile is two registers wide, and holds at most 16 of them
  # (AVX2's 16 registers of 8 floats; AVX-512 has 32 of 16)
  simd_floats: int = 8
  rewrites: PatternMatcher | None = None  # a last pass over the lowered kernel, for what only this target does
  # GPU targets: the most work-groups per launch dimension (None: a CPU-shaped target, loops stay loops),
  # the most threads per work-group in each dimension and in all, and the preferred work-group size
  global_max: tuple[int, ...] | None = None
  local_max: tuple[int, ...] = (1, 1, 1)
  workgroup_max: int = 1
  workgroup_pref: int = 1
  # bytes before and after every buffer that the device's allocator keeps mapped: a gated read whose address stays in
  # the buffer or in them needs no gate (uop/symbolic.py, ungate_load)
  spare_bytes: tuple[int, int] = (0, 0)
  # which of IR_SEMANTICS the target's own instructions (or helpers) have: codegen/semantics.py writes the others as
  # plain ops before rendering, so a renderer only spells ops
  native: frozenset[str] = frozenset()
  @property
  def has_local(self) -> bool: return self.global_max is not None  # work-groups sharing local memory (LOCAL, GROUP)
  def render(self, name: str, uops: list[UOp]) -> str: raise NotImplementedError

class Body:
  """A C-like kernel's body as it is written: lines at the current loop depth, fresh names (alu0, val1, ...) for the
  values that get one, and how many times each value is used (a value used once may be written inline)."""
  def __init__(self, uops: list[UOp]):
    self.lines: list[str] = []
    self.depth, self.counter = 1, 0
    self.uses: dict[UOp, int] = {}
    for u in uops:
      for s in u.src: self.uses[s] = self.uses.get(s, 0) + 1
  def emit(self, line: str) -> None: self.lines.append("  " * self.depth + line)
  def fresh(self, prefix: str) -> str:
    self.counter += 1
    return f"{prefix}{self.counter - 1}"
  def text(self) -> str: return "\n".join(self.lines)

def scalar_args(uops: list[UOp]) -> list[UOp]:
  """A kernel's scalar arguments, after its buffers and in this order on every target: the DEFINE_VARs by name, then a
  threaded kernel's CORE_ID (last, so a user's Variable can't move it)."""
  return sorted((u for u in uops if u.op is Ops.DEFINE_VAR), key=lambda u: u.arg) + [u for u in uops if u.op is Ops.CORE_ID]

def local_size(uops: list[UOp]) -> tuple[int, int, int]:
  """A GPU kernel's threads per work-group in each launch dimension, from its lidx SPECIALs."""
  local = [1, 1, 1]
  for u in uops:
    if u.op is Ops.SPECIAL and u.arg.startswith("lidx"): local[int(u.arg[4:])] = u.src[0].arg
  return (local[0], local[1], local[2])

def literal_operand(lit: str) -> str:
  """A literal as an operand: a negative one in parentheses, since a - -1.5 written without spaces is a decrement (a--1.5)."""
  return f"({lit})" if lit.startswith("-") else lit

def kernel_name(uops: list[UOp]) -> str:
  """A readable, deterministic name: r_ for reductions, S_ for scatter-adds, E_ for elementwise, then the loop sizes
  (not those of the loops that fold a reduce's lanes after it: lowering's, no axis of the kernel)."""
  ranges = [u for u in uops if u.op is Ops.SPECIAL or (u.op is Ops.RANGE and u.arg[1] is not AxisKind.FOLD)]
  kinds = {r.arg[1] for r in ranges if r.op is Ops.RANGE}
  kind = "r" if AxisKind.REDUCE in kinds else "S" if AxisKind.SERIAL in kinds else "E"  # S: a scatter-add's serial loops
  sizes = "_".join(str(r.src[0].arg) if r.src[0].op is Ops.CONST else "n" for r in ranges)
  return f"{kind}_{sizes}" if sizes else kind
