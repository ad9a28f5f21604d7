"""WGSL compute shaders from linear UOps (the WEBGPU backend).

WGSL differs from C in ways that shape this file:
- Storage buffers hold 32-bit words (or 64-bit ones with the wgpu-native int64/f64 extensions):
  there is no 8- or 16-bit element. bool/int8/uint8/int16/uint16/float16/bfloat16 buffers are
  arrays of u32 words, each element packed in its byte/half slot. A store to such a slot is two
  atomics on the word (clear the slot's bits, then set them), so invocations writing neighbouring
  elements of one word can't lose each other's writes; a kernel that only reads the buffer sees
  plain u32 words.
- In registers, 8/16-bit integers live in i32/u32 and are wrapped back into their width after
  every op; bfloat16 lives as its bits in a u32 (the lowering does all its math in float32).
- int64/uint64/float64 exist only where the adapter offers wgpu-native's 'shader-int64' and
  'shader-f64' features, float16 where it offers 'shader-f16'; the renderer refuses the others at
  kernel-build time, naming the dtype. float64 exp2/log2/sin are refused: Vulkan's GLSL.std.450
  defines them for 16/32-bit floats only (lavapipe returns 0).
- Constant expressions are evaluated by the shader compiler, which rejects NaN, inf and integer
  overflow in them: those constants are written as bitcasts of their bits.
- Shift amounts are u32 (codegen/semantics.py has already reduced them below the width, and guarded x/0).
Kernel-argument scalars (DEFINE_VAR) live in one uniform buffer bound after the data buffers."""
from __future__ import annotations
import math, struct
from attograd.dtype import DType, PtrDType, dtypes, truncate
from attograd.helpers import float_to_bf16_bits
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.renderer import Body, Renderer, literal_operand, scalar_args

# the type a value of each dtype has in a shader
COMPUTE: dict[DType, str] = {
  dtypes.bool: "bool", dtypes.int8: "i32", dtypes.uint8: "u32", dtypes.int16: "i32", dtypes.uint16: "u32",
  dtypes.int32: "i32", dtypes.uint32: "u32", dtypes.int64: "i64", dtypes.uint64: "u64",
  dtypes.float16: "f16", dtypes.bfloat16: "u32", dtypes.float32: "f32", dtypes.float64: "f64"}
# dtypes stored packed in u32 words (itemsize < 4)
PACKED = (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.float16, dtypes.bfloat16)
# which adapter feature a dtype needs
FEATURE = {dtypes.int64: "shader-int64", dtypes.uint64: "shader-int64", dtypes.float64: "shader-f64", dtypes.float16: "shader-f16"}
INT_SUFFIX = {"i32": "i", "u32": "u", "i64": "li", "u64": "lu"}
# how WGSL spells each op (codegen/semantics.py has already written out x/0, NaN in max, wide shifts and bool math)
INFIX = {Ops.ADD: "+", Ops.SUB: "-", Ops.MUL: "*", Ops.FDIV: "/", Ops.IDIV: "/", Ops.MOD: "%", Ops.CMPLT: "<",
         Ops.CMPNE: "!=", Ops.CMPEQ: "==", Ops.AND: "&", Ops.OR: "|", Ops.XOR: "^", Ops.SHL: "<<", Ops.SHR: ">>"}
TEMPLATES = {Ops.TRUNC: "trunc({0})", Ops.RECIP: "(1.0 / {0})", Ops.WHERE: "select({2}, {1}, {0})",
             Ops.MULACC: "(({0} * {1}) + {2})", Ops.MAX: "select({1}, {0}, {0} > {1})"}

def to_bits(x: str, dt: DType) -> str:
  """The low 8/16 bits of a packed dtype's value, as u32."""
  if dt == dtypes.bool: return f"select(0u, 1u, {x})"
  if dt == dtypes.float16: return f"f16_to_bits({x})"
  mask = "0xffu" if dt.itemsize == 1 else "0xffffu"
  return f"(bitcast<u32>({x}) & {mask})" if COMPUTE[dt] == "i32" else f"({x} & {mask})"

