"""nn.state: state dicts, safetensors and PyTorch checkpoints, and the DISK device they load onto."""
import collections, json, os, pickle, random, struct, zipfile
import numpy as np
import pytest
import torch
from attograd import Tensor, Device, dtypes
from attograd.nn.state import (get_parameters, get_state_dict, load_state_dict, safe_save, safe_load, safe_load_metadata, torch_load,
                               SAFETENSORS_NAMES)
from attograd.runtime import ops_disk
from helpers import TORCH_DTYPES, FROM_TORCH

def raw(t: Tensor) -> bytes:
  """A tensor's bytes, read from wherever it is."""
  return bytes((t.to("CPU") if t.device.startswith("DISK") else t).data())

def torch_raw(t: torch.Tensor) -> bytes: return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()

def random_bits(dtype, shape, rng: np.random.Generator) -> Tensor:
  """Any bit pattern of the dtype (NaN payloads, negative zero, ...), except bools, which are 0 or 1."""
  n = int(np.prod(shape))
  if dtype == dtypes.bool: return Tensor(rng.random(shape) < 0.5)
  data = rng.integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8).tobytes()
  if dtype == dtypes.bfloat16: return Tensor(np.frombuffer(data, np.uint16).reshape(shape)).bitcast(dtypes.bfloat16)
  return Tensor(np.frombuffer(data, np.dtype(dtype.name)).reshape(shape))

SHAPES = [(2, 3, 4), (), (0, 3), (5,)]

# ***** safetensors *****

def test_safe_round_trip_is_bit_exact_for_every_dtype(tmp_path):
  rng = np.random.default_rng(0)
  tensors = {f"{dt.name}.{i}": random_bits(dt, shape, rng) for dt in SAFETENSORS_NAMES for i, shape in enumerate(SHAPES)}
  path = tmp_path / "all.safetensors"
  safe_save(tensors, path, metadata={"format": "pt", "note": "é"})
  loaded = safe_load(path)
  assert list(loaded) == list(tensors)
  for k, t in tensors.items():
    assert loaded[k].device == f"DISK:{path}" and loaded[k].shape == t.shape and loaded[k].dtype == t.dtype, k
    assert raw(loaded[k]) == raw(t), k
  assert safe_load_metadata(path) == {"format": "pt", "note": "é"}
  # and the reference implementation reads what we wrote
  from safetensors.torch import load_file
  ref = load_file(str(path))
  for k, t in tensors.items():
    assert ref[k].dtype == TORCH_DTYPES[t.dtype] and tuple(ref[k].shape) == t.shape and torch_raw(ref[k]) == raw(t), k

def test_file_written_by_safetensors_package_loads(tmp_path):
  from safetensors.torch import save_file
  from safetensors.numpy import save_file as np_save_file
  g = torch.Generator().manual_seed(0)
  ref = {"w": torch.randn(4, 5, generator=g), "h": torch.randn(3, generator=g).half(), "b": torch.randn(2, 2, generator=g).bfloat16(),
         "i": torch.randint(-100, 100, (7,), generator=g), "u": torch.randint(0, 255, (3, 1), generator=g).to(torch.uint8),
         "m": torch.rand(6, generator=g) > 0.5, "d": torch.randn(2, generator=g).double(), "s": torch.tensor(3, dtype=torch.int32)}
  save_file(ref, str(tmp_path / "t.safetensors"), metadata={"k": "v"})
  loaded = safe_load(tmp_path / "t.safetensors")
  assert safe_load_metadata(tmp_path / "t.safetensors") == {"k": "v"}
  for k, v in ref.items():
    assert loaded[k].dtype == FROM_TORCH[v.dtype] and loaded[k].shape == tuple(v.shape) and raw(loaded[k]) == torch_raw(v), k
  arrs = {"a": np.arange(12, dtype=np.uint16).reshape(3, 4), "b": np.array([1.5, -2.0], dtype=np.float64)}
  np_save_file(arrs, str(tmp_path / "n.safetensors"))
  for k, v in safe_load(tmp_path / "n.safetensors").items(): np.testing.assert_array_equal(v.to("CPU").numpy(), arrs[k])

