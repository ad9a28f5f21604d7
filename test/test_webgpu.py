"""The WEBGPU backend beyond the op suite (which runs on it through helpers.DEVICES): LOCAL and GROUP
work-groups on real dispatches, sub-word buffers written by neighbouring invocations, and the
kernels it refuses, with the reason."""
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.codegen.opt import Opt, OptOps
from attograd.uop.ops import UOp, Ops
from attograd.engine.realize import run_schedule, buffer_of, get_kernel
from attograd.renderer.wgsl import WGSLRenderer
from attograd.runtime.device import Device
from helpers import DEVICES, run_last_kernel

pytestmark = pytest.mark.skipif("WEBGPU" not in DEVICES, reason="no WEBGPU here: pip install wgpu; apt-get install mesa-vulkan-drivers libvulkan1")
L, G = OptOps.LOCAL, OptOps.GROUP
NP = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.int8: np.int8, dtypes.float16: np.float16}

def run_webgpu(t: Tensor, opts: list[Opt]) -> np.ndarray: return run_last_kernel(t, "WEBGPU", opts)

rng = np.random.default_rng(0)
A, B = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal((48, 24)).astype(np.float32)
R = rng.standard_normal((4, 4096)).astype(np.float32)
def W(x: np.ndarray) -> Tensor: return Tensor(x, device="WEBGPU")

@pytest.mark.parametrize("opts", [
  [], [Opt(L, 1, 8), Opt(L, 0, 4)], [Opt(G, 2, 16)], [Opt(L, 1, 4), Opt(G, 2, 12)], [Opt(L, 1, 3), Opt(L, 0, 2), Opt(G, 2, 8)], None],
  ids=["none", "local", "group", "local_group", "2local_group", "heuristic"])
def test_matmul(opts):
  t = W(A) @ W(B)
  if opts is None:  # the heuristics' choice, through the ordinary path
    np.testing.assert_allclose(t.numpy(), A @ B, rtol=1e-5, atol=1e-5)
    return
  np.testing.assert_allclose(run_webgpu(t, opts), A @ B, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("case, opts", [
  ("sum", [Opt(G, 0, 256)]), ("row_sum", [Opt(G, 1, 64)]), ("row_sum", [Opt(L, 0, 4), Opt(G, 1, 32)]),
  ("row_max", [Opt(G, 1, 128)]), ("row_max", [Opt(L, 0, 2)])])
def test_reduce(case, opts):
  t, ref = {"sum": (W(R).sum(), R.sum()), "row_sum": (W(R).sum(1), R.sum(1)), "row_max": (W(R).max(axis=1), R.max(1))}[case]
  np.testing.assert_allclose(run_webgpu(t, opts), ref, rtol=1e-4, atol=1e-4)

def test_long_reduce_is_grouped():
  """A 2**17-element sum needs more loop iterations than lavapipe runs in one invocation: the
  heuristics GROUP it, and a NOOPT kernel is refused instead of silently truncated."""
  x = rng.standard_normal(1 << 17).astype(np.float32)
  np.testing.assert_allclose(W(x).sum().numpy(), x.sum(dtype=np.float64), rtol=1e-4)
  if Device["WEBGPU"].renderer.loop_limit is None: pytest.skip("this adapter runs loops of any length")
  with pytest.raises(RuntimeError, match="65535"): run_webgpu(W(x).sum(), [])

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.float16])
def test_subword_stores_from_neighbouring_invocations(dtype):
  """int8/float16 elements share 32-bit words: invocations writing neighbours must not lose writes."""
  x = rng.integers(-60, 60, (16, 64)).astype(NP[dtype])
  got = run_webgpu(W(x) * 2, [Opt(L, 0, 64)])  # (one loop of 16*64: its rows are contiguous)
  np.testing.assert_array_equal(got, x * 2)

def _ast(t: Tensor):
  return t.contiguous().schedule()[-1].ast

def test_refuses_dtypes_the_adapter_lacks():
  plain = WGSLRenderer()  # a browser's WebGPU: no int64, float64 or float16
  with pytest.raises(TypeError, match="WEBGPU has no int64"): to_program(_ast(Tensor([1, 2], device="PYTHON") + 1), plain)
  with pytest.raises(TypeError, match="WEBGPU has no float64"): to_program(_ast(Tensor([1.0], dtype=dtypes.float64, device="PYTHON") * 2), plain)
  with pytest.raises(TypeError, match="WEBGPU has no float16"): to_program(_ast(Tensor([1.0], dtype=dtypes.float16, device="PYTHON") * 2), plain)
  to_program(_ast(Tensor([1, 2], dtype=dtypes.int8, device="PYTHON") + 1), plain)  # packed in words: fine anywhere

def test_refuses_float64_transcendentals():
  with pytest.raises(TypeError, match="exp2 in float64"): W(np.ones(3)).exp2().numpy()
  with pytest.raises(TypeError, match="log2 in float64"): W(np.ones(3)).log().numpy()

def test_float64_exp():
  """exp is arithmetic (uop/mathlib.py), so float64 exp runs where float64 exp2 is refused."""
  x = np.array([-800.0, -700.0, -1.5, 0.0, 1e-10, 2.5, 700.0, 710.0, np.inf, -np.inf, np.nan])
  with np.errstate(over="ignore"): np.testing.assert_allclose(W(x).exp().numpy(), np.exp(x), rtol=3e-16, atol=0)

def test_symbolic_size_goes_through_the_uniform():
  """A kernel over a Variable-sized axis: its value reaches the shader and the launch size."""
  x = Tensor(np.arange(16, dtype=np.float32), device="WEBGPU")
  sched = (x * 2 + 1).contiguous().schedule()
  run_schedule(sched[:-1])
  si = sched[-1]
  r = next(u for u in si.ast.toposort if u.op is Ops.RANGE)
  n = UOp.variable("n", 1, 16)
  bufs = [buffer_of(b).ensure_allocated() for b in si.bufs]
  ck = get_kernel(si.ast.substitute({r.src[0]: n}), "WEBGPU")
  assert "var<uniform> vars" in ck.src
  ck([b._buf for b in bufs], {n: 10})
  got = np.frombuffer(bytes(bufs[0].as_bytes()), np.float32)
  np.testing.assert_array_equal(got, np.concatenate([np.arange(10) * 2 + 1, np.zeros(6)]).astype(np.float32))

def test_heuristics_fill_work_groups():
  """Work-groups of the device's preferred size over a matmul's outputs; a long reduce with one output is GROUPed."""
  mm = _ast(W(A) @ W(B))
  opts = get_kernel(mm, "WEBGPU").opts
  threads = int(np.prod([o.amount for o in opts if o.op is L]))
  assert 16 <= threads <= Device["WEBGPU"].renderer.workgroup_pref, opts
  assert any(o.op is G for o in get_kernel(_ast(W(R).sum()), "WEBGPU").opts)

def test_synchronize_waits_for_queued_kernels():
  from attograd.runtime.device import Device
  t = (Tensor(np.arange(1024, dtype=np.float32), device="WEBGPU") * 2).realize()
  Device["WEBGPU"].synchronize()
  assert t.numpy()[-1] == 2046.0
