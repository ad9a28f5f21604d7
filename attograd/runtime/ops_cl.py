"""CL device: OpenCL C (renderer/opencl.py) run by the system's OpenCL driver, PoCL on Debian.

The driver is reached through plain ctypes on libOpenCL.so.1 (the ICD loader): the twenty-odd C
functions a device needs don't justify a Python package that must be built or pinned (pyopencl),
so the CL backend adds no Python dependency at all, only the Debian packages below.

Kernels are built from source with clBuildProgram (the build log is in the error when it fails);
the built program binary is cached on disk by content hash like every compiled kernel."""
from __future__ import annotations
import ctypes, ctypes.util, functools, os
from attograd.helpers import DEBUG, cached, content_hash
from attograd.runtime.device import Allocator, Compiler, Compiled
from attograd.renderer.opencl import OpenCLRenderer

DEBIAN_PACKAGES = "ocl-icd-libopencl1 pocl-opencl-icd"
INSTALL_HINT = f"install an OpenCL driver, e.g. on Debian/Ubuntu `apt-get install {DEBIAN_PACKAGES}` (scripts/install_deps.sh)"

# enum values from the OpenCL headers (cl.h)
CL_DEVICE_TYPE_ALL = 0xFFFFFFFF
CL_DEVICE_MAX_COMPUTE_UNITS, CL_DEVICE_MAX_WORK_GROUP_SIZE, CL_DEVICE_MAX_WORK_ITEM_SIZES = 0x1002, 0x1004, 0x1005
CL_DEVICE_NAME, CL_DRIVER_VERSION, CL_DEVICE_VERSION, CL_DEVICE_EXTENSIONS = 0x102B, 0x102D, 0x102F, 0x1030
CL_PLATFORM_NAME = 0x0902
CL_MEM_READ_WRITE = 1
CL_PROGRAM_BINARY_SIZES, CL_PROGRAM_BINARIES, CL_PROGRAM_BUILD_LOG = 0x1165, 0x1166, 0x1183
ERRORS = {-1: "DEVICE_NOT_FOUND", -4: "MEM_OBJECT_ALLOCATION_FAILURE", -5: "OUT_OF_RESOURCES", -6: "OUT_OF_HOST_MEMORY",
          -11: "BUILD_PROGRAM_FAILURE", -30: "INVALID_VALUE", -42: "INVALID_BINARY", -46: "INVALID_KERNEL_NAME",
          -48: "INVALID_KERNEL", -51: "INVALID_ARG_SIZE", -52: "INVALID_KERNEL_ARGS", -54: "INVALID_WORK_GROUP_SIZE",
          -55: "INVALID_WORK_ITEM_SIZE", -61: "INVALID_BUFFER_SIZE", -63: "INVALID_GLOBAL_WORK_SIZE", -1001: "PLATFORM_NOT_FOUND_KHR"}
BUILD_OPTIONS = "-cl-std=CL1.2 -cl-fp32-correctly-rounded-divide-sqrt -w"  # IEEE division and sqrt, as on CPU; no warnings on stderr

vp, sz, u32, i32 = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32, ctypes.c_int32
SIGNATURES = {  # name: (return type, argument types)
  "clGetPlatformIDs": (i32, [u32, ctypes.POINTER(vp), ctypes.POINTER(u32)]),
  "clGetPlatformInfo": (i32, [vp, u32, sz, vp, ctypes.POINTER(sz)]),
  "clGetDeviceIDs": (i32, [vp, ctypes.c_uint64, u32, ctypes.POINTER(vp), ctypes.POINTER(u32)]),
  "clGetDeviceInfo": (i32, [vp, u32, sz, vp, ctypes.POINTER(sz)]),
  "clCreateContext": (vp, [vp, u32, ctypes.POINTER(vp), vp, vp, ctypes.POINTER(i32)]),
  "clCreateCommandQueue": (vp, [vp, vp, ctypes.c_uint64, ctypes.POINTER(i32)]),
  "clCreateBuffer": (vp, [vp, ctypes.c_uint64, sz, vp, ctypes.POINTER(i32)]),
  "clReleaseMemObject": (i32, [vp]),
  "clEnqueueWriteBuffer": (i32, [vp, vp, u32, sz, sz, vp, u32, vp, vp]),
  "clEnqueueReadBuffer": (i32, [vp, vp, u32, sz, sz, vp, u32, vp, vp]),
  "clCreateProgramWithSource": (vp, [vp, u32, ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(sz), ctypes.POINTER(i32)]),
  "clCreateProgramWithBinary": (vp, [vp, u32, ctypes.POINTER(vp), ctypes.POINTER(sz), ctypes.POINTER(ctypes.c_char_p),
                                     ctypes.POINTER(i32), ctypes.POINTER(i32)]),
  "clBuildProgram": (i32, [vp, u32, ctypes.POINTER(vp), ctypes.c_char_p, vp, vp]),
  "clGetProgramBuildInfo": (i32, [vp, vp, u32, sz, vp, ctypes.POINTER(sz)]),
  "clGetProgramInfo": (i32, [vp, u32, sz, vp, ctypes.POINTER(sz)]),
  "clReleaseProgram": (i32, [vp]),
  "clCreateKernel": (vp, [vp, ctypes.c_char_p, ctypes.POINTER(i32)]),
  "clReleaseKernel": (i32, [vp]),
  "clSetKernelArg": (i32, [vp, u32, sz, vp]),
  "clEnqueueNDRangeKernel": (i32, [vp, vp, u32, ctypes.POINTER(sz), ctypes.POINTER(sz), ctypes.POINTER(sz), u32, vp, vp]),
  "clFinish": (i32, [vp]),
}

