"""C source from linear UOps (the CPU backend). Subclasses for other C-like languages override
the type names, the function signature and the few ops that are spelled differently."""
from __future__ import annotations
import math, struct
from attograd.dtype import DType, PtrDType, dtypes
from attograd.uop.ops import AxisKind, UOp, Ops, GroupOp
from attograd.renderer import Body, Renderer, literal_operand, scalar_args

def _float_literal(x: float, suffix: str) -> str:
  if math.isnan(x): return "NAN"
  if math.isinf(x): return "INFINITY" if x > 0 else "-INFINITY"
  return f"{x!r}{suffix}" if "e" in repr(x) or "." in repr(x) else f"{x!r}.0{suffix}"

def float_to_int(decl: str, real: str, unsigned: str, signed: str) -> str:
  """A float -> integer conversion defined for every input (C leaves out-of-range ones undefined): truncate,
  then wrap mod 2**64 (the caller narrows further); NaN and inf give 0. Shared by the C-like renderers."""
  f = "f" if real == "float" else ""  # a float version for targets without double
  return f"{decl}({real} x) {{\n  if (x > -9.2e18{f} && x < 9.2e18{f}) return ({unsigned})({signed})x;\n" \
         f"  if (x - x != 0) return 0; x = fmod(x, 18446744073709551616.0{f});\n  return x < 0 ? -({unsigned})(-x) : ({unsigned})x; }}\n"

def arg_names(variables: list[UOp]) -> dict[UOp, str]:
  """The C names of a kernel's scalar arguments. A user's Variable gets a prefix that no name the renderers make up has
  (a Variable named data0, alu0 or core_id clashed with one), or var<i> when its name isn't made of identifier
  characters or two of the kernel's Variables share it; the THREAD opt's slice is core_id."""
  names = [v.arg[0] for v in variables if v.op is Ops.DEFINE_VAR]
  def name(i: int, v: UOp) -> str:
    if v.op is Ops.CORE_ID: return "core_id"
    plain = v.arg[0].isascii() and v.arg[0].replace("_", "a").isalnum() and names.count(v.arg[0]) == 1
    return f"var_{v.arg[0]}" if plain else f"var{i}"
  return {v: name(i, v) for i, v in enumerate(variables)}

WRAPPING = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.NEG, Ops.SHL}
# how C spells each op (codegen/semantics.py has already written out what C doesn't define: x/0, NaN in max, shifts
# by the width or more)
INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
         Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}
MATH = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}
TEMPLATES = {Ops.RECIP: "(1/{0})", Ops.MAX: "(({0}>{1})?{0}:{1})", Ops.WHERE: "({0}?{1}:{2})", Ops.MULACC: "(({0}*{1})+{2})"}

# libm's exp2f is a call per element (without fast-math the compiler won't use a vector version),
# so float32 exp2 is this branch-free function the loop vectorizer can inline: 2**x = 2**n * 2**f
# with n = round(x), f in [-0.5, 0.5], 2**f by its Taylor polynomial of degree 7 (error < 1e-8,
# so results are within 1-2 ulp). 2**n is two exact power-of-two factors so that results in the
# subnormal range round once; x is clamped to [-151, 128] first, which gives 0 and inf beyond, and
# NaN (which the clamp would hide) is passed through at the end.
EXP2_F32 = """static inline float exp2_f32(float x) {
  float c = x != x ? 0.0f : x < -151.0f ? -151.0f : x > 128.0f ? 128.0f : x;
  float n = (c + 12582912.0f) - 12582912.0f, f = c - n;
  float p = fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(fmaf(1.5252733804059841e-05f, f, 1.5403530393381609e-04f), f, 1.3333558146428443e-03f), f,
    9.6181291076284772e-03f), f, 5.5504108664821580e-02f), f, 2.4022650695910071e-01f), f, 6.9314718055994531e-01f), f, 1.0f);
  int ni = (int)n, n1 = ni >> 1, n2 = ni - n1;
  union { unsigned int u; float f; } s1 = { .u = (unsigned int)(n1 + 127) << 23 }, s2 = { .u = (unsigned int)(n2 + 127) << 23 };
  float r = (p * s1.f) * s2.f;
  return x != x ? x : r;
}
"""

