"""DISK device: Device["DISK:/path/to/file"] is a file seen as bytes. A Buffer on it is a window
(byte offset, size) into the file; reading it copies just that window out of a read-only mmap, so
loading a tensor from a big checkpoint touches only its own pages. It runs no kernels: move a
tensor to a compute device (t.to("CPU")) before computing with it."""
from __future__ import annotations
import mmap, os, weakref
from attograd.runtime.device import Allocator, Compiler, Compiled

class FileMap:
  """A read-only map of one file as it was when opened."""
  def __init__(self, path: str):
    with open(path, "rb") as f:  # the map keeps its own handle on the file
      self.mm: mmap.mmap | None = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else None
  def read(self, dest: memoryview, offset: int, path: str) -> None:
    # touching mapped pages past the end of a file truncated since is a SIGBUS: check its size now
    end, size = offset + dest.nbytes, min(len(self.mm), self.mm.size()) if self.mm is not None else 0
    if end > size: raise ValueError(f"reading bytes [{offset}, {end}) of {path}, which has only {size} bytes")
    dest.cast("B")[:] = memoryview(self.mm)[offset:end]

class DiskWindow:
  """`nbytes` bytes at `offset` of the file, and the map they are read from."""
  __slots__ = ("offset", "nbytes", "fmap")
  def __init__(self, offset: int, nbytes: int, fmap: FileMap | None):
    self.offset, self.nbytes, self.fmap = offset, nbytes, fmap

class DiskAllocator(Allocator):
  def __init__(self, path: str):
    self.path = path
    # the map of the file as it is now, keyed by its identity: a file replaced under the same name
    # (os.replace) gets a new map, while windows made before keep reading the file they were made on.
    # Held weakly: the windows own it, and it closes when the last tensor on it is gone.
    self._map: tuple[tuple[int, ...], weakref.ref[FileMap]] | None = None

  def _current_map(self) -> FileMap:
    st = os.stat(self.path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    if self._map is None or self._map[0] != key or (fmap := self._map[1]()) is None:
      fmap = FileMap(self.path)
      self._map = (key, weakref.ref(fmap))
    return fmap

  def alloc(self, nbytes: int) -> DiskWindow: return self.alloc_at(nbytes, 0)
  def alloc_at(self, nbytes: int, offset: int) -> DiskWindow:
    # bind to the file as it is when the tensor is made; a file that doesn't exist yet may be written
    return DiskWindow(offset, nbytes, self._current_map() if os.path.exists(self.path) else None)

  def copyout(self, dest: memoryview, src: DiskWindow) -> None:
    if src.fmap is None: src.fmap = self._current_map()
    src.fmap.read(dest, src.offset, self.path)

  def copyin(self, dest: DiskWindow, src: memoryview) -> None:
    # writes go through the file (creating or growing it), not through a writable map
    data, pos = src.cast("B"), 0
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
      while pos < data.nbytes: pos += os.pwrite(fd, data[pos:], dest.offset + pos)
    finally: os.close(fd)
    dest.fmap = None  # map again on the next read: the file may have grown

class DiskDevice(Compiled):
  def __init__(self, name: str):
    path = name.partition(":")[2]
    if not path: raise ValueError("the DISK device needs a file: Device['DISK:/path/to/file']")
    # renderer None: the engine refuses to run kernels here with a message saying to move to CPU
    super().__init__(name, DiskAllocator(path), None, Compiler(), lambda name, lib: None)