def load_libcl() -> ctypes.CDLL:
  # PoCL compiles each kernel to machine code when we ask for the program binary (the one cached on
  # disk), then by default again at its first launch, specialized to the launch's sizes: ~120 ms more
  # per kernel, most of it running the system linker. Without that the binary's code runs as it is
  # (first launch ~5 ms; a 512x512 matmul, a sum and an elementwise kernel took the same CPU time).
  os.environ.setdefault("POCL_WORK_GROUP_SPECIALIZATION", "0")
  try: lib = ctypes.CDLL(ctypes.util.find_library("OpenCL") or "libOpenCL.so.1")
  except OSError as e: raise RuntimeError(f"CL needs libOpenCL.so.1, which isn't installed: {INSTALL_HINT}") from e
  for name, (res, args) in SIGNATURES.items():
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = res, args
  return lib
libcl = functools.cache(load_libcl)

def check(err: int, what: str) -> None:
  if err != 0: raise RuntimeError(f"OpenCL {what} failed: CL_{ERRORS.get(err, err)}")

def call(name: str, *args) -> ctypes.c_void_p:
  """A cl* function that returns a handle and reports errors through its last argument."""
  err = i32()
  out = getattr(libcl(), name)(*args, ctypes.byref(err))
  check(err.value, name)
  return out

def _info(fn, handle, param: int, extra: tuple = ()) -> bytes:
  size = sz()
  check(fn(handle, *extra, param, 0, None, ctypes.byref(size)), fn.__name__)
  buf = ctypes.create_string_buffer(size.value)
  check(fn(handle, *extra, param, size.value, buf, None), fn.__name__)
  return buf.raw

class CLContext:
  """The first OpenCL device of the first platform that has one: its context and in-order queue."""
  def __init__(self):
    lib = libcl()
    n = u32()
    if lib.clGetPlatformIDs(0, None, ctypes.byref(n)) != 0 or n.value == 0:
      raise RuntimeError(f"CL found libOpenCL but no OpenCL platform (driver): {INSTALL_HINT}")
    platforms = (vp * n.value)()
    check(lib.clGetPlatformIDs(n.value, platforms, None), "clGetPlatformIDs")
    for p in platforms:
      if lib.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, None, ctypes.byref(n)) == 0 and n.value: break
    else: raise RuntimeError(f"CL found OpenCL platforms but no device: {INSTALL_HINT}")
    devices = (vp * n.value)()
    check(lib.clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, n.value, devices, None), "clGetDeviceIDs")
    self.device = vp(devices[0])
    self.context = call("clCreateContext", None, 1, ctypes.byref(self.device), None, None)
    self.queue = call("clCreateCommandQueue", self.context, self.device, 0)
    text = lambda param: _info(lib.clGetDeviceInfo, self.device, param).rstrip(b"\0").decode()
    self.name, self.version, self.driver = text(CL_DEVICE_NAME), text(CL_DEVICE_VERSION), text(CL_DRIVER_VERSION)
    self.extensions = set(text(CL_DEVICE_EXTENSIONS).split())
    self.platform = _info(lib.clGetPlatformInfo, p, CL_PLATFORM_NAME).rstrip(b"\0").decode()
    self.workgroup_max = ctypes.c_size_t.from_buffer_copy(_info(lib.clGetDeviceInfo, self.device, CL_DEVICE_MAX_WORK_GROUP_SIZE)).value
    self.local_max = tuple((sz * 3).from_buffer_copy(_info(lib.clGetDeviceInfo, self.device, CL_DEVICE_MAX_WORK_ITEM_SIZES)[:3 * 8]))
    self.cores = u32.from_buffer_copy(_info(lib.clGetDeviceInfo, self.device, CL_DEVICE_MAX_COMPUTE_UNITS)).value

class CLMemory:
  __slots__ = ("handle", "release")
  def __init__(self, ctx: CLContext, nbytes: int):
    self.handle = call("clCreateBuffer", ctx.context, CL_MEM_READ_WRITE, nbytes, None)
    self.release = libcl().clReleaseMemObject  # held: at interpreter exit the module's globals may be gone first
  def __del__(self): self.release(self.handle)

