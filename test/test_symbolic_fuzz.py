"""Expression fuzzer: random trees of +, -, *, //, %, min, max, comparisons, logic and where over
bounded variables and constants (negative ones included), simplified, then checked

  - exhaustively, for every point of small variable ranges, with C semantics (truncating division,
    int32 wraparound) evaluated by numpy over the whole grid at once, bounds included;
  - with Z3 for wide ranges (where an exhaustive check is impossible).

FUZZ_EXAMPLES=n scales the exhaustive fuzzer (default 5000, the CI setting)."""
import os
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck
from attograd import dtypes
from attograd.uop.ops import UOp, Ops
from z3_uop import prove_equal, prove_bounds, RLIMIT

I32 = dtypes.int32
N_EXAMPLES = int(os.getenv("FUZZ_EXAMPLES", "5000"))

# ***** C semantics over numpy grids (int64 arrays holding int32 values) *****

def _wrap(x: np.ndarray) -> np.ndarray: return ((x + 2**31) & (2**32 - 1)) - 2**31
def _cdiv(a, b):
  q = np.abs(a) // np.where(b == 0, 1, np.abs(b))
  return np.where(b == 0, 0, np.where((a < 0) != (b < 0), -q, q))
NP_OPS = {
  Ops.ADD: lambda a, b: _wrap(a + b), Ops.SUB: lambda a, b: _wrap(a - b), Ops.MUL: lambda a, b: _wrap(a * b),
  Ops.IDIV: lambda a, b: _wrap(_cdiv(a, b)), Ops.MOD: lambda a, b: np.where(b == 0, 0, a - b * _cdiv(a, b)),
  Ops.NEG: lambda a: _wrap(-a), Ops.MAX: np.maximum, Ops.CMPLT: lambda a, b: a < b, Ops.CMPNE: lambda a, b: a != b,
  Ops.CMPEQ: lambda a, b: a == b, Ops.AND: lambda a, b: a & b, Ops.OR: lambda a, b: a | b, Ops.XOR: lambda a, b: a ^ b,
  Ops.WHERE: lambda c, a, b: np.where(c, a, b),
}

def evaluate(u: UOp, env: dict[UOp, np.ndarray], check_bounds: bool = False) -> np.ndarray:
  vals: dict[UOp, np.ndarray] = {}
  for n in u.toposort:
    if n.op is Ops.CONST: vals[n] = np.asarray(n.arg, dtype=bool if n.dtype == dtypes.bool else np.int64)
    elif n.op is Ops.DEFINE_VAR: vals[n] = env[n]
    elif n.op is Ops.CAST: vals[n] = vals[n.src[0]].astype(np.int64)  # bool -> int
    else: vals[n] = NP_OPS[n.op](*(vals[s] for s in n.src))
    if check_bounds and n.dtype == I32:
      assert n.vmin <= vals[n].min() and vals[n].max() <= n.vmax, f"bounds [{n.vmin}, {n.vmax}] of {n.render()} are wrong"
  return vals[u]

# ***** random expressions *****

CONSTS = st.one_of(st.integers(-12, 12), st.sampled_from([16, 64, -64, 100, 1000, 2**20, 2**31 - 1, -2**31]))
DIVISORS = st.one_of(st.integers(-9, 9).filter(lambda v: v != 0), st.sampled_from([12, 16, 64, 100, 65536]))

