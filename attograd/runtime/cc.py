"""The system C compiler (clang when present, else gcc; CC chooses): C source -> a shared library's bytes, cached on
disk by content hash, and such bytes loaded through ctypes. Used by the CPU device's kernels and thread pool, and as
the LLVM device's linker."""
from __future__ import annotations
import ctypes, os, pathlib, shutil, subprocess, tempfile
from attograd.helpers import cache_path, cache_read, cache_write, cache_warning, content_hash, atomic_write, CACHELEVEL

def find_c_compiler() -> str:
  for cc in (os.getenv("CC"), "clang", "gcc", "cc"):
    if cc and shutil.which(cc): return cc
  raise RuntimeError("the CPU device needs a C compiler: install clang or gcc (apt-get install clang), or set CC")

def compile_c(cc: str, src: str, flags: list[str], what: str) -> bytes:
  """The shared library cc makes of src with these flags (which must include -shared); `what` names it in errors."""
  path = cache_path("cc", f"{content_hash(src, cc, ' '.join(flags))}.so") if CACHELEVEL >= 1 else None
  if path is not None and (lib := cache_read(path)) is not None: return lib
  with tempfile.TemporaryDirectory() as tmp:
    out = pathlib.Path(tmp) / "k.so"
    proc = subprocess.run([cc, *flags, "-x", "c", "-", "-o", str(out)], input=src.encode(), capture_output=True)
    if proc.returncode != 0: raise RuntimeError(f"{cc} failed to compile {what}:\n{proc.stderr.decode()}\n--- source ---\n{src}")
    lib = out.read_bytes()
  if path is not None: cache_write(path, lib)
  return lib

def load_library(lib: bytes) -> ctypes.CDLL:
  """lib loaded (ctypes loads from a path: one file per content hash, checked against lib before it is trusted)."""
  if CACHELEVEL < 1:  # no cache: a file only until it is loaded
    with tempfile.TemporaryDirectory() as tmp:
      (path := pathlib.Path(tmp) / "k.so").write_bytes(lib)
      return ctypes.CDLL(str(path))
  path = cache_path("lib", f"{content_hash(lib)}.so")
  try: on_disk: bytes | None = path.read_bytes()
  except OSError: on_disk = None
  if on_disk != lib:  # not there yet, or damaged: loading it could crash the process (an invalid ELF header)
    if on_disk is not None: cache_warning(path, "damaged")
    atomic_write(path, lib)
  return ctypes.CDLL(str(path))
