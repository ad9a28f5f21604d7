"""What every renderer promises: it is immutable (rendering one kernel leaves nothing behind that another render
could see), so one renderer serves many threads (BEAM renders its candidates in a thread pool). Rendering needs no
device: these run everywhere."""
import gc, re, sys
from concurrent.futures import ThreadPoolExecutor
import pytest
from attograd import Tensor, dtypes
from attograd.codegen import to_program
from attograd.codegen.opt import Opt, OptOps
from attograd.codegen.heuristic import heuristic_opts
from attograd.engine import progcache
from attograd.renderer.cstyle import CStyleRenderer
from attograd.renderer.cuda import CUDARenderer
from attograd.renderer.llvmir import LLVMRenderer
from attograd.renderer.opencl import OpenCLRenderer
from attograd.renderer.ptx import PTXRenderer
from attograd.renderer.wgsl import WGSLRenderer
from attograd.runtime.ops_python import PythonRenderer

def _wgsl() -> WGSLRenderer: return WGSLRenderer({"shader-f64", "shader-int64"})  # an adapter that has float64
RENDERERS = [CStyleRenderer, LLVMRenderer, OpenCLRenderer, CUDARenderer, PTXRenderer, _wgsl, PythonRenderer]

def _ast(t: Tensor):
  return t.schedule()[-1].ast

def _kernels(renderer) -> list[tuple[str, list]]:
  """(name, uops) of a few kernels: float32 and float64 (OpenCL's prelude differs), with a work-group of each size
  where the target has them."""
  a = Tensor.empty(64, 64).realize()
  asts = [_ast(a + 1), _ast(a.cast(dtypes.float64).sum(1))]
  opts = [[Opt(OptOps.LOCAL, 0, n)] for n in (2, 4, 8, 16, 32)] if renderer.has_local else [[], [Opt(OptOps.UPCAST, 0, 4)]]
  out = []
  for ast in asts:
    for o in opts:
      name, _, uops = to_program(ast, renderer, o)
      out.append((name, uops))
  return out

@pytest.mark.parametrize("cls", RENDERERS, ids=lambda c: c.__name__.strip("_"))
def test_rendering_leaves_the_renderer_as_it_was(cls):
  # the renderer's state is its settings: a render that kept per-kernel facts on it changed the program cache's key
  r = cls()
  before, key = dict(vars(r)), progcache.renderer_id(r)
  srcs = [r.render(name, uops) for name, uops in _kernels(r)]
  assert vars(r) == before and progcache.renderer_id(r) == key
  # and the same kernel renders the same, whatever was rendered in between
  assert [r.render(name, uops) for name, uops in _kernels(r)] == srcs

@pytest.mark.parametrize("cls, pattern", [(OpenCLRenderer, r"reqd_work_group_size\((\d+), 1, 1\)"), (CUDARenderer, r"__launch_bounds__\((\d+)\)")],
                         ids=["CL", "CUDA"])
def test_concurrent_renders_keep_their_own_work_group_size(cls, pattern):
  # one renderer, renders of kernels with different work-group sizes on many threads: each source declares its own
  r = cls()
  jobs = [(name, uops, n) for name, uops in _kernels(r) for n in [max(u.src[0].arg for u in uops if u.op.name == "SPECIAL" and u.arg == "lidx0")]]
  assert sorted({n for *_, n in jobs}) == [2, 4, 8, 16, 32]
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-6)  # threads switch often, as on a busy machine: a race shows in a few hundred renders
  try:
    with ThreadPoolExecutor(8) as pool:
      results = list(pool.map(lambda j: (j[2], r.render(j[0], j[1])), jobs * 100))
  finally: sys.setswitchinterval(interval)
  wrong = [(n, m.group(1)) for n, src in results if (m := re.search(pattern, src)) is None or int(m.group(1)) != n]
  assert not wrong, f"{len(wrong)} of {len(results)} renders declare another kernel's work-group size: {wrong[:5]}"

def _cycles_made(fn) -> list[str]:
  """The types of what fn left for the cycle collector (objects only a reference cycle kept)."""
  gc.collect()
  gc.set_debug(gc.DEBUG_SAVEALL)
  try:
    fn()
    gc.collect()
    return sorted({type(o).__name__ for o in gc.garbage})
  finally:
    gc.set_debug(0)
    gc.garbage.clear()

@pytest.mark.parametrize("cls", RENDERERS, ids=lambda c: c.__name__.strip("_"))
def test_lowering_and_rendering_make_no_reference_cycles(cls):
  # lowering runs with the cycle collector paused (helpers.gc_paused): a cycle made per kernel (a nested function that
  # calls itself holds its own cell) kept that kernel's graphs until the pause ended. A first run of SmolLM2 left 187k
  # such objects and 7 MiB more resident, in pymalloc arenas its later objects then pinned
  r = cls() if cls is not _wgsl else WGSLRenderer({"shader-f16", "shader-f64", "shader-int64"})
  a = Tensor.empty(48, 96).realize()
  asts = [_ast(a.reshape(6, 8, 96).permute(1, 0, 2).reshape(48, 96) @ a.T),   # index math (divmod, joined digits), a matmul
          _ast(a.cast(dtypes.bfloat16).cast(dtypes.float16).cast(dtypes.int32)),  # casts through float32
          _ast(a.cast(dtypes.int64).cast(dtypes.float16) + a.cast(dtypes.bool).cast(dtypes.bfloat16))]
  def lower_all() -> None:
    for ast in asts:
      opts = heuristic_opts(ast, r) if cls is CStyleRenderer else [Opt(OptOps.LOCAL, 0, 4)] if r.has_local else []
      name, src, uops = to_program(ast, r, opts)
  assert _cycles_made(lower_all) == []
