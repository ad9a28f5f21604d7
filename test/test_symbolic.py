"""Integer simplification: pinned output for common index patterns, bounds, sym_infer, and a
property test that simplify() never changes a value (C truncating division, DESIGN §4.4)."""
import numpy as np
import pytest
from hypothesis import given, settings, assume, strategies as st, HealthCheck
from attograd import Tensor, dtypes
from attograd.uop.ops import AxisKind, UOp, Ops, sym_infer

I32 = dtypes.int32
def c(v, dt=I32): return UOp.const(dt, v)
def rng(i, n): return UOp(Ops.RANGE, I32, (c(n),), (i, AxisKind.GLOBAL))  # as schedule/indexing.py builds them
r0, r1, r2 = rng(0, 4), rng(1, 4), rng(2, 8)
n = UOp.variable("n", 1, 128)
def simp(u): return u.simplify().render()

@pytest.mark.parametrize("expr, want", [
  # reshape round trips: (r0, r1) -> r0*4+r1 -> (idx//4%4, idx%4)
  (((r0 * 4 + r1) // 4) % 4, "r0"), ((r0 * 4 + r1) % 4, "r1"), ((r0 * 4 + r1) // 4, "r0"),
  (((r0 * 4 + r1) * 2) // 8, "r0"), ((r1 + r0 * 4) % 4, "r1"),
  (r0 % 4, "r0"), (r0 // 4, "0"), ((r0 + 4) // 4, "1"), ((r0 + 4) % 4, "r0"),
  (r2 % 4, "(r2%4)"), (r2 // 4, "(r2/4)"), ((r2 % 8) % 4, "(r2%4)"), ((r0 // 2) // 2, "0"),
  ((r0 * 8) // 4, "(r0*2)"), ((r0 * 2) // 4, "(r0/2)"),
  # sums in canonical order with like terms collected
  (r1 + r0, "(r0+r1)"), (3 + r0, "(r0+3)"), ((r0 + 1) + 2, "(r0+3)"), (r0 + r1 + r0, "((r0*2)+r1)"),
  (r0 * 2 * 3, "(r0*6)"), ((r0 + 1) * 2, "((r0*2)+2)"), (r0 - 3 + 3, "r0"),
  # pad/flip/shrink style index math
  ((3 - r0) + r0, "3"), ((r0 - 3) // 4, "0"), (r0 * 4 + r1 - r1, "(r0*4)"),
])
def test_index_patterns(expr, want): assert simp(expr) == want

def test_divmod_by_a_multiple_of_a_coefficient():
  # a permuted pool window's index: (y + 26*x)//52 with y in [0, 26) is x//2 (the 26 divides 52, y never carries)
  y, x = UOp(Ops.RANGE, I32, (c(26),), (5, AxisKind.GLOBAL)), UOp(Ops.RANGE, I32, (c(26),), (6, AxisKind.GLOBAL))
  assert simp((y + x * 26) // 52) == "(r6/2)"
  assert simp((y + x * 26) % 52) == "(((r6%2)*26)+r5)"
  assert simp((y * 2 + x * 52 + 1) // 104) == "(r6/2)"
  # y in [0, 26) no longer fits under the 13 that divides 26: nothing to take out
  assert "r5" in simp((y + x * 13) // 26)

@pytest.mark.parametrize("expr, want", [
  (c(2) + c(3) * 4, "14"), (c(7) // 2, "3"), (c(-7) // 2, "-3"), (c(7) // -2, "-3"), (c(-7) % 2, "-1"),
  (c(7) % -2, "1"), (c(-7) % -2, "-1"), (c(3) - c(5), "-2"), (c(3).maximum(c(-5)), "3"), (-c(4), "-4"),
  (c(5) // 0, "0"), (c(5) % 0, "0"),  # attograd defines x/0 = x%0 = 0, as the emulator and C renderer do
  (c(3) < c(4), "True"), (c(3).ne(3), "False"), (c(3).eq(3), "True"), ((c(1) < 2).where(c(10), c(20)), "10"),
])
def test_constant_folding(expr, want): assert simp(expr) == want

@pytest.mark.parametrize("expr, want", [
  (r0 + 0, "r0"), (r0 - 0, "r0"), (r0 * 1, "r0"), (r0 * 0, "0"), (r0 // 1, "r0"), (r0 % 1, "0"), (r0 - r0, "0"),
  (r0.maximum(r0), "r0"), (-(-r0), "r0"), ((r0 < 2).where(r1, r1), "r1"), (r0.cast(I32), "r0"),
  ((r0 < 2) & True, "(r0<2)"), ((r0 < 2) | False, "(r0<2)"), ((r0 < 2) & False, "False"), ((r0 < 2) | True, "True"),
  ((r0 < 2) & (r0 < 2), "(r0<2)"), (r0 < r0, "False"), (r0.ne(r0), "False"),
])
def test_identities(expr, want): assert simp(expr) == want

@pytest.mark.parametrize("expr, want", [
  (r0 < 4, "True"), (r0 < 0, "False"), (r0 < 3, "(r0<3)"), (r0.ne(5), "True"), (r0.eq(5), "False"),
  (r0 + 1 < 5, "True"), (r0 * 2 < 7, "True"), (r0 * 4 + r1 < 16, "True"), (r0 * 4 + r1 < 15, "(((r0*4)+r1)<15)"),
  (r0 + 2 < 4, "(r0<2)"), (r0 * 3 < 7, "(r0<3)"), (r0.maximum(4), "4"), (r0.maximum(-1), "r0"),
  (r0.maximum(2), "max(r0, 2)"), ((r0 < 8).where(r1, r2), "r1"),
])
def test_comparisons_decided_by_bounds(expr, want): assert simp(expr) == want

def test_variable():
  assert (n.vmin, n.vmax) == (1, 128) and n.render() == "n" and n.variables() == [n]
  assert simp(n < 1) == "False" and simp(n < 129) == "True" and simp(n < 64) == "(n<64)"
  assert simp(n * 4 // 4) == "n" and simp((n * 4 + 3) // 4) == "n" and simp((n * 4 + 3) % 4) == "3"
  assert simp(n - 3 + 3) == "n" and simp((n * 8 + r0 * 2) // 2) == "((n*4)+r0)"
  assert ((n - 1).simplify().vmin, (n - 1).simplify().vmax) == (0, 127)
  with pytest.raises(ValueError, match="bounds"): UOp.variable("bad", 5, 1)

def test_bounds():
  assert (r0.vmin, r0.vmax) == (0, 3) and ((r0 * 4 + r1).vmin, (r0 * 4 + r1).vmax) == (0, 15)
  assert ((r0 - r1).vmin, (r0 - r1).vmax) == (-3, 3) and ((-r2).vmin, (-r2).vmax) == (-7, 0)
  assert ((r2 // 3).vmin, (r2 // 3).vmax) == (0, 2) and ((r2 // -3).vmin, (r2 // -3).vmax) == (-2, 0)
  assert ((r2 % 3).vmin, (r2 % 3).vmax) == (0, 2) and (((r2 - 7) % 3).vmin, ((r2 - 7) % 3).vmax) == (-2, 0)
  assert ((r0 * -2 + 1).vmin, (r0 * -2 + 1).vmax) == (-5, 1) and (r0.maximum(r1 - 2).vmax) == 3
  assert ((r0 < 4).vmin, (r0 < 4).vmax) == (True, True) and ((r0 < 2).vmin, (r0 < 2).vmax) == (False, True)

def test_bounds_of_deep_chain():
  u = n
  for i in range(5000): u = UOp(Ops.ADD, I32, (u, c(1)))
  assert (u.vmin, u.vmax) == (5001, 5128)  # recursion limits must not bound graph depth (DESIGN §4.7)

def test_sym_infer():
  x = UOp.variable("x", -10, 10)
  assert sym_infer(7, {}) == 7 and sym_infer(n * 3 + 1, {n: 5}) == 16
  assert sym_infer(x // 4, {x: -7}) == -1 and sym_infer(x % 4, {x: -7}) == -3  # C truncation, not Python's floor
  assert sym_infer(x // -4, {x: 7}) == -1 and sym_infer(x % -4, {x: 7}) == 3
  assert sym_infer((x < 0).where(-x, x), {x: -9}) == 9 and sym_infer(x.maximum(n), {x: 3, n: 2}) == 3
  with pytest.raises(KeyError, match="'n'"): sym_infer(n + 1, {})

# ***** wraparound: narrow and unsigned ints wrap in C (and in PyTorch); rules may only use bounds that hold *****

@pytest.mark.parametrize("dt, build", [
  pytest.param(dtypes.uint8, lambda x: (x * 2) // 2, id="u8 (x*2)//2"),
  pytest.param(dtypes.uint8, lambda x: (x * 2 + 1) // 2, id="u8 (x*2+1)//2"),
  pytest.param(dtypes.uint8, lambda x: (x + 250) < 5, id="u8 (x+250)<5"),
  pytest.param(dtypes.uint8, lambda x: (x - 1) < 5, id="u8 (x-1)<5"),
  pytest.param(dtypes.uint8, lambda x: (x * 2) < 5, id="u8 (x*2)<5"),
  pytest.param(dtypes.int8, lambda x: (x + 100) < 0, id="i8 (x+100)<0"),
])
def test_wraparound_is_kept(dt, build):
  x = UOp.variable("x", dtypes.min(dt), dtypes.max(dt), dt)
  e = build(x); s = e.simplify()
  bad = [v for v in range(dtypes.min(dt), dtypes.max(dt) + 1) if sym_infer(e, {x: v}) != sym_infer(s, {x: v})]
  assert not bad, f"{e.render()} simplified to {s.render()} differs at x in {bad[:4]}..."

def test_wraparound_tensor_uint8():
  a = np.array([0, 10, 100, 128, 200, 255], dtype=np.uint8)
  t, two = Tensor(a, device="PYTHON"), np.uint8(2)  # the emulator: only the kernel rewrite can be wrong
  np.testing.assert_equal(((t * 2) // 2).numpy(), (a * two) // two)
  np.testing.assert_equal(((t + 250) < 5).numpy(), (a + np.uint8(250)) < 5)

# ***** property test: simplify() never changes a value, and bounds hold *****

SIZE = st.integers(-12, 12)
def int_expr(draw, vs, depth):
  if depth <= 0 or draw(st.integers(0, 3)) == 0: return draw(st.sampled_from(vs)) if draw(st.booleans()) else c(draw(SIZE))
  k = draw(st.sampled_from(["+", "-", "*", "*c", "//", "%", "max", "neg", "where", "affine"]))
  a = int_expr(draw, vs, depth - 1)
  if k == "neg": return -a
  if k == "*c": return a * draw(SIZE)
  if k in ("//", "%"):
    d = draw(st.integers(-9, 9).filter(lambda v: v != 0))
    return a // d if k == "//" else a % d
  if k == "where": return bool_expr(draw, vs, depth - 1).where(a, int_expr(draw, vs, depth - 1))
  b = int_expr(draw, vs, depth - 1)
  if k == "affine":  # what indexing makes: a*k1 + b*k2 + k3, then // or % by a constant sharing factors
    ks = st.sampled_from([1, 2, 3, 4, 6, 8, 16, -1, -2, -4])
    lin = a * draw(ks) + b * draw(ks) + draw(st.integers(-20, 20))
    return lin // draw(ks) if draw(st.booleans()) else lin % draw(ks)
  return {"+": a + b, "-": a - b, "*": a * b, "max": a.maximum(b)}[k]

def bool_expr(draw, vs, depth):
  k = draw(st.sampled_from(["<", "!=", "==", "&", "|", "not"] if depth > 1 else ["<", "!=", "=="]))
  if k == "not": return bool_expr(draw, vs, depth - 1).logical_not()
  if k in ("&", "|"):
    a, b = bool_expr(draw, vs, depth - 1), bool_expr(draw, vs, depth - 1)
    return a & b if k == "&" else a | b
  a, b = int_expr(draw, vs, depth - 1), int_expr(draw, vs, depth - 1)
  return {"<": a < b, "!=": a.ne(b), "==": a.eq(b)}[k]

@st.composite
def expressions(draw):
  vs = []
  for i in range(draw(st.integers(1, 3))):
    lo = draw(st.integers(-20, 20))
    vs.append(UOp.variable(f"v{i}", lo, lo + draw(st.integers(0, 30))))
  return (bool_expr if draw(st.integers(0, 3)) == 0 else int_expr)(draw, vs, 4), vs

@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(expressions(), st.data())
def test_simplify_keeps_values(ev, data):
  e, vs = ev
  assume(all(dtypes.min(I32) < u.vmin and u.vmax < dtypes.max(I32) for u in e.toposort if u.dtype == I32))  # no overflow
  s = e.simplify()
  envs = [{v: v.arg[1] for v in vs}, {v: v.arg[2] for v in vs}]
  envs += [{v: data.draw(st.integers(v.arg[1], v.arg[2])) for v in vs} for _ in range(3)]
  for env in envs:
    want, got = sym_infer(e, env), sym_infer(s, env)
    where = f"{e.render()} -> {s.render()} with {', '.join(f'{v.arg[0]}={x} in [{v.arg[1]},{v.arg[2]}]' for v, x in env.items())}"
    assert want == got, f"{where}: {want} != {got}"
    assert e.vmin <= want <= e.vmax and s.vmin <= got <= s.vmax, f"{where}: bounds [{e.vmin},{e.vmax}] / [{s.vmin},{s.vmax}]"
    for u in e.toposort:
      if u.op in {Ops.DEFINE_VAR, Ops.CONST}: continue
      assert u.vmin <= sym_infer(u, env) <= u.vmax, f"{where}: bounds of {u.render()} [{u.vmin},{u.vmax}]"

def test_window_remainder_test_becomes_a_range_test():
  # (kk*13 + p) % 14 < 11 is 0 <= p - kk < 11: for p < kk the remainder wraps to at least 12
  p = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 13),), (0, AxisKind.GLOBAL))
  kk = UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, 3),), (1, AxisKind.REDUCE))
  assert ((kk * 13 + p) % 14 < 11).simplify().render() == "((-1<(r0+(r1*-1)))&((r0+(r1*-1))<11))"
  # where the wrapped values can reach below the bound, the test stays as it is
  assert ((kk * 13 + p) % 14 < 13).simplify().render() == "(((r0+(r1*13))%14)<13)"

def test_exp_ln2_split_matches_decimal():
  # exp's range reduction splits ln 2 in two floats from 60 digits held as an integer (no decimal module at import):
  # hi is ln 2 truncated to the bits n*hi must stay exact in, lo the correctly rounded rest, as an 80-digit ln 2 gives
  from decimal import Decimal, localcontext
  from attograd.uop.mathlib import _ln2_split
  with localcontext() as ctx:
    ctx.prec = 80
    ln2 = Decimal(2).ln()
    for bits in (16, 32):
      hi, lo = _ln2_split(bits)
      assert hi == float(int(ln2 * 2 ** bits)) / 2 ** bits and lo == float(ln2 - Decimal(hi))
