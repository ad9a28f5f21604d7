"""PyTorch checkpoints (torch.save's zip and legacy formats) as attograd Tensors: state.torch_load's implementation,
imported only when a checkpoint is loaded (pickle, which it needs, is 0.4 MiB of a process that never reads one)."""
from __future__ import annotations
import collections, dataclasses, io, itertools, os, pickle, struct, zipfile
from typing import Any, Callable
from attograd.dtype import DType, dtypes
from attograd.helpers import prod, argsort, strides_for_shape
from attograd.tensor import Tensor
from attograd.nn.file_tensors import cpu_tensor, disk_tensor


TORCH_STORAGES: dict[str, DType] = {
  "DoubleStorage": dtypes.float64, "FloatStorage": dtypes.float32, "HalfStorage": dtypes.float16, "BFloat16Storage": dtypes.bfloat16,
  "LongStorage": dtypes.int64, "IntStorage": dtypes.int32, "ShortStorage": dtypes.int16, "CharStorage": dtypes.int8,
  "ByteStorage": dtypes.uint8, "BoolStorage": dtypes.bool}
TORCH_DTYPES: dict[str, DType] = {
  "float64": dtypes.float64, "double": dtypes.float64, "float32": dtypes.float32, "float": dtypes.float32,
  "float16": dtypes.float16, "half": dtypes.float16, "bfloat16": dtypes.bfloat16, "int64": dtypes.int64, "long": dtypes.int64,
  "int32": dtypes.int32, "int": dtypes.int32, "int16": dtypes.int16, "short": dtypes.int16, "int8": dtypes.int8,
  "uint8": dtypes.uint8, "uint16": dtypes.uint16, "uint32": dtypes.uint32, "uint64": dtypes.uint64, "bool": dtypes.bool}

@dataclasses.dataclass(frozen=True)
class _StorageType:
  dtype: DType | None  # None: torch.storage.UntypedStorage, sized in bytes, typed by the tensor

@dataclasses.dataclass(frozen=True)
class _Storage:
  """A torch storage's bytes: `nbytes` at byte `offset` of a file, or held in memory (`raw`, for a
  compressed zip entry). offset None: not located yet (first pass over a legacy file)."""
  dtype: DType | None
  nbytes: int
  path: str = ""
  offset: int | None = 0
  raw: bytes | None = None
  def tensor(self, byte_offset: int, dtype: DType, shape: tuple[int, ...]) -> Tensor | None:
    if self.raw is not None: return cpu_tensor(self.raw[byte_offset:byte_offset + prod(shape) * dtype.itemsize], dtype, shape)
    return None if self.offset is None else disk_tensor(self.path, self.offset + byte_offset, dtype, shape)

def _rebuild(storage: Any, storage_offset: Any, size: Any, stride: Any, dtype: DType | None, requires_grad: Any = False) -> Tensor | None:
  """torch's view (size, stride, offset in elements) of a storage as a Tensor: a DISK window when the
  view is contiguous, else the window it spans copied to CPU and viewed there by movement ops."""
  if not isinstance(storage, _Storage): raise pickle.UnpicklingError(f"a tensor is rebuilt from {type(storage).__name__}, not a storage")
  dtype = dtype or storage.dtype
  if dtype is None: raise ValueError("a tensor on an untyped storage without a dtype")
  ok_ints = lambda xs: isinstance(xs, tuple) and all(type(x) is int and x >= 0 for x in xs)
  if type(storage_offset) is not int or storage_offset < 0 or not ok_ints(size) or not ok_ints(stride) or len(size) != len(stride):
    raise ValueError(f"invalid tensor view: offset {storage_offset!r}, size {size!r}, stride {stride!r}")
  extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if prod(size) else 0
  if (storage_offset + extent) * dtype.itemsize > storage.nbytes:
    raise ValueError(f"a tensor of size {size} and stride {stride} at offset {storage_offset} runs past its storage of {storage.nbytes} bytes")
  contiguous = prod(size) == 0 or all(s == c for n, s, c in zip(size, stride, strides_for_shape(size)) if n > 1)
  if contiguous: t = storage.tensor(storage_offset * dtype.itemsize, dtype, size)
  elif (flat := storage.tensor(storage_offset * dtype.itemsize, dtype, (extent,))) is None: return None
  else: t = _strided(flat.to("CPU"), size, stride)
  return _parameter(t, requires_grad)