# float16 as its bits (unsigned short), for a C compiler without _Float16 (clang before 15 on x86-64): conversions with
# IEEE round-to-nearest-even, double -> half in one rounding (through float would round twice: 1+2**-11+2**-40 -> 1.0).
# half -> float rebiases the exponent by a multiply by 2**112, exact for subnormals too; float -> half rounds a subnormal
# result by adding it to 0.5 (float's ulp there is half's subnormal step, 2**-24) and a normal one by adding a rounding bias
# below the 10 kept mantissa bits (a carry moves into the exponent, as rounding up should). half -> float is exact, so
# where the target has F16C (-march=native on any x86-64 of the last decade) its instruction gives the same float in one
# step: a quantized matmul converts a float16 scale per block, and the bit version cost it about half its time
F16_BITS = """static inline float f16_to_f32(unsigned short h) {
#ifdef __F16C__
  typedef short f16_v8hi __attribute__((vector_size(16)));
  return __builtin_ia32_vcvtph2ps((f16_v8hi){(short)h})[0];
#else
  union { unsigned int u; float f; } v = { .u = (unsigned int)(h & 0x7fff) << 13 };
  v.f *= 0x1p112f;
  if ((h & 0x7fff) >= 0x7c00) v.u |= 0x7f800000u;
  v.u |= (unsigned int)(h & 0x8000) << 16;
  return v.f;
#endif
}
static inline unsigned short f32_to_f16(float f) {
  union { float f; unsigned int u; } v = { .f = f };
  unsigned int sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00);
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00);
  if (a < 0x38800000u) { v.u = a; v.f += 0.5f; return (unsigned short)(sign | (v.u - 0x3f000000u)); }
  return (unsigned short)(sign | ((a + 0xc8000fffu + ((a >> 13) & 1)) >> 13));
}
static inline unsigned short f64_to_f16(double d) {
  union { double d; unsigned long long u; } v = { .d = d };
  unsigned int sign = (unsigned int)(v.u >> 48) & 0x8000;
  unsigned long long a = v.u & 0x7fffffffffffffffull;
  if (a > 0x7ff0000000000000ull) return (unsigned short)(sign | 0x7e00);
  if (a >= 0x40effe0000000000ull) return (unsigned short)(sign | 0x7c00);
  if (a < 0x3f10000000000000ull) { v.u = a; v.d += 268435456.0; return (unsigned short)(sign | (unsigned int)(v.u - 0x41b0000000000000ull)); }
  return (unsigned short)(sign | (unsigned int)((a + 0xc100000000000000ull + 0x1ffffffffffull + ((a >> 42) & 1)) >> 42));
}
"""

# gcc 12.2's loop vectorizer miscompiles a loop whose trip count is a variable around copies written out (an upcast):
# a masked softmax over a KV cache's symbolic length, 8 queries a thread, summed 0.7 where 1.0 was right (the same
# loop with a constant count, gcc -O1 and clang were right). A kernel with such a loop gets gcc's loop vectorizer off.
# Only a count that reads a Variable: a loop bounded by an outer loop's counter (flash attention's causal keys, i + 1)
# has no copies written out around it, and its inner loops (the head dimension) need the vectorizer
GCC_SYMBOLIC_LOOPS = '#if defined(__GNUC__) && !defined(__clang__)\n__attribute__((optimize("no-tree-loop-vectorize")))\n#endif\n'

def _addends(x: UOp) -> list[UOp]:
  """The terms of a sum of ADDs, in order."""
  return [t for s in x.src for t in _addends(s)] if x.op is Ops.ADD else [x]

