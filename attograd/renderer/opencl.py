"""OpenCL C from linear UOps: the C renderer with OpenCL's types, kernel signature, thread ids,
__local memory and barriers.

16-bit floats are storage only: a device without cl_khr_fp16 (PoCL) can't compute in half, so a
float16 value lives in a float (lowering already does narrow-float math in float32), is read and
written with vload_half/vstore_half, and a cast to float16 rounds to half precision and back.
bfloat16 is a ushort with conversion helpers, as in C. float64 needs cl_khr_fp64; without it the
renderer refuses kernels that use it."""
from __future__ import annotations
from attograd.dtype import DType, PtrDType, dtypes
from attograd.uop.ops import UOp
from attograd.renderer import local_size
from attograd.renderer.cstyle import CStyleRenderer, float_to_int

def uses_fp64(uops: list[UOp]) -> bool:
  return any(u.dtype.scalar() == dtypes.float64 or (isinstance(u.dtype, PtrDType) and u.dtype.base == dtypes.float64) for u in uops)

class OpenCLRenderer(CStyleRenderer):
  device = "CL"
  has_threads = False
  global_max = (2**31 - 1,) * 3  # thread ids are int
  types: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
    dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong",
    dtypes.float16: "float", dtypes.bfloat16: "ushort", dtypes.float32: "float", dtypes.float64: "double"}
  # kernel arguments may not point to bool (its size is the implementation's) nor compute in half
  ptr_types = {dtypes.bool: "uchar", dtypes.float16: "half"}
  helpers = (
    "#pragma OPENCL FP_CONTRACT OFF\n"  # a*b+c stays two roundings, as on CPU (OpenCL C may fuse them by default)
    "float bf16_to_f32(ushort x) { return as_float((uint)x << 16); }\n"
    "ushort f32_to_bf16(float f) { uint u = as_uint(f); if (f != f) return 0x7fc0; return (ushort)((u + 0x7fff + ((u >> 16) & 1)) >> 16); }\n"
    "float f16_round(float x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return vload_half(0, (half*)&h); }\n"
    "ushort f16_bits(float x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return h; }\n"
    "float f16_from_bits(ushort h) { return vload_half(0, (half*)&h); }\n") + float_to_int("ulong f2int_f", "float", "ulong", "long")
  fp64_helpers = "float f16_round_d(double x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return vload_half(0, (half*)&h); }\n" + \
    float_to_int("ulong f2int", "double", "ulong", "long")
  prelude = helpers  # and fp64_helpers before it for a kernel that uses double (prelude_for)
  local_decl, barrier = "__local ", "barrier(CLK_LOCAL_MEM_FENCE);"

  def __init__(self, fp64: bool = True, local_max: tuple[int, ...] = (256, 256, 64), workgroup_max: int = 256, workgroup_pref: int = 64):
    self.fp64, self.local_max, self.workgroup_max, self.workgroup_pref = fp64, local_max, workgroup_max, workgroup_pref

  def dt(self, dtype: DType) -> str:
    if isinstance(dtype, PtrDType):
      space = {"global": "__global ", "local": "__local "}.get(dtype.addrspace, "")
      return f"{space}{self.ptr_types.get(dtype.base.scalar(), self.dt(dtype.base))}*"
    name = self.types[dtype.scalar()]
    return name if dtype.count == 1 else f"{name}{dtype.count}"  # vector types: float4, int2, ...

  def const(self, value, dtype: DType) -> str:
    if dtype == dtypes.float16: return super().const(value, dtypes.float32)
    if dtype == dtypes.int64: return f"{value}L" if value != dtypes.min(dtypes.int64) else "(-9223372036854775807L-1)"
    if dtype == dtypes.uint64: return f"{value}UL"
    return super().const(value, dtype)

  def math_fn(self, name: str, dtype: DType) -> str: return name  # OpenCL's math built-ins are overloaded

  def load(self, ptr: str, dtype: DType) -> str:
    return f"vload_half(0, {ptr})" if dtype == dtypes.float16 else super().load(ptr, dtype)
  def store(self, ptr: str, value: str, dtype: DType) -> str:
    return f"vstore_half_rte({value}, 0, {ptr});" if dtype == dtypes.float16 else super().store(ptr, value, dtype)

  def cast(self, x: str, frm: DType, to: DType) -> str:
    if frm == dtypes.float16: return self.cast(x, dtypes.float32, to)  # a float16 value is a float already
    if to == dtypes.float16:
      if frm == dtypes.float64: return f"f16_round_d({x})"  # one rounding, straight to half
      return f"f16_round({self.cast(x, frm, dtypes.float32)})"
    if frm == dtypes.float32 and dtypes.is_int(to): return f"(({self.dt(to)})f2int_f({x}))"  # no double needed
    return super().cast(x, frm, to)

  def bitcast(self, x: str, frm: DType, to: DType) -> str:
    if frm == dtypes.float16: return f"as_{self.dt(to)}(f16_bits({x}))"
    if to == dtypes.float16: return f"f16_from_bits(as_ushort({x}))"
    return f"as_{self.dt(to)}({x})"

  def special(self, name: str) -> str: return f"get_{'group' if name.startswith('g') else 'local'}_id({name[-1]})"

  def signature(self, name: str, params: list[UOp], variables: dict[UOp, str], uops: list[UOp]) -> str:
    args = [f"{self.dt(p.dtype)} restrict data{p.arg}" for p in params] + [f"const {self.dt(v.dtype)} {n}" for v, n in variables.items()]
    # a fixed work-group size lets the compiler specialize for it
    return f"__kernel __attribute__((reqd_work_group_size({', '.join(map(str, local_size(uops)))}))) void {name}({', '.join(args)})"

  def prelude_for(self, uops: list[UOp]) -> str:
    return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + self.fp64_helpers + self.helpers if uses_fp64(uops) else self.helpers

  def render(self, name: str, uops: list[UOp]) -> str:
    if uses_fp64(uops) and not self.fp64:
      raise RuntimeError("this OpenCL device has no cl_khr_fp64: float64 can't run on CL here; cast to float32 or use another device")
    return super().render(name, uops)
