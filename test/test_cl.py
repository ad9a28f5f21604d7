"""The CL device (OpenCL on PoCL): LOCAL/GROUP work-groups, half as storage only, clear errors.
The op suite itself runs on CL through helpers.DEVICES."""
import ctypes
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.codegen.opt import Opt, OptOps
from attograd.engine.realize import get_kernel
from attograd.renderer.opencl import OpenCLRenderer
from helpers import available, run_last_kernel

# these run whenever CL can (the op suite runs on CL through helpers.DEVICES: one case of each test unless TEST_DEVICES names CL)
pytestmark = pytest.mark.skipif(not available("CL"), reason="no OpenCL driver here (scripts/install_deps.sh installs PoCL)")
L, G = OptOps.LOCAL, OptOps.GROUP
rng = np.random.default_rng(0)

def run_with(t: Tensor, opts: list[Opt]) -> np.ndarray: return run_last_kernel(t, "CL", opts)

@pytest.mark.parametrize("opts", [[], [Opt(L, 1, 16), Opt(L, 0, 4)], [Opt(G, 2, 16)], [Opt(L, 1, 8), Opt(L, 0, 2), Opt(G, 2, 32)]],
                         ids=["plain", "local", "group", "local_group"])
def test_matmul_opts(opts):
  a, b = rng.standard_normal((32, 96)).astype(np.float32), rng.standard_normal((96, 48)).astype(np.float32)
  got = run_with(Tensor(a, device="CL") @ Tensor(b, device="CL"), opts)
  np.testing.assert_allclose(got, a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("rows, opts", [(1, [Opt(G, 0, 64)]), (1, [Opt(G, 0, 256)]), (8, [Opt(G, 1, 128)]), (8, [Opt(L, 0, 4), Opt(G, 1, 32)])],
                         ids=["total_group64", "total_group256", "rows_group", "rows_local_group"])
def test_sum_opts(rows, opts):
  x = rng.standard_normal((rows, 4096)).astype(np.float32)
  got = run_with(Tensor(x, device="CL").sum(1), opts)
  np.testing.assert_allclose(got, x.sum(1), rtol=1e-4, atol=1e-3)

def test_heuristics_use_work_groups():
  x = Tensor(rng.standard_normal((4, 4096)).astype(np.float32), device="CL")
  y = x.max(axis=1).realize()
  np.testing.assert_array_equal(y.numpy(), x.numpy().max(1))
  ck = get_kernel(x.max(axis=1).schedule()[-1].ast, "CL")
  assert any(o.op is G for o in ck.opts) and "barrier(CLK_LOCAL_MEM_FENCE);" in ck.src
  big = Tensor(rng.standard_normal((64, 256)).astype(np.float32), device="CL")
  ck = get_kernel((big * 2).contiguous().schedule()[-1].ast, "CL")
  assert ck.launch[1] != (1, 1, 1), "an elementwise kernel this big should run in work-groups"

def test_half_is_storage_only():
  x = rng.standard_normal(37).astype(np.float16)
  t = Tensor(x, device="CL")
  src = get_kernel((t * 3).schedule()[-1].ast, "CL").src
  assert "vload_half(" in src and "vstore_half_rte(" in src and "cl_khr_fp16" not in src
  np.testing.assert_array_equal((t * 3).numpy(), (x.astype(np.float32) * 3).astype(np.float16))
  np.testing.assert_array_equal(t.bitcast(dtypes.int16).numpy(), x.view(np.int16))

def test_float64_refused_without_fp64():
  ast = (Tensor(np.ones(4), device="CL") + 1).schedule()[-1].ast
  with pytest.raises(RuntimeError, match="no cl_khr_fp64"): to_program(ast, OpenCLRenderer(fp64=False), [])

def test_build_error_has_the_log():
  from attograd.runtime.device import Device
  with pytest.raises(RuntimeError, match="(?s)OpenCL build failed.*error.*--- source ---"):
    Device["CL"].compiler.compile("__kernel void k(__global float* a) { a[0] = undefined_thing; }")

def test_missing_driver_names_the_packages(monkeypatch):
  import attograd.runtime.ops_cl as ops_cl
  def no_lib(*a, **k): raise OSError("libOpenCL.so.1: cannot open shared object file")
  monkeypatch.setattr(ctypes, "CDLL", no_lib)
  with pytest.raises(RuntimeError, match="apt-get install ocl-icd-libopencl1 pocl-opencl-icd"): ops_cl.load_libcl()
