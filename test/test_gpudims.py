"""GPU thread ids and the LOCAL/GROUP Opts, run by the PYTHON emulator as a GPU would run them
(one interpreter per thread, threads of a work-group meeting at barriers). Every compiled GPU
backend must agree with these results; they need no GPU."""
import numpy as np
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.codegen.gpudims import launch_dims, eval_dims
from attograd.codegen.heuristic import gpu_opts
from attograd.codegen.opt import Opt, OptOps, KernelOptError, apply_opts, axes
from attograd.engine import search
from attograd.engine.realize import run_schedule, buffer_of
from attograd.runtime.device import Device
from attograd.runtime.ops_python import PythonRenderer, PythonProgram
from attograd.uop.ops import AxisKind, UOp, Ops
from attograd.uop.spec import verify_kernel

class GPUPythonRenderer(PythonRenderer):
  """The PYTHON emulator with a GPU's shape: loops over outputs become thread ids."""
  global_max = (2**31 - 1, 65535, 65535)
  local_max = (256, 256, 64)
  workgroup_max = 256
  workgroup_pref = 32

GPU = GPUPythonRenderer()
L, G = OptOps.LOCAL, OptOps.GROUP

def run_gpu(t: Tensor, opts: list[Opt] | None) -> np.ndarray:
  """t's last kernel on the emulated GPU (opts None: the heuristics'), what it needs computed on PYTHON."""
  sched = t.contiguous().schedule()
  run_schedule(sched[:-1])
  si = sched[-1]
  bufs = [buffer_of(b).ensure_allocated() for b in si.bufs]
  ast = si.ast
  name, src, uops = to_program(ast, GPU, gpu_opts(ast, GPU) if opts is None else opts)
  assert not any(u.op is Ops.RANGE and u.arg[1] in (AxisKind.GLOBAL, AxisKind.LOCAL) for u in uops), "output loops must become thread ids"
  verify_kernel(uops[-1])
  groups, local = launch_dims(uops)
  PythonProgram(name, src.encode())([b._buf for b in bufs], [], eval_dims(groups, {}), local)
  out = np.frombuffer(bytes(bufs[0].as_bytes()), dtype=np.float32 if t.dtype == dtypes.float32 else np.int32)
  return out.reshape(t.shape)

rng = np.random.default_rng(0)
A, B = rng.standard_normal((8, 12)).astype(np.float32), rng.standard_normal((12, 6)).astype(np.float32)
V = rng.standard_normal((2, 3, 2, 4, 3)).astype(np.float32)
R = rng.standard_normal((4, 96)).astype(np.float32)
S = rng.standard_normal((3, 16)).astype(np.float32)  # softmax recomputes each row's max and sum in every thread: keep it small

# name: (attograd tensor, numpy reference, LOCAL opts that fit its global axes)
CASES = {
  "matmul": (lambda: Tensor(A, device="PYTHON") @ Tensor(B, device="PYTHON"), lambda: A @ B, [Opt(L, 1, 3), Opt(L, 0, 4)]),
  "sum_all": (lambda: Tensor(R, device="PYTHON").sum(), lambda: R.sum(), []),
  "row_sum": (lambda: Tensor(R, device="PYTHON").sum(1), lambda: R.sum(1), [Opt(L, 0, 2)]),
  "max_rows": (lambda: Tensor(R, device="PYTHON").max(axis=1), lambda: R.max(1), [Opt(L, 0, 4)]),
  "softmax": (lambda: Tensor(S, device="PYTHON").softmax(1),
              lambda: np.exp(S - S.max(1, keepdims=True)) / np.exp(S - S.max(1, keepdims=True)).sum(1, keepdims=True), [Opt(L, 1, 4), Opt(L, 0, 3)]),
  # five global axes (no two of them one loop) share three launch dimensions, and four local ones too
  "5d_elementwise": (lambda: (Tensor(V, device="PYTHON").permute(4, 0, 2, 1, 3) * 2).flip(1), lambda: np.flip(V.transpose(4, 0, 2, 1, 3) * 2, 1),
                     [Opt(L, 4, 2), Opt(L, 3, 3), Opt(L, 2, 2), Opt(L, 0, 3)]),
  "pad": (lambda: Tensor(A, device="PYTHON").pad(((1, 2), (3, 0))) + 1, lambda: np.pad(A, ((1, 2), (3, 0))) + 1, [Opt(L, 1, 5), Opt(L, 0, 11)]),
}

