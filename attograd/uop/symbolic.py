"""Rewrite rules for integer (index) arithmetic and constant folding.
Every rule holds under C's truncating division (DESIGN §4.4); rules that would change a
float result (reassociation, x*0) are restricted to integers."""
from __future__ import annotations
import functools, math
from attograd.dtype import dtypes, DType, INTS
from attograd.uop.ops import UOp, Ops, GroupOp, exec_alu
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite

INT_TYPES = INTS
BOOL_INT = (dtypes.bool, *INTS)

@functools.lru_cache(maxsize=4096)  # (the terms of the sums simplified last: unbounded, it kept every node it was asked of)
def _key(u: UOp) -> tuple:
  """A deterministic order for terms (same across processes, unlike id()): r0 before r1."""
  return (u.op.value, str(u.arg), u.dtype.name, tuple(_key(s) for s in u.src))

def split_terms(u: UOp) -> tuple[list[tuple[UOp, int]], int]:
  """An integer sum as [(node, coefficient)], constant."""
  if u.op is Ops.ADD:
    (a, ca), (b, cb) = split_terms(u.src[0]), split_terms(u.src[1])
    return a + b, ca + cb
  if u.op is Ops.CONST: return [], u.arg
  if u.op is Ops.MUL and u.src[1].op is Ops.CONST:
    terms, c = split_terms(u.src[0])
    return [(n, k * u.src[1].arg) for n, k in terms], c * u.src[1].arg
  return [(u, 1)], 0

def build_sum(dtype: DType, terms: list[tuple[UOp, int]], const: int) -> UOp:
  merged: dict[UOp, int] = {}
  for n, k in terms: merged[n] = merged.get(n, 0) + k
  parts = [n if k == 1 else UOp(Ops.MUL, dtype, (n, UOp.const(dtype, k))) for n, k in sorted(merged.items(), key=lambda t: _key(t[0])) if k != 0]
  if const != 0 or not parts: parts.append(UOp.const(dtype, const))
  ret = parts[0]
  for p in parts[1:]: ret = UOp(Ops.ADD, dtype, (ret, p))
  return ret

def normalize_sum(x: UOp) -> UOp | None:
  """Collect like terms and constants of an integer sum into one canonical form, and put back
  together what a reshape took apart (the div/mod pairs below)."""
  terms, const = split_terms(x)
  merged: dict[UOp, int] = {}
  for n, k in terms: merged[n] = merged.get(n, 0) + k
  while join_divmod(x.dtype, merged) or join_digits(x.dtype, merged): pass
  return build_sum(x.dtype, list(merged.items()), const)

def join_divmod(dt: DType, terms: dict[UOp, int]) -> bool:
  """(y//c)*c + y%c = y for any y and c != 0 (y = q*c + r is what C's / and % mean), and
  ((y//c1)%c2)*c1 + y%c1 = y%(c1*c2) for c1, c2 > 0: both parts carry y's sign, so their sum is the
  remainder of the truncating division by c1*c2. Applies to k times each side alike."""
  for m, k in terms.items():
    if m.op is not Ops.MOD or m.src[1].op is not Ops.CONST or k == 0 or m.src[1].arg == 0: continue
    y, c = m.src
    q = UOp(Ops.IDIV, dt, (y, c))
    if terms.get(q, 0) == k * c.arg:
      del terms[m], terms[q]
      terms[y] = terms.get(y, 0) + k
      return True
    for n, kn in terms.items():
      if n.op is Ops.MOD and n.src[0] is q and n.src[1].op is Ops.CONST and kn == k * c.arg and c.arg > 0 and \
         0 < n.src[1].arg and c.arg * n.src[1].arg <= dtypes.max(dt):
        del terms[m], terms[n]
        r = UOp(Ops.MOD, dt, (y, UOp.const(dt, c.arg * n.src[1].arg)))
        terms[r] = terms.get(r, 0) + k
        return True
  return False

