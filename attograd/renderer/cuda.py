"""CUDA C from linear UOps: the C renderer with CUDA's kernel signature, blockIdx/threadIdx for
thread ids, __shared__ memory and __syncthreads. float16 is cuda_fp16.h's half and bfloat16
cuda_bf16.h's __nv_bfloat16, converted through float (lowering already computes them in float32)."""
from __future__ import annotations
from attograd.dtype import DType, dtypes
from attograd.uop.ops import UOp
from attograd.renderer import local_size
from attograd.renderer.cstyle import CStyleRenderer, float_to_int

class CUDARenderer(CStyleRenderer):
  device = "CUDA"
  has_threads = False
  # gridDim.x may reach 2**31-1, y and z 65535; a block has at most 1024 threads, 64 along z
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (1024, 1024, 64)
  workgroup_max = 1024
  workgroup_pref = 128
  types: dict[DType, str] = {**CStyleRenderer.types, dtypes.bool: "bool", dtypes.float16: "half", dtypes.bfloat16: "__nv_bfloat16"}
  prelude = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" \
    "template <class T, class F> __device__ __forceinline__ T bit_cast_(F x) { T t; memcpy(&t, &x, sizeof(T)); return t; }\n" + \
    float_to_int("__device__ static inline unsigned long long f2int", "double", "unsigned long long", "long long")
  local_decl, barrier = "__shared__ ", "__syncthreads();"
  # float -> narrow float, and back; double converts in one rounding
  to_narrow = {dtypes.float16: ("__float2half_rn", "__double2half"), dtypes.bfloat16: ("__float2bfloat16_rn", "__double2bfloat16")}
  from_narrow = {dtypes.float16: "__half2float", dtypes.bfloat16: "__bfloat162float"}

  def __init__(self, arch: str = "sm_80"): self.arch = arch

  def const(self, value, dtype: DType) -> str:
    if dtype in self.to_narrow: return f"{self.to_narrow[dtype][0]}({super().const(value, dtypes.float32)})"
    if dtypes.is_float(dtype):
      lit = super().const(value, dtype)  # INFINITY and NAN are float macros: spell them for the type
      return lit.replace("INFINITY", "__int_as_float(0x7f800000)" if dtype == dtypes.float32 else "__longlong_as_double(0x7ff0000000000000ll)") \
                .replace("NAN", "__int_as_float(0x7fc00000)" if dtype == dtypes.float32 else "__longlong_as_double(0x7ff8000000000000ll)")
    return super().const(value, dtype)

  def cast(self, x: str, frm: DType, to: DType) -> str:
    if frm in self.from_narrow: return self.cast(f"{self.from_narrow[frm]}({x})", dtypes.float32, to)
    if to in self.to_narrow:
      if frm == dtypes.float64: return f"{self.to_narrow[to][1]}({x})"
      return f"{self.to_narrow[to][0]}({self.cast(x, frm, dtypes.float32)})"
    return super().cast(x, frm, to)

  def bitcast(self, x: str, frm: DType, to: DType) -> str: return f"bit_cast_<{self.dt(to)}>({x})"

  def special(self, name: str) -> str: return f"{'blockIdx' if name.startswith('g') else 'threadIdx'}.{'xyz'[int(name[4:])]}"

  def signature(self, name: str, params: list[UOp], variables: dict[UOp, str], uops: list[UOp]) -> str:
    args = [f"{self.dt(p.dtype)} __restrict__ data{p.arg}" for p in params] + [f"const {self.dt(v.dtype)} {n}" for v, n in variables.items()]
    lx, ly, lz = local_size(uops)
    return f'extern "C" __global__ void __launch_bounds__({lx * ly * lz}) {name}({", ".join(args)})'