@pytest.mark.parametrize("opts", ["none", "heuristic", "local"])
@pytest.mark.parametrize("case", CASES)
def test_thread_ids_compute_the_same(case, opts):
  make, ref, local = CASES[case]
  got = run_gpu(make(), {"none": [], "heuristic": None, "local": local}[opts])
  np.testing.assert_allclose(got, ref(), rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("opts", [
  [Opt(G, 2, 4)], [Opt(G, 2, 12)], [Opt(L, 0, 2), Opt(G, 2, 6)], [Opt(L, 1, 3), Opt(L, 0, 2), Opt(G, 2, 3)]],
  ids=["group4", "group12", "local_group", "2local_group"])
def test_group_matmul(opts):
  np.testing.assert_allclose(run_gpu(Tensor(A, device="PYTHON") @ Tensor(B, device="PYTHON"), opts), A @ B, rtol=1e-5, atol=1e-5)

@pytest.mark.parametrize("case, opts", [("sum_all", [Opt(G, 0, 16)]), ("row_sum", [Opt(L, 0, 2), Opt(G, 1, 32)]),
                                        ("max_rows", [Opt(G, 1, 8)]), ("softmax", [Opt(G, 2, 4)])])
def test_group_reduce(case, opts):
  make, ref, _ = CASES[case]
  np.testing.assert_allclose(run_gpu(make(), opts), ref(), rtol=1e-5, atol=1e-5)

def test_group_makes_local_memory_and_a_barrier():
  ast = (Tensor(R, device="PYTHON").sum(1)).schedule()[-1].ast
  _, _, uops = to_program(ast, GPU, [Opt(L, 0, 4), Opt(G, 1, 16)])
  ops = [u.op for u in uops]
  assert ops.count(Ops.BARRIER) == 1 and ops.count(Ops.DEFINE_LOCAL) == 1
  local = next(u for u in uops if u.op is Ops.DEFINE_LOCAL)
  assert local.dtype.size == 64 and local.dtype.addrspace == "local"  # 16 partials for each of the 4 rows of a work-group
  assert launch_dims(uops) == ((1, 1, 1), (16, 4, 1))
  # only thread 0 of the reduce's group stores the result
  store = next(u for u in uops if u.op is Ops.STORE and u.src[0].dtype.addrspace == "global")
  assert len(store.src[0].src) == 3, "the output store must be gated to one thread of the group"

def test_more_than_three_global_axes_share_a_dimension():
  # (no two neighbouring axes read as one loop: each stays an axis)
  ast = (Tensor(V, device="PYTHON") * 2).permute(4, 0, 2, 1, 3).contiguous().schedule()[-1].ast
  _, _, uops = to_program(ast, GPU, [])
  assert sorted(u.arg for u in uops if u.op is Ops.SPECIAL) == ["gidx0", "gidx1", "gidx2"]
  assert launch_dims(uops) == ((4, 3, 3 * 2 * 2), (1, 1, 1))  # innermost axes first, the outer three share dimension 2

def test_symbolic_size_launch():
  n = UOp.variable("n", 1, 64)
  buf = UOp(Ops.PARAM, dtypes.float32.ptr(64), (), 0)
  r = UOp(Ops.RANGE, dtypes.int32, (n,), (0, AxisKind.GLOBAL))
  ast = buf.index(r).store(r.cast(dtypes.float32) * 2).end(r).sink()
  _, src, uops = to_program(ast, GPU, [])
  groups, local = launch_dims(uops)
  assert eval_dims(groups, {n: 10}) == (10, 1, 1) and local == (1, 1, 1)
  mem = bytearray(64 * 4)
  PythonProgram("k", src.encode())([mem], [10], eval_dims(groups, {n: 10}), local)
  np.testing.assert_array_equal(np.frombuffer(mem, np.float32)[:12], [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 0, 0])

@pytest.mark.parametrize("case", ["matmul", "row_sum", "sum_all"])
def test_beam_work_group_actions_compute_the_same(case):
  """BEAM's LOCAL and GROUP actions on a GPU target, numbered like every other Opt (global axes, then
  reduce axes): each legal one, and each after the heuristics' LOCALs, keeps the result."""
  make, ref, local = CASES[case]
  ast = make().contiguous().schedule()[-1].ast
  tried = 0
  for base in ([], local):
    for o in search.actions(apply_opts(ast, base, has_local=True), 1, local=True):
      if o.op not in (L, G): continue
      try: to_program(ast, GPU, base + [o])
      except KernelOptError: continue
      np.testing.assert_allclose(run_gpu(make(), base + [o]), ref(), rtol=1e-5, atol=1e-5, err_msg=f"{base + [o]}")
      tried += 1
  assert tried >= 4

def test_heuristics_pick_work_groups():
  matmul = (Tensor(A, device="PYTHON") @ Tensor(B, device="PYTHON")).schedule()[-1].ast
  assert gpu_opts(matmul, GPU) == [Opt(L, 1, 6), Opt(L, 0, 4)]  # 6*4 of the preferred 32 threads
  total = Tensor(R, device="PYTHON").sum().schedule()[-1].ast
  # one output: the long reduce (both axes, one loop) is split across a work-group
  assert gpu_opts(total, GPU) == [Opt(G, 0, 32)]

def test_opt_errors():
  ast = (Tensor(R, device="PYTHON").sum(1)).schedule()[-1].ast
  with pytest.raises(KernelOptError, match="no work-groups"): to_program(ast, Device["CPU"].renderer, [Opt(L, 0, 2)])
  with pytest.raises(KernelOptError, match="doesn't split"): to_program(ast, GPU, [Opt(L, 0, 3)])
  with pytest.raises(KernelOptError, match="LOCAL applies to a global axis, axis 1 is reduce"): to_program(ast, GPU, [Opt(L, 1, 2)])
  with pytest.raises(KernelOptError, match="GROUP applies to a reduce axis, axis 0 is global"): to_program(ast, GPU, [Opt(G, 0, 2)])
  with pytest.raises(KernelOptError, match="the kernel has 2 axes"): to_program(ast, GPU, [Opt(G, 2, 2)])
  with pytest.raises(KernelOptError, match="before GROUP"): to_program(ast, GPU, [Opt(G, 1, 4), Opt(L, 0, 2)])
  with pytest.raises(KernelOptError, match="over this device's limit"): to_program(ast, GPU, [Opt(L, 0, 4), Opt(G, 1, 96)])
  # a reduce inside another reduce's loop would overwrite local memory other threads still read
  x = Tensor(R, device="PYTHON")
  inner = (x.reshape(4, 96, 1) * x.reshape(4, 1, 96)).max(axis=2).sum(1)
  sast = inner.schedule()[-1].ast
  ax = axes(sast)
  assert [r.arg[1] for r in ax] == [AxisKind.GLOBAL, AxisKind.REDUCE, AxisKind.REDUCE]
  inner_axis = max((1, 2), key=lambda i: ax[i].arg)
  with pytest.raises(KernelOptError, match="inside loop"): to_program(sast, GPU, [Opt(G, inner_axis, 4)])