def from_bits(b: str, dt: DType) -> str:
  """A packed dtype's value from u32 bits (only the low 8/16 bits are read)."""
  if dt == dtypes.bool: return f"(({b} & 0xffu) != 0u)"
  if dt == dtypes.float16: return f"f16_from_bits({b})"
  bits = 8 * dt.itemsize
  if COMPUTE[dt] == "i32": return f"(bitcast<i32>({b} << {32 - bits}u) >> {32 - bits}u)"
  return f"({b} & {hex((1 << bits) - 1)}u)"

def wrap(x: str, dt: DType) -> str:
  """8/16-bit integer math happens in 32 bits: bring the result back into its width."""
  if not dtypes.is_int(dt) or dt.itemsize >= 4: return x
  return from_bits(f"bitcast<u32>({x})" if COMPUTE[dt] == "i32" else x, dt)

# helper functions, included when the body (or another included helper) names them. Functions
# rather than inline bitcasts: the shader compiler's constant folding fails on 16-bit vectors, and
# NaN is tested on the bits because Vulkan lets the driver assume it away (lavapipe folds x != x)
HELPERS: dict[str, str] = {
  "isnan_f32": "fn isnan_f32(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }",
  "isnan_f64": "fn isnan_f64(x: f64) -> bool { return (bitcast<u64>(x) & 0x7ffffffffffffffflu) > 0x7ff0000000000000lu; }",
  "isnan_f16": "fn isnan_f16(x: f16) -> bool { return (f16_to_bits(x) & 0x7fffu) > 0x7c00u; }",
  # f16 <-> bits through f32's pack/unpack, exact for every f16 value (vec2<f16> bitcasts don't validate)
  "f16_from_bits": "fn f16_from_bits(b: u32) -> f16 { return f16(unpack2x16float(b)[0]); }",
  "f16_to_bits": "fn f16_to_bits(x: f16) -> u32 { return pack2x16float(vec2<f32>(f32(x), 0.0)) & 0xffffu; }",
  # x < y from the sign of x - y, corrected where the subtraction overflows (Hacker's Delight 2-12)
  "lt_i64": "fn lt_i64(x: i64, y: i64) -> bool { let d = x - y; return (bitcast<u64>(d ^ ((x ^ y) & (d ^ x))) >> 63u) != 0lu; }",
  # round to nearest even, NaN stays NaN (as helpers.float_to_bf16_bits)
  "f32_to_bf16": "fn f32_to_bf16(f: f32) -> u32 {\n  if (isnan_f32(f)) { return 0x7fc0u; }\n  let u = bitcast<u32>(f);\n"
                 "  return ((u + 0x7fffu + ((u >> 16u) & 1u)) >> 16u) & 0xffffu;\n}",
}

def helpers_for(src: str) -> str:
  used: list[str] = []
  todo = [src]
  while todo:
    text = todo.pop()
    for name, code in HELPERS.items():
      if name not in used and f"{name}(" in text: used.append(name); todo.append(code)
  return "".join(HELPERS[n] + "\n" for n in HELPERS if n in used)

