"""PTX (NVIDIA's virtual ISA) from linear UOps, for ptxas to assemble into a cubin (sm_80 and newer).

Registers are mutable, so loops are a counter and two branches. Every CONST is moved into a register
before the first loop (an empty loop must not leave a constant unset for the code after it). 8-bit
integers live in 16-bit registers (PTX has no 8-bit registers), re-narrowed after math that can carry
out of 8 bits; float16 and bfloat16 live in .b16 registers as bits (lowering did their math in
float32). Global and local axes arrive as thread ids (SPECIAL: gidx<d> is %ctaid, lidx<d> is %tid);
work-group memory is .shared and a BARRIER is bar.sync."""
from __future__ import annotations
import re, struct
from attograd.dtype import DType, PtrDType, dtypes
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.uop.patterns import UPat, PatternMatcher
from attograd.uop.mathlib import float64_math
from attograd.renderer import Renderer, scalar_args

# the register type each dtype lives in, and the type that names it in memory instructions
REG = {dtypes.bool: "pred", dtypes.int8: "s16", dtypes.uint8: "u16", dtypes.int16: "s16", dtypes.uint16: "u16",
       dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
       dtypes.float16: "b16", dtypes.bfloat16: "b16", dtypes.float32: "f32", dtypes.float64: "f64"}
MEM = {dtypes.bool: "u8", dtypes.int8: "s8", dtypes.uint8: "u8", dtypes.int16: "s16", dtypes.uint16: "u16",
       dtypes.int32: "s32", dtypes.uint32: "u32", dtypes.int64: "s64", dtypes.uint64: "u64",
       dtypes.float16: "b16", dtypes.bfloat16: "b16", dtypes.float32: "f32", dtypes.float64: "f64"}
NARROW = (dtypes.int8, dtypes.uint8)
INT_INST = {Ops.AND: "and", Ops.OR: "or", Ops.XOR: "xor"}  # bitwise: on .pred, .b16, .b32 or .b64

def bits(dt: DType) -> int: return 8 * dt.itemsize
def is_float(dt: DType) -> bool: return dt in (dtypes.float32, dtypes.float64)

def imm(value, dt: DType) -> str:
  """An immediate operand of the register type of dt."""
  if dt == dtypes.float32: return "0f" + struct.pack(">f", float(value)).hex().upper()
  if dt == dtypes.float64: return "0d" + struct.pack(">d", float(value)).hex().upper()
  if dt == dtypes.float16: return "0x" + struct.pack(">e", float(value)).hex().upper()
  if dt == dtypes.bfloat16:
    from attograd.helpers import float_to_bf16_bits
    return hex(float_to_bf16_bits(float(value)))
  if dt == dtypes.bool: return "1" if value else "0"
  return str(int(value))

# float64 exp2/log2/sin are series (PTX has no instructions for them); float32 sin too, in float64: sin.approx
# is only accurate within about 100*pi. ex2.approx and lg2.approx are within 2 ulp everywhere
ptx_math = PatternMatcher(float64_math.rules + [
  (UPat(Ops.SIN, dtype=dtypes.float32, src=(UPat.var("x"),)), lambda x: x.cast(dtypes.float64).alu(Ops.SIN).cast(dtypes.float32)),
])

def _cast_steps(frm: DType, to: DType) -> list[DType]:
  """The dtypes a PTX cast from frm to to goes through, both ends included: each step is one conversion instruction."""
  if frm == to: return [frm]
  f32 = dtypes.float32
  half = (dtypes.float16, dtypes.bfloat16)
  # bool to and from the half floats, bfloat16 to anything, anything to bfloat16 and float16 to an integer: by float32
  if f32 not in (frm, to) and ((frm == dtypes.bool and to in half) or (to == dtypes.bool and frm in half) or frm == dtypes.bfloat16
                               or to == dtypes.bfloat16 or (frm == dtypes.float16 and dtypes.is_int(to))):
    return _cast_steps(frm, f32) + _cast_steps(f32, to)[1:]
  if to == dtypes.float16 and not is_float(frm) and frm != dtypes.bool:
    # an integer becomes a float first, exactly where it can (a double for 32 bits), as the reference
    via = dtypes.float64 if bits(frm) >= 32 else f32
    return [frm, via, to]
  return [frm, to]