def test_safe_load_reads_only_the_header_and_then_one_tensors_bytes(tmp_path, monkeypatch):
  path = tmp_path / "big.safetensors"
  safe_save({"a": Tensor.arange(1000, dtype=dtypes.float32), "b": Tensor.arange(10, dtype=dtypes.int64)}, path)
  reads = []
  orig = ops_disk.FileMap.read
  monkeypatch.setattr(ops_disk.FileMap, "read", lambda self, dest, offset, p: (reads.append((offset, dest.nbytes)), orig(self, dest, offset, p))[1])
  loaded = safe_load(path)
  assert reads == []  # nothing but the header was read
  assert loaded["b"].to("CPU").tolist() == list(range(10))
  n = struct.unpack("<Q", path.read_bytes()[:8])[0]
  begin, end = json.loads(path.read_bytes()[8:8 + n])["b"]["data_offsets"]
  assert reads == [(8 + n + begin, 80)] and end - begin == 80

def test_safe_save_of_lazy_and_disk_tensors(tmp_path):
  a = Tensor.arange(6, dtype=dtypes.float32).reshape(2, 3)
  safe_save({"x": a.T * 2, "y": a.sum(1)}, tmp_path / "1.safetensors")
  l1 = safe_load(tmp_path / "1.safetensors")
  # DISK tensors, and views of them, save too; overwriting the file they come from is safe
  safe_save({"x": l1["x"], "x_row": l1["x"][1], "y": l1["y"]}, tmp_path / "1.safetensors")
  l2 = safe_load(tmp_path / "1.safetensors")
  assert l2["x"].to("CPU").tolist() == [[0., 6.], [2., 8.], [4., 10.]] and l2["x_row"].to("CPU").tolist() == [2., 8.]
  assert l2["y"].to("CPU").tolist() == [3., 12.]
  assert l1["x"].to("CPU").tolist() == [[0., 6.], [2., 8.], [4., 10.]]  # still the file it was loaded from

def _valid_file(tmp_path) -> bytes:
  safe_save({"a": Tensor([[1., 2.], [3., 4.]]), "b": Tensor([1, 2, 3], dtype=dtypes.int16), "c": Tensor(True)}, tmp_path / "ok.safetensors",
            metadata={"m": "x"})
  return (tmp_path / "ok.safetensors").read_bytes()

def _header_file(tmp_path, header, data: bytes = b"\0" * 16) -> str:
  js = json.dumps(header).encode() if not isinstance(header, bytes) else header
  (tmp_path / "h.safetensors").write_bytes(struct.pack("<Q", len(js)) + js + data)
  return str(tmp_path / "h.safetensors")

