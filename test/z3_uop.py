"""UOp -> Z3, with attograd's semantics exactly: integers are bit-vectors of their dtype's width (so
wraparound is modelled, not assumed away), division and remainder truncate as in C, and x/0 = x%0 = 0
as the emulator and the C renderer define them. Test helper only: attograd itself never imports z3."""
from __future__ import annotations
import z3
from attograd.dtype import dtypes, DType
from attograd.uop.ops import UOp, Ops

def _bits(dt: DType) -> int: return 8 * dt.itemsize

class Z3Model:
  """Translate UOps into a Z3 context of their own. Variables (DEFINE_VAR, RANGE) become free bit-vectors,
  and `constraints` holds what their bounds say. A fresh context per model: Z3's search order follows the
  ids of the terms in its context, so in the shared one a proof's effort depended on every proof that ran
  before it in the process (one took 0.7M steps alone and ran out of 20M after other tests)."""
  def __init__(self):
    self.ctx = z3.Context()
    self.cache: dict[UOp, z3.ExprRef] = {}
    self.constraints: list[z3.BoolRef] = []
    self.in_range: list[z3.BoolRef] = []  # unused by the bit-vector model: wraparound is modelled

  def __call__(self, u: UOp) -> z3.ExprRef:
    for n in u.toposort:
      if n not in self.cache: self.cache[n] = self._one(n)
    return self.cache[u]

  def _one(self, u: UOp) -> z3.ExprRef:
    dt, op = u.dtype, u.op
    s = [self.cache[x] for x in u.src]
    sd = u.src[0].dtype if u.src else dt
    if dtypes.is_float(dt) or (u.src and dtypes.is_float(sd) and op is not Ops.WHERE): return self._float(u, s)
    if dtypes.is_bool(dt) and op is Ops.CONST: return z3.BoolVal(bool(u.arg), self.ctx)
    if op is Ops.CONST: return z3.BitVecVal(u.arg, _bits(dt), self.ctx)
    if op is Ops.DEFINE_VAR: return self._var(f"v_{u.arg[0]}", dt, u.arg[1], u.arg[2])
    if op is Ops.RANGE: return self._var(f"r{u.arg[0]}", dt, 0, s[0] - 1)
    if op is Ops.CAST: return self._cast(s[0], sd, dt)
    if op is Ops.WHERE: return z3.If(s[0], s[1], s[2])
    if dtypes.is_bool(sd):  # logic on bools
      if op is Ops.AND or op is Ops.MUL: return z3.And(s[0], s[1])
      if op is Ops.OR or op is Ops.MAX or op is Ops.ADD: return z3.Or(s[0], s[1])
      if op is Ops.XOR or op is Ops.CMPNE: return z3.Xor(s[0], s[1])
      if op is Ops.CMPEQ: return s[0] == s[1]
      if op is Ops.CMPLT: return z3.And(z3.Not(s[0]), s[1])
      raise NotImplementedError(f"no Z3 model for {op} on bool")
    uns = dtypes.is_unsigned(sd)
    lt = (lambda a, b: z3.ULT(a, b)) if uns else (lambda a, b: a < b)
    if op is Ops.ADD: return s[0] + s[1]
    if op is Ops.SUB: return s[0] - s[1]
    if op is Ops.MUL: return s[0] * s[1]
    if op is Ops.NEG: return -s[0]
    if op is Ops.IDIV: return z3.If(s[1] == 0, z3.BitVecVal(0, _bits(dt), self.ctx), z3.UDiv(s[0], s[1]) if uns else s[0] / s[1])
    if op is Ops.MOD: return z3.If(s[1] == 0, z3.BitVecVal(0, _bits(dt), self.ctx), z3.URem(s[0], s[1]) if uns else z3.SRem(s[0], s[1]))
    if op is Ops.MAX: return z3.If(lt(s[0], s[1]), s[1], s[0])
    if op is Ops.CMPLT: return lt(s[0], s[1])
    if op is Ops.CMPNE: return s[0] != s[1]
    if op is Ops.CMPEQ: return s[0] == s[1]
    if op is Ops.AND: return s[0] & s[1]
    if op is Ops.OR: return s[0] | s[1]
    if op is Ops.XOR: return s[0] ^ s[1]
    if op is Ops.SHL: return s[0] << z3.URem(s[1], _bits(dt))
    if op is Ops.SHR: return z3.LShR(s[0], s[1]) if uns else s[0] >> s[1]
    raise NotImplementedError(f"no Z3 model for {op}")

  def _float(self, u: UOp, s: list) -> z3.ExprRef:
    # float32 only; enough for the identities that apply to floats (NaN and -0.0 are what matter)
    assert u.dtype in (dtypes.float32, dtypes.bool), f"no Z3 model for {u.dtype}"
    fs, rm = z3.Float32(self.ctx), z3.RNE(self.ctx)
    op = u.op
    if op is Ops.CONST: return z3.FPVal(u.arg, fs, ctx=self.ctx)
    if op is Ops.WHERE: return z3.If(s[0], s[1], s[2])
    if op is Ops.DEFINE_VAR: return z3.FP(f"v_{u.arg[0]}", fs)
    if op is Ops.ADD: return z3.fpAdd(rm, s[0], s[1], self.ctx)
    if op is Ops.SUB: return z3.fpSub(rm, s[0], s[1], self.ctx)
    if op is Ops.MUL: return z3.fpMul(rm, s[0], s[1], self.ctx)
    if op is Ops.FDIV: return z3.fpDiv(rm, s[0], s[1], self.ctx)
    if op is Ops.NEG: return z3.fpNeg(s[0], self.ctx)
    if op is Ops.MAX: return z3.If(z3.Or(z3.fpIsNaN(s[0], self.ctx), z3.fpGT(s[0], s[1], self.ctx)), s[0], s[1])  # NaN propagates, as torch
    if op is Ops.CMPLT: return z3.fpLT(s[0], s[1], self.ctx)
    if op is Ops.CAST and u.src[0].dtype == u.dtype: return s[0]
    raise NotImplementedError(f"no Z3 model for float {op}")

  def _var(self, name: str, dt: DType, lo, hi) -> z3.ExprRef:
    v = z3.BitVec(name, _bits(dt), self.ctx)
    lo = z3.BitVecVal(lo, _bits(dt), self.ctx) if isinstance(lo, int) else lo
    hi = z3.BitVecVal(hi, _bits(dt), self.ctx) if isinstance(hi, int) else hi
    self.constraints += [z3.ULE(lo, v), z3.ULE(v, hi)] if dtypes.is_unsigned(dt) else [lo <= v, v <= hi]
    return v

  def _cast(self, x: z3.ExprRef, frm: DType, to: DType) -> z3.ExprRef:
    if dtypes.is_bool(frm): return z3.If(x, z3.BitVecVal(1, _bits(to), self.ctx), z3.BitVecVal(0, _bits(to), self.ctx))
    if dtypes.is_bool(to): return x != 0
    a, b = _bits(frm), _bits(to)
    if b < a: return z3.Extract(b - 1, 0, x)
    if b > a: return (z3.ZeroExt if dtypes.is_unsigned(frm) else z3.SignExt)(b - a, x)
    return x

  def value(self, x: z3.ExprRef, dt: DType, m: z3.ModelRef):
    v = m.eval(x, model_completion=True)
    if dtypes.is_bool(dt): return z3.is_true(v)
    if dtypes.is_float(dt): return str(v)
    return v.as_signed_long() if not dtypes.is_unsigned(dt) else v.as_long()

