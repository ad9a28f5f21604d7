"""Kernel AST -> source text: lower, linearize, render. A pure function of its inputs
(DESIGN invariant 1: same AST, same source)."""
from __future__ import annotations
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import graph_rewrite
from attograd.uop.symbolic import inbounds_load_spare
from attograd.codegen.lower import lower
from attograd.codegen.linearize import linearize
from attograd.codegen.opt import Opt, apply_opts
from attograd.codegen.gpudims import add_gpudims
from attograd.uop.mathlib import exp_math
from attograd.renderer import Renderer, kernel_name

def to_program(ast: UOp, renderer: Renderer, opts: list[Opt] | None = None) -> tuple[str, str, list[UOp]]:
  """(function name, source, linear uops) for a kernel AST with optimizations applied."""
  sink = lower(add_gpudims(apply_opts(ast, opts or [], renderer.has_local), renderer))
  # exp is arithmetic on every target: one range reduction and a polynomial, the same accuracy everywhere, and a
  # loop around it stays vectorizable on CPUs (a libm call per element would not)
  sink = graph_rewrite(sink, exp_math)
  # gcc vectorizes a gated read as a masked load, and then keeps a loop nest's accumulators in memory
  if any(renderer.spare_bytes): sink = graph_rewrite(sink, inbounds_load_spare, ctx=renderer.spare_bytes)
  if renderer.rewrites is not None: sink = graph_rewrite(sink, renderer.rewrites)
  uops = linearize(sink)
  name = kernel_name(uops)
  return name, renderer.render(name, uops), uops
