"""Model state and file formats: state dicts by dotted name, safetensors (save and lazy load) and
PyTorch checkpoints (.pt/.pth, zip and legacy formats) read through a restricted unpickler.

Loaded tensors live on the DISK device: a window into the file, read only when copied to a compute
device (load_state_dict does that), so loading touches just the bytes of the tensors used."""
from __future__ import annotations
import array, collections, collections.abc, dataclasses, io, itertools, json, mmap, os, pickle, struct, types, uuid, zipfile
from typing import Any, Callable, Iterator, NamedTuple
from attograd.dtype import DType, dtypes
from attograd.helpers import prod, argsort, strides_for_shape
from attograd.uop.ops import UOp, Ops
from attograd.tensor import Tensor
from attograd.schedule.schedule import new_buffer
from attograd.engine.realize import buffer_of
from attograd.runtime.device import Device
from attograd.nn.module import Module, IncompatibleKeys, copy_state
from attograd.nn.quant import GGML_TYPES, dequantize, split_fields

__all__ = ["get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load", "safe_load_metadata", "torch_load",
           "gguf_load", "gguf_read", "GGUFStrings"]

SAFETENSORS_DTYPES: dict[str, DType] = {
  "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "I64": dtypes.int64,
  "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8, "U8": dtypes.uint8, "U16": dtypes.uint16,
  "U32": dtypes.uint32, "U64": dtypes.uint64, "BOOL": dtypes.bool}
SAFETENSORS_NAMES: dict[DType, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}

# ***** tensors on DISK *****