def _parameter(t: Any, requires_grad: Any) -> Any:
  # as torch.load gives it; None is the first pass over a legacy file
  if t is not None and not isinstance(t, Tensor): raise pickle.UnpicklingError(f"a parameter made of {type(t).__name__}")
  if t is not None and requires_grad is True and dtypes.is_float(t.dtype): t.requires_grad = True
  return t

def _strided(flat: Tensor, shape: tuple[int, ...], strides: tuple[int, ...]) -> Tensor:
  """flat[sum(i*s)] for every index i of shape. Where no two elements share memory, movement ops do
  it: sorted by stride, each axis is a pad + reshape into rows of `stride` elements + shrink to the
  part the inner axes use. Overlapping views (as_strided windows) are gathered in Python."""
  dims = sorted((d for d in range(len(shape)) if shape[d] > 1 and strides[d] > 0), key=lambda d: -strides[d])
  ext = [1] * (len(dims) + 1)  # elements spanned by the axes from k on
  for k in reversed(range(len(dims))): ext[k] = ext[k + 1] + (shape[dims[k]] - 1) * strides[dims[k]]
  if any(strides[d] < ext[k + 1] for k, d in enumerate(dims)):
    if prod(shape) > 1 << 22: raise ValueError(f"an overlapping view of shape {shape} and strides {strides} is too big to gather")
    raw, isz = flat.data().cast("B"), flat.dtype.itemsize
    out = bytearray(prod(shape) * isz)
    for j, idx in enumerate(itertools.product(*map(range, shape))):
      p = sum(i * s for i, s in zip(idx, strides)) * isz
      out[j * isz:(j + 1) * isz] = raw[p:p + isz]
    return cpu_tensor(out, flat.dtype, shape)
  t = flat
  for k, d in enumerate(dims):
    n, st, lead = shape[d], strides[d], t.shape[:-1]
    t = t.pad(((0, 0),) * len(lead) + ((0, n * st - ext[k]),)).reshape(*lead, n, st)
    t = t.shrink(tuple((0, s) for s in lead) + ((0, n), (0, ext[k + 1])))
  t = t.reshape(tuple(shape[d] for d in dims)).permute(argsort(dims))
  return t.reshape(tuple(s if d in dims else 1 for d, s in enumerate(shape))).expand(shape)

class ForbiddenGlobal(pickle.UnpicklingError):
  """A checkpoint names something torch_load won't load: it may be an attempt to run code."""

