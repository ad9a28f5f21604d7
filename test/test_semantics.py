"""codegen/semantics.py: for a target that lacks one of the IR's defined results, the rewritten graph computes the
reference's values while using only what such hardware defines. Each case evaluates the graph twice: the original
with the reference (uop/ops.py exec_alu), the rewritten one with a 'hostile' evaluator that raises (or answers as the
hardware does) wherever the semantic is left to the target."""
import itertools, math
import pytest
from attograd import dtypes
from attograd.dtype import truncate
from attograd.uop.ops import UOp, Ops, GroupOp, exec_alu
from attograd.codegen.semantics import ir_semantics, semantics_for
from attograd.renderer import IR_SEMANTICS

class Undefined(Exception): pass

def _c_div(op: Ops, dt, a, b):
  if b == 0 or (b == -1 and a == dtypes.min(dt)): raise Undefined(f"{op} by {b}")
  return exec_alu(op, dt, [a, b])
def _shift(op: Ops, dt, a, b):
  if not 0 <= b < 8 * dt.itemsize: raise Undefined(f"shift by {b}")
  return exec_alu(op, dt, [a, b])
def _no_bool(op: Ops, dt, *x):
  if dt == dtypes.bool: raise Undefined(f"{op} on bool")
  return exec_alu(op, dt, list(x))
def _no_bool_compare(op: Ops, dt, a, b, src_dt):
  if src_dt == dtypes.bool: raise Undefined(f"{op} of bools")
  return exec_alu(op, dt, [a, b])

# how hardware without each semantic computes the ops it concerns
HOSTILE = {
  "divmod": {Ops.IDIV: _c_div, Ops.MOD: _c_div},
  "nan_max": {Ops.MAX: lambda op, dt, a, b: (a if a > b else b) if dtypes.is_float(dt) else exec_alu(op, dt, [a, b])},  # C's a > b ? a : b
  "shift_mask": {Ops.SHL: _shift, Ops.SHR: _shift},
  "bool_math": {op: _no_bool for op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.MAX)},
  "bool_compare": {op: _no_bool_compare for op in GroupOp.Comparison},
}

def evaluate(u: UOp, env: dict[UOp, object], hostile: dict | None = None, f2i_int64_only: bool = False):
  vals: dict[UOp, object] = {}
  for n in u.toposort:
    if n.op is Ops.CONST: vals[n] = n.arg
    elif n.op is Ops.DEFINE_VAR: vals[n] = env[n]
    elif n.op is Ops.SINK: continue
    elif n.op is Ops.CAST:
      x = vals[n.src[0]]
      if f2i_int64_only and dtypes.is_float(n.src[0].dtype) and dtypes.is_int(n.dtype):
        if n.dtype != dtypes.int64: raise Undefined(f"float -> {n.dtype}")
        x = 0 if math.isnan(x) else max(min(int(x), 2**63 - 1), -2**63) if math.isfinite(x) else (2**63 - 1 if x > 0 else -2**63)  # saturating
      vals[n] = truncate(n.dtype, x)
    elif hostile and n.op in hostile:
      f = hostile[n.op]
      args = [vals[s] for s in n.src]
      vals[n] = f(n.op, n.dtype, *args, n.src[0].dtype) if f is _no_bool_compare else f(n.op, n.dtype, *args)
    else: vals[n] = exec_alu(n.op, n.dtype, [vals[s] for s in n.src])
  return [vals[s] for s in u.src]

def same(a, b) -> bool: return all((x == y) or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))

def check(name: str, sink: UOp, envs: list[dict]) -> None:
  out = ir_semantics(sink, IR_SEMANTICS - {name})
  assert out is not sink, f"the {name} rules did nothing"
  hostile = HOSTILE.get(name)
  def wrong(env) -> bool:  # does the original graph, on such hardware, go wrong for env?
    try: return not same(evaluate(sink, env, hostile, name == "float_to_int"), evaluate(sink, env))
    except Undefined: return True
  assert any(wrong(env) for env in envs), "the case doesn't test anything"
  for env in envs:
    assert same(evaluate(out, env, hostile, name == "float_to_int"), evaluate(sink, env)), env

