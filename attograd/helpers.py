"""Small utilities shared by every layer. Imports nothing of attograd."""
from __future__ import annotations
import contextlib, functools, gc, math, os, pathlib, sys, tempfile, threading, time
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

def prod(xs: Iterable[Any], start: Any = 1) -> Any: return functools.reduce(lambda a, b: a * b, xs, start)
def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs)
class cached_property:
  """functools.cached_property without its lock (Python 3.11 takes one on every first access: 6% of building a
  softmax). Graph nodes are built and walked by one thread at a time."""
  def __init__(self, fn: Callable[[Any], Any]): self.fn, self.name, self.__doc__ = fn, fn.__name__, fn.__doc__
  def __set_name__(self, owner: type, name: str) -> None: self.name = name
  def __get__(self, obj: Any, owner: type | None = None) -> Any:
    if obj is None: return self
    value = obj.__dict__[self.name] = self.fn(obj)
    return value

def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def argsort(xs: Sequence[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))
def ceildiv(a: int, b: int) -> int: return -(-a // b)
def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
  """The shape numpy/PyTorch broadcasting gives, or ValueError naming the shapes."""
  if len(shapes) == 2:  # a binary op's (every one of a training step's whose shapes differ: ~300 a step)
    a, b = shapes
    if a == b: return tuple(a)
    # (the shorter shape with 1s in front, as broadcasting reads it: a bias (C,) beside (B, T, C))
    if (d := len(a) - len(b)) > 0: b = (1,) * d + tuple(b)
    elif d < 0: a = (1,) * -d + tuple(a)
    # a row's mean against its row, a bias: two comprehensions, where the general loop below took 7 us
    out = tuple([x if y == 1 else y for x, y in zip(a, b)])
    if all([x == 1 or x == o for x, o in zip(a, out)]): return out
  if all(s == shapes[0] for s in shapes[1:]): return tuple(shapes[0]) if shapes else ()  # the common case, cheaply
  n = max(len(s) for s in shapes)
  out = []
  for dims in zip(*((1,) * (n - len(s)) + tuple(s) for s in shapes)):
    size = 1
    for d in dims:
      if d == 1 or d == size: continue
      if size != 1: raise ValueError(f"shapes {' and '.join(str(tuple(s)) for s in shapes)} can't be broadcast together")
      size = d
    out.append(size)
  return tuple(out)

def strides_for_shape(shape: Sequence[int]) -> tuple[int, ...]:
  out, acc = [], 1
  for s in reversed(shape): out.append(acc if s != 1 else 0); acc *= s
  return tuple(reversed(out))

# ***** environment switches, also settable in code through Context *****

class ContextVar:
  """An integer switch read once from the environment (DEBUG=2) and overridable with Context."""
  _all: dict[str, ContextVar] = {}
  def __init__(self, key: str, default: int):
    self.key, self.value = key, int(os.getenv(key, default))
    ContextVar._all[key] = self
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, x: int) -> bool: return self.value >= x
  def __gt__(self, x: int) -> bool: return self.value > x
  def __lt__(self, x: int) -> bool: return self.value < x
  def __le__(self, x: int) -> bool: return self.value <= x
  def __int__(self) -> int: return self.value
  def __repr__(self) -> str: return f"{self.key}={self.value}"

class Switch:
  """Sets `owner.attr` to `value` inside a `with` block, or during each call of a function it decorates, and restores what
  it was after: Tensor.train(), no_grad(). Re-entrant: one switch may be entered again inside itself (a recursive call)."""
  def __init__(self, owner: Any, attr: str, value: Any): self.owner, self.attr, self.value, self.prev = owner, attr, value, []
  def __enter__(self) -> Switch:
    self.prev.append(getattr(self.owner, self.attr))
    setattr(self.owner, self.attr, self.value)
    return self
  def __exit__(self, *exc: Any) -> None: setattr(self.owner, self.attr, self.prev.pop())
  def __call__(self, fn: Callable) -> Callable:
    if not callable(fn): raise TypeError(f"{type(self).__name__}() decorates a function, got {type(fn).__name__}")
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
      with self: return fn(*args, **kwargs)
    return run