class CLAllocator(Allocator):
  def __init__(self, ctx: CLContext): self.ctx = ctx
  def alloc(self, nbytes: int) -> CLMemory: return CLMemory(self.ctx, nbytes)
  def copyin(self, dest: CLMemory, src: memoryview) -> None:
    data = src.cast("B")
    host = (ctypes.c_char * data.nbytes).from_buffer(data) if not data.readonly else ctypes.create_string_buffer(data.tobytes(), data.nbytes)
    check(libcl().clEnqueueWriteBuffer(self.ctx.queue, dest.handle, 1, 0, data.nbytes, host, 0, None, None), "clEnqueueWriteBuffer")
  def copyout(self, dest: memoryview, src: CLMemory) -> None:
    host = (ctypes.c_char * dest.nbytes).from_buffer(dest.cast("B"))
    check(libcl().clEnqueueReadBuffer(self.ctx.queue, src.handle, 1, 0, dest.nbytes, host, 0, None, None), "clEnqueueReadBuffer")

class CLCompiler(Compiler):
  """OpenCL C -> the driver's program binary, cached on disk by source, device and driver."""
  def __init__(self, ctx: CLContext): self.ctx = ctx
  def compile(self, src: str) -> bytes:
    key = content_hash(src, BUILD_OPTIONS, self.ctx.platform, self.ctx.name, self.ctx.driver)
    return cached("cl", f"{key}.clbin", lambda: self._build(src))
  def _build(self, src: str) -> bytes:
    source = ctypes.c_char_p(src.encode())
    program = call("clCreateProgramWithSource", self.ctx.context, 1, ctypes.byref(source), None)
    try:
      build(self.ctx, program, src)
      size = sz.from_buffer_copy(_info(libcl().clGetProgramInfo, program, CL_PROGRAM_BINARY_SIZES)).value
      binary = ctypes.create_string_buffer(size)
      pointers = (ctypes.c_char_p * 1)(ctypes.cast(binary, ctypes.c_char_p))
      check(libcl().clGetProgramInfo(program, CL_PROGRAM_BINARIES, ctypes.sizeof(pointers), pointers, None), "clGetProgramInfo")
    finally: libcl().clReleaseProgram(program)
    return binary.raw

def build(ctx: CLContext, program: ctypes.c_void_p, src: str | None) -> None:
  if (err := libcl().clBuildProgram(program, 1, ctypes.byref(ctx.device), BUILD_OPTIONS.encode(), None, None)) == 0: return
  log = _info(libcl().clGetProgramBuildInfo, program, CL_PROGRAM_BUILD_LOG, (ctx.device,)).rstrip(b"\0").decode(errors="replace")
  raise RuntimeError(f"OpenCL build failed (CL_{ERRORS.get(err, err)}) on {ctx.name}:\n{log}" + (f"\n--- source ---\n{src}" if src else ""))

class CLProgram:
  def __init__(self, ctx: CLContext, name: str, binary: bytes):
    self.ctx, self.name = ctx, name
    data, n = ctypes.c_char_p(binary), sz(len(binary))
    status = i32()
    self.program = call("clCreateProgramWithBinary", ctx.context, 1, ctypes.byref(ctx.device), ctypes.byref(n), ctypes.byref(data), ctypes.byref(status))
    check(status.value, "clCreateProgramWithBinary")
    build(ctx, self.program, None)
    self.kernel = call("clCreateKernel", self.program, name.encode())
    self.release = (libcl().clReleaseKernel, libcl().clReleaseProgram)
  def __call__(self, bufs: list[CLMemory], vals: list[int], groups: tuple[int, ...] = (1, 1, 1), local: tuple[int, ...] = (1, 1, 1)) -> None:
    lib = libcl()
    for i, b in enumerate(bufs): check(lib.clSetKernelArg(self.kernel, i, 8, ctypes.byref(vp(b.handle))), "clSetKernelArg")
    for i, v in enumerate(vals, len(bufs)): check(lib.clSetKernelArg(self.kernel, i, 4, ctypes.byref(i32(v))), "clSetKernelArg")
    if 0 in groups: return  # an empty launch is an error in OpenCL and no work anyway
    glob = (sz * 3)(*(g * l for g, l in zip(groups, local)))
    check(lib.clEnqueueNDRangeKernel(self.ctx.queue, self.kernel, 3, None, glob, (sz * 3)(*local), 0, None, None), f"running kernel {self.name}")
    if DEBUG >= 1: check(lib.clFinish(self.ctx.queue), "clFinish")  # so that the time reported is the kernel's
  def __del__(self):
    if hasattr(self, "release"): self.release[0](self.kernel); self.release[1](self.program)

class ClDevice(Compiled):
  def __init__(self, name: str):
    ctx = CLContext()
    renderer = OpenCLRenderer(fp64="cl_khr_fp64" in ctx.extensions, local_max=ctx.local_max, workgroup_max=ctx.workgroup_max,
                              workgroup_pref=min(ctx.workgroup_max, WORKGROUP_PREF))
    super().__init__(name, CLAllocator(ctx), renderer, CLCompiler(ctx), functools.partial(CLProgram, ctx))
    self.ctx = ctx
  def synchronize(self) -> None: check(libcl().clFinish(self.ctx.queue), "clFinish")

WORKGROUP_PREF = 64