class Z3IntModel(Z3Model):
  """The same semantics over unbounded integers, plus a claim that no node leaves its dtype's range.
  Where that claim holds the bit-vector semantics is the integer one, node by node, so a proof here is
  a proof there; and Z3 decides division by constants over integers (linear arithmetic) far faster
  than over 32- and 64-bit vectors."""
  def _one(self, u: UOp) -> z3.ExprRef:
    dt, op = u.dtype, u.op
    if any(dtypes.is_unsigned(x.dtype) for x in (u, *u.src)): raise NotImplementedError("unsigned: use bit-vectors")
    if not dtypes.is_int(dt): return super()._one(u)  # bools: comparisons and logic over the integer values
    s, ret = [self.cache[x] for x in u.src], None
    if op is Ops.CONST: ret = z3.IntVal(u.arg, self.ctx)
    elif op is Ops.DEFINE_VAR: ret = self._ivar(f"v_{u.arg[0]}", u.arg[1], u.arg[2])
    elif op is Ops.RANGE: ret = self._ivar(f"r{u.arg[0]}", 0, s[0] - 1)
    elif op is Ops.WHERE: ret = z3.If(s[0], s[1], s[2])
    elif op is Ops.CAST: ret = z3.If(s[0], 1, 0) if dtypes.is_bool(u.src[0].dtype) else s[0] if dtypes.is_int(u.src[0].dtype) else None
    elif op is Ops.ADD: ret = s[0] + s[1]
    elif op is Ops.SUB: ret = s[0] - s[1]
    elif op is Ops.MUL: ret = s[0] * s[1]
    elif op is Ops.NEG: ret = -s[0]
    elif op is Ops.MAX: ret = z3.If(s[0] < s[1], s[1], s[0])
    elif op is Ops.SHR and u.src[1].op is Ops.CONST: ret = s[0] / (2 ** u.src[1].arg)  # floor, like an arithmetic shift
    elif op is Ops.AND and u.src[1].op is Ops.CONST and u.src[1].arg >= 0 and (u.src[1].arg + 1) & u.src[1].arg == 0:
      ret = s[0] % (u.src[1].arg + 1)  # a low mask is the non-negative remainder, for negative values too
    elif op in (Ops.IDIV, Ops.MOD):
      a, b = s
      if u.src[1].op is Ops.CONST: q = z3.IntVal(0, self.ctx) if u.src[1].arg == 0 else z3.If(a >= 0, a / abs(u.src[1].arg), -((-a) / abs(u.src[1].arg))) * (1 if u.src[1].arg > 0 else -1)
      else: q = z3.If(b == 0, 0, z3.If(a >= 0, a / z3.If(b > 0, b, -b), -((-a) / z3.If(b > 0, b, -b))) * z3.If(b > 0, 1, -1))
      ret = q if op is Ops.IDIV else z3.If(b == 0, 0, a - b * q)
    if ret is None: raise NotImplementedError(f"no integer model for {op}")
    self.in_range.append(z3.And(dtypes.min(dt) <= ret, ret <= dtypes.max(dt)))
    return ret
  def _ivar(self, name, lo, hi):
    v = z3.Int(name, self.ctx)
    self.constraints += [lo <= v, v <= hi]
    return v
  def value(self, x, dt, m):
    v = m.eval(x, model_completion=True)
    return z3.is_true(v) if dtypes.is_bool(dt) else v.as_long()

