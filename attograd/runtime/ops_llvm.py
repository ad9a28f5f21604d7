"""LLVM device: LLVM IR compiled in-process by llvmlite at O3 for the host CPU (its name and
features, like -march=native), cached on disk as an object file by content hash, linked into
this process by LLVM's ORC JIT and called through ctypes. Memory is the CPU device's."""
from __future__ import annotations
import ctypes, functools, itertools
from typing import Any
from attograd.helpers import cache_dir, content_hash, atomic_write, CACHELEVEL
from attograd.runtime.device import Compiler, Compiled
from attograd.runtime.ops_cpu import CPUAllocator, CPUMemory
from attograd.renderer.llvmir import LLVMRenderer

@functools.cache
def _llvm() -> Any:
  try: import llvmlite.binding as llvm
  except ImportError: raise RuntimeError("the LLVM device needs llvmlite: pip install 'attograd[llvm]'") from None
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  return llvm

@functools.cache
def _target_machine() -> Any:
  llvm = _llvm()
  target = llvm.Target.from_triple(llvm.get_process_triple())
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                      opt=3, reloc="pic", codemodel="default")

class LLVMCompiler(Compiler):
  def __init__(self):
    llvm, tm = _llvm(), _target_machine()
    self.target = f"{llvm.llvm_version_info} {llvm.get_process_triple()} {tm.target_data} {llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"
  def optimized(self, src: str) -> Any:
    """The module of src after LLVM's O3 pipeline for this machine."""
    llvm, tm = _llvm(), _target_machine()
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e: raise RuntimeError(f"LLVM rejected a kernel: {e}\n--- source ---\n{src}") from None
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)
    return mod
  def assembly(self, src: str) -> str: return _target_machine().emit_assembly(self.optimized(src))
  def compile(self, src: str) -> bytes:
    key = content_hash(src, self.target)
    path = cache_dir() / f"{key}.llvm.o"
    if CACHELEVEL >= 1 and path.exists(): return path.read_bytes()
    obj = _target_machine().emit_object(self.optimized(src))
    if CACHELEVEL >= 1: atomic_write(path, obj)
    return obj

@functools.cache
def _jit() -> Any: return _llvm().create_lljit_compiler(_target_machine())
_library_ids = itertools.count()

class LLVMProgram:
  """One kernel linked as its own JIT library (kernel names repeat across kernels); math functions
  the code calls (sinf, exp2f, ...) resolve to this process's C library."""
  def __init__(self, name: str, lib: bytes):
    llvm = _llvm()
    self.tracker = llvm.JITLibraryBuilder().add_object_img(lib).add_current_process().export_symbol(name) \
      .link(_jit(), f"attograd_{name}_{next(_library_ids)}")
    self.addr = self.tracker[name]
    self.fxn: Any = None
  def __call__(self, bufs: list[CPUMemory], vals: list[int]) -> None:
    if self.fxn is None: self.fxn = _prototype(len(bufs), len(vals))(self.addr)
    self.fxn(*[b.addr for b in bufs], *vals)

@functools.cache
def _prototype(nbufs: int, nvals: int) -> Any:
  # buffers are pointers, variables are i64 (the renderer truncates them); ctypes releases the GIL, so
  # the THREAD opt's slices run in parallel
  return ctypes.CFUNCTYPE(None, *[ctypes.c_void_p] * nbufs, *[ctypes.c_int64] * nvals)

class LlvmDevice(Compiled):
  def __init__(self, name: str):
    _llvm()
    super().__init__(name, CPUAllocator(), LLVMRenderer(), LLVMCompiler(), LLVMProgram)