def int_expr(draw, vs, depth):
  if depth <= 0 or draw(st.integers(0, 4)) == 0:
    return draw(st.sampled_from(vs)) if draw(st.integers(0, 2)) else UOp.const(I32, draw(CONSTS))
  k = draw(st.sampled_from(["+", "-", "*", "*c", "//", "%", "//x", "min", "max", "neg", "where", "affine", "reshape"]))
  a = int_expr(draw, vs, depth - 1)
  if k == "neg": return -a
  if k == "*c": return a * draw(CONSTS)
  if k in ("//", "%"):
    d = draw(DIVISORS)
    return a // d if k == "//" else a % d
  if k == "where": return bool_expr(draw, vs, depth - 1).where(a, int_expr(draw, vs, depth - 1))
  if k == "reshape":  # what indexing makes of a reshape: (a // s) % n, (a % s) // t, ...
    s1, s2 = draw(st.sampled_from([2, 3, 4, 6, 8])), draw(st.sampled_from([2, 3, 4, 6, 8]))
    return draw(st.sampled_from([(a // s1) % s2, (a % (s1 * s2)) // s1, (a // s1) * s1 + a % s1, ((a // s1) % s2) * s1 + a % s1]))
  b = int_expr(draw, vs, depth - 1)
  if k == "affine":  # a*k1 + b*k2 + k3, then // or % by a constant sharing factors
    ks = st.sampled_from([1, 2, 3, 4, 6, 8, 16, -1, -2, -4])
    lin = a * draw(ks) + b * draw(ks) + draw(st.integers(-20, 20))
    return lin // draw(ks) if draw(st.booleans()) else lin % draw(ks)
  if k == "//x": return a // b
  return {"+": a + b, "-": a - b, "*": a * b, "min": a.minimum(b), "max": a.maximum(b)}[k]

def bool_expr(draw, vs, depth):
  k = draw(st.sampled_from(["<", "<=", "!=", "==", "&", "|", "not"] if depth > 1 else ["<", "!=", "=="]))
  if k == "not": return bool_expr(draw, vs, depth - 1).logical_not()
  if k in ("&", "|"):
    a, b = bool_expr(draw, vs, depth - 1), bool_expr(draw, vs, depth - 1)
    return a & b if k == "&" else a | b
  a, b = int_expr(draw, vs, depth - 1), int_expr(draw, vs, depth - 1)
  return {"<": a < b, "<=": a <= b, "!=": a.ne(b), "==": a.eq(b)}[k]

@st.composite
def expressions(draw, max_width=12, wide=False):
  vs = []
  for i in range(draw(st.integers(1, 3))):
    if wide: lo, hi = sorted((draw(st.integers(-2**31, 2**31 - 1)), draw(st.integers(-2**20, 2**20))))
    else:
      lo = draw(st.integers(-20, 20))
      hi = lo + draw(st.integers(0, max_width))
    vs.append(UOp.variable(f"v{i}", lo, hi))
  return (bool_expr if draw(st.integers(0, 3)) == 0 else int_expr)(draw, vs, draw(st.integers(1, 5))), vs

def grid(vs: list[UOp]) -> dict[UOp, np.ndarray]:
  axes = np.meshgrid(*(np.arange(v.arg[1], v.arg[2] + 1, dtype=np.int64) for v in vs), indexing="ij")
  return {v: a.ravel() for v, a in zip(vs, axes)}

STATS = {"checked": 0, "changed": 0}

@settings(max_examples=N_EXAMPLES, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(expressions())
def test_fuzz_exhaustive(ev):
  e, vs = ev
  s = e.simplify()
  env = grid(vs)
  want, got = evaluate(e, env, check_bounds=True), evaluate(s, env, check_bounds=True)
  bad = np.nonzero(np.broadcast_to(want != got, env[vs[0]].shape))[0]
  if len(bad):
    i = bad[0]
    at = ", ".join(f"{v.arg[0]}={env[v][i]} in [{v.arg[1]},{v.arg[2]}]" for v in vs)
    pytest.fail(f"{e.render()} simplified to {s.render()}: {np.broadcast_to(want, env[vs[0]].shape)[i]} != "
                f"{np.broadcast_to(got, env[vs[0]].shape)[i]} at {at}")
  STATS["checked"] += 1; STATS["changed"] += s is not e

def test_fuzz_count():
  # the fuzzer above ran in this process (or the count is for another worker): report what it did
  if STATS["checked"]: print(f"\nfuzzer: {STATS['checked']} expressions, {STATS['changed']} simplified, 0 mismatches")

@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(expressions(wide=True))
def test_fuzz_z3_wide_ranges(ev):
  """Variables with ranges far too wide to enumerate (up to the whole int32 range): Z3 proves
  simplify() kept the value, wraparound included; bounds too."""
  e, vs = ev
  s = e.simplify()
  if s is e: return
  res, why = prove_equal(e, s, rlimit=RLIMIT // 40)
  assert res != "counterexample", f"{e.render()} simplified to {s.render()}: {why}"
  res, why = prove_bounds(s, rlimit=RLIMIT // 40)
  assert res != "counterexample", f"bounds [{s.vmin}, {s.vmax}] of {s.render()}: {why}"
