"""The pass lists are the pipeline a reader (and the visualizer) sees: pinned by name and order, each documented in
docs/pipeline.md, and each run, in that order, when a kernel is lowered."""
import pathlib, re
from attograd import Tensor
from attograd.helpers import Context
from attograd.codegen import PASSES, lowered, to_program
from attograd.codegen.linearize import linearize
from attograd.runtime.device import Device
from attograd.schedule.schedule import INDEXING_PASSES

KERNEL = ["apply_opts", "gpu_dims", "split_loops", "simd_in_serial_loops", "expand", "symbolic_expanded", "lower_reduces", "float32_math",
          "symbolic_lowered", "divmod", "exp_math", "spare_bytes", "lane_gates", "renderer_rewrites", "ir_semantics"]
INDEXING = ["pushdown", "kernel_cleanup", "reduce_dedup", "scatter_cleanup", "merge_loops", "flash_attention"]

def test_pass_lists_are_pinned():
  assert [n for n, _ in PASSES] == KERNEL
  assert [n for n, _ in INDEXING_PASSES] == INDEXING

def test_every_pass_is_documented():
  doc = (pathlib.Path(__file__).parent.parent / "docs" / "pipeline.md").read_text()
  documented = re.findall(r"^\| `([a-z_0-9]+)` \|", doc, re.M)
  assert documented == INDEXING + KERNEL

def test_passes_run_in_order(capsys):
  ast = (Tensor.empty(16, 32) @ Tensor.empty(32, 8)).exp().schedule()[-1].ast
  with Context(DEBUG=5): sink = lowered(ast, Device["CPU"].renderer)
  ran = re.findall(r"^pass (\S+)", capsys.readouterr().out, re.M)
  assert ran == KERNEL
  # to_program renders exactly what the pass list makes
  assert to_program(ast, Device["CPU"].renderer)[2] == linearize(sink)