class WGSLRenderer(Renderer):
  device = "WEBGPU"
  # WebGPU's default limits; the device raises them to what its adapter allows
  global_max: tuple[int, ...] | None = (65535, 65535, 65535)
  local_max: tuple[int, ...] = (256, 256, 64)
  workgroup_max = 256
  workgroup_pref = 64
  # float -> int converts to each type directly (saturating there: without shader-int64 there is no int64 to go through)
  native = frozenset({"float_to_int"})

  def __init__(self, features: frozenset[str] | set[str] = frozenset(), loop_limit: int | None = None):
    # loop_limit: back-edges one invocation may take per outermost loop nest (llvmpipe/lavapipe
    # silently ends a loop nest after 65535); kernels that could need more are refused
    self.features, self.loop_limit = frozenset(features), loop_limit

  def check_dtype(self, dt: DType) -> None:
    dt = dt.scalar()
    if dt in FEATURE and FEATURE[dt] not in self.features:
      raise TypeError(f"WEBGPU has no {dt.name}: the adapter doesn't offer the '{FEATURE[dt]}' feature")

  def dt(self, dtype: DType) -> str: return COMPUTE[dtype.scalar()]

  def const(self, value, dtype: DType) -> str:
    dtype = dtype.scalar()
    t = COMPUTE[dtype]
    if dtype == dtypes.bool: return "true" if value else "false"
    if dtype == dtypes.bfloat16: return f"{float_to_bf16_bits(float(value))}u"
    if dtypes.is_float(dtype):
      value = truncate(dtype, value)
      if math.isnan(value) or math.isinf(value):
        # non-finite constants are an error in WGSL constant expressions: bitcast their bits
        if dtype == dtypes.float16: return f"f16_from_bits({struct.unpack('<H', struct.pack('<e', value))[0]}u)"
        fmt, ut = ("<d", "<Q") if dtype == dtypes.float64 else ("<f", "<I")
        return f"bitcast<{t}>({struct.unpack(ut, struct.pack(fmt, value))[0]}{INT_SUFFIX['u64' if t == 'f64' else 'u32']})"
      return f"{value!r}{ {'f32': 'f', 'f64': 'lf', 'f16': 'h'}[t]}"
    value = int(value)
    if t in ("i32", "i64") and value == -2 ** (31 if t == "i32" else 63):  # -MIN doesn't fit: one more than MIN
      return f"({value + 1}{INT_SUFFIX[t]} - 1{INT_SUFFIX[t]})"
    return f"{value}{INT_SUFFIX[t]}"

  def alu(self, op: Ops, dtype: DType, a: list[str], src: tuple[UOp, ...]) -> str:
    sdt = src[0].dtype.scalar() if src else dtype
    t = COMPUTE[dtype.scalar()]
    if sdt == dtypes.float64 and op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
      raise TypeError(f"WEBGPU can't compute {op.name.lower()} in float64 (Vulkan defines it for 16/32-bit floats only)")
    if op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT):
      # lavapipe's exp2 clamps its argument with NaN-dropping min/max: pass NaN through explicitly
      return f"select({op.name.lower()}({a[0]}), {a[0]}, isnan_{COMPUTE[sdt]}({a[0]}))"
    if op is Ops.NEG: return f"(!{a[0]})" if sdt == dtypes.bool else f"(0u - {a[0]})" if t in ("u32", "u64") else f"(-{a[0]})"
    if dtypes.is_float(sdt) and op in GroupOp.Comparison:
      # Vulkan lets the driver assume no NaN (lavapipe folds x != x to false): NaN is tested on the bits
      n0, n1 = f"isnan_{COMPUTE[sdt]}({a[0]})", f"isnan_{COMPUTE[sdt]}({a[1]})"
      if op is Ops.CMPNE: return n0 if src[0] is src[1] else f"({n0} || {n1} || {a[0]} != {a[1]})"
      return f"(!{n0} && !{n1} && {a[0]} {INFIX[op]} {a[1]})"
    if sdt == dtypes.int64 and op in (Ops.MAX, Ops.CMPLT):
      # lavapipe (Mesa 22.3) miscompiles signed 64-bit < against constants: compare by the sign of the difference
      return f"select({a[1]}, {a[0]}, lt_i64({a[1]}, {a[0]}))" if op is Ops.MAX else f"lt_i64({a[0]}, {a[1]})"
    if op in (Ops.SHL, Ops.SHR):  # amounts are u32 (and already below the width)
      return f"({a[0]} {INFIX[op]} {f'{src[1].arg}u' if src[1].op is Ops.CONST else f'u32({a[1]})'})"
    # bool math and bool comparisons arrive as logic (codegen/semantics.py): on bool, ^ is spelled !=
    if op is Ops.XOR and sdt == dtypes.bool: return f"({a[0]} != {a[1]})"
    if op in INFIX: return f"({a[0]} {INFIX[op]} {a[1]})"
    return TEMPLATES[op].format(*a)

  def cast(self, x: str, frm: DType, to: DType) -> str:
    frm, to = frm.scalar(), to.scalar()
    if frm == to: return x
    if frm == dtypes.bfloat16: return self.cast(f"bitcast<f32>({x} << 16u)", dtypes.float32, to)
    if to == dtypes.bfloat16: return f"f32_to_bf16({self.cast(x, frm, dtypes.float32)})"
    if to == dtypes.bool: return f"({x} != {self.const(0, frm)})"
    if frm == dtypes.bool: return f"select({self.const(0, to)}, {self.const(1, to)}, {x})"
    return wrap(f"{COMPUTE[to]}({x})", to)

  def bitcast(self, x: str, frm: DType, to: DType) -> str:
    frm, to = frm.scalar(), to.scalar()
    if frm.itemsize < 4: return from_bits(to_bits(x, frm), to)
    return f"bitcast<{COMPUTE[to]}>({x})"

  def index(self, x: str, dt: DType) -> str:
    """Array indices are i32 or u32 in WGSL. A 64-bit literal is written as an i32 one: naga refuses i32(0li)."""
    if COMPUTE[dt.scalar()] not in ("i64", "u64"): return x
    return f"{x[:-2]}i" if x[-2:] in ("li", "lu") and x[:-2].lstrip("-").isdigit() and abs(int(x[:-2])) < 2**31 else f"i32({x})"

  def render(self, name: str, uops: list[UOp]) -> str:
    for u in uops:
      for d in (u.dtype, u.dtype.base) if isinstance(u.dtype, PtrDType) else (u.dtype,):
        if d != dtypes.void: self.check_dtype(d)
    body = Body(uops)
    params = sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    variables = scalar_args(uops)
    def root(u: UOp) -> UOp:
      while u.op is Ops.AFTER: u = u.src[0]
      return u
    stored = {root(u.src[0].src[0]) for u in uops if u.op is Ops.STORE}
    r: dict[UOp, str] = {}
    self.check_loops(uops)
    local_size = [1, 1, 1]
    shared: list[str] = []
    emit = body.emit
    def var(u: UOp, prefix: str, expr: str) -> None:
      r[u] = body.fresh(prefix)
      emit(f"let {r[u]} = {expr};")
    for u in uops:
      op = u.op
      if op is Ops.PARAM: r[u] = f"data{u.arg}"
      elif op is Ops.DEFINE_VAR: r[u] = f"vars.v{variables.index(u)}"
      elif op is Ops.CONST: r[u] = literal_operand(self.const(u.arg, u.dtype))
      elif op is Ops.SINK or op is Ops.NOOP: pass
      elif op is Ops.SPECIAL:
        # gidx<d>: work-group id, lidx<d>: invocation id within it, in launch dimension d
        r[u] = u.arg
        d = int(u.arg[4:])
        if u.arg.startswith("lidx"): local_size[d] = u.src[0].arg
        emit(f"let {u.arg} = i32({'wid' if u.arg.startswith('gidx') else 'lid'}.{'xyz'[d]});")
      elif op is Ops.DEFINE_LOCAL:
        r[u] = f"temp{u.arg}"
        shared.append(f"var<workgroup> {r[u]}: array<{self.dt(u.dtype.base)}, {u.dtype.size}>;")
      elif op is Ops.BARRIER: emit("workgroupBarrier();")
      elif op is Ops.RANGE:
        r[u] = f"r{u.arg[0]}"
        cond = self.alu(Ops.CMPLT, dtypes.bool, [r[u], r[u.src[0]]], (u, u.src[0]))
        emit(f"for (var {r[u]}: {self.dt(u.dtype)} = {self.const(0, u.dtype)}; {cond}; {r[u]} += {self.const(1, u.dtype)}) {{")
        body.depth += 1
      elif op is Ops.END: body.depth -= 1; emit("}")
      elif op is Ops.DEFINE_REG:
        r[u] = f"acc{u.arg}"; emit(f"var {r[u]}: array<{self.dt(u.dtype.base)}, {u.dtype.size}>;")
      elif op is Ops.AFTER: r[u] = r[u.src[0]]
      elif op is Ops.INDEX: r[u] = self.index(r[u.src[1]], u.src[1].dtype)
      elif op is Ops.LOAD:
        idx = u.src[0]
        expr = self.access(root(idx.src[0]), r[idx.src[0]], r[idx], root(idx.src[0]) in stored)
        if idx.gate is not None:
          # a load behind a false gate must not happen: it could read past the buffer
          r[u] = body.fresh("val")
          emit(f"var {r[u]}: {self.dt(u.dtype)} = {self.const(0, u.dtype)};")
          emit(f"if ({r[idx.gate]}) {{ {r[u]} = {expr}; }}")
        else: var(u, "val", expr)
      elif op is Ops.STORE:
        idx = u.src[0]
        line = self.store(root(idx.src[0]), r[idx.src[0]], r[idx], r[u.src[1]])
        emit(line if idx.gate is None else f"if ({r[idx.gate]}) {{ {line} }}")
      elif op in GroupOp.ALU or op is Ops.CAST or op is Ops.BITCAST:
        if op is Ops.CAST: expr = self.cast(r[u.src[0]], u.src[0].dtype, u.dtype)
        elif op is Ops.BITCAST: expr = self.bitcast(r[u.src[0]], u.src[0].dtype, u.dtype)
        else:
          expr = self.alu(op, u.dtype, [r[s] for s in u.src], u.src)
          if op is not Ops.WHERE: expr = wrap(expr, u.dtype)
        if body.uses.get(u, 0) <= 1 and len(expr) < 80: r[u] = expr
        else: var(u, "alu", expr)
      else: raise NotImplementedError(f"WGSL renderer can't render {op}")
    decls = [self.buffer_decl(p, p in stored) for p in params]
    if variables:
      fields = ", ".join(f"v{i}: {self.dt(v.dtype)}" for i, v in enumerate(variables))
      decls.append(f"struct Vars {{ {fields} }}\n@group(0) @binding({len(params)}) var<uniform> vars: Vars;")
    src = body.text()
    prelude = "enable f16;\n" if "f16" in self.features_used(uops) else ""
    args = "@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>"
    return f"{prelude}{helpers_for(src)}{chr(10).join(decls + shared)}\n" \
           f"@compute @workgroup_size({', '.join(map(str, local_size))})\nfn {name}({args}) {{\n{src}\n}}\n"

  def check_loops(self, uops: list[UOp]) -> None:
    """Refuse a kernel whose loops could run past the driver's per-invocation limit."""
    if self.loop_limit is None: return
    open_loops: list[int] = []  # trip count of each open loop times those around it
    nest = 0
    for u in uops:
      if u.op is Ops.RANGE:
        trips = (open_loops[-1] if open_loops else 1) * max(int(u.src[0].vmax), 0)
        open_loops.append(trips)
        nest += trips
      elif u.op is Ops.END:
        open_loops.pop()
        if not open_loops:
          if nest > self.loop_limit:
            raise RuntimeError(f"WEBGPU kernel needs {nest} loop iterations in one invocation; this driver (llvmpipe) stops "
                               f"a shader's loops after {self.loop_limit}: use an optimization that spreads the loop over threads (GROUP)")
          nest = 0

  def features_used(self, uops: list[UOp]) -> set[str]:
    out = set()
    for u in uops:
      for d in (u.dtype, u.dtype.base) if isinstance(u.dtype, PtrDType) else (u.dtype,):
        if d != dtypes.void and d.scalar() == dtypes.float16: out.add("f16")
    return out

  def buffer_decl(self, p: UOp, stored: bool) -> str:
    base = p.dtype.base
    if base in PACKED: elem = "atomic<u32>" if stored else "u32"
    else: elem = COMPUTE[base]
    access = "read_write" if stored else "read"
    return f"@group(0) @binding({p.arg}) var<storage, {access}> data{p.arg}: array<{elem}>;"

  def access(self, buf: UOp, b: str, i: str, stored: bool) -> str:
    """The value at index i of buffer (or register) b."""
    if buf.op is not Ops.PARAM or buf.dtype.base not in PACKED: return f"{b}[{i}]"
    dt = buf.dtype.base
    per, bits = 4 // dt.itemsize, 8 * dt.itemsize
    word = f"{b}[u32({i}) >> {per.bit_length() - 1}u]"
    if stored: word = f"atomicLoad(&{word})"
    return from_bits(f"({word} >> ((u32({i}) & {per - 1}u) * {bits}u))", dt)

  def store(self, buf: UOp, b: str, i: str, v: str) -> str:
    if buf.op is not Ops.PARAM or buf.dtype.base not in PACKED: return f"{b}[{i}] = {v};"
    dt = buf.dtype.base
    per, bits = 4 // dt.itemsize, 8 * dt.itemsize
    w, s = f"&{b}[u32({i}) >> {per.bit_length() - 1}u]", f"((u32({i}) & {per - 1}u) * {bits}u)"
    # clear the slot, then set its bits: other invocations only touch other slots of the word
    return f"atomicAnd({w}, ~({hex((1 << bits) - 1)}u << {s})); atomicOr({w}, {to_bits(v, dt)} << {s});"