# Python's own unpickler (pickle._Unpickler, not the C one): its opcode table can be changed, so BUILD
# (setting attributes) is limited to the OrderedDict of a state dict. With the C unpickler a file
# could write into the __dict__ of anything it can name: `torch.float32` followed by BUILD
# {"itemsize": 1} would change attograd's dtypes.float32 for the whole process.
class _TorchUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
  """Unpickles a checkpoint allowing only what a tensor dict needs. find_class hands out attograd's
  own stand-ins for torch's rebuild functions and storage types, so nothing is imported and no code
  named by the file runs; any other global is refused."""
  def __init__(self, f: io.BufferedIOBase, load_storage: Callable[[tuple], _Storage]):
    super().__init__(f)
    self.load_storage = load_storage
  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in _ALLOWED: return _ALLOWED[(module, name)]
    if module == "torch" and name in TORCH_STORAGES: return _StorageType(TORCH_STORAGES[name])
    if module == "torch" and name in TORCH_DTYPES: return TORCH_DTYPES[name]
    if module == "torch" and (name.endswith("Storage") or name.startswith(("complex", "float8", "float4", "qint", "quint", "bits", "int", "uint"))):
      raise ValueError(f"torch_load: torch.{name} is a dtype attograd doesn't have")
    raise ForbiddenGlobal(f"torch_load refuses the global {module}.{name}: a checkpoint may hold only tensors, "
                          "OrderedDicts and plain Python values (as torch.load(weights_only=True))")
  def persistent_load(self, pid: Any) -> _Storage:
    if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)
            and isinstance(pid[2], str) and type(pid[4]) is int and pid[4] >= 0):
      raise pickle.UnpicklingError(f"torch_load: unexpected persistent id {pid!r}")
    return self.load_storage(pid)
  def load_build(self) -> None:
    state, inst = self.stack[-1], self.stack[-2]
    if type(inst) is not collections.OrderedDict or not isinstance(state, dict) or not all(type(k) is str for k in state):
      raise ForbiddenGlobal(f"torch_load refuses to set the state of a {type(inst).__name__}")
    super().load_build()
  dispatch = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: load_build}  # type: ignore[attr-defined]

def _no_storage(pid: tuple) -> _Storage: raise pickle.UnpicklingError("a storage outside the checkpoint's object")

_ALLOWED: dict[tuple[str, str], Any] = {
  ("collections", "OrderedDict"): collections.OrderedDict,
  ("torch", "Size"): tuple,
  ("torch.storage", "UntypedStorage"): _StorageType(None),
  ("torch._utils", "_rebuild_tensor"): lambda storage, offset, size, stride: _rebuild(storage, offset, size, stride, None),
  ("torch._utils", "_rebuild_tensor_v2"):
    lambda storage, offset, size, stride, requires_grad, hooks, metadata=None: _rebuild(storage, offset, size, stride, None, requires_grad),
  ("torch._utils", "_rebuild_tensor_v3"):
    lambda storage, offset, size, stride, requires_grad, hooks, dtype, metadata=None: _rebuild(storage, offset, size, stride, dtype, requires_grad),
  ("torch._utils", "_rebuild_parameter"): lambda data, requires_grad, hooks: _parameter(data, requires_grad),
  ("torch._utils", "_rebuild_parameter_with_state"): lambda data, requires_grad, hooks, state: _parameter(data, requires_grad),
}

def _storage_nbytes(pid: tuple) -> int: return pid[4] * (pid[1].dtype.itemsize if pid[1].dtype else 1)

def _torch_load_zip(path: str, z: zipfile.ZipFile) -> Any:
  pkl = [n for n in z.namelist() if n == "data.pkl" or n.endswith("/data.pkl")]
  if len(pkl) != 1: raise ValueError(f"{path}: a zip but not a PyTorch checkpoint (no single data.pkl, found {pkl})")
  prefix = pkl[0][:-len("data.pkl")]
  if (bo := z.read(f"{prefix}byteorder") if f"{prefix}byteorder" in z.NameToInfo else b"little") != b"little":
    raise ValueError(f"{path}: saved with byte order {bo.decode(errors='replace')!r}; only little-endian is supported")
  storages: dict[str, _Storage] = {}
  def load_storage(pid: tuple) -> _Storage:
    if (key := pid[2]) not in storages:
      info, nbytes = z.NameToInfo.get(f"{prefix}data/{key}"), _storage_nbytes(pid)
      if info is None: raise ValueError(f"{path}: storage {key!r} is missing from the archive")
      if info.file_size < nbytes: raise ValueError(f"{path}: storage {key!r} holds {info.file_size} bytes, {nbytes} expected")
      if info.compress_type != zipfile.ZIP_STORED: storages[key] = _Storage(pid[1].dtype, nbytes, raw=z.read(info))
      else:  # torch stores entries uncompressed: the bytes are in the file, after the entry's local header
        with open(path, "rb") as f:
          f.seek(info.header_offset)
          local = f.read(30)
        if len(local) != 30 or local[:4] != b"PK\x03\x04": raise ValueError(f"{path}: corrupt zip entry for storage {key!r}")
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        storages[key] = _Storage(pid[1].dtype, nbytes, path, info.header_offset + 30 + name_len + extra_len)
    return storages[key]
  with z.open(pkl[0]) as f: return _TorchUnpickler(f, load_storage).load()

