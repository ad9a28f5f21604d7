"""Shared helpers for the op tests: run the same function on attograd and on torch with the same
inputs and compare shape, dtype and values."""
from __future__ import annotations
import os
from typing import Any, Callable, Sequence
import numpy as np
import pytest
import torch
from attograd import Tensor, dtypes, DType
from attograd.runtime.device import Device

try: import z3  # noqa: F401  libz3 loaded after lavapipe's LLVM (the WEBGPU probe below) segfaults; loaded first, both work
except ImportError: pass

def available(device: str) -> bool:
  """Whether a backend can run here (LLVM needs llvmlite, CL an OpenCL driver, WEBGPU wgpu and a Vulkan driver)."""
  try: Device[device]
  except (RuntimeError, ImportError): return False
  return True

# every op test runs on each device with the same expectations; devices whose driver is missing here drop out.
# By default CL runs one case of each op test (conftest.py drops its other parametrizations): PoCL compiles
# a kernel in ~0.3 s (its C front end, then machine code and the system linker), so with empty caches every
# case of test_ops alone would take minutes. Naming devices runs every case: TEST_DEVICES=CPU,PYTHON,LLVM,CL,WEBGPU
DEVICES = [d for d in os.getenv("TEST_DEVICES", "CPU,PYTHON,LLVM,CL,WEBGPU").split(",") if d in ("CPU", "PYTHON") or available(d)]
SAMPLED = set() if "TEST_DEVICES" in os.environ else {"CL"}

# What a backend refuses, by name, with the reason. A test that needs it calls expect_refusal: on that
# backend it is marked xfail, strictly and only for the refusal's TypeError, so a wrong answer (or a
# backend that learns the feature) still fails the run. `pytest -rx` lists and counts them by reason.
LIMITS: dict[str, dict[str, str]] = {
  "WEBGPU": {"f64_math": "WEBGPU refuses float64 exp2/log2/sin: Vulkan defines them for 16/32-bit floats only"},
}

def expect_refusal(request: pytest.FixtureRequest, device: str, limit: str, applies: bool = True) -> None:
  if applies and (reason := LIMITS.get(device, {}).get(limit)):
    request.applymarker(pytest.mark.xfail(reason=reason, raises=TypeError, strict=True))

TORCH_DTYPES: dict[DType, torch.dtype] = {
  dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8, dtypes.int16: torch.int16,
  dtypes.uint16: torch.uint16, dtypes.int32: torch.int32, dtypes.uint32: torch.uint32, dtypes.int64: torch.int64,
  dtypes.uint64: torch.uint64, dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16,
  dtypes.float32: torch.float32, dtypes.float64: torch.float64}
FROM_TORCH = {v: k for k, v in TORCH_DTYPES.items()}
ALL_DTYPES = list(TORCH_DTYPES)

def to_torch_dtype(dt: DType) -> torch.dtype: return TORCH_DTYPES[dt]

def random_array(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator, low: float = -2, high: float = 2) -> np.ndarray:
  """Values in [low, high) of the given kind; floats kept in float64 until cast to their dtype."""
  if dtype == dtypes.bool: return rng.random(shape) < 0.5
  if dtypes.is_int(dtype): return rng.integers(int(low), int(high), size=shape, endpoint=False).astype(np.int64)
  return rng.uniform(low, high, size=shape)

def make_pair(arr: np.ndarray, dtype: DType, device: str) -> tuple[Tensor, torch.Tensor]:
  """The same values as an attograd Tensor and a torch tensor of `dtype`."""
  if dtype == dtypes.bfloat16:  # numpy has no bfloat16: both sides round from float32
    f = np.ascontiguousarray(arr, dtype=np.float32)
    return Tensor(f, device=device).cast(dtype), torch.from_numpy(f.copy()).to(torch.bfloat16)
  np_arr = np.ascontiguousarray(arr).astype(torch.empty(0, dtype=TORCH_DTYPES[dtype]).numpy().dtype)
  return Tensor(np_arr, device=device), torch.from_numpy(np_arr.copy())

def _layout_shape(shape: tuple[int, ...], layout: str) -> tuple[int, ...]:
  if layout == "T": return tuple(reversed(shape))
  if layout == "slice": return tuple(2 * s + 1 for s in shape)
  return shape

def _apply_layout(x: Any, layout: str, ndim: int) -> Any:
  """Make a non-contiguous view (same code for both frameworks): reversed axes, or every other element."""
  if layout == "T": return x.permute(*reversed(range(ndim)))
  if layout == "slice": return x[tuple(slice(1, None, 2) for _ in range(ndim))]
  return x

