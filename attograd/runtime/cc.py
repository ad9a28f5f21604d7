"""The system C compiler (gcc when present, else clang; CC chooses): C source -> a shared library's bytes, cached on
disk by content hash, and such bytes loaded through ctypes. Used by the CPU device's kernels and thread pool, and as
the LLVM device's linker."""
from __future__ import annotations
import ctypes, functools, os, pathlib, shutil, tempfile, threading
# subprocess (0.5 MiB resident with what it imports) is imported where a compiler runs: a process whose kernels all
# come from the caches never runs one
from attograd.helpers import cache_path, cache_read, cache_write, cache_warning, cached, content_hash, CACHELEVEL

def find_c_compiler() -> str:
  # gcc first: the kernels were faster with it, and a small transformer's first steps compiled in 24-35 s against clang 14's
  # 44-49 s; the renderer's choices (loop pragmas, the simd loop's addressing) were tuned on gcc's vectorizer
  for cc in (os.getenv("CC"), "gcc", "clang", "cc"):
    if cc and shutil.which(cc): return cc
  raise RuntimeError("the CPU device needs a C compiler: install gcc or clang (apt-get install gcc), or set CC")

def compile_c(cc: str, src: str, flags: list[str], what: str) -> bytes:
  """The shared library cc makes of src with these flags (which must include -shared); `what` names it in errors."""
  return cached("cc", _entry(cc, src, flags), lambda: _build(cc, src, flags, what), _resolve)

def compile_c_batch(cc: str, srcs: list[str], flags: list[str], what: str, common: str = "") -> list[bytes]:
  """compile_c of each source, with the ones not cached built by one compiler call: one translation unit (`common`,
  a prelude every source starts with, once, then the rest of each), so one shared library holds them all. A process
  and its headers cost ~25 ms per call, about a third of compiling a small kernel; gcc took 4 s for a transformer's
  146 kernels in one unit against 9 s one by one. The sources must define distinct external names. Each one's entry
  in cc/ then names the shared library, kept once in lib/ under its content hash and checked against it when read."""
  names = [_entry(cc, s, flags) for s in srcs]
  libs: list[bytes | None] = [cache_read(cache_path("cc", n), _resolve) if CACHELEVEL >= 1 else None for n in names]
  todo = [i for i, lib in enumerate(libs) if lib is None]
  if len(todo) > 1 and all(srcs[i].startswith(common) for i in todo):
    unit = common + "".join(srcs[i][len(common):] for i in todo)
    try: lib = _build(cc, unit, flags, what)
    except RuntimeError: lib = None  # one source doesn't compile: built alone below, so the error names it
    if lib is not None:
      digest = content_hash(lib)
      # the library first: a link is written only to a library already there
      if CACHELEVEL >= 1 and cache_write(cache_path("lib", f"{digest}.so"), lib, raw=True):
        for i in todo: cache_write(cache_path("cc", names[i]), _LINK + digest.encode())
      _linked[digest] = lib
      _broken.discard(digest)  # gcc's output is deterministic: a damaged library built again is whole again
      for i in todo: libs[i] = lib
  return [lib if lib is not None else compile_c(cc, s, flags, what) for s, lib in zip(srcs, libs)]

# a cc/ entry holding this and a hash names a shared library in lib/ that several kernels' sources were built into
_LINK = b"attograd-lib "
_linked: dict[str, bytes] = {}  # libraries this process read through links and found whole
_broken: set[str] = set()  # and those it found damaged or missing

def _entry(cc: str, src: str, flags: list[str]) -> str: return f"{content_hash(src, cc, ' '.join(flags))}.so"

def _resolve(data: bytes) -> bytes | None:
  """The library a whole cc/ entry stands for: its bytes, or the library it links to if that is whole (None, with a
  warning, when a changed, truncated or missing lib/ file makes the source be built again)."""
  if not data.startswith(_LINK): return data
  digest = data[len(_LINK):].decode()
  if (lib := _linked.get(digest)) is not None: return lib
  if digest in _broken: return None
  target = cache_path("lib", f"{digest}.so")
  try: lib = target.read_bytes()
  except OSError: lib = None
  if lib is None or content_hash(lib) != digest:
    cache_warning(target, "missing" if lib is None else "damaged")  # once: each kernel built into it is rebuilt
    _broken.add(digest)
    return None
  _linked[digest] = lib
  return lib

_usage = threading.local()
def compiler_cpu() -> float:
  """CPU seconds the compiler processes this thread ran have used (user and system, theirs and their children's): what
  compiling cost, whatever else the machine was doing."""
  return getattr(_usage, "cpu", 0.0)

