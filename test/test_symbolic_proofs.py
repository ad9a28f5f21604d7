"""Every rewrite rule of the symbolic engine, proven with Z3.

The left sides below are templates filled from pools of variables (with bounds that are positive,
negative, mixed, huge, or the dtype's whole range) and constants (zero, -1, powers of two, and ones
near the dtype's limits). Each filled-in left side is offered to every rule of every matcher; where a
rule fires, Z3 proves its result equal to the left side for every variable value in bounds, with C's
truncating division and the dtype's wraparound modelled bit for bit (test/z3_uop.py). The bounds
(vmin/vmax) that the rules' guards rely on are proven too. A rule that no sample makes fire fails
the suite: a new rule comes with a left side that exercises it."""
import functools, itertools, math
import pytest
from attograd import dtypes
from attograd.uop.ops import AxisKind, UOp, Ops, sym_infer
from attograd.uop.symbolic import symbolic, gated_index
from attograd.codegen.divmod import divmod_lowering
from z3_uop import prove, prove_equal, prove_bounds, RLIMIT

I32, I8, U8, I64, F32 = dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64, dtypes.float32
def c(v, dt=I32): return UOp.const(dt, v)
def v(name, lo, hi, dt=I32): return UOp.variable(name, lo, hi, dt)
def rng(i, n, dt=I32): return UOp(Ops.RANGE, dt, (c(n, dt),), (i, AxisKind.GLOBAL))

MATCHERS = {"symbolic": symbolic, "gated_index": gated_index, "divmod": divmod_lowering}

# ***** pools *****
a, b, neg, big = v("a", 0, 10), v("b", -10, 10), v("neg", -20, -3), v("big", 0, 2**31 - 1)
full, r0, r1, n = v("full", -2**31, 2**31 - 1), rng(0, 16), rng(1, 5), v("n", 1, 64)
ATOMS = {I32: [a, b, neg, big, full, r0, r0 * 4 + r1, b * 3 + 2, r0 - a, n * 8 + r1],
         U8: [v("u", 0, 255, U8), v("us", 3, 20, U8)], I8: [v("i8", -128, 127, I8), v("s8", -9, 9, I8)],
         I64: [v("w", 0, 2**40, I64), v("wn", -2**40, 2**40, I64)]}
CONSTS = {I32: [0, 1, -1, 2, 3, 4, -4, 6, 12, 65537, 2**31 - 1, -2**31],
          U8: [0, 1, 2, 3, 4, 250, 255], I8: [0, 1, -1, 3, -4, 100, -128, 127], I64: [0, 1, -1, 3, 12, 2**33 + 1, -2**62]}
SMALL_CONSTS = {I32: [0, -1, 2, 3, 4, -4, 6, 65537, 65536, -2**31], U8: [0, 2, 3, 250], I8: [0, -1, 3, -4, -128], I64: [0, -1, 3, 2**33 + 1]}

def int_samples():
  """(dtype, x, y, c1, c2) tuples, kept to a few hundred: y and c2 come from short lists."""
  for dt in ATOMS:
    xs, cs, scs = ATOMS[dt], CONSTS[dt], SMALL_CONSTS[dt]
    for x, c1, c2 in itertools.product(xs, cs, scs): yield dt, x, xs[(xs.index(x) + 1) % len(xs)], c(c1, dt), c(c2, dt)

