"""CUDA device, compile-only: kernels render to CUDA C (renderer/cuda.py) and nvcc compiles them to
cubins for the GPU architecture in CUDA_ARCH (default sm_80; nvcc 13 accepts sm_75 and newer).
Running them needs an NVIDIA driver (libcuda), which this backend doesn't drive yet: allocating
memory or launching a kernel raises an error that says so."""
from __future__ import annotations
import ctypes.util, os, pathlib, shutil, subprocess, tempfile
from attograd.helpers import cached, content_hash, getenv
from attograd.runtime.device import Allocator, Compiler, Compiled
from attograd.renderer.cuda import CUDARenderer

def find_nvcc() -> str | None:
  return shutil.which("nvcc") or next((p for p in ("/usr/local/cuda/bin/nvcc",) if os.path.exists(p)), None)

def no_driver(*_) -> None:
  why = "an NVIDIA driver (libcuda) is installed, but attograd doesn't drive it yet" if ctypes.util.find_library("cuda") else \
    "no CUDA driver (libcuda) here"
  raise RuntimeError(f"CUDA is compile-only: {why}. Kernels render and compile to cubins with nvcc; to run them use CL, CPU or PYTHON")

class CUDAAllocator(Allocator):
  alloc = copyin = copyout = staticmethod(no_driver)

class NVCCCompiler(Compiler):
  """CUDA C -> cubin with nvcc, cached on disk by source and architecture."""
  def __init__(self, arch: str): self.arch = arch
  def compile(self, src: str) -> bytes: return nvcc(src, self.arch)

def nvcc(src: str, arch: str) -> bytes:
  if (path := find_nvcc()) is None: raise RuntimeError("compiling for CUDA needs nvcc (the CUDA toolkit) on PATH")
  return cached("cuda", f"{content_hash(src, arch, path)}.cubin", lambda: _nvcc_build(path, src, arch))

def _nvcc_build(nvcc: str, src: str, arch: str) -> bytes:
  with tempfile.TemporaryDirectory() as tmp:
    cu, out = pathlib.Path(tmp) / "k.cu", pathlib.Path(tmp) / "k.cubin"
    cu.write_text(src)
    # --fmad=false: a*b+c stays two roundings, as on the other backends
    proc = subprocess.run([nvcc, "-cubin", f"-arch={arch}", "--fmad=false", "-o", str(out), str(cu)], capture_output=True)
    if proc.returncode != 0: raise RuntimeError(f"nvcc failed to compile for {arch}:\n{proc.stderr.decode()}\n--- source ---\n{src}")
    return out.read_bytes()

class CudaDevice(Compiled):
  def __init__(self, name: str):
    arch = getenv("CUDA_ARCH", "sm_80")
    super().__init__(name, CUDAAllocator(), CUDARenderer(arch), NVCCCompiler(arch), no_driver)