def _disk_tensor(path: str, offset: int, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  """A lazy tensor of `shape` whose bytes are at byte `offset` of the file."""
  buf = new_buffer(f"DISK:{path}", prod(shape), dtype)
  buf = buf.replace(arg=dataclasses.replace(buf.arg, offset=offset))
  buffer_of(buf).ensure_allocated()  # binds it to the file as it is now: a later replace doesn't change it
  return Tensor(buf if shape == (buf.arg.size,) else UOp(Ops.RESHAPE, dtype, (buf,), shape))

def _cpu_tensor(raw: bytes | memoryview, dtype: DType, shape: tuple[int, ...]) -> Tensor:
  buf = new_buffer("CPU", prod(shape), dtype)
  buffer_of(buf).copyin(memoryview(raw))
  return Tensor(buf if shape == (buf.arg.size,) else UOp(Ops.RESHAPE, dtype, (buf,), shape))

# ***** state dicts *****

def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every tensor reachable from obj through attributes, lists, tuples and dicts, by dotted name
  ("layers.0.weight", as torch names them). A tensor reachable twice appears under both names.
  An nn.Module contributes its state_dict(): its parameters and persistent buffers, as torch's would."""
  out: dict[str, Tensor] = {}
  on_path: set[int] = set()  # guards against cycles (a layer pointing back at its model)
  def walk(o: Any, name: str) -> None:
    if isinstance(o, tensor_type): out[name.rstrip(".")] = o; return
    if isinstance(o, Module): o.state_dict(out, name); return
    if id(o) in on_path or isinstance(o, (str, bytes, int, float, type, types.ModuleType, UOp)) or o is None: return
    if isinstance(o, dict): items: Any = o.items()
    elif isinstance(o, (list, tuple)): items = enumerate(o)
    elif hasattr(o, "__dict__") and isinstance(vars(o), dict): items = vars(o).items()
    else: return
    on_path.add(id(o))
    for k, v in list(items): walk(v, f"{name}{k}.")
    on_path.discard(id(o))
  walk(obj, prefix)
  return out

def get_parameters(obj: Any) -> list[Tensor]:
  """The distinct tensors of obj, in state-dict order (a shared tensor once, like torch's parameters())."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())

def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True, verbose: bool = False) -> IncompatibleKeys:
  """Copy state_dict's tensors into the model's (by get_state_dict names), as torch's load_state_dict.
  Everything is checked before anything is written: on an error the model is unchanged."""
  return copy_state(type(model).__name__, get_state_dict(model), state_dict, strict, verbose)

# ***** safetensors: 8-byte little-endian header length, a JSON header, then the data *****

def _bad(path: str, why: str) -> ValueError: return ValueError(f"{path}: not a valid safetensors file: {why}")

def _read_safetensors_header(path: str) -> tuple[dict[str, tuple[DType, tuple[int, ...], int]], dict[str, str], int]:
  """Each tensor's (dtype, shape, byte offset in the file), the user metadata, and the data start.
  Everything a tensor will read is checked here, so a malformed file fails now with a ValueError."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    head = f.read(8)
    if len(head) < 8: raise _bad(path, f"{size} bytes is too short for the 8-byte header length")
    n = int.from_bytes(head, "little")
    if n > size - 8: raise _bad(path, f"the header length {n} runs past the end of the file ({size} bytes)")
    raw = f.read(n)
  try: header = json.loads(raw)
  except (ValueError, RecursionError) as e: raise _bad(path, f"the header is not JSON ({e})") from None
  if not isinstance(header, dict): raise _bad(path, f"the header is a JSON {type(header).__name__}, not an object")
  data_start, data_len = 8 + n, size - 8 - n
  metadata = header.pop("__metadata__", None) or {}
  if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise _bad(path, "__metadata__ must map strings to strings")
  out = {}
  for name, info in header.items():
    if not isinstance(info, dict): raise _bad(path, f"the entry for {name!r} is not an object")
    dt, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if not isinstance(dt, str) or dt not in SAFETENSORS_DTYPES:
      raise _bad(path, f"{name!r} has unknown dtype {dt!r}; known: {', '.join(SAFETENSORS_DTYPES)}")
    if not isinstance(shape, list) or not all(type(s) is int and s >= 0 for s in shape):
      raise _bad(path, f"{name!r} has invalid shape {shape!r}")
    if not isinstance(offs, list) or len(offs) != 2 or not all(type(o) is int for o in offs) or not 0 <= offs[0] <= offs[1] <= data_len:
      raise _bad(path, f"{name!r} has data_offsets {offs!r} outside the {data_len} bytes of data")
    dtype = SAFETENSORS_DTYPES[dt]
    if offs[1] - offs[0] != prod(shape) * dtype.itemsize:
      raise _bad(path, f"{name!r} of shape {shape} and dtype {dt} needs {prod(shape) * dtype.itemsize} bytes, its data_offsets {offs} hold {offs[1] - offs[0]}")
    out[name] = (dtype, tuple(shape), data_start + offs[0])
  return out, metadata, data_start

def safe_load(path: str | os.PathLike) -> dict[str, Tensor]:
  """The tensors of a safetensors file, lazily on DISK: nothing but the header is read until a tensor is used."""
  path = os.path.abspath(os.fspath(path))
  entries, _, _ = _read_safetensors_header(path)
  return {name: _disk_tensor(path, off, dt, shape) for name, (dt, shape, off) in entries.items()}

def safe_load_metadata(path: str | os.PathLike) -> dict[str, str]:
  """The user metadata (the header's "__metadata__", as passed to safe_save), reading only the header."""
  return _read_safetensors_header(os.path.abspath(os.fspath(path)))[1]

def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write tensors as a safetensors file. The file appears complete or not at all: it is written
  aside in the same directory and renamed over `path` only once everything is on disk."""
  path = os.fspath(path)
  for k, t in tensors.items():
    if not isinstance(k, str) or k == "__metadata__": raise ValueError(f"invalid tensor name {k!r}")
    if not isinstance(t, Tensor): raise TypeError(f"safe_save: {k!r} is a {type(t).__name__}, not a Tensor")
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise TypeError("safe_save: metadata must map strings to strings")
  Tensor.realize_all(list({id(t): t for t in tensors.values() if not t.device.startswith("DISK")}.values()))
  header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
  for k, t in tensors.items(): header[k] = {"dtype": SAFETENSORS_NAMES[t.dtype], "shape": list(t.shape)}
  # data by falling item size, so that every tensor is aligned to its item size in the file
  order, pos = sorted(tensors, key=lambda k: -tensors[k].dtype.itemsize), 0
  for k in order:
    header[k]["data_offsets"] = [pos, pos + tensors[k].nbytes()]
    pos += tensors[k].nbytes()
  js = json.dumps(header, separators=(",", ":")).encode()
  js += b" " * (-len(js) % 8)  # pad so the data starts 8-byte aligned, as the safetensors package does
  tmp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{uuid.uuid4().hex[:12]}.tmp")
  try:
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
      f.write(struct.pack("<Q", len(js)) + js)
      for t in (tensors[k] for k in order): f.write(t.to("CPU").data() if t.device.startswith("DISK") else t.data())
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.unlink(tmp)

# ***** PyTorch checkpoints *****

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
    if self.raw is not None: return _cpu_tensor(self.raw[byte_offset:byte_offset + prod(shape) * dtype.itemsize], dtype, shape)
    return None if self.offset is None else _disk_tensor(self.path, self.offset + byte_offset, dtype, shape)

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
    return _cpu_tensor(out, flat.dtype, shape)
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

def torch_load(path: str | os.PathLike) -> Any:
  """What torch.save wrote (usually a state dict), with tensors as attograd Tensors, lazily on DISK
  where the saved view is contiguous. Only tensors, storages, OrderedDict and plain Python values are
  accepted: any other global in the pickle raises pickle.UnpicklingError before it can run."""
  path = os.path.abspath(os.fspath(path))
  try:
    if zipfile.is_zipfile(path):
      with zipfile.ZipFile(path) as z: return _torch_load_zip(path, z)
    with open(path, "rb") as f: return _torch_load_legacy(path, f)
  except (ForbiddenGlobal, ValueError, OSError): raise
  # a damaged pickle fails in many ways (IndexError, KeyError, TypeError from a call with wrong arguments, ...)
  except Exception as e: raise ValueError(f"{path}: truncated or corrupt PyTorch checkpoint ({type(e).__name__}: {e})") from e

# ***** GGUF (llama.cpp's format): a header of typed key/values and tensor descriptions, then aligned tensor data *****

class GGUFError(ValueError): pass

class GGUFTensorInfo(NamedTuple):
  name: str
  ggml_type: int               # a key of nn.quant.GGML_TYPES
  shape: tuple[int, ...]       # numpy order: the file's dims (fastest first) reversed
  offset: int                  # absolute byte offset in the file
  nbytes: int

# metadata value type id -> struct format (8: string, 9: array are read apart)
_GGUF_SCALARS: dict[int, str] = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

_U64 = struct.Struct("<Q")

class GGUFStrings(collections.abc.Sequence):
  """A GGUF array of strings, kept as the file's bytes (each string after its 8-byte length) and decoded when read. It
  reads as a list: len, indexing, slicing, iteration, == a list. A vocabulary's 49k tokens and 49k merges as Python
  strings were 100k objects, ~8 MiB of the process, and the pools they freed stayed resident, pinned by the objects made
  beside them; as bytes they are two buffers of under 1 MiB, freed whole."""
  __slots__ = ("raw", "_n", "_starts")
  def __init__(self, raw: bytes, n: int): self.raw, self._n, self._starts = raw, n, None
  def __len__(self) -> int: return self._n
  def spans(self) -> Iterator[tuple[int, int]]:
    """(start, end) of each string's UTF-8 bytes in `raw`, in order."""
    pos, raw, unpack = 0, self.raw, _U64.unpack_from
    for _ in range(self._n):
      end = pos + 8 + unpack(raw, pos)[0]
      yield pos + 8, end
      pos = end
  def __iter__(self) -> Iterator[str]:
    pos, raw, unpack = 0, self.raw, _U64.unpack_from
    for _ in range(self._n):
      end = pos + 8 + unpack(raw, pos)[0]
      yield raw[pos + 8:end].decode()
      pos = end
  def __getitem__(self, i: Any) -> Any:
    if isinstance(i, slice): return [self[j] for j in range(*i.indices(self._n))]
    if not -self._n <= i < self._n: raise IndexError(f"index {i} is out of range for {self._n} strings")
    if self._starts is None:  # where each string starts, found once (8 bytes a string) for reads out of order
      self._starts = array.array("Q", (a for a, _ in self.spans()))
    a = self._starts[i % self._n]
    return str(self.raw[a:a + _U64.unpack_from(self.raw, a - 8)[0]], "utf-8")
  def __eq__(self, other: object) -> bool:
    if isinstance(other, GGUFStrings): return self._n == other._n and self.raw == other.raw
    return isinstance(other, collections.abc.Sequence) and not isinstance(other, (str, bytes)) and len(other) == self._n and all(a == b for a, b in zip(self, other))
  __hash__ = None  # type: ignore[assignment]  # like a list
  def __repr__(self) -> str: return repr(list(self)) if self._n <= 8 else f"GGUFStrings([{', '.join(map(repr, self[:3]))}, ...], {self._n} strings)"

class _Reader:
  """Reads little-endian GGUF fields from a buffer, naming the field and file in every error."""
  def __init__(self, buf: memoryview, path: str): self.buf, self.pos, self.path = buf, 0, path
  def fail(self, field: str, why: str) -> GGUFError: return GGUFError(f"{self.path}: bad GGUF file at byte {self.pos}, {field}: {why}")
  def take(self, fmt: str, field: str, count: int = 1) -> Any:
    size = struct.calcsize("<" + fmt) * count
    if self.pos + size > len(self.buf):
      raise self.fail(field, f"needs {size} bytes, the file ends after {len(self.buf) - self.pos} (truncated?)")
    out = struct.unpack_from(f"<{count}{fmt}", self.buf, self.pos)
    self.pos += size
    return out[0] if count == 1 else list(out)
  def string(self, field: str) -> str:
    n = self.take("Q", f"{field} (string length)")
    if self.pos + n > len(self.buf): raise self.fail(field, f"a string of {n} bytes runs past the end of the file (truncated?)")
    raw = bytes(self.buf[self.pos:self.pos + n]); self.pos += n
    try: return raw.decode()
    except UnicodeDecodeError: raise self.fail(field, "a string that is not UTF-8") from None
  def strings(self, field: str, n: int) -> GGUFStrings:
    """An array of n strings, checked here (lengths within the file, UTF-8) and kept as its bytes."""
    start, buf, unpack = self.pos, self.buf, _U64.unpack_from
    for i in range(n):
      if self.pos + 8 > len(buf): raise self.fail(f"{field}[{i}] (string length)", f"needs 8 bytes, the file ends after {len(buf) - self.pos} (truncated?)")
      k = unpack(buf, self.pos)[0]
      if self.pos + 8 + k > len(buf): raise self.fail(f"{field}[{i}]", f"a string of {k} bytes runs past the end of the file (truncated?)")
      try: str(buf[self.pos + 8:self.pos + 8 + k], "utf-8")
      except UnicodeDecodeError: raise self.fail(f"{field}[{i}]", "a string that is not UTF-8") from None
      self.pos += 8 + k
    return GGUFStrings(bytes(buf[start:self.pos]), n)
  def value(self, vtype: int, field: str) -> Any:
    if vtype in _GGUF_SCALARS: return self.take(_GGUF_SCALARS[vtype], field)
    if vtype == 8: return self.string(field)
    if vtype == 9:
      etype, n = self.take("I", f"{field} (array type)"), self.take("Q", f"{field} (array length)")
      if etype in _GGUF_SCALARS: return self.take(_GGUF_SCALARS[etype], field, n) if n != 1 else [self.take(_GGUF_SCALARS[etype], field)]
      if etype == 8: return self.strings(field, n)
      if etype == 9: return [self.value(etype, f"{field}[{i}]") for i in range(n)]
      raise self.fail(field, f"unknown array element type {etype}; expected one of {sorted([*_GGUF_SCALARS, 8, 9])}")
    raise self.fail(field, f"unknown value type {vtype}; expected one of {sorted([*_GGUF_SCALARS, 8, 9])}")

def _parse_gguf(buf: memoryview, path: str, size: int) -> tuple[dict[str, Any], dict[str, GGUFTensorInfo]]:
  r = _Reader(buf, path)
  magic = bytes(buf[:4])
  if magic != b"GGUF": raise GGUFError(f"{path}: not a GGUF file: magic is {magic!r}, expected b'GGUF'")
  r.pos = 4
  version = r.take("I", "version")
  if version not in (2, 3): raise r.fail("version", f"version {version} is not supported (expected 2 or 3)")
  n_tensors, n_kv = r.take("Q", "tensor_count"), r.take("Q", "metadata_kv_count")
  if n_tensors > size or n_kv > size: raise r.fail("header", f"{n_tensors} tensors and {n_kv} metadata entries cannot fit in {size} bytes")
  meta: dict[str, Any] = {"GGUF.version": version}
  for i in range(n_kv):
    key = r.string(f"metadata key #{i}")
    meta[key] = r.value(r.take("I", f"{key} (value type)"), key)
  align = meta.get("general.alignment", 32)
  if not isinstance(align, int) or align <= 0 or align & (align - 1): raise r.fail("general.alignment", f"{align!r} is not a power of two")
  raw_infos = []
  for i in range(n_tensors):
    name = r.string(f"tensor #{i} name")
    nd = r.take("I", f"{name} (n_dims)")
    if nd > 8: raise r.fail(f"{name} (n_dims)", f"{nd} dimensions; expected at most 8")
    dims = r.take("Q", f"{name} (dims)", nd) if nd != 1 else [r.take("Q", f"{name} (dims)")]
    ttype, off = r.take("I", f"{name} (type)"), r.take("Q", f"{name} (offset)")
    raw_infos.append((name, list(dims) if nd else [], ttype, off))
  data_start = (r.pos + align - 1) // align * align
  infos: dict[str, GGUFTensorInfo] = {}
  for name, dims, ttype, off in raw_infos:
    if ttype not in GGML_TYPES:
      raise GGUFError(f"{path}: tensor {name!r} has ggml type {ttype}, which attograd does not read; supported: "
                      + ", ".join(f"{k} ({t.name})" for k, t in GGML_TYPES.items()))
    t, n = GGML_TYPES[ttype], prod(dims)
    if n % t.block_elements: raise GGUFError(f"{path}: tensor {name!r} of dims {dims} is not a whole number of {t.name} blocks of {t.block_elements}")
    nbytes = n // t.block_elements * t.block_bytes
    if off % align or data_start + off + nbytes > size:
      raise GGUFError(f"{path}: tensor {name!r} ({t.name}, dims {dims}) at data offset {off} needs bytes [{data_start + off}, {data_start + off + nbytes}) "
                      f"aligned to {align}, the file has {size} bytes (truncated?)")
    if name in infos: raise GGUFError(f"{path}: tensor {name!r} appears twice")
    infos[name] = GGUFTensorInfo(name, ttype, tuple(reversed(dims)), data_start + off, nbytes)
  return meta, infos

def gguf_read(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, GGUFTensorInfo]]:
  """The metadata and tensor descriptions of a GGUF file, reading only the header. Everything a tensor
  will read is checked here: a truncated or corrupt file raises GGUFError (a ValueError) naming the field."""
  path = os.path.abspath(os.fspath(path))
  size = os.path.getsize(path)
  if size < 4: raise GGUFError(f"{path}: not a GGUF file: {size} bytes")
  with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
    buf = memoryview(mm)
    try: return _parse_gguf(buf, path, size)
    finally: buf.release()

