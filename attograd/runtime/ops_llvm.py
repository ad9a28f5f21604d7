"""LLVM device: LLVM IR compiled in-process by llvmlite at O3 for the host CPU (its name and
features, like -march=native) to an object file, which the system linker makes a shared library
(cached on disk by content hash), loaded and called through ctypes like the CPU device's. Memory is
the CPU device's. Not LLVM's in-process JIT linker: one less LLVM subsystem living in the process
(Mesa's lavapipe brings a second LLVM), and a cached kernel needs no LLVM at all."""
from __future__ import annotations
import ctypes, functools, pathlib, tempfile
from typing import Any
from attograd.helpers import cached, content_hash
from attograd.runtime.device import Compiler, Compiled
from attograd.runtime.ops_cpu import CPUAllocator, CPUProgram
from attograd.runtime.cc import find_c_compiler, link_shared
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

# O3 and the SLP vectorizer (llvmlite leaves it off; clang's -O3 and gcc's turn it on): it packs a register tile's
# written-out multiply-adds and a reduce's partial accumulators (its lane loop, fully unrolled) into vector registers
PIPELINE = {"speed_level": 3, "slp_vectorization": True}

class LLVMCompiler(Compiler):
  def __init__(self):
    llvm, tm = _llvm(), _target_machine()
    self.linker = find_c_compiler()
    self.target = f"{PIPELINE} {llvm.llvm_version_info} {llvm.get_process_triple()} {tm.target_data} {llvm.get_host_cpu_name()} {llvm.get_host_cpu_features().flatten()}"
  def optimized(self, src: str) -> Any:
    """The module of src after LLVM's O3 pipeline for this machine."""
    llvm, tm = _llvm(), _target_machine()
    try:
      mod = llvm.parse_assembly(src)
      mod.verify()
    except RuntimeError as e: raise RuntimeError(f"LLVM rejected a kernel: {e}\n--- source ---\n{src}") from None
    mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
    pto = llvm.create_pipeline_tuning_options(speed_level=PIPELINE["speed_level"])
    for k, v in PIPELINE.items(): setattr(pto, k, v)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    return mod
  def assembly(self, src: str) -> str: return _target_machine().emit_assembly(self.optimized(src))
  def compile(self, src: str) -> bytes:
    """A shared library holding the kernel: LLVM makes the object file, the system linker the library."""
    return cached("llvm", f"{content_hash(src, self.target, self.linker)}.so", lambda: self._link(src))
  def _link(self, src: str) -> bytes:
    obj = _target_machine().emit_object(self.optimized(src))
    with tempfile.TemporaryDirectory() as tmp:
      (o := pathlib.Path(tmp) / "k.o").write_bytes(obj)
      so, log = pathlib.Path(tmp) / "k.so", pathlib.Path(tmp) / "log"
      if not link_shared(self.linker, o, so, ["-shared", "-lm"], log):
        raise RuntimeError(f"{self.linker} failed to link a kernel:\n{log.read_text(errors='replace')}")
      return so.read_bytes()

class LLVMProgram(CPUProgram):
  # variables arrive as i64 (one calling convention for every kernel; the renderer truncates them)
  var_type = ctypes.c_int64

class LlvmDevice(Compiled):
  def __init__(self, name: str):
    _llvm()
    super().__init__(name, CPUAllocator(), LLVMRenderer(), LLVMCompiler(), functools.partial(LLVMProgram, pool=name))
