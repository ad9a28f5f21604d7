"""LLVM IR text from linear UOps (the LLVM backend). Loops are basic blocks with a phi for the
index; accumulators are allocas that LLVM promotes to registers. Values keep their dtype's LLVM
type except bool (i1 in registers, i8 in memory) and bfloat16 (its bits, i16, as in the C renderer:
math on it was already moved to float32 by lowering). Float math is strict IEEE (no contraction, no
fast-math) except that an accumulated product is a fused multiply-add, as the C renderer's fmaf: a sum
adds in the order the UOps give, as the C backend does (the same bits). Not reassociating also keeps
LLVM's loop vectorizer off a reduce loop, which it would vectorize across iterations, reading a register
tile's written-out copies or a sum's partial accumulators with gathers (5-7x slower): the SLP vectorizer
packs those into vector registers instead (ops_llvm.py turns it on), as gcc does."""
from __future__ import annotations
import struct
from attograd.dtype import DType, PtrDType, dtypes
from attograd.helpers import float_to_bf16_bits
from attograd.uop.ops import UOp, Ops, GroupOp
from attograd.renderer import Renderer, scalar_args

SCALAR = {dtypes.bool: "i1", dtypes.int8: "i8", dtypes.uint8: "i8", dtypes.int16: "i16", dtypes.uint16: "i16",
          dtypes.int32: "i32", dtypes.uint32: "i32", dtypes.int64: "i64", dtypes.uint64: "i64",
          dtypes.float16: "half", dtypes.bfloat16: "i16", dtypes.float32: "float", dtypes.float64: "double"}
FLOAT_INTRINSICS = {Ops.EXP2: "exp2", Ops.LOG2: "log2", Ops.SIN: "sin", Ops.SQRT: "sqrt", Ops.TRUNC: "trunc"}
# each op's instruction (codegen/semantics.py has already written out x/0, NaN in max, wide shifts and bool math);
# a pair is (unsigned, signed)
FLOAT_INST = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.FDIV: "fdiv", Ops.CMPLT: "olt", Ops.CMPNE: "une", Ops.CMPEQ: "oeq"}
INT_INST: dict[Ops, str | tuple[str, str]] = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul", Ops.AND: "and", Ops.OR: "or",
  Ops.XOR: "xor", Ops.SHL: "shl", Ops.SHR: ("lshr", "ashr"), Ops.IDIV: ("udiv", "sdiv"), Ops.MOD: ("urem", "srem")}
INT_CMP = {Ops.CMPLT: ("ult", "slt"), Ops.MAX: ("ugt", "sgt"), Ops.CMPNE: ("ne", "ne"), Ops.CMPEQ: ("eq", "eq")}

def ltype(dt: DType) -> str:
  if isinstance(dt, PtrDType): return "ptr"
  s = SCALAR[dt.scalar()]
  return f"<{dt.count} x {s}>" if dt.count > 1 else s

def mem_type(dt: DType) -> str:
  """How a value of dt is stored: bool takes a byte."""
  return "i8" if dt.scalar() == dtypes.bool else ltype(dt)

def is_float(dt: DType) -> bool: return dtypes.is_float(dt) and dt.scalar() != dtypes.bfloat16
def is_signed(dt: DType) -> bool: return dtypes.is_int(dt) and not dtypes.is_unsigned(dt)
def bits(dt: DType) -> int: return 1 if dt.scalar() == dtypes.bool else 8 * dt.itemsize

def const(value, dt: DType) -> str:
  if dt == dtypes.bfloat16: return str(float_to_bf16_bits(float(value)))
  if dt == dtypes.float16: return "0xH" + struct.pack(">e", float(value)).hex().upper()
  if dtypes.is_float(dt):  # float and double literals are written as the double's bits (exact for float values)
    return "0x" + struct.pack(">d", float(value)).hex().upper()
  if dtypes.is_bool(dt): return "true" if value else "false"
  v = int(value)
  return str(v - (1 << 64) if v >= 1 << 63 else v)  # LLVM reads i64 literals as signed