class PTXRenderer(Renderer):
  device = "CUDA"
  rewrites = ptx_math
  global_max, local_max, workgroup_max, workgroup_pref = (2**31 - 1, 65535, 65535), (1024, 1024, 64), 1024, 128
  def __init__(self, arch: str = "sm_80", version: str = "7.8"):  # 7.8: the first with sm_90 (CUDA 11.8)
    if not ((m := re.fullmatch(r"sm_(\d+)[af]?", arch)) and int(m.group(1)) >= 80):
      raise ValueError(f"the PTX renderer targets sm_80 and newer (it converts bfloat16 in hardware), got {arch!r}")
    self.arch, self.version = arch, version

  def header(self) -> str: return f".version {self.version}\n.target {self.arch}\n.address_size 64\n"
  def render(self, name: str, uops: list[UOp]) -> str: return self.header() + self.render_entry(name, uops)

  def render_entry(self, name: str, uops: list[UOp]) -> str:
    regs: dict[str, int] = {}
    r: dict[UOp, str] = {}
    space: dict[UOp, str] = {}  # pointer values: "global" or "local"
    prologue: list[str] = []
    lines: list[str] = []
    def reg(kind: str) -> str:
      regs[kind] = regs.get(kind, 0) + 1
      return f"%{kind}_{regs[kind]}"
    def emit(line: str) -> None: lines.append("  " + line)
    def new(dt: DType) -> str: return reg(REG[dt.scalar()])

    def narrow(x: str, dt: DType) -> str:
      """An 8-bit value in its 16-bit register, wrapped back into 8 bits."""
      if dt not in NARROW: return x
      out = new(dt)
      emit(f"cvt.s16.s8 {out}, {x};" if dt == dtypes.int8 else f"and.b16 {out}, {x}, 255;")
      return out

    # a cast is a chain of steps (_cast_steps); step doesn't call itself: a nested function that does is a reference
    # cycle, and with it everything render made would wait for the cycle collector, which lowering pauses
    def cast(x: str, frm: DType, to: DType) -> str:
      steps = _cast_steps(frm, to)
      for a, b in zip(steps, steps[1:]): x = step(x, a, b)
      return x

    def step(x: str, frm: DType, to: DType) -> str:
      """One conversion of _cast_steps."""
      out = new(to)
      if frm == dtypes.bool: emit(f"selp.{REG[to]} {out}, {imm(1, to)}, {imm(0, to)}, {x};"); return out
      if to == dtypes.bool: emit(f"setp.{'neu' if is_float(frm) else 'ne'}.{REG[frm]} {out}, {x}, {imm(0, frm)};"); return out
      if frm == dtypes.bfloat16: emit(f"mov.b32 {out}, {{0, {x}}};"); return out  # its bits are the top half of a float32
      if to == dtypes.bfloat16: emit(f"cvt.rn.bf16.f32 {out}, {x};"); return out  # round to nearest even, as the other backends
      if frm == dtypes.float16: emit(f"cvt.{REG[to]}.f16 {out}, {x};"); return out
      if to == dtypes.float16: emit(f"cvt.rn.f16.{REG[frm]} {out}, {x};"); return out
      if is_float(frm) and is_float(to):
        emit(f"cvt{'.rn' if bits(to) < bits(frm) else ''}.{REG[to]}.{REG[frm]} {out}, {x};"); return out
      if is_float(to):
        emit(f"cvt.rn.{REG[to]}.{REG[frm]} {out}, {x};"); return out
      if is_float(frm):  # only to int64 arrives (codegen/semantics.py): cvt saturates and makes NaN 0
        emit(f"cvt.rzi.s64.{REG[frm]} {out}, {x};"); return out
      # integer to integer: cvt truncates or extends by the source's signedness
      if REG[frm] == REG[to] and frm not in NARROW and to not in NARROW: return x
      emit(f"cvt.{REG[to]}.{REG[frm]} {out}, {x};")
      return narrow(out, to)

    def alu(u: UOp) -> str:
      op, dt, s = u.op, u.dtype, u.src
      a = [r[x] for x in s]
      sd = s[-1].dtype if op is not Ops.WHERE else dt  # operand dtype
      t = REG[sd.scalar()]
      out = new(dt)
      fl = is_float(sd)
      if op is Ops.WHERE:
        if dt == dtypes.bool:
          t1, t2 = reg("pred"), reg("pred")
          emit(f"and.pred {t1}, {a[0]}, {a[1]};"); emit(f"not.pred {t2}, {a[0]};"); emit(f"and.pred {t2}, {t2}, {a[2]};")
          emit(f"or.pred {out}, {t1}, {t2};")
        else: emit(f"selp.{t} {out}, {a[1]}, {a[2]}, {a[0]};")
        return out
      if dt == dtypes.bool and op not in GroupOp.Comparison:  # logic (bool math arrives as logic: codegen/semantics.py)
        if op is Ops.NEG: emit(f"not.pred {out}, {a[0]};")
        else: emit(f"{INT_INST[op]}.pred {out}, {a[0]}, {a[1]};")
        return out
      if op in GroupOp.Comparison:
        cmp = {Ops.CMPLT: "lt", Ops.CMPNE: "neu" if fl else "ne", Ops.CMPEQ: "eq"}[op]
        emit(f"setp.{cmp}.{t} {out}, {a[0]}, {a[1]};"); return out
      if op is Ops.MAX: emit(f"max.{t} {out}, {a[0]}, {a[1]};"); return out  # integers: a float MAX arrives written out
      if op is Ops.MULACC:
        if fl: emit(f"fma.rn.{t} {out}, {a[0]}, {a[1]}, {a[2]};")
        else: emit(f"mad.lo.{t} {out}, {a[0]}, {a[1]}, {a[2]};")
        return narrow(out, dt)
      if op is Ops.NEG:
        # neg has only signed types: an unsigned value negates as the signed one of its size (the same bits)
        emit(f"neg.{'s' + t[1:] if t[0] == 'u' else t} {out}, {a[0]};"); return narrow(out, dt)
      if op is Ops.RECIP: emit(f"rcp.rn.{t} {out}, {a[0]};"); return out
      if op is Ops.SQRT: emit(f"sqrt.rn.{t} {out}, {a[0]};"); return out
      if op is Ops.TRUNC: emit(f"cvt.rzi.{t}.{t} {out}, {a[0]};"); return out
      if op in (Ops.EXP2, Ops.LOG2):  # float32 only: the rest was rewritten into series (ptx_math)
        emit(f"{'ex2' if op is Ops.EXP2 else 'lg2'}.approx.{t} {out}, {a[0]};"); return out
      if op in (Ops.SHL, Ops.SHR):  # the amount is a u32 (and already below the width)
        if REG[s[1].dtype] != "u32": emit(f"cvt.u32.{REG[s[1].dtype]} {(amt := reg('u32'))}, {a[1]};"); a[1] = amt
        emit(f"{'shl.b' + t[1:] if op is Ops.SHL else f'shr.{t}'} {out}, {a[0]}, {a[1]};"); return narrow(out, dt)
      if fl:
        # .rn keeps ptxas from fusing a*b+c: the same rounding as the other backends
        emit(f"{({Ops.ADD: 'add.rn', Ops.SUB: 'sub.rn', Ops.MUL: 'mul.rn', Ops.FDIV: 'div.rn'})[op]}.{t} {out}, {a[0]}, {a[1]};")
        return out
      inst = {Ops.ADD: f"add.{t}", Ops.SUB: f"sub.{t}", Ops.MUL: f"mul.lo.{t}", Ops.IDIV: f"div.{t}", Ops.MOD: f"rem.{t}"}.get(op) \
        or f"{INT_INST[op]}.b{t[1:]}"
      emit(f"{inst} {out}, {a[0]}, {a[1]};")
      return narrow(out, dt)

    def address(idx: UOp) -> str:
      """The byte address an INDEX names."""
      buf, i = idx.src[0], idx.src[1]
      size = idx.dtype.base.itemsize if isinstance(idx.dtype, PtrDType) else idx.dtype.itemsize
      off, addr = reg("s64"), reg("u64")
      if i.dtype.itemsize == 8: emit(f"mul.lo.s64 {off}, {r[i]}, {size};")
      else: emit(f"mul.wide.{REG[i.dtype]} {off}, {r[i]}, {size};")
      emit(f"add.s64 {addr}, {r[buf]}, {off};")
      return addr

    params = sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    variables = scalar_args(uops)
    decls = [f".param .u64 {name}_data{p.arg}" for p in params] + [f".param .{REG[v.dtype]} {name}_var{i}" for i, v in enumerate(variables)]
    for p in params:
      raw = reg("u64")
      prologue.append(f"  ld.param.u64 {raw}, [{name}_data{p.arg}];")
      r[p] = reg("u64")
      prologue.append(f"  cvta.to.global.u64 {r[p]}, {raw};")
      space[p] = "global"
    for i, v in enumerate(variables):
      r[v] = new(v.dtype)
      prologue.append(f"  ld.param.{REG[v.dtype]} {r[v]}, [{name}_var{i}];")
    locals_: list[str] = []
    for u in uops:
      if u.op is Ops.CONST:
        r[u] = new(u.dtype)
        prologue.append(f"  mov.{'pred' if u.dtype == dtypes.bool else REG[u.dtype]} {r[u]}, {imm(u.arg, u.dtype)};")
    for u in uops:
      op = u.op
      if op in (Ops.PARAM, Ops.DEFINE_VAR, Ops.CONST, Ops.SINK, Ops.NOOP): continue
      if op is Ops.DEFINE_REG:
        base = u.dtype.base
        locals_.append(f"  .local .align {max(base.itemsize, 4)} .b8 {name}_acc{u.arg}[{u.dtype.size * base.itemsize}];")
        r[u] = reg("u64"); space[u] = "local"
        prologue.append(f"  mov.u64 {r[u]}, {name}_acc{u.arg};")
      elif op is Ops.DEFINE_LOCAL:
        base = u.dtype.base
        locals_.append(f"  .shared .align {max(base.itemsize, 4)} .b8 {name}_temp{u.arg}[{u.dtype.size * base.itemsize}];")
        r[u] = reg("u64"); space[u] = "shared"
        prologue.append(f"  mov.u64 {r[u]}, {name}_temp{u.arg};")
      elif op is Ops.SPECIAL:
        r[u] = new(u.dtype)
        emit(f"mov.u32 {r[u]}, %{'ctaid' if u.arg.startswith('gidx') else 'tid'}.{'xyz'[int(u.arg[-1])]};")
      elif op is Ops.BARRIER: emit("bar.sync 0;")
      elif op is Ops.AFTER: r[u], space[u] = r[u.src[0]], space[u.src[0]]
      elif op is Ops.INDEX: r[u], space[u] = address(u), space[u.src[0]]
      elif op is Ops.LOAD:
        idx = u.src[0]
        dt = u.dtype
        dst = new(dt) if dt != dtypes.bool else reg("u16")
        gate = "" if idx.gate is None else f"@{r[idx.gate]} "
        if gate: emit(f"mov.{REG[dt] if dt != dtypes.bool else 'u16'} {dst}, {imm(0, dt)};")
        emit(f"{gate}ld.{space[idx]}.{MEM[dt]} {dst}, [{r[idx]}];")
        if dt == dtypes.bool:
          r[u] = reg("pred"); emit(f"setp.ne.u16 {r[u]}, {dst}, 0;")
        else: r[u] = dst
      elif op is Ops.STORE:
        idx, val = u.src
        v = r[val]
        if val.dtype == dtypes.bool:
          v = reg("u16"); emit(f"selp.u16 {v}, 1, 0, {r[val]};")
        gate = "" if idx.gate is None else f"@{r[idx.gate]} "
        emit(f"{gate}st.{space[idx]}.{MEM[val.dtype]} [{r[idx]}], {v};")
      elif op is Ops.RANGE:
        k, t = u.arg[0], REG[u.dtype]
        r[u] = new(u.dtype)
        done = reg("pred")
        emit(f"mov.{t} {r[u]}, 0;")
        lines.append(f"LOOP_{k}:")
        emit(f"setp.ge.{t} {done}, {r[u]}, {r[u.src[0]]};")
        emit(f"@{done} bra END_{k};")
      elif op is Ops.END:
        rng = u.src[1]
        k = rng.arg[0]
        emit(f"add.{REG[rng.dtype]} {r[rng]}, {r[rng]}, 1;")
        emit(f"bra LOOP_{k};")
        lines.append(f"END_{k}:")
      elif op is Ops.CAST: r[u] = cast(r[u.src[0]], u.src[0].dtype, u.dtype)
      elif op is Ops.BITCAST:
        frm, to = u.src[0].dtype, u.dtype
        x = r[u.src[0]]
        if frm == dtypes.bool: x = cast(x, frm, dtypes.uint8)
        if to == dtypes.bool: r[u] = cast(x, dtypes.uint8 if frm != dtypes.bool else frm, to)
        elif to in NARROW: r[u] = narrow(x, to)
        else:
          r[u] = new(to)
          emit(f"mov.b{max(bits(to), 16)} {r[u]}, {x};")
      elif op in GroupOp.ALU: r[u] = alu(u)
      else: raise NotImplementedError(f"PTX renderer can't render {op}")
    decl = "\n".join(f"  .reg .{kind} %{kind}_<{n + 1}>;" for kind, n in sorted(regs.items()))
    return (f".visible .entry {name}(\n  " + ",\n  ".join(decls) + "\n)\n{\n" + decl + "\n" + "\n".join(locals_ + prologue + lines) +
            "\n  ret;\n}\n")
