"""Model state and file formats: state dicts by dotted name, safetensors (save and lazy load) and
PyTorch checkpoints (.pt/.pth, zip and legacy formats) read through a restricted unpickler.

Loaded tensors live on the DISK device: a window into the file, read only when copied to a compute
device (load_state_dict does that), so loading touches just the bytes of the tensors used."""
from __future__ import annotations
import array, collections, collections.abc, json, mmap, os, struct, types
from typing import Any, Iterator, NamedTuple
from attograd.dtype import DType, dtypes
from attograd.helpers import prod
from attograd.uop.ops import UOp
from attograd.tensor import Tensor
from attograd.runtime.device import Device
from attograd.nn.module import Module, IncompatibleKeys, copy_state
from attograd.nn.quant import GGML_TYPES, dequantize, split_fields
from attograd.nn.file_tensors import cpu_tensor, disk_tensor

__all__ = ["get_parameters", "get_state_dict", "load_state_dict", "safe_save", "safe_load", "safe_load_metadata", "torch_load",
           "gguf_load", "gguf_read", "GGUFStrings"]

SAFETENSORS_DTYPES: dict[str, DType] = {
  "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16, "I64": dtypes.int64,
  "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8, "U8": dtypes.uint8, "U16": dtypes.uint16,
  "U32": dtypes.uint32, "U64": dtypes.uint64, "BOOL": dtypes.bool}
SAFETENSORS_NAMES: dict[DType, str] = {v: k for k, v in SAFETENSORS_DTYPES.items()}

# ***** tensors on DISK *****

# ***** state dicts *****

def get_state_dict(obj: Any, prefix: str = "", tensor_type: type = Tensor) -> dict[str, Tensor]:
  """Every tensor reachable from obj through attributes, lists, tuples and dicts, by dotted name
  ("layers.0.weight", as torch names them). A tensor reachable twice appears under both names.
  An nn.Module contributes its state_dict(): its parameters and persistent buffers, as torch's would."""
  out: dict[str, Tensor] = {}
  _walk_state(obj, prefix, out, set(), tensor_type)
  return out

def _walk_state(o: Any, name: str, out: dict[str, Tensor], on_path: set[int], tensor_type: type) -> None:
  """get_state_dict's walk: the tensors reachable from o into out; on_path guards against cycles (a layer pointing back
  at its model)."""
  if isinstance(o, tensor_type): out[name.rstrip(".")] = o; return
  if isinstance(o, Module): o.state_dict(out, name); return
  if id(o) in on_path or isinstance(o, (str, bytes, int, float, type, types.ModuleType, UOp)) or o is None: return
  if isinstance(o, dict): items: Any = o.items()
  elif isinstance(o, (list, tuple)): items = enumerate(o)
  elif hasattr(o, "__dict__") and isinstance(vars(o), dict): items = vars(o).items()
  else: return
  on_path.add(id(o))
  for k, v in list(items): _walk_state(v, f"{name}{k}.", out, on_path, tensor_type)
  on_path.discard(id(o))

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
  return {name: disk_tensor(path, off, dt, shape) for name, (dt, shape, off) in entries.items()}

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
  import uuid  # (here: 0.2 MiB resident, for a name no other process picks)
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

# ***** PyTorch checkpoints (nn/torch_checkpoint.py) *****

def torch_load(path: str | os.PathLike) -> Any:
  """What torch.save wrote (usually a state dict), with tensors as attograd Tensors, lazily on DISK
  where the saved view is contiguous. Only tensors, storages, OrderedDict and plain Python values are
  accepted: any other global in the pickle raises pickle.UnpicklingError before it can run."""
  import attograd.nn.torch_checkpoint as torch_checkpoint  # (imported here: it needs pickle, 0.4 MiB resident in a process that loads no checkpoint)
  return torch_checkpoint.load(path)

def __getattr__(name: str) -> Any:  # the checkpoint loader's names, as they were when it lived here
  if name in ("ForbiddenGlobal", "TORCH_DTYPES", "TORCH_STORAGES"):
    import attograd.nn.torch_checkpoint as torch_checkpoint
    return getattr(torch_checkpoint, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

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
        return cpu_tensor(f.read(info.nbytes), dt, (info.nbytes // dt.itemsize,))
    else:
      def window(info: GGUFTensorInfo, dt: DType) -> Tensor: return disk_tensor(path, info.offset, dt, (info.nbytes // dt.itemsize,))
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