DEBUG, NOOPT, CACHELEVEL = ContextVar("DEBUG", 0), ContextVar("NOOPT", 0), ContextVar("CACHELEVEL", 2)
BEAM = ContextVar("BEAM", 0)  # kernel Opts from a search of this width instead of the heuristics

@contextlib.contextmanager
def Context(**kwargs: int) -> Iterator[None]:
  """with Context(DEBUG=4): ... temporarily sets switches."""
  unknown = [k for k in kwargs if k not in ContextVar._all]
  if unknown: raise KeyError(f"unknown Context switch(es) {unknown}; known: {sorted(ContextVar._all)}")
  old = {k: ContextVar._all[k].value for k in kwargs}
  for k, v in kwargs.items(): ContextVar._all[k].value = int(v)
  try: yield
  finally:
    for k, v in old.items(): ContextVar._all[k].value = v

def getenv(key: str, default: Any = 0) -> Any: return type(default)(os.getenv(key, default))

# ***** counters of work done, reported at DEBUG>=1 *****

class GlobalCounters:
  kernel_count: int = 0
  global_ops: int = 0
  global_mem: int = 0
  time_sum: float = 0.0
  mem_used: int = 0   # bytes of device memory held by live buffers now (not reset: it is a level, not a count)
  mem_peak: int = 0   # the most mem_used has been since the last reset
  @staticmethod
  def reset() -> None:
    GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem, GlobalCounters.time_sum = 0, 0, 0, 0.0
    GlobalCounters.mem_peak = GlobalCounters.mem_used

# ***** disk caches: compiled binaries, lowered programs, schedules, BEAM's winners (datasets keep their own checksums) *****
# CACHELEVEL: 0 no disk cache at all, 1 binaries and BEAM results, 2 (default) also lowered programs and schedules.
# Every entry is written by cache_write and read by cache_read, or (a file another program must read as it is, such as
# a shared library for dlopen) named by its content hash and checked against it. An entry is never trusted unchecked:
# a damaged one is rebuilt with a one-line warning. Nothing needs the cache: when it can't be written, it is skipped.