@pytest.mark.parametrize("header, match", [
  ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}}, "needs 8 bytes"),
  ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, "outside"),
  ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [-1, 15]}}, "outside"),
  ({"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, "unknown dtype 'C64'"),
  ({"a": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "invalid shape"),
  ({"a": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}, "invalid shape"),
  ({"a": {"dtype": "F32", "shape": [4]}}, "data_offsets"),
  ({"a": [1, 2]}, "not an object"),
  ([1, 2], "not an object"),
  ({"__metadata__": {"k": 1}}, "__metadata__"),
  (b"{not json", "not JSON"),
  (b"\xff\xfe", "not JSON"),
  (b"[" * 100000, "not JSON"),
])
def test_malformed_safetensors_raise_value_error(tmp_path, header, match):
  with pytest.raises(ValueError, match=match): safe_load(_header_file(tmp_path, header))

def test_bad_header_length_and_short_files(tmp_path):
  p = tmp_path / "x.safetensors"
  p.write_bytes(b"\x01\x02")
  with pytest.raises(ValueError, match="too short"): safe_load(p)
  p.write_bytes(struct.pack("<Q", 2**63) + b"{}")
  with pytest.raises(ValueError, match="runs past the end"): safe_load(p)

def test_fuzzed_safetensors_load_or_raise_value_error(tmp_path):
  good, rng = _valid_file(tmp_path), random.Random(0)
  hlen = 8 + struct.unpack("<Q", good[:8])[0]
  p = tmp_path / "fuzz.safetensors"
  outcomes = collections.Counter()
  for i in range(300):
    data = bytearray(good)
    if i % 3 == 0: data = data[:rng.randrange(len(data))]
    else:
      for _ in range(rng.randint(1, 3)): data[rng.randrange(hlen) if i % 3 == 1 else rng.randrange(hlen, len(data))] ^= 1 << rng.randrange(8)
    p.write_bytes(bytes(data))
    try: loaded = safe_load(p)
    except ValueError: outcomes["ValueError"] += 1; continue
    for t in loaded.values(): raw(t)  # whatever loads can be read
    outcomes["loaded"] += 1
  assert outcomes["ValueError"] > 150 and outcomes["loaded"] >= 100  # flips in the data load

def test_failed_save_leaves_no_file(tmp_path, monkeypatch):
  target = tmp_path / "out.safetensors"
  missing = Tensor.empty(4, device=f"DISK:{tmp_path / 'does-not-exist'}")  # reading it fails midway through the save
  with pytest.raises(FileNotFoundError): safe_save({"a": Tensor([1., 2.]), "b": missing}, target)
  assert os.listdir(tmp_path) == []
  safe_save({"a": Tensor([1., 2.])}, target)
  before = target.read_bytes()
  def broken(*a): raise OSError("disk full")
  monkeypatch.setattr(os, "fsync", broken)
  with pytest.raises(OSError, match="disk full"): safe_save({"a": Tensor([5., 6.])}, target)
  assert os.listdir(tmp_path) == ["out.safetensors"] and target.read_bytes() == before  # the old file is untouched
  monkeypatch.undo()
  monkeypatch.setattr(os, "replace", broken)
  with pytest.raises(OSError): safe_save({"a": Tensor([5., 6.])}, target)
  assert os.listdir(tmp_path) == ["out.safetensors"] and target.read_bytes() == before

# ***** PyTorch checkpoints *****

def _torch_state():
  g = torch.Generator().manual_seed(0)
  base = torch.randn(6, 8, generator=g)
  sd = collections.OrderedDict(
    f32=torch.randn(3, 4, generator=g), f16=torch.randn(5, generator=g).half(), bf16=torch.randn(2, 3, generator=g).bfloat16(),
    f64=torch.randn(4, generator=g).double(), i64=torch.randint(-2**40, 2**40, (3,), generator=g), i32=torch.tensor([-1, 7], dtype=torch.int32),
    i16=torch.tensor([-300, 2], dtype=torch.int16), i8=torch.tensor([-5, 5], dtype=torch.int8), u8=torch.tensor([0, 255], dtype=torch.uint8),
    u16=torch.tensor([1, 65535], dtype=torch.uint16), b=torch.tensor([True, False, True]), scalar=torch.tensor(2.5), empty=torch.zeros(0, 3),
    # views: storage offsets, transposes, steps, broadcasts, and an overlapping as_strided window
    offset=base[2:4], transposed=base.t(), stepped=base[1::2, ::3], column=base[:, 5], permuted=base.reshape(2, 3, 8).permute(2, 0, 1),
    expanded=torch.arange(3.).reshape(3, 1).expand(3, 4), overlapping=torch.arange(10.).as_strided((4, 3), (2, 1), 1),
    half_t=torch.randn(3, 5, generator=g).half().t())
  sd["tied"] = sd["f32"]  # shares a storage with f32
  return sd

@pytest.mark.parametrize("legacy", [False, True])
def test_torch_load_matches_torch(tmp_path, legacy):
  sd = _torch_state()
  torch.save(sd, tmp_path / "m.pt", _use_new_zipfile_serialization=not legacy)
  loaded = torch_load(tmp_path / "m.pt")
  assert isinstance(loaded, collections.OrderedDict) and list(loaded) == list(sd)
  for k, v in sd.items():
    assert loaded[k].shape == tuple(v.shape) and loaded[k].dtype == FROM_TORCH[v.dtype], k
    assert raw(loaded[k]) == torch_raw(v), k
  assert loaded["f32"].device.startswith("DISK") and loaded["offset"].device.startswith("DISK")  # contiguous views stay lazy

def test_torch_load_module_state_dict_and_compressed_zip(tmp_path):
  net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
  torch.save(net.state_dict(), tmp_path / "net.pt")
  sd = torch_load(tmp_path / "net.pt")
  assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias"]
  # the same archive recompressed: entries are read from the zip instead of mapped
  with zipfile.ZipFile(tmp_path / "net.pt") as zin, zipfile.ZipFile(tmp_path / "z.pt", "w", zipfile.ZIP_DEFLATED) as zout:
    for info in zin.infolist(): zout.writestr(info.filename, zin.read(info))
  for s in (sd, torch_load(tmp_path / "z.pt")):
    for k, v in net.state_dict().items(): np.testing.assert_array_equal(s[k].to("CPU").numpy(), v.numpy())
  torch.save(torch.nn.Parameter(torch.ones(2)), tmp_path / "p.pt")
  p = torch_load(tmp_path / "p.pt")
  assert p.requires_grad and p.to("CPU").tolist() == [1., 1.]

class Evil:
  def __init__(self, marker): self.marker = marker
  def __reduce__(self): return (os.system, (f"touch {self.marker}",))

@pytest.mark.parametrize("legacy", [False, True])
def test_malicious_pickle_is_refused_without_running(tmp_path, legacy):
  marker = tmp_path / "pwned"
  torch.save({"w": torch.ones(2), "x": Evil(marker)}, tmp_path / "evil.pt", _use_new_zipfile_serialization=not legacy)
  with pytest.raises(pickle.UnpicklingError, match=r"refuses the global (posix|os)\.system"): torch_load(tmp_path / "evil.pt")
  (tmp_path / "evil.pkl").write_bytes(pickle.dumps(Evil(marker)))
  with pytest.raises(pickle.UnpicklingError, match="system"): torch_load(tmp_path / "evil.pkl")
  assert not marker.exists()

def test_pickle_cant_set_attributes_of_what_it_names(tmp_path):
  # GLOBAL torch.float32 (attograd's dtypes.float32), then BUILD {"itemsize": 1}: would corrupt the dtype for everyone
  evil = b"\x80\x02ctorch\nfloat32\n}X\x08\x00\x00\x00itemsizeK\x01sb."
  with zipfile.ZipFile(tmp_path / "e.pt", "w") as z: z.writestr("e/data.pkl", evil)
  with pytest.raises(pickle.UnpicklingError, match="refuses to set the state of a DType"): torch_load(tmp_path / "e.pt")
  assert dtypes.float32.itemsize == 4

def test_truncated_torch_files_raise_value_error(tmp_path):
  for legacy in (False, True):
    torch.save(_torch_state(), tmp_path / "m.pt", _use_new_zipfile_serialization=not legacy)
    good = (tmp_path / "m.pt").read_bytes()
    for n in sorted({0, 1, 7, len(good) // 3, len(good) // 2, len(good) - 100, len(good) - 1}):
      (tmp_path / "t.pt").write_bytes(good[:n])
      with pytest.raises(ValueError): torch_load(tmp_path / "t.pt")

# ***** state dicts *****

class Linear:
  def __init__(self, i, o): self.weight, self.bias = Tensor.zeros(o, i).contiguous().realize(), Tensor.zeros(o).contiguous().realize()

class Block:
  def __init__(self):
    self.attn, self.norm = Linear(2, 2), {"scale": Tensor.ones(2).contiguous().realize()}
    self.parent = None  # set to the model: a cycle

class Model:
  def __init__(self):
    self.embed = Tensor.zeros(5, 2).contiguous().realize()
    self.layers = [Block(), Block()]
    self.head = Linear(2, 3)
    self.name, self.n = "m", 3
    for b in self.layers: b.parent = self

def test_get_state_dict_names_like_torch():
  m = Model()
  sd = get_state_dict(m)
  assert list(sd) == ["embed", "layers.0.attn.weight", "layers.0.attn.bias", "layers.0.norm.scale", "layers.1.attn.weight",
                      "layers.1.attn.bias", "layers.1.norm.scale", "head.weight", "head.bias"]
  assert sd["head.weight"] is m.head.weight
  assert list(get_state_dict(m.head, prefix="model.head.")) == ["model.head.weight", "model.head.bias"]
  assert get_state_dict(m.embed, prefix="e.") == {"e": m.embed}
  m.head.weight = m.embed  # tied: listed under both names, but one parameter
  assert "head.weight" in get_state_dict(m) and "embed" in get_state_dict(m)
  assert len(get_parameters(m)) == 8 and any(p is m.embed for p in get_parameters(m))

def test_load_state_dict_copies_values():
  m = Model()
  sd = {k: Tensor.full(v.shape, i, dtype=v.dtype) for i, (k, v) in enumerate(get_state_dict(m).items())}
  res = load_state_dict(m, sd)
  assert res.missing_keys == [] and res.unexpected_keys == []
  assert m.layers[1].attn.bias.tolist() == [5., 5.] and m.head.weight.tolist() == [[7., 7.]] * 3 and m.embed.device == "CPU"

def test_load_state_dict_from_disk_files(tmp_path):
  m = Model()
  sd = {k: Tensor.rand(*v.shape) for k, v in get_state_dict(m).items()}
  safe_save(sd, tmp_path / "m.safetensors")
  load_state_dict(m, safe_load(tmp_path / "m.safetensors"))
  assert m.layers[0].attn.weight.tolist() == sd["layers.0.attn.weight"].tolist() and m.layers[0].attn.weight.device == "CPU"
  lin = torch.nn.Linear(2, 3)
  torch.save(lin.state_dict(), tmp_path / "l.pt")
  load_state_dict(m.head, torch_load(tmp_path / "l.pt"))
  np.testing.assert_array_equal(m.head.weight.numpy(), lin.weight.detach().numpy())

def test_load_state_dict_strictness_and_mismatches():
  m = Model()
  sd = {k: v.zeros_like() + 1 for k, v in get_state_dict(m).items()}
  with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "head.bias"'): load_state_dict(m, {k: v for k, v in sd.items() if k != "head.bias"})
  with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "extra"'): load_state_dict(m, {**sd, "extra": Tensor([1.])})
  assert m.embed.tolist() == [[0., 0.]] * 5  # nothing was written by the failed loads
  res = load_state_dict(m, {**{k: v for k, v in sd.items() if k != "head.bias"}, "extra": Tensor([1.])}, strict=False)
  assert res.missing_keys == ["head.bias"] and res.unexpected_keys == ["extra"] and m.embed.tolist() == [[1., 1.]] * 5
  with pytest.raises(RuntimeError, match=r"size mismatch for head.weight: .*shape \(2, 3\) from checkpoint.*model is \(3, 2\)"):
    load_state_dict(m, {**sd, "head.weight": Tensor.zeros(2, 3)})
  with pytest.raises(RuntimeError, match=r"dtype mismatch for embed: .*dtypes.float16 from checkpoint.*model is dtypes.float32"):
    load_state_dict(m, {**sd, "embed": Tensor.zeros(5, 2, dtype=dtypes.float16)}, strict=False)

# ***** the DISK device *****

def test_disk_device(tmp_path):
  path = tmp_path / "Mixed Case.bin"
  assert Device.canonicalize(f"disk:{path}") == f"DISK:{path}"
  t = Tensor([1, 2, 3], dtype=dtypes.int32).to(f"DISK:{path}").realize()
  assert path.read_bytes() == struct.pack("<3i", 1, 2, 3) and t.tolist() == [1, 2, 3]
  with pytest.raises(RuntimeError, match=r"can't run kernels.*to\('CPU'\)"): (t + 1).realize()
  assert (t.to("CPU") + 1).tolist() == [2, 3, 4]
  with pytest.raises(ValueError, match="needs a file"): Device["DISK"]

def test_disk_read_past_a_truncated_file_raises(tmp_path):
  path = tmp_path / "t.safetensors"
  safe_save({"a": Tensor.arange(100, dtype=dtypes.float32)}, path)
  t = safe_load(path)["a"]
  with open(path, "r+b") as f: f.truncate(100)  # the same file, now shorter: the map must not be read past its end
  with pytest.raises(ValueError, match="which has only 100 bytes"): t.to("CPU").realize()
