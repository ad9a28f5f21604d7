"""GGUF loading: every tensor type against the `gguf` package's own dequantization, on files written with its
GGUFWriter (random bytes in every block, with finite float16 scales), metadata of every value type, the file's
bytes as a Tensor, and clear errors for truncated or corrupt files."""
import os
import numpy as np
import pytest
gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q
from attograd import Tensor, dtypes
from attograd.nn.state import gguf_load, gguf_read
from attograd.nn.quant import GGML_TYPES

# byte offsets of the float16 scales inside each block type (random bytes there could be inf/nan)
F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82], "Q3_K": [108],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}
rng = np.random.default_rng(0)

def random_blocks(name: str, rows: int, cols: int) -> np.ndarray:
  """The bytes of a (rows, cols) tensor of type `name`: random, except that float16 fields are finite."""
  t = GGML_TYPES[Q[name].value]
  if name == "F32": return rng.standard_normal((rows, cols)).astype(np.float32)
  if name == "F16": return rng.standard_normal((rows, cols)).astype(np.float16)
  nb = rows * cols // t.block_elements
  if name == "BF16": return (rng.standard_normal(rows * cols).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(rows, -1)
  raw = rng.integers(0, 256, (nb, t.block_bytes), dtype=np.uint8)
  for o in F16_AT[name]: raw[:, o:o + 2] = (rng.standard_normal((nb, 1)) * 0.1).astype(np.float16).view(np.uint8)
  return raw.reshape(rows, -1)

# (rows, cols) per type: several blocks per row, several rows, a single block, rows in groups (nn.quant.ROW_GROUP) that a
# resident load interleaves
SHAPES = [(3, 2), (1, 1), (4, 3), (32, 2)]

@pytest.fixture(scope="module")
def written(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("gguf") / "all.gguf")
  w = gguf.GGUFWriter(path, "llama")
  w.add_uint32("test.u32", 7); w.add_float32("test.f32", 0.5); w.add_string("test.s", "héllo 🦙")
  w.add_bool("test.b", True); w.add_array("test.arr", [1, 2, 3]); w.add_array("test.strs", ["a", "", "ß"])
  w.add_int64("test.i64", -5); w.add_float64("test.f64", 1.25)
  expected = {}
  for name in [t.name for t in GGML_TYPES.values()]:
    bs = GGML_TYPES[Q[name].value].block_elements
    for i, (r, c) in enumerate(SHAPES):
      cols = c * bs if bs > 1 else 5 * c
      data = random_blocks(name, r, cols)
      tname = f"{name}.{i}"
      if name in ("F32", "F16"): w.add_tensor(tname, data)
      else: w.add_tensor(tname, data, raw_dtype=Q[name])
      expected[tname] = gguf.quants.dequantize(data.view(np.uint8) if name not in ("F32", "F16") else data, Q[name]).reshape(r, cols)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  return path, expected

def test_every_type_matches_gguf(written):
  path, expected = written
  meta, tensors = gguf_load(path)
  assert set(tensors) == set(expected)
  Tensor.realize_all([t.float() for t in tensors.values()])
  for name, ref in expected.items():
    got = tensors[name].float().numpy()
    assert got.shape == ref.shape, name
    np.testing.assert_allclose(got, ref.astype(np.float32), rtol=1e-6, atol=1e-7, err_msg=name)

def test_metadata(written):
  meta, infos = gguf_read(written[0])
  assert meta["general.architecture"] == "llama" and meta["test.u32"] == 7 and meta["test.f32"] == 0.5
  assert meta["test.s"] == "héllo 🦙" and meta["test.b"] is True and meta["test.arr"] == [1, 2, 3]
  assert meta["test.strs"] == ["a", "", "ß"] and meta["test.i64"] == -5 and meta["test.f64"] == 1.25
  assert meta["GGUF.version"] == 3 and infos["Q4_K.0"].shape == (3, 512)

def test_string_arrays_read_as_lists(written):
  # an array of strings stays the file's bytes (a vocabulary's 100k strings as Python objects were ~8 MiB), decoded when read
  path = written[0]
  strs = gguf_read(path)[0]["test.strs"]
  assert len(strs) == 3 and list(strs) == ["a", "", "ß"] and strs[2] == strs[-1] == "ß" and strs[1:] == ["", "ß"]
  assert strs == ["a", "", "ß"] and ["a", "", "ß"] == strs and strs != ["a", "", "s"] and strs != ["a", ""] and strs != "a"
  assert repr(strs) == "['a', '', 'ß']" and strs.index("ß") == 2 and "" in strs and strs == gguf_read(path)[0]["test.strs"]
  with pytest.raises(IndexError): strs[3]
  # a string that is not UTF-8, or one that runs past the end, is found when the file is read
  data = open(path, "rb").read()
  at = data.index(b"\x01\x00\x00\x00\x00\x00\x00\x00a\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\xc3\x9f")  # test.strs' elements
  for bad, name, why in [(data[:at + 8] + b"\xff" + data[at + 9:], "utf8.gguf", r"test\.strs\[0\]: a string that is not UTF-8"),
                         (data[:at] + (2 ** 40).to_bytes(8, "little") + data[at + 8:], "long.gguf", r"test\.strs\[0\]: a string of 1099511627776 bytes runs past")]:
    p = os.path.join(os.path.dirname(path), name)
    with open(p, "wb") as f: f.write(bad)
    with pytest.raises(ValueError, match=name.replace(".", r"\.") + ".*" + why): gguf_read(p)

def test_resident_and_tensor_source(written):
  path, expected = written
  _, res = gguf_load(path, resident=True)
  _, from_bytes = gguf_load(Tensor(np.fromfile(path, dtype=np.uint8)))
  for name in ("Q4_1.2", "Q6_K.0", "F16.0", "BF16.2"):
    np.testing.assert_allclose(res[name].float().numpy(), expected[name], rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(from_bytes[name].float().numpy(), expected[name], rtol=1e-6, err_msg=name)
  # every block type at 32 rows: those interleaved in groups of 16 (nn.quant.ROW_GROUPED) read back in row order
  for name in (f"{t.name}.3" for t in GGML_TYPES.values() if t.block_elements > 1):
    np.testing.assert_allclose(res[name].numpy(), expected[name], rtol=1e-6, atol=1e-7, err_msg=name)

def test_matmul_with_quantized_weight(written):
  path, expected = written
  _, t = gguf_load(path, resident=True)
  x = rng.standard_normal((2, 96)).astype(np.float32)
  np.testing.assert_allclose((Tensor(x) @ t["Q4_1.2"].T).numpy(), x @ expected["Q4_1.2"].T, rtol=1e-4, atol=1e-4)

def test_bad_files(written, tmp_path):
  path, _ = written
  data = open(path, "rb").read()
  def load(raw: bytes, name: str):
    p = tmp_path / name; p.write_bytes(raw); return gguf_load(str(p))
  with pytest.raises(ValueError, match="not a GGUF file.*magic"): load(b"GGML" + data[4:], "magic.gguf")
  with pytest.raises(ValueError, match="version 9 is not supported"): load(data[:4] + (9).to_bytes(4, "little") + data[8:], "version.gguf")
  with pytest.raises(ValueError, match=r"trunc\.gguf.*truncated"): load(data[:200], "trunc.gguf")
  with pytest.raises(ValueError, match=r"cut\.gguf: tensor .* the file has .* bytes \(truncated\?\)"): load(data[:-100], "cut.gguf")
  with pytest.raises(ValueError, match="not a GGUF file"): load(b"", "empty.gguf")
  # an unknown tensor type: IQ2_XXS (16), which attograd does not read
  p = str(tmp_path / "iq.gguf")
  w = gguf.GGUFWriter(p, "llama")
  w.add_tensor("w", np.zeros((1, 66), np.uint8), raw_dtype=Q.IQ2_XXS)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  with pytest.raises(ValueError, match=r"iq\.gguf: tensor 'w' has ggml type 16"): gguf_load(p)

def test_quantized_matvec_inner_loop_vectorizes(tmp_path):
  """A decode step's matvec over Q8_0 weights: gcc vectorizes the loop over a block's bytes (the SIMD loop inside the
  reduce). With gcc's unroll-and-jam on (-O3's default), two blocks' iterations were fused into it, the second block's
  scale became a load the vectorizer couldn't analyse, and the loop stayed scalar (4x slower)."""
  import re, subprocess
  from attograd.runtime.device import Device
  from attograd.engine.realize import get_kernel
  from attograd.nn.quant import split_fields, dequantize
  from attograd.codegen.opt import Opt, OptOps
  dev = Device["CPU"]
  cc = getattr(dev.compiler, "cc", "")
  if "gcc" not in os.path.basename(os.path.realpath(__import__("shutil").which(cc) or cc)): pytest.skip("the CPU compiler is not gcc")
  rows, cols = 64, 576
  w = dequantize(split_fields(Tensor(random_blocks("Q8_0", rows, cols).reshape(-1)), Q.Q8_0.value), Q.Q8_0.value, (rows, cols))
  x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
  # 16 partial sums (the heuristics' first choice) and nothing else: the reduce loop left runs over half-blocks, the scale
  # read at r//2
  src = get_kernel((x @ w.T).schedule()[-1].ast, "CPU", [Opt(OptOps.UPCAST, 1, 16)]).src
  lines = src.splitlines()
  # the SIMD loop: a loop the renderer keeps rolled (pragma) that reads the weight bytes
  loop = next(i + 2 for i, l in enumerate(lines) if "#pragma GCC unroll 1" in l and "unsigned char" in "".join(lines[i + 1:i + 8]))
  (tmp_path / "k.c").write_text(src)
  flags = [f for f in dev.compiler.flags if f not in ("-shared", "-lm")]
  out = subprocess.run([cc, *flags, "-c", str(tmp_path / "k.c"), "-o", str(tmp_path / "k.o"), "-fopt-info-vec-optimized"],
                       capture_output=True, text=True, check=True)
  assert re.search(rf"k\.c:{loop}:\d+: optimized: loop vectorized", out.stderr), f"line {loop} not vectorized:\n{out.stderr}\n{src}"
  np.testing.assert_allclose((x @ w.T).numpy(), x.numpy() @ w.numpy().T, rtol=1e-4, atol=1e-4)

def test_quantized_matvec_several_rows_at_once():
  """A decode step's matvec over Q4_1 weights computes 4 rows at once (codegen/heuristic.py matvec_rows: independent
  accumulator chains, each value of the vector loaded once for them), and its values still match gguf's dequantization.
  A depthwise conv's short window (same weights at every pixel, 9 terms) gets no such rows."""
  from attograd.runtime.device import Device
  from attograd.codegen.heuristic import cpu_opts
  from attograd.codegen.opt import Opt, OptOps
  from attograd.nn.quant import split_fields, dequantize
  rows, cols = 256, 576
  raw = random_blocks("Q4_1", rows, cols)
  w = dequantize(split_fields(Tensor(raw.reshape(-1)), Q.Q4_1.value), Q.Q4_1.value, (rows, cols))
  x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
  y = x @ w.T
  opts = cpu_opts(y.schedule()[-1].ast, 1, 16)
  assert Opt(OptOps.UPCAST, 0, 4) in opts, opts
  ref = x.numpy().astype(np.float64) @ gguf.quants.dequantize(raw, Q.Q4_1).reshape(rows, cols).astype(np.float64).T
  np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
  conv = Tensor.empty(1, 64, 26, 66).conv2d(Tensor.empty(64, 1, 3, 3), groups=64)
  assert not any(o.op is OptOps.UPCAST and o.axis == 0 for o in cpu_opts(conv.schedule()[-1].ast, 1, 16))

def test_quantized_matvec_reads_a_row_group_together():
  """Given the tensor's shape, split_fields interleaves its rows in groups of 16 block by block (nn.quant.ROW_GROUP):
  a decode step's matvec then computes a group's 16 rows at once (codegen/heuristic.py matvec_rows), reading the
  weights as one run front to back, and its values still match gguf's dequantization. Without the shape, the GGUF
  order and 4 rows. The scales stay float16 (the file's bytes), and the matvec converts a block's scales for all the
  rows it computes at once (WIDEN)."""
  from attograd.codegen.heuristic import cpu_opts
  from attograd.codegen.opt import Opt, OptOps
  from attograd.nn.quant import split_fields, dequantize, ROW_GROUP
  rows, cols = 96, 576
  raw = random_blocks("Q4_1", rows, cols)
  x = Tensor(rng.standard_normal((1, cols)).astype(np.float32)).realize()
  ref = x.numpy().astype(np.float64) @ gguf.quants.dequantize(raw, Q.Q4_1).reshape(rows, cols).astype(np.float64).T
  for shape, amount in (((rows, cols), ROW_GROUP), (None, 4)):
    fields = split_fields(Tensor(raw.reshape(-1)), Q.Q4_1.value, shape)
    assert {v.dtype for k, v in fields.items() if k[0] == "f16"} == {dtypes.float16}
    w = dequantize(fields, Q.Q4_1.value, (rows, cols))
    y = x @ w.T
    sched = y.schedule()
    # one kernel: the fields are read as split_fields stored them (a view of the lazy layout rebuilt it from the raw
    # bytes in kernels of its own on every use, and kept the raw bytes alive)
    assert len(sched) == 1, [si.ast.arg for si in sched]
    opts = cpu_opts(sched[-1].ast, 1, 16)
    assert Opt(OptOps.UPCAST, 0, amount) in opts and Opt(OptOps.WIDEN, 0, 0) in opts, (shape, opts)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-4)