def join_digits(dt: DType, terms: dict[UOp, int]) -> bool:
  """k*(y//c)*c + k*(the digits of y%c) = k*y, where the digits are y%c itself or, for c = c1*c2 with c1, c2 > 0,
  ((y//c1)%c2)*c1 and the digits of y%c1 (join_divmod's identities, nested). Unlike join_divmod this finds the digits
  after they were simplified on their own ((8*a+b)%4 is b%4 by the time the sum sees it): a digit is present when its
  simplified form is. Only a c1 that some term's coefficient shows is tried, and every term matched is consumed
  entirely, so the sum shrinks each time."""
  coefs = set(terms.values())
  for q, kq in terms.items():
    if q.op is not Ops.IDIV or q.src[1].op is not Ops.CONST or (c := q.src[1].arg) <= 1 or kq == 0 or kq % c != 0: continue
    if (found := _digits(dt, terms, coefs, q.src[0], c, kq // c)) is None or len({n for n, _ in found}) != len(found): continue
    for n, _ in found: del terms[n]
    del terms[q]
    terms[q.src[0]] = terms.get(q.src[0], 0) + kq // c
    return True
  return False

def _digits(dt: DType, terms: dict[UOp, int], coefs: set[int], y: UOp, c: int, k: int) -> list[tuple[UOp, int]] | None:
  """join_digits' digits of y%c with coefficient k among terms, as [(term, coefficient)] (None: one is missing)."""
  m = UOp(Ops.MOD, dt, (y, UOp.const(dt, c)))
  if terms.get(m) == k or terms.get(m := simplify(m)) == k: return [(m, k)]
  for c1 in sorted(k1 // k for k1 in coefs if k1 % k == 0 and 1 < k1 // k < c and c % (k1 // k) == 0):
    d = simplify(UOp(Ops.MOD, dt, (UOp(Ops.IDIV, dt, (y, UOp.const(dt, c1))), UOp.const(dt, c // c1))))
    if terms.get(d) == k * c1 and (rest := _digits(dt, terms, coefs, y, c1, k)) is not None: return [(d, k * c1)] + rest
  return None

def fold_divmod(x: UOp, c: UOp, d: UOp) -> UOp | None:
  """x // c and x % c for a constant c > 0. Each term n*k of x splits as n*(k//c)*c + n*(k%c),
  so x = c*Q + R; with x >= 0 and R >= 0 truncation is floor division, x//c = Q + R//c and
  x%c = R%c exactly. Bounds then often decide R//c = 0 and R%c = R."""
  cv = c.arg
  if cv <= 0: return None
  if not x.exact: return None  # the rules below reason about magnitudes, which wraparound breaks
  if x.vmin >= 0 and x.vmax < cv: return x if d.op is Ops.MOD else x.const_like(0)
  if x.vmin >= 0 and x.vmin // cv == x.vmax // cv and d.op is Ops.IDIV: return x.const_like(x.vmin // cv)
  terms, const = split_terms(x)
  if all(0 <= k < cv for _, k in terms) and 0 <= const < cv: return common_factor(x, terms, const, cv, d)
  rest = build_sum(x.dtype, [(n, k % cv) for n, k in terms], const % cv)
  if x.vmin < 0 or rest.vmin < 0 or not (x.exact and rest.exact): return None
  if d.op is Ops.MOD: return UOp(Ops.MOD, x.dtype, (rest, c))
  return build_sum(x.dtype, [(n, k // cv) for n, k in terms] + [(UOp(Ops.IDIV, x.dtype, (rest, c)), 1)], const // cv)

def common_factor(x: UOp, terms: list[tuple[UOp, int]], const: int, cv: int, d: UOp) -> UOp | None:
  """x = g*B + S with g dividing c, B >= 0 and S in [0, g): x//c = B//(c/g) and x%c = (B%(c/g))*g + S. A permuted
  window's (y + 26*x)//52 is x//2 when y < 26."""
  for g in sorted({math.gcd(k, cv) for _, k in terms} - {1}, reverse=True):
    big = build_sum(x.dtype, [(n, k // g) for n, k in terms if k % g == 0], const // g)
    small = build_sum(x.dtype, [(n, k) for n, k in terms if k % g], const % g)
    if not (big.exact and small.exact) or big.vmin < 0 or small.vmin < 0 or small.vmax >= g: continue
    if d.op is Ops.IDIV: return UOp(Ops.IDIV, x.dtype, (big, UOp.const(x.dtype, cv // g)))
    return UOp(Ops.MOD, x.dtype, (big, UOp.const(x.dtype, cv // g))) * g + small
  return None

def balanced_split(y: UOp, c: int) -> tuple[UOp, UOp]:
  """y = c*Q + R with each coefficient's remainder in (-c/2, c/2]: kk*13 + p over 14 is 14*kk + (p - kk).
  Where R stays in [0, c), y//c = Q and y%c = R (for y >= 0)."""
  terms, const = split_terms(y)
  bal = lambda k: k % c - c if k % c > c // 2 else k % c
  q = build_sum(y.dtype, [(n, (k - bal(k)) // c) for n, k in terms], (const - bal(const)) // c)
  return q, build_sum(y.dtype, [(n, bal(k)) for n, k in terms], bal(const))

def remainder_below(y: UOp, c: UOp, b: UOp) -> UOp | None:
  """y%c < b as a range test on R (y = c*Q + R, balanced_split): for y >= 0 and R in [-c, c), y%c is R where
  R >= 0 and R + c where R < 0; when R + c can't get below b, y%c < b is 0 <= R < b. A window's gradient
  asks this of a row-major index into rows one longer than the data (pad, reshape)."""
  if not y.exact or y.vmin < 0 or (cv := c.arg) <= 0: return None
  _, r = balanced_split(y, cv)
  if not r.exact or r.vmin >= 0 or r.vmin < -cv or r.vmax >= cv or r.vmin + cv < b.arg: return None
  return (r.const_like(-1) < r) & (r < b.arg)

def fold_const(a: UOp) -> UOp: return a.const_like(exec_alu(a.op, a.dtype, [s.arg for s in a.src]))

def decided_by_bounds(x: UOp) -> UOp | None:
  if (dtypes.is_int(x.dtype) or dtypes.is_bool(x.dtype)) and x.vmin == x.vmax: return x.const_like(x.vmin)
  return None

x, y, z, c1, c2 = UPat.var("x"), UPat.var("y"), UPat.var("z"), UPat.cvar("c1"), UPat.cvar("c2")
ix, iy = UPat.var("x", INT_TYPES), UPat.var("y", INT_TYPES)

symbolic = PatternMatcher([
  # constant folding, and integer values that bounds pin to one number
  (UPat(GroupOp.ALU, src=UPat(Ops.CONST), name="a"), fold_const),
  (UPat(Ops.CAST, src=(UPat(Ops.CONST, name="c"),), name="a"), lambda a, c: UOp.const(a.dtype, c.arg)),
  (UPat(GroupOp.ALU | {Ops.CAST}, dtype=BOOL_INT, name="x"), decided_by_bounds),
  # constants go on the right of commutative ops, so the rules below see one form
  (UPat(GroupOp.Commutative, src=(UPat(Ops.CONST), UPat(name="b")), name="a"),
   lambda a, b: a.replace(src=(b, a.src[0])) if b.op is not Ops.CONST else None),
  # identities
  # for floats only x + -0.0 and x - +0.0 are identities: -0.0 + 0.0 is +0.0 (Z3 found it)
  (x + UPat.cvar("z"), lambda x, z: x if z.arg == 0 and (dtypes.is_int(x.dtype) or math.copysign(1, z.arg) < 0) else None),
  (x - UPat.cvar("z"), lambda x, z: x if z.arg == 0 and (dtypes.is_int(x.dtype) or math.copysign(1, z.arg) > 0) else None),
  (x * UPat.const(None, 1), lambda x: x), (ix * UPat.const(None, 0), lambda x: x.const_like(0)),
  (x // UPat.const(None, 1), lambda x: x), (UPat(Ops.FDIV, src=(x, UPat.const(None, 1.0))), lambda x: x),
  (ix % UPat.const(None, 1), lambda x: x.const_like(0)),
  (ix - ix, lambda x: x.const_like(0)), (x.maximum(x), lambda x: x),
  (UPat(Ops.NEG, src=(UPat(Ops.NEG, src=(x,)),)), lambda x: x),
  (x & UPat.const(dtypes.bool, True), lambda x: x), (x | UPat.const(dtypes.bool, False), lambda x: x),
  (x & UPat.const(dtypes.bool, False), lambda x: x.const_like(False)), (x | UPat.const(dtypes.bool, True), lambda x: x.const_like(True)),
  (UPat((Ops.AND, Ops.OR), dtype=dtypes.bool, src=(x, x)), lambda x: x),
  (UPat(Ops.WHERE, src=(UPat(Ops.CONST, name="c"), x, y)), lambda c, x, y: x if c.arg else y),
  (UPat(Ops.WHERE, src=(UPat.var(), x, x)), lambda x: x),
  # nested pad gates become one conjunction, whose clauses gated_index simplifies under each other
  (UPat(Ops.WHERE, src=(UPat.var("g1"), UPat(Ops.WHERE, src=(UPat.var("g2"), x, y)), y)), lambda g1, g2, x, y: (g1 & g2).where(x, y)),
  (UPat(Ops.CAST, name="a", src=(x,)), lambda a, x: x if a.dtype == x.dtype else None),
  (UPat((Ops.CMPLT, Ops.CMPNE), src=(ix, ix)), lambda x: UOp.const(dtypes.bool, False)),
  (UPat(Ops.MAX, src=(x, y)), lambda x, y: (x if x.vmin >= y.vmax else y if y.vmin >= x.vmax else None)
     if dtypes.is_int(x.dtype) else None),
  # integer sums in one canonical form: like terms and constants collected
  (UPat(Ops.SUB, dtype=INT_TYPES, src=(x, y)), lambda x, y: x + y * -1),
  (UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat(Ops.ADD, name="s"), c1)),
   lambda s, c1: build_sum(s.dtype, [(n, k * c1.arg) for n, k in split_terms(s)[0]], split_terms(s)[1] * c1.arg)),
  (UPat(Ops.MUL, dtype=INT_TYPES, src=(UPat(Ops.MUL, src=(x, c1)), c2)), lambda x, c1, c2: x * (c1.arg * c2.arg)),
  (UPat(Ops.ADD, dtype=INT_TYPES, name="s"), lambda s: r if (r := normalize_sum(s)) is not s else None),
  # division and remainder by constants
  (UPat((Ops.IDIV, Ops.MOD), dtype=INT_TYPES, src=(ix, c1), name="d"), lambda x, c1, d: fold_divmod(x, c1, d)),
  (UPat(Ops.IDIV, src=(UPat(Ops.MUL, src=(ix, c1), name="m"), c2)),
   lambda x, c1, c2, m: (x * (c1.arg // c2.arg) if c1.arg % c2.arg == 0 else x // (c2.arg // c1.arg) if c2.arg % c1.arg == 0 else None)
     if c1.arg > 0 and c2.arg > 0 and m.exact else None),
  # (x//c1)//c2 = x//(c1*c2) only while c1*c2 fits the dtype (65537*65537 wraps: Z3 found it)
  (UPat(Ops.IDIV, src=(UPat(Ops.IDIV, src=(ix, c1)), c2)),
   lambda x, c1, c2: x // (c1.arg * c2.arg) if c1.arg > 0 and c2.arg > 0 and c1.arg * c2.arg <= dtypes.max(x.dtype) else None),
  # (x%c1)%c2 = x%c2 when c2 divides c1, but not for c1 = 0 (x%0 is 0, and 0 "divides" by every c2: Z3 found it)
  (UPat(Ops.MOD, src=(UPat(Ops.MOD, src=(ix, c1)), c2)),
   lambda x, c1, c2: x % c2 if c1.arg != 0 and c2.arg != 0 and c1.arg % c2.arg == 0 else None),
  (UPat(Ops.CMPLT, src=(UPat(Ops.MOD, src=(ix, c1)), c2)), lambda x, c1, c2: remainder_below(x, c1, c2)),
  # comparisons against constants move the constants to one side
  (UPat(Ops.CMPLT, src=(UPat(Ops.ADD, dtype=INT_TYPES, src=(x, c1), name="a"), c2)),
   lambda x, c1, c2, a: x < (c2.arg - c1.arg) if a.exact and x.dtype.scalar() == a.dtype and
     dtypes.min(a.dtype) <= c2.arg - c1.arg <= dtypes.max(a.dtype) else None),
  (UPat(Ops.CMPLT, src=(UPat(Ops.MUL, dtype=INT_TYPES, src=(x, c1), name="m"), c2)),
   lambda x, c1, c2, m: x < -(-c2.arg // c1.arg) if c1.arg > 0 and m.exact else None),
])

def simplify(u: UOp) -> UOp: return graph_rewrite(u, symbolic, name="simplify")
UOp.simplifier = simplify

# ***** validity-aware simplification: an index is only used where its gate holds *****

def gate_bounds(gate: UOp) -> dict[UOp, tuple[int, int]]:
  """What the clauses of an AND-ed gate say about the integer expressions they compare:
  `e < c` gives e <= c-1, `c < e` gives e >= c+1, `!(e < c)` gives e >= c (pad builds these)."""
  out: dict[UOp, tuple[int, int]] = {}
  stack = [gate]
  while stack:
    g = stack.pop()
    if g.op is Ops.AND: stack.extend(g.src); continue
    lo, hi, e = None, None, None
    if g.op is Ops.CMPNE and g.src[1].op is Ops.CONST and g.src[1].arg is True: g, flip = g.src[0], True
    else: flip = False
    if g.op is not Ops.CMPLT or not dtypes.is_int(g.src[0].dtype): continue
    (a, b) = g.src
    if b.op is Ops.CONST and a.op is not Ops.CONST: e, lo, hi = (a, b.arg, None) if flip else (a, None, b.arg - 1)
    elif a.op is Ops.CONST and b.op is not Ops.CONST: e, lo, hi = (b, None, a.arg) if flip else (b, a.arg + 1, None)
    if e is None: continue
    olo, ohi = out.get(e, (e.vmin, e.vmax))
    out[e] = (max(olo, lo) if lo is not None else olo, min(ohi, hi) if hi is not None else ohi)
  return out

def standin(e: UOp, lo: int, hi: int, inside: set[UOp], change: bool) -> tuple[dict[UOp, UOp], UOp] | None:
  """A variable v in [lo, hi] for the expression e, as ({node: its form in v}, v). e itself stands in where x uses
  it; with `change`, a sum e = n + rest (n a term of coefficient +-1 that x uses) instead replaces n by v - rest
  everywhere, so a window's p - kk reaches the kk*13 + p that a reshape made of it."""
  if lo > hi or (lo, hi) == (e.vmin, e.vmax) or not e.exact: return None
  v = UOp.variable("gate", lo, hi, e.dtype)
  if not change: return ({e: v}, v) if e in inside else None
  if e.op is not Ops.ADD: return None
  terms, const = split_terms(e)
  if (unit := next(((n, k) for n, k in terms if k in (1, -1) and n in inside), None)) is None: return None
  rest = build_sum(e.dtype, [(n, k) for n, k in terms if n is not unit[0]], const)
  return {unit[0]: v - rest if unit[1] == 1 else rest - v}, v

def under_bounds(x: UOp, bounds: dict[UOp, tuple[int, int]]) -> UOp | None:
  """x simplified as if each bounded expression were a variable with the narrowed bounds, then put back, one
  expression at a time: equal to x wherever the bounds hold. None unless that makes x smaller."""
  if not x.exact: return None
  best = x
  for e, (lo, hi) in bounds.items():
    for change in (True, False):
      if (sub := standin(e, lo, hi, set(best.toposort), change)) is None: continue
      # simplified again after e is back, so the result is a fixed point of symbolic (no rewrite undoes it)
      new = simplify(simplify(best.substitute(sub[0])).substitute({sub[1]: e}))
      if len(new.toposort) < len(best.toposort): best = new
  return None if best is x else best

def clauses(gate: UOp) -> list[UOp]: return [c for s in gate.src for c in clauses(s)] if gate.op is Ops.AND else [gate]

def simplify_gate(gate: UOp) -> UOp | None:
  """Each clause of an AND-ed gate simplified where the others hold: the same conjunction, smaller (the
  second axis of a conv's gradient window is only simple once the first axis is known to be in range)."""
  cs = clauses(gate)
  if len(cs) < 2: return None
  changed = False
  for j in range(len(cs)):
    others = [c for k, c in enumerate(cs) if k != j]
    if (new := under_bounds(cs[j], gate_bounds(functools.reduce(lambda a, b: a & b, others)))) is not None:
      cs[j], changed = simplify(new), True
  if not changed: return None
  new = simplify(functools.reduce(lambda a, b: a & b, cs))
  return new if len(new.toposort) < len(gate.toposort) else None

def simplify_under_gate(i: UOp, idx: UOp, gate: UOp) -> UOp | None:
  """The gate's clauses simplified under each other, and idx under the gate: the INDEX reads the same
  memory wherever the gate holds, and nowhere else."""
  if (g := simplify_gate(gate)) is not None: gate = g
  if (x := under_bounds(idx, gate_bounds(gate))) is not None: idx = x
  return None if idx is i.src[1] and gate is i.src[2] else i.replace(src=(i.src[0], idx, gate))

gated_index = PatternMatcher([
  (UPat(Ops.INDEX, src=(UPat((Ops.PARAM, Ops.DEFINE_REG), name="buf"), UPat.var("idx"), UPat.var("gate")), name="i"),
   lambda buf, idx, gate, i: simplify_under_gate(i, idx, gate)),
  (UPat(Ops.WHERE, src=(UPat(Ops.AND, name="gate"), x, y)), lambda gate, x, y: None if (g := simplify_gate(gate)) is None else g.where(x, y)),
])

def ungate_load(ld: UOp, i: UOp, buf: UOp, idx: UOp, spare_bytes: tuple[int, int] = (0, 0)) -> UOp | None:
  """A load whose address is in the buffer for every value of the loops needs no gate. What a gate hides is
  masked where it is used (a pad's WHERE, a padded reduce's identity, a gated store), so the gate only ever
  kept the read itself in bounds; a conv's gradient puts the image's pad gate on every weight read. On a device
  that keeps `spare_bytes` mapped before and after every buffer, an address in them is as good (a padded conv
  reads above its first row; a conv's row padded to 32 reads 2 elements past the image)."""
  before, after = (n // buf.dtype.base.itemsize for n in spare_bytes)
  if not idx.exact or buf.dtype.size < 0 or idx.vmin < -before or idx.vmax >= buf.dtype.size + after: return None
  return ld.replace(src=(i.replace(src=(buf, idx)), *ld.src[1:]))

gated_param_load = UPat(Ops.LOAD, src=(UPat(Ops.INDEX, src=(UPat(Ops.PARAM, name="buf"), UPat.var("idx"), UPat.var()), name="i"),),
                        allow_any_len=True, name="ld")
inbounds_load = PatternMatcher([(gated_param_load, ungate_load)])
# codegen's, with the device's spare bytes (Renderer.spare_bytes) as ctx
inbounds_load_spare = PatternMatcher([(gated_param_load, lambda ctx, ld, i, buf, idx: ungate_load(ld, i, buf, idx, ctx))])