def cache_dir() -> pathlib.Path:
  """The cache's root (made when something is first written there)."""
  return pathlib.Path(os.getenv("ATTOGRAD_CACHE") or os.path.join(os.getenv("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "attograd"))

class gc_paused:
  """`with gc_paused():` Python's cycle collector off for a burst of allocation (scheduling a graph, lowering its kernels,
  every realize). Graphs hold no cycles (UOp.ancestors), so it finds nothing there, but with a training step's graphs
  alive each full pass walks all of them: 1.1 s of CPU in a small transformer's first 10 steps, a quarter of its Python
  time. What a pause leaves behind is collected after it. A class, not a generator: a tiny op's realize enters one."""
  __slots__ = ("paused",)
  def __enter__(self) -> None:
    if (paused := gc.isenabled()): gc.disable()
    self.paused = paused
  def __exit__(self, *exc: Any) -> None:
    if self.paused: gc.enable()

@functools.cache
def code_version() -> str:
  """A hash of attograd's Python sources, read once per process (5 ms): cached programs and schedules are functions of
  the code that made them, so any change to it makes new keys."""
  root = pathlib.Path(__file__).resolve().parent
  files = sorted(root.rglob("*.py"))
  if not files: return os.urandom(16).hex()  # no sources to hash (a .pyc-only install): entries can't outlive the process
  return content_hash(*(part for f in files for part in (f.relative_to(root).as_posix(), f.read_bytes())))

def cache_path(kind: str, name: str) -> pathlib.Path:
  """Where a cache entry of this kind (a subdirectory: "program", "cc", "beam", ...) lives."""
  return cache_dir() / kind / name

# BLAKE2b of 32 bytes for every key and checksum: CPython's own C implementation (hashlib's is the same object). hashlib
# itself loads OpenSSL's libcrypto for its other algorithms on import: 3.3 MiB resident in every process that imported
# attograd, and 2 ms of import, for keys that never needed it (1.4 GB/s here against OpenSSL SHA-256's 2.1: a cache
# entry of 40 KiB costs 30 us)
try: from _blake2 import blake2b as _blake2b
except ImportError: from hashlib import blake2b as _blake2b  # (a Python built without it: through hashlib)

def hasher() -> Any:
  """A fresh hash object (update/hexdigest) of the kind every cache key and entry checksum uses."""
  return _blake2b(digest_size=32)

def content_hash(*parts: str | bytes) -> str:
  h = hasher()
  for p in parts: h.update(p.encode() if isinstance(p, str) else p); h.update(b"\0")
  return h.hexdigest()

@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, durable: bool = False) -> Iterator[BinaryIO]:
  """A new file to fill that then replaces path in one rename: no reader ever sees half of it, and a process killed
  while writing leaves path as it was (and a ".name.*.tmp" beside it). Every writer has a temporary file of its own, so
  threads and processes writing one path at once each put a whole file there; the last one stays. An exception in the
  block leaves path alone. durable: fsync before the rename, so a power cut can't leave an empty file (0.3 ms a file
  here: cache entries skip it, cache_read finds an emptied entry anyway)."""
  path = pathlib.Path(path)
  try: fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  except FileNotFoundError:  # the first entry of its kind: made here, so that reads never pay for a mkdir
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
  renamed = False
  try:
    with os.fdopen(fd, "wb") as f:
      yield f
      if durable: f.flush(); os.fsync(f.fileno())
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a shared cache from other users
    os.replace(tmp, path)
    renamed = True
  finally:
    if not renamed:
      with contextlib.suppress(OSError): os.unlink(tmp)

def atomic_write(path: str | os.PathLike, data: bytes) -> None:
  """path holds data, written so that no reader ever sees part of it (atomic_file)."""
  with atomic_file(path) as f: f.write(data)

# an entry is one header line (format, payload size, payload hash) and the payload: a reader trusts only a whole,
# unchanged payload. A rename is atomic but not durable: after a crash the file may be empty or hold old blocks
_CACHE_MAGIC = b"attograd-cache 2 "  # 2: the payload hash is BLAKE2b (1: SHA-256)
STALE_SECONDS = 3600  # a temporary file this old was left by a killed writer (a live one finishes in milliseconds)
_swept: set[pathlib.Path] = set()
def _checksum(data: bytes) -> str:
  h = hasher(); h.update(data); return h.hexdigest()
_unwritable: list[str] = []  # the first entry that couldn't be written (compiler threads write at once: under the lock)
_unwritable_lock = threading.Lock()

def cache_write(path: pathlib.Path, data: bytes, raw: bool = False) -> bool:
  """Store data at path (atomically) for cache_read to check and return; raw: as it is, for a file named by its
  content hash that another program reads (a shared library). False when the cache can't be written (a read-only
  or full disk): then the program goes on without it, after a warning the first time."""
  try:
    atomic_write(path, data if raw else _CACHE_MAGIC + f"{len(data)} {_checksum(data)}\n".encode() + data)
    if path.parent not in _swept: _sweep(path.parent)
    return True
  except OSError as e:
    with _unwritable_lock:
      if _unwritable: return False
      _unwritable.append(str(path))
      print(f"attograd: warning: can't write the disk cache ({e.strerror or e}: {e.filename or path}); going on without it", file=sys.stderr)
    return False

def _sweep(folder: pathlib.Path) -> None:
  """Remove the temporary files killed writers left in folder (once a process, at its first write there)."""
  _swept.add(folder)
  stale = time.time() - STALE_SECONDS
  with contextlib.suppress(OSError):
    for e in os.scandir(folder):
      if e.name.startswith(".") and e.name.endswith(".tmp"):
        with contextlib.suppress(OSError):
          if e.stat().st_mtime < stale: os.unlink(e.path)

_DAMAGED = (ValueError, KeyError, TypeError, IndexError, AttributeError, StopIteration)

def cache_read(path: pathlib.Path, decode: Callable[[bytes], Any] = bytes) -> Any:
  """decode(what cache_write stored at path); None if nothing is there, or if the file is damaged (truncated, zeroed,
  changed, unreadable) or decode finds it isn't what this version of attograd writes (it raises ValueError, KeyError,
  ...): then with a one-line warning, and the caller builds the value again and writes it over the file. decode may
  also return None itself, having said why."""
  try: raw = path.read_bytes()
  except (FileNotFoundError, NotADirectoryError): return None  # (a cache whose place is taken by a file: never written)
  except OSError as e:
    cache_warning(path, f"unreadable ({e.strerror})")
    return None
  head, nl, data = raw.partition(b"\n")
  if not (head.startswith(_CACHE_MAGIC) and nl and head[len(_CACHE_MAGIC):] == f"{len(data)} {_checksum(data)}".encode()):
    cache_warning(path, "damaged")
    return None
  try: return decode(data)
  except _DAMAGED as e:  # whole, but not an entry of this kind and key
    cache_warning(path, f"not a valid entry ({type(e).__name__}: {e})")
    return None

def cache_warning(path: pathlib.Path, what: str, action: str = "rebuilding it") -> None:
  print(f"attograd: warning: cache entry {path} is {what}; {action}", file=sys.stderr)

def cached(kind: str, name: str, build: Callable[[], bytes], decode: Callable[[bytes], bytes | None] = bytes) -> bytes:
  """What build() makes (a compiler's binary), kept on disk as kind/name when CACHELEVEL >= 1: read back and checked
  when it is there (decode: what a whole entry stands for), else built and written. Every device compiler caches
  through this."""
  if CACHELEVEL < 1: return build()
  path = cache_path(kind, name)
  if (data := cache_read(path, decode)) is not None: return data
  cache_write(path, data := build())
  return data

# ***** progress of long work (compiling many kernels, BEAM) *****

PROGRESS = ContextVar("PROGRESS", 1)  # 0: never show a progress bar

class Progress:
  """A bar over `total` steps that shows once the work has lasted `delay` seconds and isn't done, so quick work prints
  nothing: one stderr line rewritten in place. Until then an update is a clock read. (Not tqdm's bar: importing it
  brings multiprocessing, email and logging, 2 MiB resident, and a monitor thread into a process that only compiles.)"""
  def __init__(self, total: int, desc: str, unit: str = "kernel", delay: float = 1.0):
    self.total, self.desc, self.unit, self.delay, self.done = total, desc, unit, delay, 0
    self.start, self.shown, self.note, self.open = time.perf_counter(), 0.0, "", False
  def update(self, n: int = 0, note: str | None = None) -> None:
    """n more steps done; `note` says what is being worked on. Also call it with n=0 during a long step."""
    self.done += n
    if note is not None: self.note = note
    now = time.perf_counter()
    if not self.open:
      if now - self.start < self.delay or self.done >= self.total or not PROGRESS: return
      self.open = True
    if now - self.shown < 0.1 and self.done < self.total: return  # at most 10 redraws a second
    self.shown = now
    self._line(now)
  def _line(self, now: float) -> None:
    line = f"{self.desc}: {self.done}/{self.total} {self.unit}s [{now - self.start:.0f} s] {self.note}"
    sys.stderr.write(f"\r{line[:100]:100s}"); sys.stderr.flush()
  def close(self) -> None:
    if not self.open: return
    self._line(time.perf_counter())
    sys.stderr.write("\n"); sys.stderr.flush()
    self.open = False

class _Bar:
  """tqdm's common surface (iterate, update, set_description, set_postfix, close, with) for when tqdm isn't installed:
  one stderr line rewritten at most 10 times a second."""
  def __init__(self, iterable: Iterable[Any] | None = None, desc: str = "", total: int | None = None, disable: bool = False,
               unit: str = "it", leave: bool = True, **kw: Any):
    self.iterable, self.desc, self.disable, self.unit, self.leave, self.n, self.postfix = iterable, desc, disable, unit, leave, 0, ""
    self.total = total if total is not None else (len(iterable) if hasattr(iterable, "__len__") else None)  # type: ignore[arg-type]
    self.start, self.shown = time.perf_counter(), 0.0
  def __iter__(self) -> Iterator[Any]:
    if self.iterable is None: raise TypeError("this progress bar has no iterable: call update()")
    try:
      for x in self.iterable:
        yield x
        self.update(1)
    finally: self.close()
  def __len__(self) -> int: return self.total or 0
  def __enter__(self) -> _Bar: return self
  def __exit__(self, *exc: Any) -> None: self.close()
  def set_description(self, desc: str = "", refresh: bool = True) -> None: self.desc = desc; self._draw(refresh)
  def set_postfix_str(self, s: str = "", refresh: bool = True) -> None: self.postfix = s; self._draw(refresh)
  def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kw: Any) -> None:
    self.set_postfix_str(", ".join(f"{k}={v}" for k, v in {**(ordered_dict or {}), **kw}.items()), refresh)
  def update(self, n: int = 1) -> None: self.n += n; self._draw(False)
  def refresh(self) -> None: self._draw(True)
  def _draw(self, force: bool) -> None:
    now = time.perf_counter()
    if self.disable or (not force and now - self.shown < 0.1 and self.n != self.total): return
    self.shown, el = now, now - self.start
    rate = f"{self.n / el:.2f} {self.unit}/s" if el > 0 else ""
    of = f"{self.n}/{self.total}" if self.total else f"{self.n}"
    sys.stderr.write(f"\r{self.desc + ': ' if self.desc else ''}{of} [{el:.1f} s, {rate}]{' ' + self.postfix if self.postfix else ''}\033[K")
    sys.stderr.flush()
  def close(self) -> None:
    if self.disable or self.shown < 0: return
    self._draw(True)
    sys.stderr.write("\n" if self.leave else "\r\033[K"); sys.stderr.flush()
    self.shown = -1.0

def tqdm(iterable: Iterable[Any] | None = None, *args: Any, **kw: Any) -> Any:
  """tqdm's progress bar when the package is installed, else a small one with the same common methods."""
  try: from tqdm import tqdm as real
  except ImportError: return _Bar(iterable, *args, **kw)
  return real(iterable, *args, **kw)

def trange(n: int, *args: Any, **kw: Any) -> Any:
  """tqdm(range(n)): tinygrad's `for i in (t := trange(steps)): t.set_description(...)`."""
  return tqdm(range(n), *args, **kw)

class Timing(contextlib.ContextDecorator):
  """with Timing("step: "): ... prints how long the block took (wall clock), in ms; on_exit(ns) adds to the line."""
  def __init__(self, prefix: str = "", on_exit: Callable[[int], str] | None = None, enabled: bool = True):
    self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled
  def __enter__(self) -> Timing:
    self.st = time.perf_counter_ns()
    return self
  def __exit__(self, *exc: Any) -> None:
    self.et = time.perf_counter_ns() - self.st
    if self.enabled: print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))

def colored(s: str, color: str | None) -> str:
  codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36}
  return f"\u001b[{codes[color]}m{s}\u001b[0m" if color and sys.stdout.isatty() else s

def float_to_bf16_bits(x: float) -> int:
  """float -> bfloat16 bits with round-to-nearest-even, NaN kept NaN."""
  import struct
  bits = struct.unpack("<I", struct.pack("<f", x))[0]
  if math.isnan(x): return 0x7fc0
  return ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) & 0xffff

def bf16_bits_to_float(b: int) -> float:
  import struct
  return struct.unpack("<f", struct.pack("<I", (b & 0xffff) << 16))[0]

def unwrap(x: T | None) -> T:
  assert x is not None
  return x