# types stored as plain values: read with their own dtype, not through the byte decoders
_GGUF_PLAIN = {0: dtypes.float32, 1: dtypes.float16, 30: dtypes.bfloat16}

def gguf_load(path_or_tensor: str | os.PathLike | Tensor, resident: bool = False, device: str = "CPU") -> tuple[dict[str, Any], dict[str, Tensor]]:
  """(metadata, tensors) of a GGUF file (v2 or v3). Tensors come in numpy dim order (the file lists dims fastest
  first). F32/F16/BF16 tensors keep their dtype; quantized ones (Q4_0 ... Q6_K) are float32 Tensors that are
  lazy dequantizations of the raw bytes, so a matmul that uses one fuses the decoding into its kernel.

  The bytes stay in the file (DISK) until a tensor is used; `resident=True` copies the raw (still quantized)
  bytes to `device` now, once, so later uses decode from memory instead of reading the file again.
  A Tensor argument is the file's bytes (uint8). Metadata arrays of strings are GGUFStrings: read-only sequences (indexing,
  iteration, == a list; list(x) for a list) kept as the file's bytes and decoded when read."""
  if isinstance(path_or_tensor, Tensor):
    src = path_or_tensor
    if src.dtype != dtypes.uint8 or src.ndim != 1: raise GGUFError(f"gguf_load: a Tensor argument must be the file's bytes (1-d uint8), got {src.shape} {src.dtype}")
    data = src.to("CPU").data()
    meta, infos = _parse_gguf(data.cast("B"), "<tensor>", len(data))
    def window(info: GGUFTensorInfo, dt: DType) -> Tensor:
      raw = src[info.offset:info.offset + info.nbytes]
      return raw if dt == dtypes.uint8 else _bytes_as(raw.to(device), dt)
  else:
    path = os.path.abspath(os.fspath(path_or_tensor))
    meta, infos = gguf_read(path)
    if resident and device == "CPU":
      # read straight into memory: through DISK's map, the file's pages would stay resident beside the copy
      f = open(path, "rb")
      def window(info: GGUFTensorInfo, dt: DType) -> Tensor:
        f.seek(info.offset)
        return _cpu_tensor(f.read(info.nbytes), dt, (info.nbytes // dt.itemsize,))
    else:
      def window(info: GGUFTensorInfo, dt: DType) -> Tensor: return _disk_tensor(path, info.offset, dt, (info.nbytes // dt.itemsize,))
  raws: dict[str, Any] = {}
  for name, info in infos.items():
    raws[name] = window(info, _GGUF_PLAIN.get(info.ggml_type, dtypes.uint8)).to(device)
    # resident: quantized tensors are kept as their fields apart (nn.quant.split_fields: the same bytes), plain ones as
    # they are; one tensor at a time, so its raw bytes are freed before the next is read (all read first, the weights
    # were twice in memory at the peak)
    if resident: raws[name] = raws[name].realize() if info.ggml_type in _GGUF_PLAIN else split_fields(raws[name], info.ggml_type, info.shape)
  if resident:
    if not isinstance(path_or_tensor, Tensor) and device == "CPU": f.close()
    # the raw bytes' buffers are free now, and no later buffer has their sizes: kept for reuse, they would hold the
    # file's size again in memory
    Device[device].allocator.release_cached()
  out = {}
  for name, info in infos.items():
    raw = raws[name]
    out[name] = raw.reshape(info.shape) if info.ggml_type in _GGUF_PLAIN else dequantize(raw, info.ggml_type, info.shape)
  return meta, out

def _bytes_as(raw: Tensor, dt: DType) -> Tensor:
  """uint8 bytes -> values of dtype dt (little-endian), with Tensor ops."""
  return dequantize(raw, {v: k for k, v in _GGUF_PLAIN.items()}[dt], (raw.numel() // dt.itemsize,)).cast(dt)