# templates: x, y are expressions, c1, c2 constants (all of one int dtype)
INT_TEMPLATES = [
  lambda x, y, c1, c2: x + c1, lambda x, y, c1, c2: c1 + x, lambda x, y, c1, c2: x - c1, lambda x, y, c1, c2: x * c1,
  lambda x, y, c1, c2: c1 * x, lambda x, y, c1, c2: x // c1, lambda x, y, c1, c2: x % c1,
  lambda x, y, c1, c2: x.maximum(c1), lambda x, y, c1, c2: x < c1, lambda x, y, c1, c2: c1 < x,
  lambda x, y, c1, c2: (x + c1) * c2, lambda x, y, c1, c2: (x * c1) * c2, lambda x, y, c1, c2: (x + c1) + c2,
  lambda x, y, c1, c2: (x * c1) // c2, lambda x, y, c1, c2: (x // c1) // c2, lambda x, y, c1, c2: (x % c1) % c2,
  lambda x, y, c1, c2: (x + c1) < c2, lambda x, y, c1, c2: (x * c1) < c2, lambda x, y, c1, c2: (x * c1 + c2) // c1,
  lambda x, y, c1, c2: (x * c1 + c2) % c1, lambda x, y, c1, c2: (x * c1 + y) // c2, lambda x, y, c1, c2: (x * c1 + y) % c2,
  lambda x, y, c1, c2: (x // c1) * c1 + x % c1, lambda x, y, c1, c2: ((x // c1) % c2) * c1 + x % c1,
  lambda x, y, c1, c2: (x % c1) // c2, lambda x, y, c1, c2: (x + y) // c1 * c1 + (x + y) % c1,
  lambda x, y, c1, c2: x.cast(I32 if x.dtype != I32 else I8), lambda x, y, c1, c2: UOp.const(x.dtype, c1.arg).cast(I64 if x.dtype != I64 else I8),
]
PAIR_TEMPLATES = [  # x, y only
  lambda x, y: x - y, lambda x, y: x + y - y, lambda x, y: x - x, lambda x, y: x.maximum(x), lambda x, y: x.maximum(y),
  lambda x, y: -(-x), lambda x, y: x < x, lambda x, y: x.ne(x), lambda x, y: (x < y).where(x, x), lambda x, y: x * 1,
  lambda x, y: x * 0, lambda x, y: x // 1, lambda x, y: x % 1, lambda x, y: x + 0, lambda x, y: x - 0, lambda x, y: UOp(Ops.CAST, x.dtype, (x,)),
  lambda x, y: (x < y) & True, lambda x, y: (x < y) | False, lambda x, y: (x < y) & False, lambda x, y: (x < y) | True,
  lambda x, y: (x < y) & (x < y), lambda x, y: (x < y) | (x < y), lambda x, y: c(True, dtypes.bool).where(x, y),
  lambda x, y: c(False, dtypes.bool).where(x, y), lambda x, y: x * y, lambda x, y: x.maximum(y + 100),
]
fx, fy = UOp(Ops.DEFINE_VAR, F32, (), ("fx", 0, 0)), UOp(Ops.DEFINE_VAR, F32, (), ("fy", 0, 0))  # floats: bounds unused
FLOAT_SAMPLES = [fx + c(0.0, F32), fx + c(-0.0, F32), fx - c(0.0, F32), fx - c(-0.0, F32), fx * c(1.0, F32), fx / c(1.0, F32),
                 -(-fx), fx.maximum(fx), (fx < fy).where(fx, fx), c(2.0, F32) + c(3.0, F32), c(2.0, F32) * fx, UOp(Ops.CAST, F32, (fx,))]

def gated_samples():
  """INDEX(buf, idx, gate) as a PAD makes them: the gate narrows what idx can be."""
  buf = UOp(Ops.PARAM, F32.ptr(64), (), 1)
  r, s = rng(0, 20), rng(1, 4)
  p, kk = rng(2, 13), rng(3, 3)
  gates_and_idx = [
    ((c(1) < r) & (r < 18), r - 2),                                   # pad (2, 2) around 16 elements
    ((c(1) < r * 4 + s) & (r * 4 + s < 18), (((r * 4 + s - 2) // 4) % 4) * 4 + (r * 4 + s - 2) % 4),  # pad, then reshape
    ((c(2) < r) & (r < 7), (r - 3) // 4),                             # r in [3, 6]: the quotient is 0
    ((c(2) < r) & (r < 7), (r - 3) % 4 + s * 4),
    ((r < 9), (r + 7) // 16),                                         # one-sided gates
    ((c(-1) < r - 4), (r - 4) % 16),
    ((c(0) < r) & (r < 9), ((r - 1) * 4 + s) // 4),
    # a window's gradient (a conv's, 13 wide, 3x3): row kk of rows one longer than the data starts kk later
    ((c(-1) < p - kk) & (p - kk < 11), (kk * 13 + p) // 14 * 11 + (kk * 13 + p) % 14),
    # the second clause is simple only where the first holds
    ((c(-1) < p - kk) & (p - kk < 11) & (((kk * 13 + p) // 14 * 11 + (kk * 13 + p) % 14) // 33 + p < 12), p),
  ]
  for gate, idx in gates_and_idx: yield UOp(Ops.INDEX, F32.ptr(64), (buf, idx.simplify(), gate.simplify()))
  # pad gates on float values: nested ones become one, and its clauses simplify under each other
  g1, g2 = (c(-1) < p - kk) & (p - kk < 11), ((kk * 13 + p) // 14 * 11 + (kk * 13 + p) % 14) < 33
  yield g1.where(g2.where(fx, fy), fy)
  yield (g1 & g2).simplify().where(fx, fy)
  yield (kk * 13 + p) % c(14) < c(11)

def divmod_samples():
  for dt, bounds in ((I32, [(0, 100), (0, 2**31 - 1), (-2**31, 2**31 - 1), (-1000, 1000), (7, 7000)]),
                     (I64, [(0, 2**40), (-2**40, 2**40), (0, 2**63 - 1)])):
    for (lo, hi), d in itertools.product(bounds, [2, 3, 5, 7, 10, 16, 25, 100, 641, 1000, 65537, 2**31 - 1]):
      x = v(f"x{lo}_{hi}", lo, hi, dt)
      yield x // c(d, dt)
      yield x % c(d, dt)
  yield rng(0, 96) // 12 + (rng(0, 96) % 12) * 100
  # a common factor of the divisor and some coefficients, the other terms below it (a permuted window's index)
  y, x = rng(2, 26), rng(3, 26)
  for e in (y + x * 26, y * 2 + x * 52 + 1, y + x * 13, b + x * 26): yield e // c(52); yield e % c(52)

def all_samples() -> list[UOp]:
  out = []
  for dt, x, y, c1, c2 in int_samples():
    for t in INT_TEMPLATES: out.append(t(x, y, c1, c2))
  for dt, xs in ATOMS.items():
    for x, y in itertools.product(xs, xs[:3]): out += [t(x, y) for t in PAIR_TEMPLATES]
  return out + FLOAT_SAMPLES + list(gated_samples()) + list(divmod_samples())

def firings(matcher, u: UOp):
  """(rule index, result) for every rule of the matcher that rewrites u in one step."""
  for i, (pat, fn) in enumerate(matcher.rules):
    if pat.op is not None and u.op not in pat.op: continue
    for store in pat.match(u, {}):
      if (ret := fn(**store)) is not None and ret is not u: yield i, ret; break

@pytest.fixture(scope="module")
def fired():
  out: dict[tuple[str, int], list[tuple[UOp, UOp]]] = {}
  seen = set()
  for u in all_samples():
    if u in seen: continue
    seen.add(u)
    for name, pm in MATCHERS.items():
      for i, ret in firings(pm, u): out.setdefault((name, i), []).append((u, ret))
  return out

def test_every_rule_is_exercised(fired):
  missing = [f"{name}[{i}] {pm.rules[i][0]} (line {pm.rules[i][1].__code__.co_firstlineno})"
             for name, pm in MATCHERS.items() for i in range(len(pm.rules)) if (name, i) not in fired]
  assert not missing, "rules no sample makes fire (add a left side to this file):\n" + "\n".join(missing)

MAX_PER_RULE = 100  # the most distinct firings proven per rule: enough for every guard, bounded time
def _chunk(name: str, pm) -> list:
  return [pytest.param(name, i, id=f"{name}[{i}]") for i in range(len(pm.rules))]

@pytest.mark.parametrize("name, i", [p for name, pm in MATCHERS.items() for p in _chunk(name, pm)])
def test_rule_is_proven(fired, name, i):
  by_dtype: dict = {}
  for lhs, rhs in fired.get((name, i), []): by_dtype.setdefault(lhs.dtype, []).append((lhs, rhs))
  chosen = []  # spread the choice over every dtype, and over the templates within one
  for group in by_dtype.values(): chosen += group[::max(1, len(group) * len(by_dtype) // MAX_PER_RULE)]
  for lhs, rhs in chosen:
    assert lhs.dtype == rhs.dtype or lhs.op is Ops.INDEX, f"{name}[{i}] changed the dtype of {lhs.render()}: {lhs.dtype} -> {rhs.dtype}"
    if lhs.op is Ops.INDEX:  # the gated-index rules: the same gate (maybe simpler), and the same index where it holds
      assert rhs.op is Ops.INDEX and rhs.src[0] is lhs.src[0] and lhs.gate is not None and rhs.gate is not None
      res, why = prove_equal(lhs.gate, rhs.gate)
      assert res == "proven", f"{name}[{i}]: gate {lhs.gate.render()} -> {rhs.gate.render()}: {res} {why}"
      res, why = prove_equal(lhs.src[1], rhs.src[1], assume=lhs.gate)
    else: res, why = prove_equal(lhs, rhs)
    assert res == "proven", f"{name}[{i}]: {lhs.render()} -> {rhs.render()}: {res} {why}"
    for u in (lhs, rhs) if lhs.op is not Ops.INDEX else (rhs.src[1],):
      if u.dtype != F32:
        res, why = prove_bounds(u)
        assert res == "proven", f"bounds [{u.vmin}, {u.vmax}] of {u.render()} are wrong: {why}"

# ***** join_digits: a sum of digits each simplified on its own, put back together *****

def digit_sums():
  """(y//C)*C + the digits of y%C in mixed radix, each term simplified before the sum sees it (as a reshape chain
  leaves them): y positive, negative, a wide variable, and an int64 one."""
  ys = [rng(0, 8) * 8 + rng(1, 8), b * 3 + 2, neg * 7 + a, full, rng(0, 6) * 10 + rng(1, 10), v("w", -2**40, 2**40, I64) * 6 + 5]
  for y, radix in itertools.product(ys, [(4, 4), (4, 2, 2), (3, 4, 5), (2, 3)]):
    dt = y.dtype
    place = [math.prod(radix[:i]) for i in range(len(radix) + 1)]  # 1, r0, r0*r1, ... C
    terms = [((y // c(place[-1], dt)) * c(place[-1], dt)).simplify(), (y % c(place[1], dt)).simplify()]
    terms += [(((y // c(p, dt)) % c(r, dt)) * c(p, dt)).simplify() for p, r in zip(place[1:-1], radix[1:])]
    yield functools.reduce(lambda acc, t: acc + t, terms)

@pytest.mark.parametrize("i", range(24))
def test_join_digits_is_proven(i):
  lhs = list(digit_sums())[i]
  rhs = lhs.simplify()
  res, why = prove_equal(lhs, rhs)
  assert res == "proven", f"{lhs.render()} -> {rhs.render()}: {res} {why}"
  # the digits were recognized: y is back (or y itself simplified, when bounds pin a digit)
  assert len(rhs.toposort) < len(lhs.toposort) and Ops.IDIV not in {u.op for u in rhs.toposort}, f"{lhs.render()} -> {rhs.render()}"

# ***** the translator agrees with the emulator's semantics (what every proof above rests on) *****

@pytest.mark.parametrize("dt", [I32, I8, U8])
def test_z3_model_matches_sym_infer(dt):
  import random
  rnd = random.Random(0)
  x, y = v("x", dtypes.min(dt), dtypes.max(dt), dt), v("y", dtypes.min(dt), dtypes.max(dt), dt)
  exprs = [x + y, x - y, x * y, x // y, x % y, x.maximum(y), -x, x < y, x.ne(y), x.eq(y), x & y, x | y, x ^ y,
           (x < y).where(x, y), x.cast(I64), x.cast(U8), x.cast(dtypes.bool), x >> c(3, dt)]
  from z3_uop import Z3Model
  import z3
  for e in exprs:
    for _ in range(20):
      env = {x: rnd.choice([dtypes.min(dt), dtypes.max(dt), 0, -1 if dt != U8 else 1, rnd.randint(dtypes.min(dt), dtypes.max(dt))]),
             y: rnd.choice([0, -1 if dt != U8 else 1, dtypes.min(dt), rnd.randint(dtypes.min(dt), dtypes.max(dt))])}
      m = Z3Model()
      ze = m(e); m(x); m(y)
      s = z3.Solver(ctx=m.ctx); s.add(m.cache[x] == env[x], m.cache[y] == env[y]); assert s.check() == z3.sat
      assert m.value(ze, e.dtype, s.model()) == sym_infer(e, env), f"{e.render()} at {env}"

# ***** multiply-shift division: the whole int32 range, and int64 as wide as a 64-bit product allows *****
from attograd.codegen.divmod import fast_div, fast_mod, magic, wide_enough

DIVISORS = [2, 3, 5, 6, 7, 10, 12, 25, 60, 100, 641, 1000, 65537, 2**31 - 1]

@pytest.mark.parametrize("d", DIVISORS)
def test_fast_divmod_full_int32(d):
  x = v("x", -2**31, 2**31 - 1)
  for ref, fast in ((x // d, fast_div(x, d)), (x % d, fast_mod(x, d))):
    assert fast is not None and Ops.IDIV not in {u.op for u in fast.toposort}, f"no fast form for {ref.render()}"
    res, why = prove_equal(ref, fast)
    assert res == "proven", f"{ref.render()} -> {fast.render()}: {why}"

@pytest.mark.parametrize("d", DIVISORS + [2**40 + 1])
def test_fast_divmod_int64(d):
  # the widest non-negative and the widest symmetric int64 range the magic number allows, proven;
  # one wider refuses (a 128-bit product would be needed, and a divide is cheaper than emulating it)
  for signed in (False, True):
    n = (1 << 62) if d & (d - 1) == 0 and not signed else max(k for k in (2**e - 1 for e in range(1, 63))
                                                               if wide_enough(I64, k, magic(d, k)[0]) is not None)
    x = v("x", -n if signed else 0, n, I64)
    for ref, fast in ((x // c(d, I64), fast_div(x, d)), (x % c(d, I64), fast_mod(x, d))):
      assert fast is not None
      res, why = prove_equal(ref, fast)
      assert res == "proven", f"{ref.render()} -> {fast.render()}: {why}"
  if d & (d - 1): assert fast_div(v("x", -2**63, 2**63 - 1, I64), d) is None

def test_fast_divmod_values():
  """The proofs above go through Z3's integer model (bit-vector multiplication of 64 bits is too slow
  for Z3): a cross-check of the same forms by evaluation, at the edges and at random points."""
  import random
  rnd = random.Random(1)
  for dt, lo, hi in ((I32, -2**31, 2**31 - 1), (I64, -2**40, 2**40)):
    x = v("x", lo, hi, dt)
    pts = [lo, lo + 1, -1, 0, 1, hi - 1, hi] + [rnd.randint(lo, hi) for _ in range(200)]
    for d in DIVISORS:
      pts_d = pts + [k * d + e for k in (-3, 3, hi // d, lo // d + 1) for e in (-1, 0, 1) if lo <= k * d + e <= hi]
      for ref, fast in ((x // c(d, dt), fast_div(x, d)), (x % c(d, dt), fast_mod(x, d))):
        if fast is None: assert dt == I64; continue  # refused: the product would not fit 64 bits
        for p in pts_d: assert sym_infer(ref, {x: p}) == sym_infer(fast, {x: p}), f"{ref.render()} at x={p}"

# ***** multiply-shift division for any divisor and any int64 range, by a lemma proven once *****
# Bit-blasting x*M for 64-bit x is beyond Z3 in CI time. Instead Z3 proves, over unbounded integers with P = 2**s
# symbolic, the condition magic() is built on (Granlund-Montgomery): with M*d = P + e, 0 <= e < d and n*e < P,
# floor(x*M/P) is floor(x/d) for 0 <= x <= n, and for -n <= x < 0 (with e > 0) it is trunc(x/d) - 1. What is left
# per divisor is arithmetic on constants (the side conditions, and that the product fits the dtype it is computed
# in), checked for every divisor below and for the widest bound fast_div accepts: the lowering is then proven for
# every dividend in that bound, including int64 ranges the integer model can't reach in time.
import z3

def test_magic_number_lemma():
  d, P, M, e, x, n, q, r = z3.Ints("d P M e x n q r")
  hyps = [d >= 2, P >= 1, M * d - P == e, e >= 0, e < d, n * e < P, 0 <= r, r < d, q >= 0]
  for goal, extra in (
      (z3.And(q * P <= x * M, x * M < (q + 1) * P), [x == q * d + r, x <= n]),          # x >= 0: floor(x*M/P) = q = x//d
      (z3.And(-(q + 1) * P <= x * M, x * M < -q * P), [x == -(q * d + r), -x <= n, x < 0, e > 0])):  # x < 0: floor = -q-1
    s = z3.Solver()
    s.set("rlimit", RLIMIT)
    s.add(*hyps, *extra, z3.Not(goal))
    assert s.check() == z3.unsat

def _fast_div_parts(fast: UOp, x: UOp) -> tuple[int, int, bool]:
  """(M, s, has the +1 for negative x) of ((x.cast(w) * M) >> s).cast(dt) [+ (x < 0).cast(dt)], or an assertion error."""
  neg = fast.op is Ops.ADD
  q = fast.src[0] if neg else fast
  if neg: assert fast.src[1].op is Ops.CAST and fast.src[1].src[0].op is Ops.CMPLT and fast.src[1].src[0].src == (x, c(0, x.dtype))
  sh = q.src[0] if q.op is Ops.CAST else q
  assert sh.op is Ops.SHR and sh.src[1].op is Ops.CONST and sh.src[0].op is Ops.MUL and sh.src[0].src[1].op is Ops.CONST
  xw = sh.src[0].src[0]
  assert xw is x or (xw.op is Ops.CAST and xw.src[0] is x)
  return sh.src[0].src[1].arg, sh.src[1].arg, neg

def test_fast_div_by_lemma():
  import random
  rnd = random.Random(3)
  divisors = sorted(set(DIVISORS + [2**40 + 1, 2**61 - 1] + [rnd.randrange(3, 2**31) for _ in range(60)] + [rnd.randrange(3, 2**62) for _ in range(60)]))
  checked = 0
  for dt in (I32, I64):
    for d in divisors:
      if d & (d - 1) == 0 or d > dtypes.max(dt): continue
      # the widest symmetric and non-negative bounds fast_div accepts (a power of two less one, by bisection on the exponent)
      for signed in (False, True):
        ok = [k for k in range(1, 8 * dt.itemsize) if fast_div(v("x", -(2**k - 1) if signed else 0, 2**k - 1, dt), d) is not None]
        if not ok: continue
        n = 2 ** max(ok) - 1
        x = v("x", -n if signed else 0, n, dt)
        m, s, plus_one = _fast_div_parts(fast_div(x, d), x)
        e = m * d - 2**s
        assert 0 <= e < d and n * e < 2**s, f"d={d} n={n}: M={m} s={s} breaks the lemma's condition"
        assert plus_one == signed and (not signed or e > 0)
        wide = I64 if n * m > dtypes.max(dt) else dt
        assert n * m <= dtypes.max(wide), f"d={d} n={n}: the product overflows {wide}"
        checked += 1
  assert checked > 200