@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.int64, dtypes.uint8, dtypes.uint32])
def test_divmod(dt):
  lo = 0 if dtypes.is_unsigned(dt) else dtypes.min(dt)
  a, b = UOp.variable("a", lo, dtypes.max(dt), dt), UOp.variable("b", lo, dtypes.max(dt), dt)
  sink = UOp.sink(a // b, a % b, a // b.const_like(0), a % b.const_like(0), *([a // b.const_like(-1), a % b.const_like(-1)] if lo else []))
  values = [0, 1, 7, dtypes.max(dt)] + ([-1, -7, lo] if lo else [])
  check("divmod", sink, [{a: x, b: y} for x, y in itertools.product(values, [0] + values)])

def test_divisors_that_cant_trap_stay():
  a, b = UOp.variable("a", -10, 10), UOp.variable("b", 1, 10)
  sink = UOp.sink(a // b, a % UOp.const(dtypes.int32, 3))
  assert ir_semantics(sink, frozenset()) is sink

@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.float64])
def test_nan_max(dt):
  a, b = UOp.variable("a", 0, 3, dtypes.int32), UOp.variable("b", 0, 3, dtypes.int32)
  table = [math.nan, -1.5, 2.0, math.inf]  # the float operands, picked by the variables through a chain of WHEREs
  def pick(v: UOp) -> UOp:
    out = UOp.const(dt, table[0])
    for i, x in enumerate(table[1:], 1): out = v.eq(i).where(UOp.const(dt, x), out)
    return out
  sink = UOp.sink(pick(a).maximum(pick(b)))
  check("nan_max", sink, [{a: x, b: y} for x, y in itertools.product(range(4), range(4))])

@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.int32, dtypes.uint64])
def test_shift_mask(dt):
  a, n = UOp.variable("a", 0, 100, dt), UOp.variable("n", 0, 200, dt)
  sink = UOp.sink(a << n, a >> n, a << UOp.const(dt, 8 * dt.itemsize + 3))
  check("shift_mask", sink, [{a: x, n: y} for x, y in itertools.product([0, 1, 5, 100], [0, 3, 8 * dt.itemsize - 1, 8 * dt.itemsize, 200])])

def test_shift_in_range_stays():
  a = UOp.variable("a", 0, 100)
  sink = UOp.sink(a << UOp.const(dtypes.int32, 3), a >> (a & 7))
  assert ir_semantics(sink, frozenset()) is sink

@pytest.mark.parametrize("name", ["bool_math", "bool_compare"])
def test_bool(name):
  a, b = UOp.variable("a", 0, 1), UOp.variable("b", 0, 1)
  p, q = a.eq(1), b.eq(1)
  exprs = [p + q, p - q, p * q, p.maximum(q)] if name == "bool_math" else [p < q, p.ne(q), p.eq(q)]
  check(name, UOp.sink(*exprs), [{a: x, b: y} for x, y in itertools.product([0, 1], [0, 1])])

@pytest.mark.parametrize("frm", [dtypes.float32, dtypes.float64, dtypes.float16])
@pytest.mark.parametrize("to", [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.uint64])
def test_float_to_int(frm, to):
  # values an int64 holds (and for uint64 its [2**63, 2**64) too) convert as the reference does; beyond, such a target
  # saturates (README)
  big = [] if frm == dtypes.float16 else [9.2e18, -9.2e18] + ([1e19, 1.8e19] if to == dtypes.uint64 else [])
  table = [1.5, -2.7, 300.7, math.nan, 65504.0, -65504.0] + big
  v = UOp.variable("v", 0, len(table) - 1)
  x = UOp.const(frm, table[0])
  for i, t in enumerate(table[1:], 1): x = v.eq(i).where(UOp.const(frm, t), x)
  check("float_to_int", UOp.sink(x.cast(to)), [{v: i} for i in range(len(table))])

def test_everything_native_is_no_pass():
  assert semantics_for(IR_SEMANTICS) is None
  with pytest.raises(ValueError, match="unknown IR semantics"): semantics_for(frozenset({"nan_min"}))