# Z3's work budget per check, in its resource units (the slowest proof in the suite takes ~0.6M). A
# count of steps, not seconds: a loaded machine makes proofs slower, never "unknown"
RLIMIT = 20_000_000

def prove(claim_of, *uops: UOp, rlimit: int = RLIMIT, assume=None) -> tuple[str, str]:
  """Prove claim_of(model, *z3 exprs) for every variable value in bounds (and under `assume`, a bool
  UOp, if given). Returns ("proven", "") / ("counterexample", text) / ("unknown", reason).
  The integer model is tried first; the bit-vector model decides whatever it can't prove."""
  try:
    if _check(Z3IntModel(), claim_of, uops, rlimit, assume, ranges=True)[0] == "proven": return "proven", ""
  except NotImplementedError: pass
  return _check(Z3Model(), claim_of, uops, rlimit, assume)

def _check(m: Z3Model, claim_of, uops, rlimit, assume, ranges=False) -> tuple[str, str]:
  exprs = [m(u) for u in uops]
  solver = z3.Solver(ctx=m.ctx)
  solver.set("rlimit", rlimit)
  if assume is not None: solver.add(m(assume))
  solver.add(*m.constraints)
  solver.add(z3.Not(z3.And(claim_of(m, *exprs), *m.in_range)))
  res = solver.check()
  if res == z3.unsat: return "proven", ""
  if res == z3.unknown: return "unknown", solver.reason_unknown()
  model = solver.model()
  vars_ = [u for u in uops[0].toposort if u.op in (Ops.DEFINE_VAR, Ops.RANGE)]
  env = ", ".join(f"{v.render()}={m.value(m.cache[v], v.dtype, model)}" for v in vars_)
  vals = ", ".join(f"{u.render()} = {m.value(e, u.dtype, model)}" for u, e in zip(uops, exprs))
  return "counterexample", f"with {env}: {vals}"

def prove_equal(a: UOp, b: UOp, **kw) -> tuple[str, str]:
  return prove(lambda m, x, y: x == y, a, b, **kw)

def prove_bounds(u: UOp, **kw) -> tuple[str, str]:
  """vmin <= u <= vmax for every value in bounds."""
  if dtypes.is_bool(u.dtype):
    if u.vmin == u.vmax: return prove(lambda m, x: x == z3.BoolVal(bool(u.vmin), m.ctx), u, **kw)
    return "proven", ""
  bits, uns = _bits(u.dtype), dtypes.is_unsigned(u.dtype)
  def claim(m, x):
    if isinstance(m, Z3IntModel): return z3.And(u.vmin <= x, x <= u.vmax)
    lo, hi = z3.BitVecVal(u.vmin, bits, m.ctx), z3.BitVecVal(u.vmax, bits, m.ctx)
    return z3.And(z3.ULE(lo, x), z3.ULE(x, hi)) if uns else z3.And(lo <= x, x <= hi)
  return prove(claim, u, **kw)