class CStyleRenderer(Renderer):
  device = "CPU"
  has_threads = True
  native = frozenset({"bool_math", "bool_compare", "float_to_int"})  # bool math in int, converted back; f2int
  types: dict[DType, str] = {
    dtypes.bool: "_Bool", dtypes.int8: "signed char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
    dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long long",
    dtypes.uint64: "unsigned long long", dtypes.float16: "_Float16", dtypes.bfloat16: "unsigned short",
    dtypes.float32: "float", dtypes.float64: "double"}
  # the few libm functions and macros kernels use, declared here: parsing <math.h> costs more than compiling a small kernel
  prelude = "#define NAN __builtin_nanf(\"\")\n#define INFINITY __builtin_inff()\n" \
    "float exp2f(float); double exp2(double); float log2f(float); double log2(double); float sinf(float); double sin(double);\n" \
    "float sqrtf(float); double sqrt(double); float truncf(float); double trunc(double); float fmaf(float, float, float);\n" \
    "double fma(double, double, double); double fmod(double, double);\n" \
    "static inline float bf16_to_f32(unsigned short x) { union { unsigned int u; float f; } v; v.u = (unsigned int)x << 16; return v.f; }\n" \
    "static inline unsigned short f32_to_bf16(float f) { union { unsigned int u; float f; } v; v.f = f;\n" \
    "  if (f != f) return 0x7fc0; return (unsigned short)((v.u + 0x7fff + ((v.u >> 16) & 1)) >> 16); }\n"
  prelude += float_to_int("static inline unsigned long long f2int", "double", "unsigned long long", "long long") + EXP2_F32
  func_prefix = ""
  f16_bits = False  # float16 stored as its bits, converted by F16_BITS's functions (the compiler has no _Float16)
  def __init__(self, spare_bytes: tuple[int, int] = (0, 0), simd_floats: int = 8, f16_bits: bool = False):
    self.spare_bytes, self.simd_floats = spare_bytes, simd_floats
    if f16_bits: self.f16_bits, self.prelude = True, type(self).prelude + F16_BITS  # a setting: in the program cache's key

  def dt(self, dtype: DType) -> str:
    if isinstance(dtype, PtrDType): return self.dt(dtype.base) + "*"
    return "unsigned short" if self.f16_bits and dtype.scalar() == dtypes.float16 else self.types[dtype.scalar()]

  def const(self, value, dtype: DType) -> str:
    if dtype == dtypes.float16 and self.f16_bits: return f"((unsigned short){struct.unpack('<H', struct.pack('<e', value))[0]})"
    if dtypes.is_float(dtype):
      lit = _float_literal(float(value), "f" if dtype in (dtypes.float32, dtypes.float16, dtypes.bfloat16) else "")
      if dtype == dtypes.bfloat16: return f"f32_to_bf16({lit})"
      return f"(({self.dt(dtype)}){lit})" if dtype == dtypes.float16 else lit
    if dtypes.is_bool(dtype): return "1" if value else "0"
    if dtype == dtypes.uint64: return f"{value}ull"
    if dtype == dtypes.int64: return f"{value}ll" if value != dtypes.min(dtypes.int64) else "(-9223372036854775807ll-1)"
    if dtype == dtypes.int32 and value == dtypes.min(dtypes.int32): return "(-2147483647-1)"
    if dtype == dtypes.uint32: return f"{value}u"
    return str(value)

  def math_fn(self, name: str, dtype: DType) -> str: return name + ("f" if dtype != dtypes.float64 else "")

  def alu(self, op: Ops, dtype: DType, a: list[str], src: tuple[UOp, ...]) -> str:
    if op in INFIX: return f"({a[0]}{INFIX[op]}{a[1]})"
    if op in MATH:
      if op is Ops.EXP2 and dtype == dtypes.float32 and EXP2_F32 in self.prelude: return f"exp2_f32({a[0]})"
      return f"{self.math_fn(MATH[op], dtype)}({a[0]})"
    if op is Ops.NEG: return f"(!{a[0]})" if dtypes.is_bool(dtype) else f"(-{a[0]})"
    if op is Ops.MULACC and dtypes.is_float(dtype): return f"{self.math_fn('fma', dtype)}({a[0]},{a[1]},{a[2]})"
    return TEMPLATES[op].format(*a)

  def cast(self, x: str, frm: DType, to: DType) -> str:
    if frm == dtypes.bfloat16: return self.cast(f"bf16_to_f32({x})", dtypes.float32, to)
    if to == dtypes.bfloat16: return f"f32_to_bf16({self.cast(x, frm, dtypes.float32)})"
    if self.f16_bits and frm == dtypes.float16: return self.cast(f"f16_to_f32({x})", dtypes.float32, to)
    if self.f16_bits and to == dtypes.float16:
      return f"f64_to_f16({x})" if frm == dtypes.float64 else f"f32_to_f16({self.cast(x, frm, dtypes.float32)})"
    if dtypes.is_bool(to): return f"({x}!=0)"
    if dtypes.is_float(frm) and dtypes.is_int(to): return f"(({self.dt(to)})f2int({x}))"
    return f"(({self.dt(to)})({x}))"

  def bitcast(self, x: str, frm: DType, to: DType) -> str:
    return f"((union {{ {self.dt(frm)} a; {self.dt(to)} b; }}){{.a={x}}}).b"

  def load(self, ptr: str, dtype: DType) -> str: return f"(*{ptr})"
  def store(self, ptr: str, value: str, dtype: DType) -> str: return f"*{ptr} = {value};"
  # GPU-style languages: how thread ids, work-group memory and barriers are spelled
  def special(self, name: str) -> str: raise NotImplementedError(f"{type(self).__name__} has no thread ids")
  local_decl, barrier = "", ""

  def prelude_for(self, uops: list[UOp]) -> str:
    """What this kernel's source starts with: the helpers it may call."""
    return self.prelude

  def signature(self, name: str, params: list[UOp], variables: dict[UOp, str], uops: list[UOp]) -> str:
    """The function's head: its buffers, then its scalar arguments (by their C names)."""
    args = [f"{self.dt(p.dtype)} restrict data{p.arg}" for p in params] + [f"const {self.dt(v.dtype)} {n}" for v, n in variables.items()]
    return GCC_SYMBOLIC_LOOPS * any(u.op is Ops.RANGE and any(x.op is Ops.DEFINE_VAR for x in u.src[0].toposort) for u in uops) + \
      f"{self.func_prefix}void {name}({', '.join(args)})"

  def slice_entry(self, name: str, params: list[UOp], variables: list[UOp]) -> str:
    """Every CPU kernel's second entry point, of one C type for all: the thread pool (runtime/threadpool.py) calls it once
    per slice of a threaded kernel with the buffers and variables in arrays and the slice as the core id, and a replay's
    native run loop calls any kernel through it (a kernel that isn't threaded has no core id: its slice is all of it)."""
    args = [f"({self.dt(p.dtype)})bufs[{i}]" for i, p in enumerate(params)] + \
           ["core" if v.op is Ops.CORE_ID else f"vals[{i}]" for i, v in enumerate(variables)]
    return f"void {name}_slice(void *const *bufs, const long long *vals, long long core) {{ {name}({', '.join(args)}); }}\n"

  @staticmethod
  def offset(idx: UOp, r: dict[UOp, str]) -> str:
    """An index inside a simd loop as (the part the loop doesn't move)+(the part it does): gcc's loop vectorizer
    sees pointer + a masked (gated) read's offset as affine only when the loop's part isn't summed in int with the
    rest (that sum could wrap on the lanes the mask turns off), and otherwise reads it with a gather."""
    # (x.ranges, kept on each node, not x.toposort: a copy of everything under x for each term of each index was half the render)
    def moves(x: UOp) -> bool: return any(y.arg[1] is AxisKind.SIMD for y in x.ranges)
    parts = _addends(idx)
    if not any(moves(t) for t in parts) or all(moves(t) for t in parts): return r[idx]
    still, moving = [r[t] for t in parts if not moves(t)], [r[t] for t in parts if moves(t)]
    return f"({'+'.join(still)})+({'+'.join(moving)})"

  def render(self, name: str, uops: list[UOp]) -> str:
    body = Body(uops)
    # the loop depth each value is computed at, and the deepest one it is used at: a value is written inline only into a
    # use in its own loop. Inlined into an inner loop, a loop-invariant (a row's max, tested for inf, in logsumexp) became
    # control flow inside it, and gcc left the loop scalar (logsumexp of (4096, 1024): 9.1 -> 2.8 ms)
    level, deepest, d = {}, {}, 1
    for u in uops:
      if u.op is Ops.END: d -= 1
      level[u] = d
      for s in u.src: deepest[s] = max(deepest.get(s, 0), d)
      if u.op is Ops.RANGE: d += 1
    select_arms = {s for u in uops if u.op is Ops.WHERE for s in u.src[1:] if s.op is Ops.WHERE}
    r: dict[UOp, str] = {}
    emit = body.emit
    def var(u: UOp, prefix: str, expr: str) -> None:
      r[u] = body.fresh(prefix)
      emit(f"{self.dt(u.dtype)} {r[u]} = {expr};")
    params = sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    variables = scalar_args(uops)
    names = arg_names(variables)
    for u in uops:
      op = u.op
      if op is Ops.PARAM: r[u] = f"data{u.arg}"
      elif op is Ops.DEFINE_VAR or op is Ops.CORE_ID: r[u] = names[u]
      elif op is Ops.CONST: r[u] = literal_operand(self.const(u.arg, u.dtype))
      elif op is Ops.SINK or op is Ops.NOOP: pass
      elif op is Ops.RANGE:
        r[u] = f"r{u.arg[0]}"
        # a lane or simd loop is a SIMD register's worth of accumulators: unrolled first, it would no longer vectorize
        if u.arg[1] in (AxisKind.LANE, AxisKind.SIMD, AxisKind.FOLD): body.lines.append("#pragma GCC unroll 1")
        emit(f"for ({self.dt(u.dtype)} {r[u]} = 0; {r[u]} < {r[u.src[0]]}; {r[u]}++) {{"); body.depth += 1
      elif op is Ops.END: body.depth -= 1; emit("}")
      elif op is Ops.DEFINE_REG:
        r[u] = f"acc{u.arg}"; emit(f"{self.dt(u.dtype.base)} {r[u]}[{u.dtype.size}];")
      elif op is Ops.AFTER: r[u] = r[u.src[0]]
      elif op is Ops.SPECIAL: r[u] = u.arg; emit(f"int {u.arg} = {self.special(u.arg)};")
      elif op is Ops.DEFINE_LOCAL:
        r[u] = f"temp{u.arg}"; emit(f"{self.local_decl}{self.dt(u.dtype.base)} {r[u]}[{u.dtype.size}];")
      elif op is Ops.BARRIER: emit(self.barrier)
      elif op is Ops.INDEX: r[u] = f"({r[u.src[0]]}+{self.offset(u.src[1], r)})"
      elif op is Ops.LOAD:
        idx = u.src[0]
        expr = self.load(r[idx], u.dtype)
        if idx.gate is not None: expr = f"({r[idx.gate]}?{expr}:{self.const(0, u.dtype)})"
        var(u, "val", expr)
      elif op is Ops.STORE:
        idx = u.src[0]
        line = self.store(r[idx], r[u.src[1]], u.src[1].dtype)
        emit(line if idx.gate is None else f"if ({r[idx.gate]}) {line}")
      elif op in GroupOp.ALU or op is Ops.CAST or op is Ops.BITCAST:
        if op is Ops.CAST: expr = self.cast(r[u.src[0]], u.src[0].dtype, u.dtype)
        elif op is Ops.BITCAST: expr = self.bitcast(r[u.src[0]], u.src[0].dtype, u.dtype)
        elif op in WRAPPING and dtypes.is_int(u.dtype) and not dtypes.is_unsigned(u.dtype) and u.dtype.itemsize >= 4 and not u.exact:
          # signed overflow is undefined in C: math that bounds can't prove safe wraps through unsigned
          unsigned = self.dt({4: dtypes.uint32, 8: dtypes.uint64}[u.dtype.itemsize])
          expr = f"(({self.dt(u.dtype)})" + self.alu(op, u.dtype, [f"({unsigned})({r[s]})" for s in u.src], u.src) + ")"
        else: expr = self.alu(op, u.dtype, [r[s] for s in u.src], u.src)
        # C computes 8- and 16-bit integer math in int: wrap the result back into its type
        if dtypes.is_int(u.dtype) and u.dtype.itemsize < 4 and op is not Ops.WHERE: expr = f"(({self.dt(u.dtype)}){expr})"
        # single-use pure values are written inline; the rest get a name. A select is not written into another's arm:
        # computed there only on its path, it is control flow (gcc branches per element), where named it is computed
        # unconditionally and both become blend or max instructions (NaN-propagating max: its two selects)
        if body.uses.get(u, 0) <= 1 and deepest.get(u, 0) <= level[u] and len(expr) < 80 and u not in select_arms: r[u] = expr
        else: var(u, "alu", expr)
      else: raise NotImplementedError(f"C renderer can't render {op}")
    src = f"{self.prelude_for(uops)}{self.signature(name, params, names, uops)} {{\n{body.text()}\n}}\n"
    if self.has_threads: src += self.slice_entry(name, params, variables)
    return src