LEGACY_MAGIC = 0x1950a86a20f9469cfc6c

def _torch_load_legacy(path: str, f: io.BufferedReader) -> Any:
  """The pre-1.6 format: pickles of the magic number, protocol version and system info, the object,
  the list of storage keys, then each storage as an int64 element count and its bytes. Storage
  offsets are known only after the object, so it is unpickled twice: to learn each storage's dtype,
  then to build tensors at the offsets found."""
  try:
    if _TorchUnpickler(f, _no_storage).load() != LEGACY_MAGIC: raise ValueError("bad magic number")
    if _TorchUnpickler(f, _no_storage).load() != 1001: raise ValueError("unknown protocol version")
    sys_info = _TorchUnpickler(f, _no_storage).load()
  except ForbiddenGlobal: raise
  except Exception as e: raise ValueError(f"{path}: not a PyTorch checkpoint ({type(e).__name__}: {e})") from e
  if not isinstance(sys_info, dict) or sys_info.get("little_endian") is not True:
    raise ValueError(f"{path}: only little-endian legacy checkpoints are supported")
  start = f.tell()
  seen: dict[str, tuple] = {}
  def first_pass(pid: tuple) -> _Storage:
    seen.setdefault(pid[2], pid)
    return _Storage(pid[1].dtype, _storage_nbytes(pid), offset=None)
  _TorchUnpickler(f, first_pass).load()
  keys = _TorchUnpickler(f, _no_storage).load()
  if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys): raise ValueError(f"{path}: bad storage key list")
  size, pos, located = os.path.getsize(path), f.tell(), {}
  for key in keys:
    if key not in seen: raise ValueError(f"{path}: storage {key!r} is listed but never used")
    f.seek(pos)
    head = f.read(8)
    count = int.from_bytes(head, "little") if len(head) == 8 else -1
    nbytes = count * (seen[key][1].dtype.itemsize if seen[key][1].dtype else 1)
    if count < 0 or pos + 8 + nbytes > size: raise ValueError(f"{path}: storage {key!r} runs past the end of the file")
    located[key] = _Storage(seen[key][1].dtype, nbytes, path, pos + 8)
    pos += 8 + nbytes
  def second_pass(pid: tuple) -> _Storage:
    if (st := located.get(pid[2])) is None: raise ValueError(f"{path}: storage {pid[2]!r} has no data")
    if len(pid) > 5 and pid[5] is not None:  # a view into the storage: (view key, element offset, element count)
      _, off, n = pid[5]
      isz = st.dtype.itemsize if st.dtype else 1
      if not (type(off) is int and type(n) is int and 0 <= off and (off + n) * isz <= st.nbytes): raise ValueError(f"{path}: bad storage view {pid[5]!r}")
      st = dataclasses.replace(st, offset=st.offset + off * isz, nbytes=n * isz)
    return st
  f.seek(start)
  return _TorchUnpickler(f, second_pass).load()

def load(path: str | os.PathLike) -> Any:
  """state.torch_load: what torch.save wrote at path."""
  path = os.path.abspath(os.fspath(path))
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z: return _torch_load_zip(path, z)
    with open(path, "rb") as f: return _torch_load_legacy(path, f)
  except (ForbiddenGlobal, ValueError, OSError): raise
  # a damaged pickle fails in many ways (IndexError, KeyError, TypeError from a call with wrong arguments, ...)
  except Exception as e: raise ValueError(f"{path}: truncated or corrupt PyTorch checkpoint ({type(e).__name__}: {e})") from e
