"""Kernel AST -> source text: lower, linearize, render. A pure function of its inputs
(DESIGN invariant 1: same AST, same source)."""
from __future__ import annotations
from typing import NamedTuple
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import Pass, graph_rewrite, run_passes
from attograd.uop.symbolic import symbolic, inbounds_load_spare
from attograd.codegen.lower import expander, lowerer, lower_reduces, simd_in_serial_loops, split_loops, lane_gates
from attograd.codegen.divmod import divmod_lowering
from attograd.codegen.linearize import linearize
from attograd.codegen.opt import Opt, apply_opts
from attograd.codegen.gpudims import add_gpudims
from attograd.codegen.semantics import ir_semantics
from attograd.uop.mathlib import exp_math
from attograd.renderer import Renderer, kernel_name

class Target(NamedTuple):
  """What a kernel's passes read besides its graph: the source is a function of (AST, Opts, renderer)."""
  renderer: Renderer
  opts: list[Opt]

def _spare_bytes(sink: UOp, t: Target) -> UOp:
  # gcc vectorizes a gated read as a masked load, and then keeps a loop nest's accumulators in memory
  return graph_rewrite(sink, inbounds_load_spare, ctx=t.renderer.spare_bytes, name="spare_bytes") if any(t.renderer.spare_bytes) else sink

def _renderer_rewrites(sink: UOp, t: Target) -> UOp:
  return sink if t.renderer.rewrites is None else graph_rewrite(sink, t.renderer.rewrites, name="renderer_rewrites")

# Kernel AST -> the graph linearize() orders, pass by pass (print them: [name for name, _ in PASSES]; docs/pipeline.md
# says what each does). Division by constants goes after the last symbolic pass: its multiply-shift form is no longer
# one the symbolic rules read. exp is arithmetic on every target: one range reduction and a polynomial, the same
# accuracy everywhere, and a loop around it stays vectorizable on CPUs (a libm call per element would not). The IR's
# defined results (x/0, NaN in max, ...) are written out last, after the renderer's own rewrites, which may make them.
PASSES: list[Pass] = [
  ("apply_opts", lambda sink, t: apply_opts(sink, t.opts, t.renderer.has_local)),
  ("gpu_dims", lambda sink, t: add_gpudims(sink, t.renderer)),
  ("split_loops", lambda sink, t: split_loops(sink)),
  ("simd_in_serial_loops", lambda sink, t: simd_in_serial_loops(sink)),
  ("expand", expander),
  ("symbolic_expanded", symbolic),
  ("lower_reduces", lambda sink, t: lower_reduces(sink)),
  ("float32_math", lowerer),
  ("symbolic_lowered", symbolic),
  ("divmod", divmod_lowering),
  ("exp_math", exp_math),
  ("spare_bytes", _spare_bytes),
  ("lane_gates", lane_gates),
  ("renderer_rewrites", _renderer_rewrites),
  ("ir_semantics", lambda sink, t: ir_semantics(sink, t.renderer.native)),
]

def lowered(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> UOp:
  """The kernel AST after every pass of PASSES, ready to linearize. Every buffer of the AST stays a parameter: the
  caller passes them all, and a GPU API refuses a call with more arguments than the kernel has (a pass may fold the last
  read of one away: ir_semantics folds x // 0 to 0)."""
  sink = run_passes(ast, PASSES, Target(renderer, opts or []))
  kept = {u for u in sink.toposort if u.op is Ops.PARAM}
  lost = tuple(u for u in ast.toposort if u.op is Ops.PARAM and u not in kept)
  return sink.replace(src=sink.src + lost) if lost else sink

def to_program(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> tuple[str, str, list[UOp]]:
  """(function name, source, linear uops) for a kernel AST with optimizations applied."""
  sink = lowered(ast, renderer, opts)
  uops = linearize(sink)
  name = kernel_name(uops)
  return name, renderer.render(name, uops), uops
