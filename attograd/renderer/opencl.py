"""OpenCL C from linear UOps: the C renderer with OpenCL's types, kernel signature, thread ids,
__local memory and barriers.

16-bit floats are storage only: a device without cl_khr_fp16 (PoCL) can't compute in half, so a
float16 value lives in a float (lowering already does narrow-float math in float32), is read and
written with vload_half/vstore_half, and a cast to float16 rounds to half precision and back.
bfloat16 is a ushort with conversion helpers, as in C. float64 needs cl_khr_fp64; without it the
renderer refuses kernels that use it."""
from __future__ import annotations
from attograd.dtype import DType, PtrDType, dtypes
from attograd.uop.ops import UOp, Ops
from attograd.renderer.cstyle import CStyleRenderer

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
    "float f16_from_bits(ushort h) { return vload_half(0, (half*)&h); }\n")
  fp64_helpers = "float f16_round_d(double x) { ushort h; vstore_half_rte(x, 0, (half*)&h); return vload_half(0, (half*)&h); }\n"
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
    return super().cast(x, frm, to)

  def bitcast(self, x: str, frm: DType, to: DType) -> str:
    if frm == dtypes.float16: return f"as_{self.dt(to)}(f16_bits({x}))"
    if to == dtypes.float16: return f"f16_from_bits(as_ushort({x}))"
    return f"as_{self.dt(to)}({x})"

  def special(self, name: str) -> str: return f"get_{'group' if name.startswith('g') else 'local'}_id({name[-1]})"

  def signature(self, name: str, params: list[UOp], variables: list[UOp]) -> str:
    args = [f"{self.dt(p.dtype)} restrict data{p.arg}" for p in params] + [f"const {self.dt(v.dtype)} {v.arg[0]}" for v in variables]
    return f"__kernel {self.attributes}void {name}({', '.join(args)})"

  def render(self, name: str, uops: list[UOp]) -> str:
    uses_fp64 = any(u.dtype.scalar() == dtypes.float64 or (isinstance(u.dtype, PtrDType) and u.dtype.base == dtypes.float64) for u in uops)
    if uses_fp64 and not self.fp64:
      raise RuntimeError("this OpenCL device has no cl_khr_fp64: float64 can't run on CL here; cast to float32 or use another device")
    local = [1, 1, 1]
    for u in uops:
      if u.op is Ops.SPECIAL and u.arg.startswith("lidx"): local[int(u.arg[4:])] = u.src[0].arg
    # a fixed work-group size lets the compiler specialize for it
    self.attributes = f"__attribute__((reqd_work_group_size({local[0]}, {local[1]}, {local[2]}))) "
    self.prelude = ("#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n" + self.fp64_helpers if uses_fp64 else "") + self.helpers
    return super().render(name, uops)