class LLVMRenderer(Renderer):
  device = "LLVM"
  has_threads = True
  native = frozenset({"bool_compare"})  # icmp on i1

  def render(self, name: str, uops: list[UOp]) -> str:
    r: dict[UOp, str] = {}
    allocas: list[str] = []
    lines: list[str] = []
    declares: set[str] = set()
    n = 0
    block = "entry"  # the block instructions are going into, for phi sources
    def tmp() -> str:
      nonlocal n
      n += 1
      return f"%t{n}"
    def ins(expr: str) -> str:
      name = tmp()
      lines.append(f"  {name} = {expr}")
      return name
    def label(name: str) -> None:
      nonlocal block
      lines.append(f"{name}:")
      block = name
    def call(fn: str, ret: str, args: list[tuple[str, str]]) -> str:
      declares.add(f"declare {ret} @{fn}({', '.join(t for t, _ in args)})")
      return ins(f"call {ret} @{fn}({', '.join(f'{t} {v}' for t, v in args)})")

    # (cast goes through step, neither calls itself: a nested function that does is a reference cycle, and with it
    # everything render made would wait for the cycle collector, which lowering pauses)
    def cast(x: str, frm: DType, to: DType) -> str:
      """Value x of dtype frm as dtype to, with the semantics of the PYTHON device."""
      if frm == to: return x
      if frm == dtypes.bfloat16:  # its bits are the top half of a float32
        wide = ins(f"zext i16 {x} to i32")
        x, frm = ins(f"bitcast i32 {ins(f'shl i32 {wide}, 16')} to float"), dtypes.float32
      if to == dtypes.bfloat16:  # round to nearest even from float32; NaN becomes the quiet NaN 0x7fc0
        f = step(x, frm, dtypes.float32)
        b = ins(f"bitcast float {f} to i32")
        odd = ins(f"and i32 {ins(f'lshr i32 {b}, 16')}, 1")
        up = ins(f"add i32 {ins(f'add i32 {b}, 32767')}, {odd}")
        rounded = ins(f"trunc i32 {ins(f'lshr i32 {up}, 16')} to i16")
        return ins(f"select i1 {ins(f'fcmp uno float {f}, 0.0')}, i16 32704, i16 {rounded}")
      if to == dtypes.float16 and not is_float(frm) and bits(frm) == 64:  # as the reference does: the integer becomes a double first
        x, frm = step(x, frm, dtypes.float64), dtypes.float64
      return step(x, frm, to)

    def step(x: str, frm: DType, to: DType) -> str:
      """cast between two dtypes that aren't bfloat16, in one conversion."""
      if frm == to: return x
      ft, tt = ltype(frm), ltype(to)
      if dtypes.is_bool(to): return ins(f"fcmp une {ft} {x}, 0.0" if is_float(frm) else f"icmp ne {ft} {x}, 0")
      if dtypes.is_bool(frm): return ins(f"uitofp i1 {x} to {tt}" if is_float(to) else f"zext i1 {x} to {tt}")
      if is_float(frm) and is_float(to):
        if to == dtypes.float16 and frm == dtypes.float64:
          # no libcall for double -> half outside compiler-rt: round to odd in float, which rounds once after
          return ins(f"fptrunc float {round_to_odd_f32(x)} to half")
        return ins(f"{'fpext' if bits(to) > bits(frm) else 'fptrunc'} {ft} {x} to {tt}")
      if is_float(to): return ins(f"{'sitofp' if is_signed(frm) else 'uitofp'} {ft} {x} to {tt}")
      if is_float(frm):  # only to int64 arrives (codegen/semantics.py): saturating, NaN to 0 (fptosi is poison beyond)
        return call(f"llvm.fptosi.sat.i64.{intr(frm)}", "i64", [(ft, x)])
      if bits(to) == bits(frm): return x
      if bits(to) < bits(frm): return ins(f"trunc {ft} {x} to {tt}")
      return ins(f"{'sext' if is_signed(frm) else 'zext'} {ft} {x} to {tt}")

    def round_to_odd_f32(x: str) -> str:
      """double -> float rounded to odd (toward zero, then the last bit set if inexact): rounding that
      to half is then the correctly rounded double -> half."""
      f = ins(f"fptrunc double {x} to float")
      back = ins(f"fpext float {f} to double")
      fabs = lambda v: call("llvm.fabs.f64", "double", [("double", v)])
      b = ins(f"bitcast float {f} to i32")
      b = ins(f"select i1 {ins(f'fcmp ogt double {fabs(back)}, {fabs(x)}')}, i32 {ins(f'sub i32 {b}, 1')}, i32 {b}")
      b = ins(f"select i1 {ins(f'fcmp one double {back}, {x}')}, i32 {ins(f'or i32 {b}, 1')}, i32 {b}")
      return ins(f"bitcast i32 {b} to float")

    def intr(dt: DType) -> str: return {dtypes.float32: "f32", dtypes.float64: "f64", dtypes.float16: "f16"}[dt.scalar()]

    def alu(u: UOp) -> str:
      op, dt, s = u.op, u.dtype, u.src
      a = [r[x] for x in s]
      t = ltype(s[-1].dtype if op is not Ops.WHERE else dt)
      fl = is_float(s[0].dtype) if op is not Ops.WHERE else is_float(dt)
      if op in FLOAT_INTRINSICS: return call(f"llvm.{FLOAT_INTRINSICS[op]}.{intr(dt)}", t, [(t, a[0])])
      if op is Ops.RECIP: return ins(f"fdiv {t} {const(1.0, dt)}, {a[0]}")
      if op is Ops.NEG:
        if fl: return ins(f"fneg {t} {a[0]}")
        return ins(f"xor i1 {a[0]}, true") if dtypes.is_bool(dt) else ins(f"sub {t} 0, {a[0]}")
      if op is Ops.WHERE: return ins(f"select i1 {a[0]}, {t} {a[1]}, {t} {a[2]}")
      if op is Ops.MULACC:
        if fl: return call(f"llvm.fmuladd.{intr(dt)}", t, [(t, a[0]), (t, a[1]), (t, a[2])])
        return ins(f"add {t} {ins(f'mul {t} {a[0]}, {a[1]}')}, {a[2]}")
      if op is Ops.MAX:  # integers (a float MAX arrives written out: codegen/semantics.py)
        return ins(f"select i1 {ins(f'icmp {INT_CMP[op][is_signed(dt)]} {t} {a[0]}, {a[1]}')}, {t} {a[0]}, {t} {a[1]}")
      if op in GroupOp.Comparison:
        if fl: return ins(f"fcmp {FLOAT_INST[op]} {t} {a[0]}, {a[1]}")
        return ins(f"icmp {INT_CMP[op][is_signed(s[0].dtype)]} {t} {a[0]}, {a[1]}")
      if fl: return ins(f"{FLOAT_INST[op]} {t} {a[0]}, {a[1]}")
      if op in (Ops.SHL, Ops.SHR) and s[1].dtype != dt: a[1] = cast(a[1], s[1].dtype, dt)  # LLVM shifts by its own type
      inst = INT_INST[op] if isinstance(INT_INST[op], str) else INT_INST[op][is_signed(dt)]
      # integer math wraps; where bounds prove it can't, say so and let LLVM reason about it
      nowrap = (" nsw" if is_signed(dt) else " nuw") if op in (Ops.ADD, Ops.SUB, Ops.MUL) and u.exact and not dtypes.is_bool(dt) else ""
      return ins(f"{inst}{nowrap} {t} {a[0]}, {a[1]}")

    def gated(gate: str, body) -> str | None:
      """Run body() only where gate holds; returns body's value (or 0) as a phi."""
      k = tmp()[2:]
      before = block
      lines.append(f"  br i1 {gate}, label %g{k}, label %j{k}")
      label(f"g{k}")
      val, ty, zero = body()
      end = block
      lines.append(f"  br label %j{k}")
      label(f"j{k}")
      return ins(f"phi {ty} [ {val}, %{end} ], [ {zero}, %{before} ]") if val is not None else None

    params = sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg)
    variables = scalar_args(uops)
    for v in variables:  # variables arrive as i64 (one calling convention for every kernel)
      r[v] = f"%var{variables.index(v)}" if ltype(v.dtype) == "i64" else ins(f"trunc i64 %var{variables.index(v)} to {ltype(v.dtype)}")
    for u in uops:
      op = u.op
      if op is Ops.PARAM: r[u] = f"%data{u.arg}"
      elif op in (Ops.DEFINE_VAR, Ops.CORE_ID, Ops.SINK, Ops.NOOP): pass
      elif op is Ops.CONST: r[u] = const(u.arg, u.dtype)
      elif op is Ops.DEFINE_REG:
        r[u] = f"%acc{u.arg}"
        allocas.append(f"  %acc{u.arg} = alloca [{u.dtype.size} x {mem_type(u.dtype.base)}]")
      elif op is Ops.AFTER: r[u] = r[u.src[0]]
      elif op is Ops.INDEX:
        r[u] = ins(f"getelementptr inbounds {mem_type(u.dtype.base)}, ptr {r[u.src[0]]}, {ltype(u.src[1].dtype)} {r[u.src[1]]}")
      elif op is Ops.LOAD:
        idx = u.src[0]
        mt = mem_type(u.dtype)
        def load(idx=idx, mt=mt, u=u):
          v = ins(f"load {mt}, ptr {r[idx]}")
          return (ins(f"icmp ne i8 {v}, 0") if dtypes.is_bool(u.dtype) else v), ltype(u.dtype), const(0, u.dtype)
        r[u] = load()[0] if idx.gate is None else gated(r[idx.gate], load)
      elif op is Ops.STORE:
        idx, val = u.src
        def store(idx=idx, val=val):
          v = ins(f"zext i1 {r[val]} to i8") if dtypes.is_bool(val.dtype) else r[val]
          lines.append(f"  store {mem_type(val.dtype)} {v}, ptr {r[idx]}")
          return None, "", ""
        if idx.gate is not None: gated(r[idx.gate], store)
        else: store()
      elif op is Ops.RANGE:
        k, t = u.arg[0], ltype(u.dtype)
        r[u] = f"%r{k}"
        lines.append(f"  br label %loop{k}")
        pre = block
        label(f"loop{k}")
        lines.append(f"  %r{k} = phi {t} [ 0, %{pre} ], [ %r{k}.next, %latch{k} ]")
        lines.append(f"  br i1 {ins(f'icmp slt {t} %r{k}, {r[u.src[0]]}')}, label %body{k}, label %exit{k}")
        label(f"body{k}")
      elif op is Ops.END:
        rng = u.src[1]
        k, t = rng.arg[0], ltype(rng.dtype)
        lines.append(f"  br label %latch{k}")
        label(f"latch{k}")
        lines.append(f"  %r{k}.next = add nuw nsw {t} %r{k}, 1")
        lines.append(f"  br label %loop{k}")
        label(f"exit{k}")
      elif op is Ops.CAST: r[u] = cast(r[u.src[0]], u.src[0].dtype, u.dtype)
      elif op is Ops.BITCAST:
        frm, to = u.src[0].dtype, u.dtype
        x = r[u.src[0]]
        if dtypes.is_bool(frm): x = ins(f"zext i1 {x} to i8")  # bool is a byte in memory, and so for bitcasts
        r[u] = ins(f"icmp ne i8 {x}, 0") if dtypes.is_bool(to) else x if mem_type(frm) == mem_type(to) else \
          ins(f"bitcast {mem_type(frm)} {x} to {mem_type(to)}")
      elif op in GroupOp.ALU: r[u] = alu(u)
      else: raise NotImplementedError(f"LLVM renderer can't render {op}")
    args = [f"ptr noalias %data{p.arg}" for p in params] + [f"i64 %var{i}" for i in range(len(variables))]
    body = "\n".join(allocas + lines)
    # every kernel is also called through its slice entry (a threaded one per slice, any of them by a replay's native run
    # loop): not inlined there, one copy of it to compile
    return (f"define void @{name}({', '.join(args)}) nounwind noinline {{\nentry:\n{body}\n  ret void\n}}\n" +
            "".join(d + "\n" for d in sorted(declares)) + self.slice_entry(name, len(params), variables))

  @staticmethod
  def slice_entry(name: str, nparams: int, variables: list[UOp]) -> str:
    """Every kernel's second entry point, of one C type for all: the thread pool (runtime/threadpool.py) calls
    void <name>_slice(void *const *bufs, const long long *vals, long long core) once per slice of a threaded kernel, and a
    replay's native run loop calls any kernel through it."""
    lines = [f"  %b{i}.at = getelementptr inbounds ptr, ptr %bufs, i64 {i}\n  %b{i} = load ptr, ptr %b{i}.at" for i in range(nparams)]
    lines += [f"  %v{i}.at = getelementptr inbounds i64, ptr %vals, i64 {i}\n  %v{i} = load i64, ptr %v{i}.at"
              for i, v in enumerate(variables) if v.op is not Ops.CORE_ID]
    args = [f"ptr %b{i}" for i in range(nparams)] + [f"i64 {'%core' if v.op is Ops.CORE_ID else f'%v{i}'}" for i, v in enumerate(variables)]
    return (f"define void @{name}_slice(ptr %bufs, ptr %vals, i64 %core) nounwind {{\nentry:\n" + "\n".join(lines) +
            f"\n  call void @{name}({', '.join(args)})\n  ret void\n}}\n")