def to_numpy(x: Tensor | torch.Tensor) -> np.ndarray:
  if isinstance(x, torch.Tensor): return (x.float() if x.dtype == torch.bfloat16 else x).numpy()
  return (x.float() if x.dtype == dtypes.bfloat16 else x).numpy()

def compare(out: Any, ref: Any, atol: float = 1e-6, rtol: float = 1e-5, check_dtype: bool = True) -> None:
  if isinstance(ref, (tuple, list)):
    assert isinstance(out, (tuple, list)) and len(out) == len(ref), f"got {out!r}, expected {len(ref)} results"
    for o, r in zip(out, ref): compare(o, r, atol, rtol, check_dtype)
    return
  assert isinstance(out, Tensor), f"expected a Tensor, got {type(out).__name__}"
  assert out.shape == tuple(ref.shape), f"shape {out.shape} != torch's {tuple(ref.shape)}"
  if check_dtype: assert out.dtype == FROM_TORCH[ref.dtype], f"dtype {out.dtype} != torch's {ref.dtype}"
  got, want = to_numpy(out), to_numpy(ref)
  if want.dtype == np.bool_ or np.issubdtype(want.dtype, np.integer): np.testing.assert_array_equal(got, want)
  else:
    with np.errstate(invalid="ignore"):  # bitcasts make signalling NaNs; widening them is fine
      np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=atol, rtol=rtol, equal_nan=True)

def check(fa: Callable[..., Any], ft: Callable[..., Any] | None, shapes: Sequence[tuple[int, ...]], dtype: DType | Sequence[DType] = dtypes.float32,
          device: str = "CPU", atol: float = 1e-6, rtol: float = 1e-5, low: float = -2, high: float = 2, layout: str = "contig",
          vals: Sequence[Any] | None = None, check_dtype: bool = True, seed: int = 0) -> None:
  """fa(*attograd tensors) vs ft(*torch tensors) (ft None: the same function) on random inputs of `shapes`
  (or the given `vals`), each of `dtype` (one per input, or one for all). `layout` makes the inputs
  non-contiguous views: "T" (axes reversed) or "slice" (every other element)."""
  rng = np.random.default_rng(seed)
  n = len(vals) if vals is not None else len(shapes)
  dts = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * n
  ins_a, ins_t = [], []
  for i in range(n):
    arr = np.array(vals[i]) if vals is not None else random_array(_layout_shape(tuple(shapes[i]), layout), dts[i], rng, low, high)
    a, t = make_pair(arr, dts[i], device)
    if vals is None: a, t = _apply_layout(a, layout, arr.ndim), _apply_layout(t, layout, arr.ndim)
    ins_a.append(a); ins_t.append(t)
  out = fa(*ins_a)
  ref = (ft or fa)(*ins_t)
  compare(out, ref, atol, rtol, check_dtype)

def grad_check(fa: Callable[..., Any], ft: Callable[..., Any], vals: Sequence[Any], device: str = "CPU", atol: float = 1e-5, rtol: float = 1e-4) -> None:
  """d(sum(f(x)))/dx of every float32 input in `vals` (arrays) against torch: shapes and values."""
  ours = [Tensor(np.asarray(v, dtype=np.float32), device=device, requires_grad=True) for v in vals]
  theirs = [torch.tensor(np.asarray(v, dtype=np.float32), requires_grad=True) for v in vals]
  fa(*ours).sum().backward()
  ft(*theirs).sum().backward()
  for o, t in zip(ours, theirs):
    assert o.grad is not None and o.grad.shape == tuple(t.grad.shape)
    np.testing.assert_allclose(o.grad.numpy(), t.grad.numpy(), atol=atol, rtol=rtol)

def run_last_kernel(t: Tensor, device: str, opts: list) -> np.ndarray:
  """t's last kernel compiled for `device` with exactly these Opts (the kernels before it run as usual)."""
  from attograd.engine.realize import get_kernel, buffer_of, run_schedule
  sched = t.contiguous().schedule()
  run_schedule(sched[:-1])
  si = sched[-1]
  bufs = [buffer_of(b).ensure_allocated() for b in si.bufs]
  ck = get_kernel(si.ast, device, opts)
  assert ck.opts == opts
  ck([b._buf for b in bufs], {})
  np_dtype = {dtypes.float16: np.float16}.get(t.dtype) or np.dtype(t.dtype.fmt)
  return np.frombuffer(bytes(bufs[0].as_bytes()), dtype=np_dtype).reshape(t.shape)