def _run(cmd: list[str], log: pathlib.Path) -> int:
  """cmd's exit code, its output appended to log, and its CPU time (its children's too) added to compiler_cpu()."""
  import subprocess
  with open(log, "ab") as err: proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
  # reaped here, not by Popen: wait4 tells the CPU time of the process and the ones it ran (cc1, as, ld)
  _, status, usage = os.wait4(proc.pid, 0)
  _usage.cpu = compiler_cpu() + usage.ru_utime + usage.ru_stime
  return os.waitstatus_to_exitcode(status)

# the link flags the direct link (_linker) stands for: a library else (-pthread's too) is linked by the compiler's driver
_LINKS_DIRECTLY = ("-shared", "-lm")

@functools.cache
def _linker(cc: str) -> tuple[str, list[str]] | None:
  """ld and what it links a kernel's object with (libc, libm, and libgcc's helpers, such as a double -> _Float16
  conversion), as cc's driver would link them, or None when cc doesn't say where they are. Linking through the driver
  cost ~12 ms a shared library (collect2, its plugin, the start files and every default library, searched), ld alone
  5-8 ms: about a fifth of compiling a small kernel, paid by every batch."""
  import subprocess
  try: out = subprocess.run([cc, "-print-search-dirs"], capture_output=True, text=True, timeout=30).stdout
  except (OSError, subprocess.SubprocessError): return None
  dirs = {k.strip(): v.strip().lstrip("=").split(":") for k, _, v in (line.partition(":") for line in out.splitlines()) if v}
  def find(name: str, where: list[str]) -> str | None: return next((str(p) for d in where if d and (p := pathlib.Path(d) / name).is_file()), None)
  ld = find("ld", dirs.get("programs", [])) or shutil.which("ld")
  libs = [find(n, dirs.get("libraries", [])) for n in ("libc.so.6", "libm.so.6", "libgcc.a")]
  if ld is None or None in libs: return None
  return ld, libs  # type: ignore[return-value]

def _links_directly(flags: list[str]) -> bool:
  return not any(f.startswith(("-l", "-Wl,", "-pthread")) for f in flags if f not in _LINKS_DIRECTLY)

def link_shared(cc: str, obj: pathlib.Path, out: pathlib.Path, flags: list[str], log: pathlib.Path) -> bool:
  """Link the object file obj into the shared library out (flags: cc's, -shared among them), by ld itself where cc
  names it and the flags link no other library, else (or should ld refuse) by cc's driver. Whether it worked (what the
  linker said is in log)."""
  if _links_directly(flags) and (found := _linker(cc)) is not None:
    ld, libs = found
    # the libraries after the object: --as-needed names one in the library only if the object calls into it, and ld
    # takes from an archive (libgcc.a) only what is undefined when it reaches it
    if _run([ld, "-shared", "--eh-frame-hdr", "-o", str(out), str(obj), "--as-needed", *libs], log) == 0: return True
  return _run([cc, *flags, str(obj), "-o", str(out)], log) == 0

def _build(cc: str, src: str, flags: list[str], what: str) -> bytes:
  with tempfile.TemporaryDirectory() as tmp:
    (code := pathlib.Path(tmp) / "k.c").write_text(src)
    out, obj, log = pathlib.Path(tmp) / "k.so", pathlib.Path(tmp) / "k.o", pathlib.Path(tmp) / "log"
    if not _links_directly(flags) or _linker(cc) is None: ok = _run([cc, *flags, str(code), "-o", str(out)], log) == 0
    # compiled to an object (-pipe: the assembly through a pipe, not a file), then linked (link_shared)
    else: ok = _run([cc, *[f for f in flags if f not in _LINKS_DIRECTLY], "-pipe", "-c", str(code), "-o", str(obj)], log) == 0 and \
               link_shared(cc, obj, out, flags, log)
    if not ok: raise RuntimeError(f"{cc} failed to compile {what}:\n{log.read_text(errors='replace')}\n--- source ---\n{src}")
    return out.read_bytes()

_loaded: dict[str, ctypes.CDLL] = {}  # by content hash: the kernels of one batch share their library

def load_library(lib: bytes) -> ctypes.CDLL:
  """lib loaded (ctypes loads from a path: one file per content hash in lib/, checked against lib before it is
  trusted, or a private temporary file when the cache is off or can't be written)."""
  if (dll := _loaded.get(digest := content_hash(lib))) is not None: return dll
  path = cache_path("lib", f"{digest}.so")
  if CACHELEVEL >= 1:
    try: on_disk: bytes | None = path.read_bytes()
    except OSError: on_disk = None
    # not there yet, or damaged (loading that could crash the process with an invalid ELF header): written whole
    if on_disk is not None and on_disk != lib: cache_warning(path, "damaged")
    if on_disk == lib or cache_write(path, lib, raw=True):
      dll = _loaded[digest] = ctypes.CDLL(str(path))
      return dll
  with tempfile.TemporaryDirectory() as tmp:  # a file only until it is loaded
    (path := pathlib.Path(tmp) / "k.so").write_bytes(lib)
    dll = _loaded[digest] = ctypes.CDLL(str(path))
    return dll
