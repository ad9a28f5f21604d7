"""Opts change how a kernel runs, never what it computes."""
import json, re
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from attograd import Tensor, Context, GlobalCounters, dtypes
from attograd.uop.ops import AxisKind, Ops
from attograd.codegen import to_program
from attograd.codegen.opt import Opt, OptOps, KernelOptError, THREADS, apply_opt, axes, global_ranges, const_size, apply_opts, written_out_size
from attograd.codegen import heuristic
from attograd.codegen.heuristic import cpu_opts
from attograd.engine import realize, search
from attograd.runtime.device import Device, Buffer
from attograd.renderer.cstyle import CStyleRenderer

def _run(make, threads):
  realize._kernel_cache.clear()
  x = Tensor(np.random.default_rng(0).standard_normal((640, 256)).astype(np.float32))  # new buffer: nothing memoized
  with Context(THREADS=threads): return make(x).numpy()

@pytest.mark.parametrize("name, make", [
  ("matmul_relu", lambda x: (x[:256, :128] @ x[:128, 100:180]).relu()),
  ("reduce_rows", lambda x: (x.sin() * 3).sum(1)),
  ("pad_flip_elementwise", lambda x: x.pad(((2, 2), (1, 0))).flip(0).exp2() * 1e-3),
])
def test_threaded_equals_single_threaded(name, make):
  one, two = _run(make, 1), _run(make, 2)
  np.testing.assert_array_equal(one, two)
  assert any(ck.threads == 2 for ck in realize._kernel_cache.values()), "the heuristic should thread a kernel this big"

def test_more_slices_than_cores_all_run():
  rng = np.random.default_rng(5)
  x = Tensor(rng.standard_normal((64, 96), dtype=np.float32)).realize()
  si = (x.exp() * 2).schedule()[-1]
  plain = _exec(si, [])
  for threads in (1, 2, 3):  # slices are taken by however many cores there are, down to one
    with Context(THREADS=threads): np.testing.assert_array_equal(_exec(si, [Opt(OptOps.THREAD, 0, 8)]), plain)

def _ast(t: Tensor):
  return t.schedule()[-1].ast

def test_illegal_opts_raise():
  x = Tensor.rand(5, 6).realize()
  ast = _ast(x.T + 1)  # two axes, 6 and 5 (transposed: they don't read as one loop)
  renderer = Device["CPU"].renderer
  with pytest.raises(KernelOptError, match="axes"): to_program(ast, renderer, [Opt(OptOps.THREAD, 2, 2)])
  with pytest.raises(KernelOptError, match="doesn't split"): to_program(ast, renderer, [Opt(OptOps.THREAD, 1, 2)])
  with pytest.raises(KernelOptError, match="already threaded"): to_program(ast, renderer, [Opt(OptOps.THREAD, 0, 2), Opt(OptOps.THREAD, 0, 3)])
  with pytest.raises(KernelOptError, match="doesn't split"): to_program(ast, renderer, [Opt(OptOps.UPCAST, 1, 3)])
  with pytest.raises(KernelOptError, match="reduce axis"): to_program(ast, renderer, [Opt(OptOps.UNROLL, 0, 2)])
  with pytest.raises(KernelOptError, match="already a multiple"): to_program(ast, renderer, [Opt(OptOps.PADTO, 1, 5)])
  with pytest.raises(KernelOptError, match="another global axis"): to_program(ast, renderer, [Opt(OptOps.SWAP, 0, 0)])
  with pytest.raises(KernelOptError, match="workgroups"): to_program(ast, renderer, [Opt(OptOps.LOCAL, 0, 2)])
  with pytest.raises(KernelOptError, match="copies"): to_program(_ast(Tensor.rand(64, 64).realize() @ Tensor.rand(64, 64).realize()),
                                                                  renderer, [Opt(OptOps.UPCAST, 0, 32), Opt(OptOps.UPCAST, 1, 32)])
  red = _ast(x.T.sum(1))
  with pytest.raises(KernelOptError, match="global axis"): to_program(red, renderer, [Opt(OptOps.THREAD, 1, 5)])

def test_same_ast_and_opts_give_same_source():
  x = Tensor.rand(64, 64).realize()
  ast = _ast(x @ x)
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.THREAD, 0, 2)]
  assert to_program(ast, Device["CPU"].renderer, opts)[1] == to_program(ast, Device["CPU"].renderer, list(opts))[1]

# ***** every legal Opt list computes what the plain kernel computes *****

def _kernels():
  rng = np.random.default_rng(1)
  a, b = Tensor(rng.standard_normal((12, 10), dtype=np.float32)), Tensor(rng.standard_normal((10, 18), dtype=np.float32))
  img, w = Tensor(rng.standard_normal((2, 3, 7, 6), dtype=np.float32)), Tensor(rng.standard_normal((4, 3, 3, 3), dtype=np.float32))
  v = Tensor(rng.standard_normal((6, 20), dtype=np.float32))
  return {
    "elementwise": ((a * 2 + 1).relu().exp() - a.T.reshape(12, 10)),
    "reduce": (v.max(axis=1) + v.sum(1)),
    "softmax": v.softmax(1),
    "matmul": (a @ b).relu(),
    "conv": img.conv2d(w, padding=1),
  }
NAMES = ["elementwise", "reduce", "softmax", "matmul", "conv"]

def _exec(si, opts):
  """Run the kernel with these opts on the schedule item's own inputs; the output as numpy."""
  ck = realize.compile_kernel(si.ast, "CPU", opts)
  out = Buffer("CPU", si.bufs[0].arg.size, si.bufs[0].dtype).ensure_allocated()
  ck([out._buf] + [realize.buffer_of(b).ensure_allocated()._buf for b in si.bufs[1:]], {})
  return np.frombuffer(out.as_bytes(), dtype=np.float32).copy()

@pytest.fixture(scope="module")
def kernels():
  """name -> (the kernel's schedule item, with its inputs realized; its output without opts)"""
  out = {}
  for name, t in _kernels().items():
    *before, si = t.schedule()
    realize.run_schedule(before)
    out[name] = (si, _exec(si, []))
  return out

@settings(max_examples=40, deadline=None, derandomize=True)
@given(name=st.sampled_from(NAMES), picks=st.lists(st.integers(0, 10_000), min_size=1, max_size=4))
def test_random_opts_keep_results(kernels, name, picks):
  si, reference = kernels[name]
  ast, opts = si.ast, []
  for p in picks:  # each pick chooses among the Opts legal at that point
    legal = []
    for o in search.actions(ast, 2):
      try: legal.append((o, apply_opt(ast, o)))
      except KernelOptError: pass
    if not legal: break
    o, ast = legal[p % len(legal)]
    opts.append(o)
  got = _exec(si, opts)
  # partial accumulators (UPCAST of a reduce axis) add in another order: equal up to rounding
  np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {opts}")

def test_heuristics_pick_tiles_and_accumulators():
  mm = _ast(Tensor.empty(256, 256) @ Tensor.empty(256, 256))
  # a register tile: a SIMD loop two registers wide by 8 written-out rows (heuristic.LOOP_TILES), 4 slices per core
  # of the axis that splits: cores take them as they come free
  tile = [Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 8)]
  assert cpu_opts(mm, 2) == tile + [Opt(OptOps.THREAD, 0, 8)]
  # x @ w.T reads w along its rows: each column panel is packed contiguously first, with the panels' loop outside
  linear = cpu_opts(_ast(Tensor.empty(256, 64) @ Tensor.empty(192, 64).T), 1)
  assert linear == tile + [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  assert cpu_opts(_ast(Tensor.empty(128, 128) @ Tensor.empty(128, 128)), 2)[-1] == Opt(OptOps.THREAD, 0, 2)
  # under heuristic.THREAD_MIN_COST operations a kernel stays on one core (a threaded launch costs more than it saves),
  # where a transcendental's few iterations may do that many
  assert not any(o.op is OptOps.THREAD for o in cpu_opts(_ast(Tensor.empty(32, 64) @ Tensor.empty(64, 64)), 2))
  assert cpu_opts(_ast(Tensor.empty(512, 256).exp()), 2)[-1].op is OptOps.THREAD
  assert not any(o.op is OptOps.THREAD for o in cpu_opts(_ast(Tensor.empty(512, 256) * 2), 2))
  s = _ast(Tensor.empty(1 << 16).sum())
  assert Opt(OptOps.UPCAST, 0, 16) in cpu_opts(s, 2)
  # with AVX-512 (registers of 16 floats, twice as many of them) the tile is two of its registers wide
  assert cpu_opts(mm, 1, simd=16) == [Opt(OptOps.SIMD, 1, 32), Opt(OptOps.UPCAST, 0, 8)]

def test_heuristics_written_out_tiles(monkeypatch):
  # the tiles written out (what a width no SIMD loop divides gets, and all of them with LOOP_TILES off): 16x6 (12 AVX
  # registers of accumulators; the rows padded to 258, whose reads stay in the spare page after the buffer)
  monkeypatch.setattr(heuristic, "LOOP_TILES", False)
  mm = _ast(Tensor.empty(256, 256) @ Tensor.empty(256, 256))
  tile = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6)]
  assert cpu_opts(mm, 2) == tile + [Opt(OptOps.THREAD, 1, 8)]
  linear = cpu_opts(_ast(Tensor.empty(256, 64) @ Tensor.empty(192, 64).T), 1)
  assert linear == tile + [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  # rows that 6 divides need no padding; a long reduce (the padding's reads would leave the spare page) takes 8 rows
  assert cpu_opts(_ast(Tensor.empty(96, 64) @ Tensor.empty(64, 64)), 1) == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 6)]
  assert cpu_opts(_ast(Tensor.empty(64, 2048) @ Tensor.empty(2048, 64)), 1)[:2] == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 8)]
  assert cpu_opts(mm, 1, simd=16)[:3] == [Opt(OptOps.UPCAST, 1, 32), Opt(OptOps.PADTO, 0, 6), Opt(OptOps.UPCAST, 0, 6)]
  # a vocabulary of 90 (a transformer's head) is written out with LOOP_TILES on too: padded to a loop it ran 6x slower
  monkeypatch.setattr(heuristic, "LOOP_TILES", True)
  # in the divisor of 90 whose rows pack best into vectors (18 = 16 + 2), by rows up to ODD_TILE_REGISTERS vectors: 18x2
  # (10x6's twelve vectors took gcc twice as long, and ran no faster)
  head = cpu_opts(_ast(Tensor.empty(1024, 64) @ Tensor.empty(90, 64).T), 1, simd=16)
  assert head[:2] == [Opt(OptOps.UPCAST, 1, 18), Opt(OptOps.UPCAST, 0, 2)], head
  # its written-out size, which lowering and gcc take time in proportion to, is under the 10x6 tile's
  assert written_out_size(apply_opts(_ast(Tensor.empty(1024, 64) @ Tensor.empty(90, 64).T), head)) < 600

def test_odd_widths():
  assert heuristic.vector_pieces(18, 16) == 2 and heuristic.vector_pieces(10, 16) == 2 and heuristic.vector_pieces(15, 8) == 4
  assert heuristic.odd_widths(90, 16) == (18, 30, 10, 9, 15, 6, 5)
  assert heuristic.odd_widths(96, 16) == ()  # whole vectors: the written-out widths of 8s, or a loop

def test_heuristics_put_a_tile_with_a_relu_in_a_simd_loop():
  # a compare, select or division after a tile's sums (relu, hardswish) left gcc's written-out copies scalar (5 GFLOPS):
  # the width goes in a SIMD loop two registers wide by 8 rows (50-115); so does a bias add's tile (LOOP_TILES), which
  # stays written out without LOOP_TILES (vectorized as it was)
  a, b = Tensor.empty(256, 256), Tensor.empty(256, 256)
  for simd in (8, 16):
    looped = [Opt(OptOps.SIMD, 1, 2 * simd), Opt(OptOps.UPCAST, 0, 8)]
    assert cpu_opts(_ast((a @ b).relu()), 1, simd) == looped
    assert cpu_opts(_ast(Tensor.empty(1, 64, 24, 80).conv2d(Tensor.empty(128, 64, 1, 1)).hardswish()), 1, simd) == looped
    assert cpu_opts(_ast(a @ b + Tensor.empty(256)), 1, simd)[0] == Opt(OptOps.SIMD, 1, 2 * simd)
    heuristic.LOOP_TILES = False
    try: assert cpu_opts(_ast(a @ b + Tensor.empty(256)), 1, simd)[0] == Opt(OptOps.UPCAST, 1, 2 * simd)
    finally: heuristic.LOOP_TILES = True
    # beautiful_mnist's 5x5 conv: its 20-wide output rows, which no SIMD loop divides, padded to whole registers (loop_width):
    # three AVX2 loops of 8 (24); with AVX-512 padded to the input's 24 and merged with the rows (merged_rows) for a loop of
    # two registers (20 of 24 lanes busy, where two registers of a row alone kept 20 of 32)
    conv = _ast(Tensor.empty(8, 32, 24, 24).conv2d(Tensor.empty(32, 32, 5, 5)).relu())
    merge = [Opt(OptOps.MERGE, 2, 3)] if simd == 16 else []
    assert cpu_opts(conv, 1, simd) == [Opt(OptOps.PADTO, 3, 24), *merge, Opt(OptOps.SIMD, 3, 2 * simd if merge else 8), Opt(OptOps.UPCAST, 1, 8)]
  # reads gated along the width (a 1x3 conv padded along it) are masked loads in the loop, a select per copy written out;
  # 40 wide, padded to 48 for a loop of whole registers (0.27 -> 0.19 ms one core, in one process), by 12 rows of its 60
  # (GATED_ROWS: 6 rows 0.104 ms, 12 rows 0.090 on Zen 5)
  gated = _ast(Tensor.empty(1, 960, 1, 40).conv2d(Tensor.empty(60, 960, 1, 3), padding=(0, 1)))
  assert cpu_opts(gated, 1, 16) == [Opt(OptOps.PADTO, 1, 48), Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 12)]
  # (AVX2's 16 registers keep a loop of one register to 8 rows at most: 6 of 60)
  assert cpu_opts(gated, 1, 8)[-1] == Opt(OptOps.UPCAST, 0, 6)
  # a padded 3x3 conv whose row of outputs sums over more than GATED_WIDE_BYTES of inputs (PP-OCR det's head, 96 -> 24
  # channels at 160x160): a loop of one register (the masked loads of a loop of two ran it 2.3x slower) by all 24 rows
  # (GATED_ROWS); under it, or with no gate (unpadded), a loop of two registers
  head = _ast(Tensor.empty(1, 96, 160, 160).conv2d(Tensor.empty(24, 96, 3, 3), padding=1).relu())
  assert cpu_opts(head, 1, 16) == [Opt(OptOps.SIMD, 2, 16), Opt(OptOps.UPCAST, 0, 24)]
  assert cpu_opts(head, 1, 8) == [Opt(OptOps.SIMD, 2, 16), Opt(OptOps.UPCAST, 0, 8)]  # (AVX2: unmeasured, unchanged)
  assert cpu_opts(_ast(Tensor.empty(1, 96, 162, 162).conv2d(Tensor.empty(24, 96, 3, 3)).relu()), 1, 16)[0] == Opt(OptOps.SIMD, 2, 32)
  assert cpu_opts(_ast(Tensor.empty(1, 64, 64, 64).conv2d(Tensor.empty(64, 64, 3, 3), padding=1).relu()), 1, 16)[0] == Opt(OptOps.SIMD, 2, 32)
  # a 24-wide input gradient of a 5x5 conv: a loop of 8 (half an AVX-512 register) padded to 32 (101 -> 71 ms at batch 128)
  dx = next(a for a in _conv_backward_asts((8, 32, 24, 24), (32, 32, 5, 5)) if [const_size(r) for r in global_ranges(a)] == [8, 32, 24, 24])
  assert cpu_opts(dx, 1, 16)[:2] == [Opt(OptOps.PADTO, 3, 32), Opt(OptOps.SIMD, 3, 32)]
  # unless its sum is short (a conv of one channel, 25 terms: the padded loop's gated stores cost 2x)
  assert cpu_opts(_ast(Tensor.empty(8, 1, 28, 28).conv2d(Tensor.empty(32, 1, 5, 5))), 1, 16) == [Opt(OptOps.SIMD, 3, 8), Opt(OptOps.UPCAST, 1, 8)]
  # a 6-wide output row (beautiful_mnist's last 3x3 conv) had no tile at all (1.3 GFLOPS): now a channel tile (its 64
  # output channels a loop of 32, the row of 6 written out, the weights packed per block of channels); the blocks' loop
  # outside the images', so each block is packed once, not once per image (batch 512, one core: 34 -> 16 ms)
  six = Tensor.empty(8, 64, 8, 8).conv2d(Tensor.empty(64, 64, 3, 3))
  for t in (six, six.relu()):
    assert cpu_opts(_ast(t), 1, 16)[-3:] == [Opt(OptOps.UPCAST, 3, 6), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  # and the padded loops compute the same as torch
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((2, 32, 24, 24), dtype=np.float32), rng.standard_normal((32, 32, 5, 5), dtype=np.float32)
  want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).relu().numpy()
  np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w)).relu().numpy(), want, rtol=1e-4, atol=1e-4)
  x6, w6 = rng.standard_normal((2, 16, 8, 8), dtype=np.float32), rng.standard_normal((64, 16, 3, 3), dtype=np.float32)
  want6 = torch.nn.functional.conv2d(torch.from_numpy(x6), torch.from_numpy(w6)).numpy()
  np.testing.assert_allclose(Tensor(x6).conv2d(Tensor(w6)).numpy(), want6, rtol=1e-4, atol=1e-4)

def test_heuristics_loop_a_depthwise_conv_along_its_width():
  # a 5x5 depthwise conv (PP-OCR's, padded: every read gated): the contiguous output width is a SIMD loop inside the
  # window's loops (2.5-5.5 -> 21-47 GFLOPS); a column sum (no sliding window) and an ungated 3x3 written out keep theirs
  x, w = Tensor.empty(1, 88, 6, 96), Tensor.empty(88, 1, 5, 5)
  assert cpu_opts(_ast(x.conv2d(w, padding=2, groups=88)), 1) == [Opt(OptOps.SIMD, 2, 32)]
  # with rows for 4 registers of accumulators (WINDOW_REGISTERS): each row's a chain of 25 dependent multiply-adds
  # (AVX-512, one core: PP-OCR rec's 240 channels at 12x80 0.56 -> 0.41 ms as 16 lanes by 4 rows)
  assert cpu_opts(_ast(x.conv2d(w, padding=2, groups=88)), 1, simd=16) == [Opt(OptOps.SIMD, 2, 32), Opt(OptOps.UPCAST, 1, 2)]
  rec = _ast(Tensor.empty(1, 240, 12, 80).conv2d(Tensor.empty(240, 1, 5, 5), padding=2, groups=240))
  assert cpu_opts(rec, 1, simd=16) == [Opt(OptOps.SIMD, 2, 16), Opt(OptOps.UPCAST, 1, 4)]
  # 3 rows, which a loop of 32 can't take within 4 registers: a loop of 16 by 3 rows (cls's 88 channels at 3x96: 34 -> 29 us)
  cls = _ast(Tensor.empty(1, 88, 3, 96).conv2d(Tensor.empty(88, 1, 5, 5), padding=2, groups=88))
  assert cpu_opts(cls, 1, simd=16) == [Opt(OptOps.SIMD, 2, 16), Opt(OptOps.UPCAST, 1, 3)]
  assert cpu_opts(cls, 1, simd=8) == [Opt(OptOps.SIMD, 2, 32)]  # (AVX2: unmeasured, unchanged)
  # ... but not a 3x3's loop of a whole register (a short chain; with rows, PP-OCR det's 96 channels at 80x80 +3.8 ms)
  det = _ast(Tensor.empty(1, 96, 80, 80).conv2d(Tensor.empty(96, 1, 3, 3), padding=1, groups=96))
  assert cpu_opts(det, 1, simd=16) == [Opt(OptOps.SIMD, 2, 16)]
  # a column sum's row of accumulators: SIMD loops of a register written out (128 columns: 16 loops of 8 floats with AVX2)
  assert cpu_opts(_ast(Tensor.empty(16, 1 << 16).sum(0)), 1) == [Opt(OptOps.SIMD, 0, 8), Opt(OptOps.UPCAST, 0, 16)]
  # a small one (a bias gradient, 1024 x 192) 64 wide: as fast, half the code (WIDE_COLUMN_SUM)
  assert cpu_opts(_ast(Tensor.empty(1024, 192).sum(0)), 1, simd=16) == [Opt(OptOps.SIMD, 0, 16), Opt(OptOps.UPCAST, 0, 4)]
  # a few partial sums combined (a large model's weight gradient, (4, 1152 * 384).sum(0)) is written out whole, a loop gcc
  # vectorizes: no columns written out for accumulators there is no loop for (128 of them: 360 ms lowering, 810 ms gcc)
  assert cpu_opts(_ast(Tensor.empty(4, 1152 * 384).sum(0)), 1) == [Opt(OptOps.UNROLL, 1, 4)]
  assert all(o.op is OptOps.UNROLL for o in cpu_opts(_ast(Tensor.empty(1, 64, 26, 66).conv2d(Tensor.empty(64, 1, 3, 3), groups=64)), 1))
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  xn, wn = rng.standard_normal((1, 88, 6, 96), dtype=np.float32), rng.standard_normal((88, 1, 5, 5), dtype=np.float32)
  want = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=2, groups=88).numpy()
  np.testing.assert_allclose(Tensor(xn).conv2d(Tensor(wn), padding=2, groups=88).numpy(), want, rtol=1e-4, atol=1e-4)
  si = Tensor(xn).conv2d(Tensor(wn), padding=2, groups=88).schedule()[-1]
  got = _exec(si, [Opt(OptOps.SIMD, 2, 32), Opt(OptOps.UPCAST, 1, 2)]).reshape(want.shape)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

def test_a_padded_windows_row_gate_is_a_bound_of_its_lanes_compare():
  # a padded depthwise conv in a SIMD loop along its width: the row's gate (the same for all lanes) is folded into the
  # bound of the columns' compare (lane_gates), not ANDed with the lanes' masks (gcc builds a mask of a shared bool bit
  # by bit: PP-OCR rec's 5x5 depthwise convs 0.61 -> 0.35 ms a core); results against torch, rows written out too
  from attograd.codegen import lowered
  from attograd.codegen.lower import _conjuncts, _in_lanes
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  xn, wn = rng.standard_normal((1, 24, 12, 40), dtype=np.float32), rng.standard_normal((24, 1, 5, 5), dtype=np.float32)
  want = torch.nn.functional.conv2d(torch.from_numpy(xn), torch.from_numpy(wn), padding=2, groups=24).numpy()
  x, w = Tensor(xn).realize(), Tensor(wn).realize()
  si = x.conv2d(w, padding=2, groups=24).schedule()[-1]
  for opts in ([Opt(OptOps.SIMD, 2, 8)], [Opt(OptOps.SIMD, 2, 8), Opt(OptOps.UPCAST, 1, 4)]):
    sink = lowered(si.ast, Device["CPU"].renderer, opts)
    mixed = [g for g in sink.toposort if g.op is Ops.AND and any(_in_lanes(c) for c in _conjuncts(g)) and not all(_in_lanes(c) for c in _conjuncts(g))]
    assert not mixed, opts
    np.testing.assert_allclose(_exec(si, opts).reshape(want.shape), want, rtol=1e-4, atol=1e-4)

def test_tile_with_a_costly_epilogue_keeps_its_rows():
  # a GELU's gradient computed from each output of x @ w.T is ~100 nodes: written out for every output of a 16x6 tile
  # it is over the budget, so the width is a SIMD loop and the rows stay written out (not a 16x1 tile, 12x slower)
  x, w, g = Tensor.empty(1024, 256, requires_grad=True), Tensor.empty(256, 64), Tensor.empty(1024, 64)
  ((x.gelu() @ w) * g).sum().backward()
  ast = next(si.ast for si in x.grad.schedule() if any(u.op is Ops.REDUCE for u in si.ast.toposort))
  opts = cpu_opts(ast, 1)
  assert Opt(OptOps.SIMD, 1, 16) in opts and Opt(OptOps.UPCAST, 0, 8) in opts, opts

def test_padto_masks_extra_iterations():
  rng = np.random.default_rng(2)
  x = Tensor(rng.standard_normal((5, 7), dtype=np.float32)).realize()
  si = (x.exp().sum(1) + x.max(axis=1)).schedule()[-1]
  plain = _exec(si, [])
  for opts in ([Opt(OptOps.PADTO, 0, 8)], [Opt(OptOps.PADTO, 1, 8)], [Opt(OptOps.PADTO, 1, 4), Opt(OptOps.UPCAST, 1, 4)]):
    np.testing.assert_allclose(_exec(si, opts), plain, rtol=1e-6)

def test_simd_loop_keeps_results():
  # a SIMD axis stays a loop inside the reduce's loops (one accumulator per iteration) and again around the store;
  # padded (gated reads and writes) or not, next to written-out copies of another axis, it computes the same
  rng = np.random.default_rng(3)
  a, b = Tensor(rng.standard_normal((12, 10), dtype=np.float32)).realize(), Tensor(rng.standard_normal((10, 30), dtype=np.float32)).realize()
  si = (a @ b).relu().schedule()[-1]
  plain = _exec(si, [])
  for opts in ([Opt(OptOps.SIMD, 1, 10)], [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 4)],
               [Opt(OptOps.SIMD, 0, 4), Opt(OptOps.UNROLL, 2, 2), Opt(OptOps.THREAD, 1, 3)]):
    np.testing.assert_array_equal(_exec(si, opts), plain, err_msg=str(opts))
  with pytest.raises(KernelOptError, match="already has a SIMD loop"):
    to_program(si.ast, Device["CPU"].renderer, [Opt(OptOps.SIMD, 1, 10), Opt(OptOps.SIMD, 0, 2)])

def test_heuristics_pad_a_conv_width_to_a_simd_loop():
  # a 30-wide conv output: no multiple of 8 divides it, so it is padded to 32 and run as a 16-iteration loop that
  # gcc vectorizes, with 8 output channels written out around it; the result is exact
  rng = np.random.default_rng(4)
  img, w = Tensor(rng.standard_normal((2, 4, 32, 32), dtype=np.float32)).realize(), Tensor(rng.standard_normal((16, 4, 3, 3), dtype=np.float32)).realize()
  out = img.conv2d(w)
  opts = cpu_opts(_ast(out), 1)
  assert opts[:3] == [Opt(OptOps.PADTO, 3, 32), Opt(OptOps.SIMD, 3, 16), Opt(OptOps.UPCAST, 1, 8)], opts
  src = to_program(_ast(out), Device["CPU"].renderer, opts)[1]
  assert "#pragma GCC unroll 1" in src
  torch = pytest.importorskip("torch")
  ref = torch.nn.functional.conv2d(torch.tensor(img.numpy()), torch.tensor(w.numpy())).numpy()
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)

def test_reads_into_the_spare_bytes_lose_their_gate():
  # a conv row padded to 32 reads up to 2 elements past the image's end, and a padded conv reads above its first row; the
  # CPU maps spare bytes before and after every buffer, so those reads need no gate (gcc's masked load kept the
  # accumulators in memory). The image ends on a page boundary: a read past it without the spare bytes would fault. A
  # read further before the buffer than the spare bytes reach keeps its gate
  rng = np.random.default_rng(5)
  img, w = Tensor(rng.standard_normal((2, 4, 32, 32), dtype=np.float32)).realize(), Tensor(rng.standard_normal((16, 4, 3, 3), dtype=np.float32)).realize()
  def gated_image_reads(out: Tensor, renderer) -> int:
    ast = _ast(out)
    uops = to_program(ast, renderer, cpu_opts(ast, 1))[2]
    return sum(1 for u in uops if u.op is Ops.LOAD and len(u.src[0].src) == 3 and u.src[0].src[0].dtype.size == img.numel())
  before, after = Device["CPU"].renderer.spare_bytes
  assert before >= 33 * 4 and after >= 2 * 4
  for pad in (0, 1):
    assert gated_image_reads(img.conv2d(w, padding=pad), CStyleRenderer()) > 0 and gated_image_reads(img.conv2d(w, padding=pad), Device["CPU"].renderer) == 0
  assert gated_image_reads(img.conv2d(w, padding=before // 4 // 32 + 2), Device["CPU"].renderer) > 0
  torch = pytest.importorskip("torch")
  for pad in (0, 1, 40):
    ref = torch.nn.functional.conv2d(torch.tensor(img.numpy()), torch.tensor(w.numpy()), padding=pad).numpy()
    np.testing.assert_allclose(img.conv2d(w, padding=pad).numpy(), ref, rtol=1e-5, atol=1e-5)

def test_concatenation_is_one_loop_per_input():
  # cat's output loop tests its counter against the inputs' boundaries; lowering splits it there, so each stretch reads
  # one input with no select (and gcc vectorizes it). The transposed middle input reads along its other axis
  rng = np.random.default_rng(6)
  a, b, c = [Tensor(rng.standard_normal((64, n), dtype=np.float32)).realize() for n in (48, 64, 16)]
  out = Tensor.cat(a, b.T, c, dim=1)
  src = to_program(_ast(out), Device["CPU"].renderer, [])[1]
  body = src[src.index("void E_"):]
  assert body.count("for (int") == 4 and "?" not in body, body
  np.testing.assert_array_equal(out.numpy(), np.concatenate([a.numpy(), b.numpy().T, c.numpy()], 1))
  # a pad's edges too, on every backend's semantics (the split happens for loops only: a GPU's thread index is no loop)
  np.testing.assert_array_equal(a.pad(((0, 0), (3, 5)), value=2.0).numpy(), np.pad(a.numpy(), ((0, 0), (3, 5)), constant_values=2.0))

def test_odd_length_loop_is_whole_vector_steps_and_the_rest():
  # a row of 90 (a vocabulary): gcc's cheap vectorizer cost model leaves a loop needing a scalar epilogue scalar, so the
  # loop is cut into 88 (11 vector steps) and 2; values at the cut and past it stay right
  rng = np.random.default_rng(7)
  x = rng.standard_normal((16, 90), dtype=np.float32) * 4
  b = rng.standard_normal(90, dtype=np.float32)
  t, tb = Tensor(x).realize(), Tensor(b).realize()
  out = (t - tb).exp()  # the row of b read again per row keeps the rows a loop of their own
  src = to_program(_ast(out), Device["CPU"].renderer, [])[1]
  body = src[src.index("void E_"):]
  assert "< 88;" in body and "< 90;" not in body, body
  np.testing.assert_allclose(out.numpy(), np.exp(x - b), rtol=2e-7)
  # a short loop is left whole: two pieces would cost more code than they save
  assert "< 10;" in to_program(_ast((t[:, :10] - tb[:10]).exp()), Device["CPU"].renderer, [])[1]

def test_a_kernel_no_axis_splits_evenly_is_still_split_across_cores():
  # a language model's head over 1026 tokens, (1026, 64) @ (90, 64).T: 5 panels of 18 columns and 513 tiles of 2 rows,
  # neither even for 2 cores: 9 slices of the rows (5 and 4 a core) where one core ran it all
  x, w = Tensor.empty(1026, 64), Tensor.empty(90, 64)
  opts = cpu_opts(_ast(x @ w.T), 2, 16)
  assert opts[:2] == [Opt(OptOps.UPCAST, 1, 18), Opt(OptOps.UPCAST, 0, 2)] and opts[-1] == Opt(OptOps.THREAD, 1, 9), opts

def _layernorm(x: Tensor) -> Tensor:
  d = x - x.mean(-1, keepdim=True)
  return d / ((d * d).mean(-1, keepdim=True) + 1e-6).sqrt()

def test_no_slice_redoes_a_sum_another_slice_did():
  # a layernorm of features stored transposed (PP-OCR rec's (40, 120) after its attention): its rows tiled by 8 leave 5
  # tiles, no split for 2 cores; the columns would split, but each column slice redid its rows' mean and variance (0.07 ->
  # 0.5 ms of CPU in 8 slices): one core runs it; where the rows split, they do
  for rows, want in ((40, []), (4096, [Opt(OptOps.THREAD, 0, 8)])):
    opts = cpu_opts(_ast(_layernorm(Tensor.empty(120, rows).T)), 2, 16)
    assert [o for o in opts if o.op is OptOps.THREAD] == want, (rows, opts)
  rng = np.random.default_rng(0)
  xn = rng.standard_normal((120, 40), dtype=np.float32)
  want = _layernorm(Tensor(xn).T).numpy()
  with Context(THREADS=2):
    realize._kernel_cache.clear()
    np.testing.assert_allclose(_layernorm(Tensor(xn).T).numpy(), want, rtol=1e-5, atol=1e-5)

def test_row_reduce_lanes_fold_in_halving_loops_and_odd_rows_pad():
  # a row max over 64 takes 32 lanes; after the row they fold by halving loops (16, 8, 4, 2, then one), each a vector
  # op, not a chain through all 32; the kernel is still named by its own loops only. A NaN in any lane comes through
  rng = np.random.default_rng(3)
  x = rng.standard_normal((64, 64), dtype=np.float32)
  x[5, 37], x[9, 0] = np.nan, np.nan
  t = Tensor(x).realize()
  ast = _ast(t.max(axis=1))
  assert cpu_opts(ast, 1)[0] == Opt(OptOps.UPCAST, 1, 32)
  name, src = to_program(ast, Device["CPU"].renderer, [Opt(OptOps.UPCAST, 1, 32)])[:2]
  assert name == "r_64_2_32" and all(f"< {n};" in src for n in (16, 8, 4, 2)), src
  np.testing.assert_array_equal(t.max(axis=1).numpy(), x.max(axis=1))
  # a row of 90 (a vocabulary) that 4 doesn't divide is padded to 96 with the reduce's identity for 16 lanes
  y = rng.standard_normal((32, 90), dtype=np.float32) - 50
  ty = Tensor(y).realize()
  for red, ref in ((ty.max(axis=1), y.max(axis=1)), (ty.sum(axis=1), y.sum(axis=1))):
    assert cpu_opts(_ast(red), 1)[:2] == [Opt(OptOps.PADTO, 1, 16), Opt(OptOps.UPCAST, 1, 16)]
    np.testing.assert_allclose(red.numpy(), ref, rtol=1e-5)

# ***** BEAM *****

def test_beam_finds_a_kernel_and_caches_it(monkeypatch, tmp_path):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(search, "MAX_ROUNDS", 1)
  rng = np.random.default_rng(3)
  na, nb = rng.standard_normal((64, 48), dtype=np.float32), rng.standard_normal((48, 32), dtype=np.float32)
  ta, tb = Tensor(na).realize(), Tensor(nb).realize()
  realize._kernel_cache.clear()
  with Context(BEAM=1):
    out = (ta @ tb).numpy()
  np.testing.assert_allclose(out, na @ nb, rtol=1e-4, atol=1e-4)
  ast = _ast(ta @ tb)
  cached = search._cache_path(ast, "CPU", 1, THREADS.value)
  assert cached.exists()
  winner = json.loads(search.cache_read(cached))
  # the second search is a cache hit: it compiles nothing
  def no_compile(*a): raise AssertionError("BEAM searched again instead of using its cache")
  assert search.beam_search(ast, "CPU", 1, no_compile) == [Opt(OptOps[op], ax, n) for op, ax, n in winner]

def test_column_operand_past_the_cache_is_packed():
  # a matmul whose column operand (k x width) outgrows a core's L2 packs its panels (2.4 MB of floats: 46 -> 103 GFLOPS
  # on one core); one that fits reads them in place (1.2 MB: packing cost 80 -> 59)
  big = cpu_opts(_ast(Tensor.empty(4096, 1536) @ Tensor.empty(1536, 384)), 1)
  fits = cpu_opts(_ast(Tensor.empty(4096, 768) @ Tensor.empty(768, 384)), 1)
  assert big[-2:] == [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  assert not any(o.op is OptOps.PACK for o in fits)

def test_weight_gradient_of_a_narrow_model_packs_its_column_panels():
  # a d=128 model's weight gradient over a chunk of 1024 tokens, (1024, 128)^T @ (1024, 512): 16 row blocks each re-read
  # the 2 MiB column operand from L3 unpacked (over 2048 tokens, one core: 11.3 -> 5.0 ms packed); 8 row blocks (64
  # rows) don't pay for the packing
  g = Tensor.empty(1024, 512)
  opts = cpu_opts(_ast(Tensor.empty(1024, 128).T @ g), 1)
  assert [o.op for o in opts[-2:]] == [OptOps.SWAP, OptOps.PACK]
  assert not any(o.op is OptOps.PACK for o in cpu_opts(_ast(Tensor.empty(1024, 64).T @ g), 1))

def test_weight_gradient_read_across_rows_packs_whole_lines_of_rows():
  # dW = X^T @ dY over a chunk of tokens, with a column operand read in place: both read across their rows; on AVX-512 a
  # row block is a whole cache line of X (16 rows; 24 where they divide) by one register, packed per block (GPT d=128,
  # one core: (1024, 512)^T @ (1024, 128) 5.8 -> 4.0 ms, (2048, 384)^T @ (2048, 128) 3.3 -> 2.5)
  rng = np.random.default_rng(3)
  x, dy = (rng.standard_normal(s, dtype=np.float32) for s in ((1024, 512), (1024, 128)))
  si = (Tensor(x).realize().T @ Tensor(dy).realize()).schedule()[-1]
  opts = cpu_opts(si.ast, 1, 16)
  assert opts == [Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.PACK, 0, 0)]
  np.testing.assert_allclose(_exec(si, opts).reshape(512, 128), x.T @ dy, rtol=1e-4, atol=1e-3)
  # operands L2 keeps together (a d=64 model's, 1024 tokens: 1.5 MiB) get the plain tile, unpacked (0.54 -> 0.37 ms)
  small = cpu_opts(_ast(Tensor.empty(1024, 64).T @ Tensor.empty(1024, 256)), 1, 16)
  assert small == [Opt(OptOps.SIMD, 1, 32), Opt(OptOps.UPCAST, 0, 8)]
  assert cpu_opts(_ast(Tensor.empty(2048, 384).T @ Tensor.empty(2048, 128)), 1, 16)[:2] == [Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 24)]
  # AVX2's 16 registers (unmeasured there) and a wide column operand (its panels are packed instead) keep their tiles
  assert not any(o.op is OptOps.PACK for o in cpu_opts(si.ast, 1, 8))
  assert [o.op for o in cpu_opts(_ast(Tensor.empty(1024, 128).T @ Tensor.empty(1024, 512)), 1, 16)[-2:]] == [OptOps.SWAP, OptOps.PACK]

def test_packed_panel_and_its_rows_fit_l1():
  # (AVX-512) x @ w.T at k = 384: a panel two registers wide is 48 KiB, all of L1 with no room for its rows' block; one
  # register wide (24 KiB) by 12 rows (18 KiB) both fit (BERT MiniLM's 768 tokens: (768, 384) @ (384, 384)^T 3.9 -> 2.9 ms)
  rng = np.random.default_rng(4)
  x, w = rng.standard_normal((96, 384), dtype=np.float32), rng.standard_normal((64, 384), dtype=np.float32)
  si = (Tensor(x).realize() @ Tensor(w).realize().T).schedule()[-1]
  opts = cpu_opts(si.ast, 1, 16)
  assert opts[:2] == [Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 12)] and OptOps.PACK in [o.op for o in opts]
  np.testing.assert_allclose(_exec(si, opts).reshape(96, 64), x @ w.T, rtol=1e-4, atol=1e-3)
  # rows 12 doesn't divide get 16 where they fit (k = 384: the panel and 16 rows fill L1 exactly)
  assert cpu_opts(_ast(Tensor.empty(896, 384) @ Tensor.empty(384, 384).T), 1, 16)[:2] == [Opt(OptOps.SIMD, 1, 16), Opt(OptOps.UPCAST, 0, 16)]
  # a panel two registers wide that fits with its rows (k = 128), one no width fits (k = 1536, GPT d=128's k = 512), rows
  # neither divides, AVX2, and rows past L2 (row_blocks' 4096 tokens) keep their tiles
  for a, b, simd in (((768, 128), (384, 128), 16), ((768, 1536), (384, 1536), 16), ((2048, 512), (128, 512), 16),
                     ((1000, 384), (384, 384), 16), ((768, 384), (384, 384), 8), ((4096, 384), (1536, 384), 16)):
    assert cpu_opts(_ast(Tensor.empty(*a) @ Tensor.empty(*b).T), 1, simd)[0] == Opt(OptOps.SIMD, 1, 2 * simd)

def test_rows_past_l2_are_cut_in_blocks_that_reuse_every_panel():
  # (AVX-512: 16-float registers, tiles 32 wide) panels packed outside the rows read the whole rows operand once per panel: past L2 (rows x k > 2 MiB) the rows are cut
  # in blocks L2 keeps (THREAD on their outermost axis), each block with all panels (one core, a d=384 transformer's
  # (4096, 384) @ (384, 1536)^T: 70 -> 54 ms in 8 blocks of 512 rows)
  assert cpu_opts(_ast(Tensor.empty(4096, 384) @ Tensor.empty(1536, 384).T), 1, 16)[-1] == Opt(OptOps.THREAD, 1, 8)
  # a contiguous column operand under PACK_MIN_PANELS is packed too where the rows are blocked ((1152, 384): 61 -> 103
  # GFLOPS in 16 blocks); (768, 384) stays in place
  assert cpu_opts(_ast(Tensor.empty(4096, 1152) @ Tensor.empty(1152, 384)), 1, 16)[2:] == \
    [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0), Opt(OptOps.THREAD, 1, 16)]
  # with two cores, blocks the cores share (a multiple of them); rows split as (sentence, token) by a permute: the
  # sentences are cut, not every sentence's tokens
  assert cpu_opts(_ast(Tensor.empty(4096, 384) @ Tensor.empty(1536, 384).T), 2, 16)[-1] == Opt(OptOps.THREAD, 1, 8)
  attn = Tensor.empty(16, 6, 256, 64).transpose(1, 2).reshape(16, 256, 384) @ Tensor.empty(384, 384).T
  assert cpu_opts(_ast(attn), 1, 16)[-1] == Opt(OptOps.THREAD, 1, 8)
  # no blocks where one that fits L2 would have too few rows to pay for packing every panel again (k = 1536: 128 rows),
  # nor where the rows operand fits L2 whole (a BERT batch's 1024 tokens at d=384), nor for a few panels (GPT d=128's
  # (2048, 512) @ (512, 128)^T: 4 panels, L3 streams the rows 4 times)
  for a, b in (((4096, 1536), (384, 1536)), ((1024, 384), (1536, 384)), ((2048, 512), (128, 512))):
    assert not any(o.op is OptOps.THREAD for o in cpu_opts(_ast(Tensor.empty(*a) @ Tensor.empty(*b).T), 1, 16))
  # and the blocked kernel computes the product
  rng = np.random.default_rng(6)
  x, w = rng.standard_normal((2048, 384), dtype=np.float32), rng.standard_normal((768, 384), dtype=np.float32)
  si = (Tensor(x).realize() @ Tensor(w).realize().T).schedule()[-1]
  opts = cpu_opts(si.ast, 1, 16)
  assert opts[-1] == Opt(OptOps.THREAD, 1, 4)
  np.testing.assert_allclose(_exec(si, opts).reshape(2048, 768), x @ w.T, rtol=1e-4, atol=1e-3)

def test_transposing_copy_is_blocked():
  # x.T.contiguous() reads across the input's rows: 4x4 blocks (a power-of-two row length put every line of a column
  # in the same cache sets: (2048, 512) 10.0 -> 3.9 ms on one core); a copy that keeps the order gets no block
  x = Tensor.empty(2048, 512).realize()
  assert cpu_opts(_ast(x.T.contiguous()), 1) == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4)]
  assert not any(o.op is OptOps.UPCAST for o in cpu_opts(_ast(x.reshape(2048, 8, 64).permute(1, 0, 2).contiguous()), 1))
  na = np.random.default_rng(5).standard_normal((36, 20)).astype(np.float32)
  np.testing.assert_array_equal(Tensor(na).T.contiguous().numpy(), na.T)

def test_big_matmul_packs_each_column_panel_per_call():
  rng = np.random.default_rng(4)
  na, nb = rng.standard_normal((256, 1024), dtype=np.float32), rng.standard_normal((1024, 1024), dtype=np.float32)
  a, b = Tensor(na).realize(), Tensor(nb).realize()
  (si,) = (a @ b).schedule()  # no copy of b: the matmul kernel packs what it reads
  opts = cpu_opts(si.ast, 2)
  assert opts[2:] == [Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0), Opt(OptOps.THREAD, 0, 8)]
  _, _, uops = to_program(si.ast, Device["CPU"].renderer, opts)
  assert [u.dtype.size for u in uops if u.op is Ops.DEFINE_REG and u.dtype.size > 256] == [1024 * 16]  # one k x 16 panel
  one, two = _run_on(lambda: a @ b, 1), _run_on(lambda: a @ b, 2)
  GlobalCounters.reset()
  before = GlobalCounters.mem_used
  out = (a @ b).realize()
  assert GlobalCounters.mem_peak - before == out.nbytes()  # the scratch is on each call's stack: no device memory but the output
  np.testing.assert_array_equal(one, two)
  np.testing.assert_allclose(two, na @ nb, rtol=1e-4, atol=1e-3)

def test_panels_are_packed_outside_every_row_axis_they_dont_move():
  # attention's output (batch, heads, tokens, dim) -> (batch, tokens, heads*dim) @ w.T: the reshape doesn't merge batch and
  # tokens, so the rows are two axes; each panel is packed once outside both, not once per sentence (11 -> 55 GFLOPS)
  rng = np.random.default_rng(5)
  na, nw = rng.standard_normal((64, 12, 16, 32), dtype=np.float32), rng.standard_normal((384, 384), dtype=np.float32)
  a, w = Tensor(na).realize(), Tensor(nw).realize()
  (si,) = (a.transpose(1, 2).reshape(64, 16, 384) @ w.T).schedule()
  opts = cpu_opts(si.ast, 1)
  assert opts[-3:] == [Opt(OptOps.SWAP, 1, 2), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
  want = na.transpose(0, 2, 1, 3).reshape(64, 16, 384) @ nw.T
  np.testing.assert_allclose(_exec(si, opts), want.reshape(-1), rtol=1e-4, atol=1e-3)

def _run_on(make, threads):
  realize._kernel_cache.clear()
  with Context(THREADS=threads): return make().numpy()

@pytest.mark.parametrize("name", ["matmul", "conv"])
def test_pack_keeps_results(kernels, name):
  si, reference = kernels[name]
  ax = axes(si.ast)
  glob = [i for i, r in enumerate(ax) if r.arg[1] is AxisKind.GLOBAL]
  packed = 0
  for i in glob:
    for opts in ([Opt(OptOps.PACK, i, 0)], [Opt(OptOps.UPCAST, glob[-1], 2), Opt(OptOps.PACK, i, 0), Opt(OptOps.THREAD, glob[0], 2)]):
      try: got = _exec(si, opts)
      except KernelOptError: continue
      packed += 1
      np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5, err_msg=f"{name} with {opts}")
  assert packed >= 2

def test_pack_refuses_what_it_cant_copy():
  renderer = Device["CPU"].renderer
  with pytest.raises(KernelOptError, match="one read inside a reduce"): to_program(_ast(Tensor.rand(6, 5).realize() + 1), renderer, [Opt(OptOps.PACK, 0, 0)])
  mm = _ast(Tensor.rand(16, 16).realize() @ Tensor.rand(16, 16).realize())
  with pytest.raises(KernelOptError, match="only THREAD may follow PACK"): to_program(mm, renderer, [Opt(OptOps.PACK, 1, 0), Opt(OptOps.UPCAST, 1, 2)])

def _scaled_matvec(dt, rows: int = 64, cols: int = 256) -> Tensor:
  """x @ (W * s).T with s of dtype dt, one value per row and block of 32 columns (a quantized weight's block scales)."""
  rng = np.random.default_rng(5)
  s = Tensor((rng.random((rows, cols // 32)) + 0.5).astype(np.float32)).cast(dt).realize()
  w = Tensor(rng.standard_normal((rows, cols), dtype=np.float32)).realize()
  x = Tensor(rng.standard_normal((1, cols), dtype=np.float32)).realize()
  return x @ (w * s.float().reshape(rows, cols // 32, 1).expand(rows, cols // 32, 32).reshape(rows, cols)).T

@pytest.mark.parametrize("dt", [dtypes.float16, dtypes.bfloat16])
def test_widen_converts_block_scales_at_once(dt):
  """A narrow float read once per block and row of a matvec: the heuristics convert an iteration's values for all its
  rows in one loop (WIDEN) where each row's copy of the loop body converted its own, and the kernel computes what it
  does without, on one core and across cores."""
  si = _scaled_matvec(dt).schedule()[-1]
  opts = cpu_opts(si.ast, 1, 16)
  assert opts[-1] == Opt(OptOps.WIDEN, 0, 0), opts
  plain = _exec(si, [])
  for o in (opts, opts + [Opt(OptOps.THREAD, 0, 2)]):
    np.testing.assert_allclose(_exec(si, o), plain, rtol=1e-5, atol=1e-5, err_msg=str(o))
  def conversions(opts: list[Opt]) -> int:
    src = to_program(si.ast, Device["CPU"].renderer, opts)[1]
    return len(re.findall(r"\(\(float\)\(val\d+\)\)|f16_to_f32\(val|bf16_to_f32\(val", src[src.index("void r_"):]))
  assert conversions(opts) == 1 and conversions(opts[:-1]) == 4  # 4 rows at once (UPCAST 0, 4)

def test_widen_refuses_what_it_cant_convert():
  renderer = Device["CPU"].renderer
  mm = _ast(Tensor.rand(16, 16).realize() @ Tensor.rand(16, 16).realize())
  with pytest.raises(KernelOptError, match="no float16 or bfloat16 read"): to_program(mm, renderer, [Opt(OptOps.WIDEN, 0, 0)])
  # a half matrix read along the vectorized lanes is converted as vectors where it is read
  half = _ast(Tensor.rand(1, 64).realize() @ Tensor.rand(64, 64).half().realize().float())
  with pytest.raises(KernelOptError, match="no float16 or bfloat16 read"): to_program(half, renderer, [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.WIDEN, 0, 0)])
  sv = _ast(_scaled_matvec(dtypes.float16))
  with pytest.raises(KernelOptError, match="only THREAD may follow PACK or WIDEN"): to_program(sv, renderer, [Opt(OptOps.WIDEN, 0, 0), Opt(OptOps.UPCAST, 0, 2)])

def _conv_backward_asts(xshape=(16, 8, 13, 13), wshape=(16, 8, 3, 3)):
  from attograd.schedule.schedule import create_schedule
  x = Tensor.empty(*xshape, requires_grad=True)
  w = Tensor.empty(*wshape, requires_grad=True)
  x.conv2d(w).relu().sum().backward()
  return [si.ast for si in create_schedule([x.grad.uop, w.grad.uop])[0] if si.ast.op.name == "SINK"]

def test_conv_backward_indexes_without_divmod():
  # a window's gradient reads its rows one longer than the data (pad, reshape): under the pad's gate that is
  # plain y - ky, with no division or remainder left in any index or gate
  from attograd.uop.ops import AxisKind, Ops
  asts = _conv_backward_asts()
  for ast in asts:
    assert not {Ops.IDIV, Ops.MOD} & {u.op for u in ast.toposort}, "div/mod left in a conv backward kernel"
  # the input gradient: each window position tested once per axis, the weight read without a gate
  dx = next(a for a in asts if any(u.op is Ops.INDEX and u.gate is not None for u in a.toposort))
  gates = {u.gate.render() for u in dx.toposort if u.op is Ops.INDEX and u.gate is not None}
  assert gates == {"(((-1<(r4+(r5*-1)))&((r4+(r5*-1))<11))&((-1<(r2+(r6*-1)))&((r2+(r6*-1))<11)))"}, gates
  loads = [u.src[0] for u in dx.toposort if u.op is Ops.LOAD]
  assert sum(len(ld.src) == 2 for ld in loads) >= 1, "the weight's address is always in bounds: no gate"

def test_heuristics_write_out_a_conv_weight_gradient_window():
  # dW is (16, 8, 3, 3) summed over batch and image: the window's rows of 3 (read contiguously) padded to a SIMD loop of
  # 4, by the window's 3 rows and 8 output channels: 24 vector accumulators (written out, 36 scalar ones were 1.6-2.9x
  # slower on beautiful_mnist's and the MNIST example's weight gradients)
  from attograd.codegen.opt import global_ranges, const_size
  dw = next(a for a in _conv_backward_asts() if [const_size(r) for r in global_ranges(a)] == [16, 8, 3, 3])
  opts = cpu_opts(dw, 1)
  assert opts[:4] == [Opt(OptOps.PADTO, 3, 4), Opt(OptOps.SIMD, 3, 4), Opt(OptOps.UPCAST, 2, 3), Opt(OptOps.UPCAST, 0, 8)], opts

def test_heuristics_for_pooling_and_bias_gradients():
  rng = np.random.default_rng(6)
  x = Tensor(rng.standard_normal((4, 8, 26, 26), dtype=np.float32)).realize()
  # a pool's 2x2 window is written out (a plain loop over outputs is left, which gcc vectorizes)
  si = x.max_pool2d(2).schedule()[-1]
  opts = cpu_opts(si.ast, 1)
  assert opts == [Opt(OptOps.UNROLL, 3, 2), Opt(OptOps.UNROLL, 2, 2)], opts  # (batch, channels and rows are one loop)
  np.testing.assert_array_equal(_exec(si, opts), _exec(si, []))
  # a sum over batch x 26 x 26 (a conv's bias gradient): 26 x 26 is one loop of 676, which 4 divides: 4 accumulators
  g = Tensor(rng.standard_normal((16, 8, 26, 26), dtype=np.float32)).realize()
  si = g.sum((0, 2, 3)).schedule()[-1]
  opts = cpu_opts(si.ast, 1)
  assert opts == [Opt(OptOps.UPCAST, 2, 4)], opts
  # with no 4 in the innermost axis (batch x 26 x 13, transposed so they stay apart): factors from the innermost axis
  # outward, 8 in all (13 has none, 26 gives 2, the batch 4)
  g = Tensor(rng.standard_normal((16, 8, 13, 26), dtype=np.float32)).realize()
  si = g.transpose(2, 3).sum((0, 2, 3)).schedule()[-1]
  opts = cpu_opts(si.ast, 1)
  assert opts == [Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 1, 4)], opts
  np.testing.assert_allclose(_exec(si, opts), g.numpy().astype(np.float64).transpose(0, 1, 3, 2).sum((0, 2, 3)), rtol=1e-5, atol=1e-3)
  np.testing.assert_allclose(_exec(si, opts), g.numpy().astype(np.float64).sum((0, 2, 3)), rtol=1e-5, atol=1e-3)
  # an elementwise kernel that reads pooled[y//2, x//2] (a pool's gradient) is written out in steps of 2 along the rows;
  # the 26-wide row stays a loop (24 of it vectorized, split_loop), where written out its loop of 13 stayed scalar
  # (64x32x26x26 one core: 0.85 ms along both, 0.69 along the rows); a 6-wide row (a loop that doesn't vectorize) along both
  p = Tensor(rng.standard_normal((4, 8, 13, 13), dtype=np.float32)).realize()
  si = (x * p.reshape(4, 8, 13, 1, 13, 1).expand(4, 8, 13, 2, 13, 2).reshape(4, 8, 26, 26)).schedule()[-1]
  opts = cpu_opts(si.ast, 1)
  assert opts == [Opt(OptOps.UPCAST, 1, 2)], opts  # (batch and channels are one loop)
  np.testing.assert_array_equal(_exec(si, opts), _exec(si, []))
  small = Tensor(rng.standard_normal((4, 8, 6, 6), dtype=np.float32)).realize()
  si = (small * p[:, :, :3, :3].reshape(4, 8, 3, 1, 3, 1).expand(4, 8, 3, 2, 3, 2).reshape(4, 8, 6, 6)).schedule()[-1]
  opts = cpu_opts(si.ast, 1)
  assert opts == [Opt(OptOps.UPCAST, 2, 2), Opt(OptOps.UPCAST, 1, 2)], opts
  np.testing.assert_array_equal(_exec(si, opts), _exec(si, []))

def test_heuristics_dont_take_a_pools_argmax_for_a_column_sum():
  # a max pool after a batchnorm (beautiful_mnist): the argmax its gradient needs reads the per-channel scale and shift,
  # contiguous along the channels, next to the window it reduces. Taken for a column sum, its 32 channels were written
  # out, each with the nested window reduces (114 ms a step, one core): the reads summed decide, not the parameters
  x = Tensor.empty(4, 32, 20, 20, requires_grad=True)
  (x * Tensor.empty(32).reshape(1, 32, 1, 1) + Tensor.empty(32).reshape(1, 32, 1, 1)).max_pool2d().sum().backward()
  argmax = next(si.ast for si in x.grad.schedule() if si.ast.op is Ops.SINK and si.bufs[0].dtype == dtypes.int64)
  for simd in (8, 16): assert all(o.op is OptOps.UNROLL for o in cpu_opts(argmax, 1, simd)), cpu_opts(argmax, 1, simd)
  # (a real column sum is still one: x.sum(0) writes out a row of outputs)
  assert cpu_opts(_ast(Tensor.empty(64, 1024).sum(0)), 1) == [Opt(OptOps.SIMD, 0, 8), Opt(OptOps.UPCAST, 0, 8)]

def test_heuristics_write_out_only_whole_vectors_of_a_tiles_width():
  # a width no SIMD loop divides (20, 12, 10) written out left gcc's copies mostly scalar even with only a bias after
  # the sums (5x5 conv at 24px 4.6 GFLOPS, 3x3 at 12px 7.9, a (512, 20) linear layer 20, one core): padded to a loop
  # (to whole registers by loop_width: 20 -> 32 for two AVX-512 registers, 24 for three AVX2 loops of 8)
  for simd in (8, 16):
    to, w = (32, 32) if simd == 16 else (24, 8)
    # (a conv's rows on AVX-512: padded to its input's 24 and merged with the rows around them, merged_rows)
    conv = _ast(Tensor.empty(8, 32, 24, 24).conv2d(Tensor.empty(32, 32, 5, 5), Tensor.empty(32)))
    merge = [Opt(OptOps.PADTO, 3, 24), Opt(OptOps.MERGE, 2, 3)] if simd == 16 else [Opt(OptOps.PADTO, 3, to)]
    assert cpu_opts(conv, 1, simd) == [*merge, Opt(OptOps.SIMD, 3, w), Opt(OptOps.UPCAST, 1, 8)]
    # a 10-wide row of 64 channels: a channel tile (two registers of channels by the row: 14.8 -> 12.3 ms at batch 128)
    conv10 = _ast(Tensor.empty(8, 64, 12, 12).conv2d(Tensor.empty(64, 64, 3, 3), Tensor.empty(64)))
    assert cpu_opts(conv10, 1, simd)[-3:] == [Opt(OptOps.UPCAST, 3, 10), Opt(OptOps.SWAP, 0, 1), Opt(OptOps.PACK, 0, 0)]
    # not a linear layer's 20 columns: written out by two registers of rows, 40 accumulators
    linear = _ast(Tensor.empty(4096, 512) @ Tensor.empty(512, 20) + Tensor.empty(20))
    assert cpu_opts(linear, 1, simd) == [Opt(OptOps.PADTO, 1, to), Opt(OptOps.SIMD, 1, w), Opt(OptOps.UPCAST, 0, 8)]
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(1)
  x, w, b = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 16, 12, 12), (24, 16, 3, 3), (24,)))
  want = torch.nn.functional.conv2d(*map(torch.from_numpy, (x, w, b))).numpy()
  np.testing.assert_allclose(Tensor(x).conv2d(Tensor(w), Tensor(b)).numpy(), want, rtol=1e-4, atol=1e-4)

def test_heuristics_pad_a_gated_conv_gradient_to_a_simd_loop():
  # a conv's input gradient (13 wide) reads the output gradient under the window's gate: padded to 16 and run as a SIMD
  # loop, with 8 input channels written out, and the channels summed in a loop of their own inside each window position
  # (the gate tested once per sum, not once per multiply-add)
  from attograd.codegen import lowered
  dx = next(a for a in _conv_backward_asts() if any(u.op is Ops.INDEX and u.gate is not None for u in a.toposort))
  opts = cpu_opts(dx, 1)
  assert opts[:3] == [Opt(OptOps.PADTO, 3, 16), Opt(OptOps.SIMD, 3, 16), Opt(OptOps.UPCAST, 1, 8)], opts
  assert sum(u.op is Ops.DEFINE_REG for u in lowered(dx, Device["CPU"].renderer, opts).toposort) == 2  # window sums, channel sums
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(7)
  nx, nw = rng.standard_normal((16, 8, 13, 13), dtype=np.float32), rng.standard_normal((16, 8, 3, 3), dtype=np.float32)
  x, w = Tensor(nx, requires_grad=True), Tensor(nw, requires_grad=True)
  x.conv2d(w).relu().sum().backward()
  tx = torch.tensor(nx, requires_grad=True)
  torch.nn.functional.conv2d(tx, torch.tensor(nw)).relu().sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)

def test_gated_conv_gradient_skips_rows_outside_the_image():
  # the input gradient's row gate (y - ky inside the output gradient's rows) varies along no SIMD lane: where it is false
  # the channel sum inside it runs 0 times (its loop's count is a select), where before it was summed and thrown away
  # (beautiful_mnist's 5x5 input gradient, 24 rows from 20: 241 -> 208 ms, one core); the lanes' gate stays a select
  from attograd.codegen import lowered
  torch = pytest.importorskip("torch")
  for shape, pad in (((16, 8, 13, 13), 0), ((4, 8, 11, 9), 2)):
    wshape = (16, 8, 3, 3)
    asts = _conv_backward_asts(shape, wshape) if pad == 0 else None
    rng = np.random.default_rng(11)
    nx, nw = rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(wshape, dtype=np.float32)
    x, w = Tensor(nx, requires_grad=True), Tensor(nw, requires_grad=True)
    x.conv2d(w, padding=pad).relu().sum().backward()
    tx, tw = torch.tensor(nx, requires_grad=True), torch.tensor(nw, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, padding=pad).relu().sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)
    if asts is None: continue
    dx = next(a for a in asts if any(u.op is Ops.INDEX and u.gate is not None for u in a.toposort))
    sink = lowered(dx, Device["CPU"].renderer, cpu_opts(dx, 1))
    counted = [u for u in sink.toposort if u.op is Ops.RANGE and u.src[0].op is Ops.WHERE]
    assert len(counted) == 1 and counted[0].src[0].src[2].op is Ops.CONST and counted[0].src[0].src[2].arg == 0, counted

def test_heuristics_merge_a_convs_narrow_rows_with_the_rows_around_them():
  # a 5x5 conv's 20-wide output rows (beautiful_mnist's 32 -> 32 at 24x24) padded to its input's row of 24 and merged
  # with the rows loop (MERGE): the input is read linearly in one loop of 20 x 24, a SIMD loop of 32 over it keeps 20 of
  # 24 lanes busy where a row alone padded to 32 kept 20 of 32 (191 -> 136 ms at batch 512, one core)
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(12)
  nx, nw, nb = (rng.standard_normal(s, dtype=np.float32) for s in ((2, 32, 24, 24), (32, 32, 5, 5), (32,)))
  si = Tensor(nx).conv2d(Tensor(nw), Tensor(nb)).relu().schedule()[-1]
  opts = cpu_opts(si.ast, 1, 16)
  assert opts[:4] == [Opt(OptOps.PADTO, 3, 24), Opt(OptOps.MERGE, 2, 3), Opt(OptOps.SIMD, 3, 32), Opt(OptOps.UPCAST, 1, 8)], opts
  want = torch.nn.functional.conv2d(*map(torch.from_numpy, (nx, nw, nb))).relu().numpy().reshape(-1)
  np.testing.assert_allclose(_exec(si, opts), want, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(_exec(si, opts), _exec(si, [Opt(OptOps.PADTO, 3, 32), Opt(OptOps.SIMD, 3, 32), Opt(OptOps.UPCAST, 1, 8)]))
  # not a padded conv's: its reads are gated along the columns, which merged would be a div and mod per lane
  padded = Tensor.empty(2, 32, 24, 24).conv2d(Tensor.empty(32, 32, 5, 5), padding=2).relu().schedule()[-1]
  assert not any(o.op is OptOps.MERGE for o in cpu_opts(padded.ast, 1, 16))
  # the rows are merged only with the loop directly around them, once, before either is split
  with pytest.raises(KernelOptError, match="directly inside"): apply_opt(si.ast, Opt(OptOps.MERGE, 1, 3))
  with pytest.raises(KernelOptError, match="split already"): apply_opt(apply_opt(si.ast, Opt(OptOps.UPCAST, 3, 4)), Opt(OptOps.MERGE, 2, 3))

def test_heuristics_loop_a_small_conv_weight_gradient_window():
  # conv1 of the MNIST example: dW (8, 1, 3, 3) summed over a 26-wide image: its window a SIMD loop of 4 by 3 by the 8
  # channels (1.43 -> 0.65 ms at batch 128, one core; written out with 2 partial sums along the rows before)
  from attograd.schedule.schedule import create_schedule
  from attograd.codegen.opt import global_ranges, const_size
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(10)
  nx, nw = rng.standard_normal((4, 1, 28, 28), dtype=np.float32), rng.standard_normal((8, 1, 3, 3), dtype=np.float32)
  x, w = Tensor(nx), Tensor(nw, requires_grad=True)
  x.conv2d(w).relu().sum().backward()
  dw = next(si.ast for si in create_schedule([w.grad.uop])[0] if si.ast.op is Ops.SINK and [const_size(r) for r in global_ranges(si.ast)] == [8, 3, 3])
  assert cpu_opts(dw, 1)[:4] == [Opt(OptOps.PADTO, 2, 4), Opt(OptOps.SIMD, 2, 4), Opt(OptOps.UPCAST, 1, 3), Opt(OptOps.UPCAST, 0, 8)]
  tw = torch.tensor(nw, requires_grad=True)
  torch.nn.functional.conv2d(torch.tensor(nx), tw).relu().sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-4, atol=1e-3)

def test_heuristics_channel_tile_for_a_conv_weight_gradient():
  # beautiful_mnist's 5x5 32->32 conv at 24x24: dW summed over chunks of images. Its window's 5-wide rows padded to a loop
  # of 8 kept 5 of 16 lanes busy; the 32 output channels are the loop instead (two registers), the row of 5 written out,
  # and the output gradient packed per chunk (one core, batch 128: 69 -> 24 ms). Values against torch
  torch = pytest.importorskip("torch")
  from attograd.schedule.schedule import create_schedule
  rng = np.random.default_rng(11)
  nx, nw = rng.standard_normal((64, 32, 24, 24), dtype=np.float32), rng.standard_normal((32, 32, 5, 5), dtype=np.float32)
  ng = rng.standard_normal((64, 32, 20, 20), dtype=np.float32)
  x, w = Tensor(nx), Tensor(nw, requires_grad=True)
  x.conv2d(w).backward(Tensor(ng))
  dw = next(si.ast for si in create_schedule([w.grad.uop])[0] if si.ast.op is Ops.SINK and [const_size(r) for r in global_ranges(si.ast)][-4:] == [32, 32, 5, 5])
  opts = cpu_opts(dw, 1, 16)
  assert Opt(OptOps.SIMD, 4, 32) in opts and opts[-2:] == [Opt(OptOps.UPCAST, 4, 5), Opt(OptOps.PACK, 0, 0)], opts
  with Context(THREADS=1): got = w.grad.numpy()
  tw = torch.tensor(nw, requires_grad=True)
  torch.nn.functional.conv2d(torch.tensor(nx), tw).backward(torch.tensor(ng))
  np.testing.assert_allclose(got, tw.grad.numpy(), rtol=1e-4, atol=1e-2)

# ***** STASH: softmax's exp once per element *****

def test_heuristics_stash_softmax_exp_once():
  # the sum's loop stores each exp to the output and the output's loop scales it in place: exp's range reduction (its
  # log2(e) constant) appears once in the source, and the result is torch's
  rng = np.random.default_rng(6)
  x = Tensor(rng.standard_normal((64, 256), dtype=np.float32)).realize()
  ast = _ast(x.softmax(1))
  opts = cpu_opts(ast, 2)
  assert opts[0] == Opt(OptOps.STASH, 1, 3), opts
  assert to_program(ast, Device["CPU"].renderer, opts)[1].count("1.4426950216293335f") == 1
  assert to_program(ast, Device["CPU"].renderer, opts[1:])[1].count("1.4426950216293335f") == 2
  torch = pytest.importorskip("torch")
  np.testing.assert_allclose(x.softmax(1).numpy(), torch.tensor(x.numpy()).softmax(1).numpy(), rtol=1e-6, atol=1e-7)
  # no transcendental to save: layernorm's x - mean is read back from the input instead
  assert not any(o.op is OptOps.STASH for o in cpu_opts(_ast(x.layernorm(1)), 2))

@pytest.mark.parametrize("shape, axis", [((3, 5, 40), -1), ((6, 20), 1), ((2, 33), 1)])
def test_stash_keeps_results(shape, axis):
  rng = np.random.default_rng(7)
  x = Tensor(rng.standard_normal(shape, dtype=np.float32) * 4).realize()
  si = x.softmax(axis).schedule()[-1]
  plain = _exec(si, [])
  ax = axes(si.ast)
  o, r = sum(a.arg[1] is AxisKind.GLOBAL for a in ax) - 1, len(ax) - 1
  tried = 0
  for more in ([], [Opt(OptOps.UPCAST, r, 4)], [Opt(OptOps.UNROLL, r, 2), Opt(OptOps.UPCAST, o, 2)], [Opt(OptOps.SIMD, o, 4)],
               [Opt(OptOps.PADTO, r, 48), Opt(OptOps.UPCAST, 0, 2)], [Opt(OptOps.THREAD, 0, 2)], [Opt(OptOps.PADTO, o, 48)]):
    try: got = _exec(si, [Opt(OptOps.STASH, o, r), *more])
    except KernelOptError: continue
    tried += 1
    np.testing.assert_allclose(got, plain, rtol=1e-6, atol=1e-7, err_msg=str(more))
  assert tried >= 4

def test_stash_refuses_what_would_overwrite_results():
  renderer = Device["CPU"].renderer
  x = Tensor.rand(8, 16).realize()
  sm = _ast(x.softmax(1))
  # every core would store the whole row, over outputs another core already scaled
  with pytest.raises(KernelOptError, match="every core"): to_program(sm, renderer, [Opt(OptOps.STASH, 1, 3), Opt(OptOps.THREAD, 1, 2)])
  # the reduce must stay outside the loop that reads the row back
  sm3 = _ast(Tensor.rand(8, 4, 16).realize().permute(1, 0, 2).softmax(2))  # (permuted: its two outer axes stay two)
  with pytest.raises(KernelOptError, match="outside the loop"): to_program(sm3, renderer, [Opt(OptOps.STASH, 2, 4), Opt(OptOps.SWAP, 1, 2)])
  # with the row's axis outside another, the reduce runs inside the loop it would stash for
  with pytest.raises(KernelOptError, match="innermost"): to_program(sm3, renderer, [Opt(OptOps.SWAP, 1, 2), Opt(OptOps.STASH, 1, 4)])
  with pytest.raises(KernelOptError, match="before the opts that split"): to_program(sm, renderer, [Opt(OptOps.UPCAST, 3, 4), Opt(OptOps.STASH, 1, 3)])
  with pytest.raises(KernelOptError, match="differ in size"): to_program(_ast(x[:, :8].exp() * x.exp().sum(1, keepdim=True)), renderer, [Opt(OptOps.STASH, 1, 2)])
  with pytest.raises(KernelOptError, match="computes nothing"): to_program(_ast(x.sum(1, keepdim=True) + x.T.contiguous().T * 2), renderer, [Opt(OptOps.STASH, 1, 2)])
  with pytest.raises(KernelOptError, match="work-groups"): apply_opt(sm, Opt(OptOps.STASH, 1, 3), has_local=True)

def test_stash_replaces_the_reduce_everywhere():
  # softmax's gradient reads the row sum of exps inside other reduces too: they must read the stashing reduce, not keep
  # a second copy of it (computed twice, and partial sums chosen for both)
  x = Tensor.rand(8, 64, requires_grad=True).realize()
  loss = (x.softmax(1) * Tensor.rand(8, 64).realize()).sum()
  ast = _ast(loss.gradient(x)[0])
  opts = cpu_opts(ast, 2)
  assert opts[0].op is OptOps.STASH, opts
  stashed = apply_opt(ast, opts[0])
  count = lambda a: sum(1 for u in a.toposort if u.op is Ops.REDUCE)
  assert count(stashed) == count(ast)

def test_heuristics_sum_columns_along_the_contiguous_axis():
  # x.sum(0) of a row-major matrix reads along the output axis: a row of 64 outputs is written out, as SIMD loops of a
  # register (each row read is a contiguous run; 128 from WIDE_COLUMN_SUM elements), not 16 partial sums down a column
  # (one float per cache line: 20x slower)
  rng = np.random.default_rng(8)
  x = Tensor(rng.standard_normal((256, 512), dtype=np.float32)).realize()
  for t, want in ((x.sum(0), x.numpy().sum(0)), (x.max(axis=0), x.numpy().max(0))):
    opts = cpu_opts(_ast(t), 2)
    assert opts[:2] == [Opt(OptOps.SIMD, 0, 8), Opt(OptOps.UPCAST, 0, 8)], opts
    np.testing.assert_allclose(t.numpy(), want, rtol=1e-5, atol=1e-4)
  assert Opt(OptOps.UPCAST, 1, 16) in cpu_opts(_ast(x.sum(1)), 2)  # along the reduce: partial sums, as before

def test_loop_invariants_are_named_outside_the_loop():
  # a value used once, inside a loop it doesn't depend on (logsumexp's row max, tested for inf), is computed before the
  # loop under a name: written inline it put a branch in the loop, and gcc left the loop scalar
  x = Tensor.rand(64, 256).realize()
  ast = _ast(x.logsumexp(1))
  src = to_program(ast, Device["CPU"].renderer, cpu_opts(ast, 1))[1]
  loops = src.split("for (")
  assert not any("INFINITY)?" in body.split("}")[0] for body in loops[1:]), src

def test_reduce_axis_an_index_divides_is_written_out():
  """A matvec over 4-bit weights (two nibbles per byte, 16 bytes a block, as GGUF's Q4_0/Q4_1): after the 16 partial
  sums, the reduce axis left runs over half-blocks, read by r//2 (the block's scale) and r%2 (which nibble). Written out
  in 2 copies (UNROLL), each copy reads its own nibble: no select per weight."""
  rng = np.random.default_rng(0)
  raw, scale, x = rng.integers(0, 256, (64, 8, 16), dtype=np.uint8), rng.standard_normal((64, 8, 1)).astype(np.float32), rng.standard_normal((1, 256)).astype(np.float32)
  q = Tensor(raw)
  w = (Tensor.stack(q & 15, q >> 4, dim=2).reshape(64, 8, 32).cast("float32") * Tensor(scale)).reshape(64, 256)
  y = Tensor(x) @ w.T
  opts = cpu_opts(_ast(y), 1)
  assert opts[:2] == [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UNROLL, 1, 2)], opts
  src = to_program(_ast(y), Device["CPU"].renderer, opts)[1]
  assert "?" not in src[src.index("for ("):], src  # no select between the nibbles
  ref = x @ (np.stack([raw & 15, raw >> 4], 2).reshape(64, 8, 32).astype(np.float32) * scale).reshape(64, 256).T
  with Context(THREADS=1): np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-3)

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["mul", "div", "mod"]), st.integers(-3, 8)), min_size=1, max_size=4),
       st.integers(0, 40), st.integers(0, 2))
def test_unit_stride_fast_path_agrees_with_the_rewrite(terms, const, which):
  # heuristic.unit_stride reads an affine index's step off its terms; it must answer as the symbolic rewrite of
  # index(r + 1) - index does, for indices with r // c and r % c in them too (those take the rewrite)
  from attograd.uop.ops import UOp
  from attograd.uop.patterns import graph_rewrite
  from attograd.uop.symbolic import symbolic, simplify
  rs = [UOp(Ops.RANGE, dtypes.int32, (UOp.const(dtypes.int32, n),), (i, AxisKind.GLOBAL)) for i, n in enumerate((16, 12, 64))]
  index = UOp.const(dtypes.int32, const)
  for k, kind, c in terms:
    x = rs[k]
    index = index + (x * c if kind == "mul" else x // (abs(c) + 1) if kind == "div" else x % (abs(c) + 1))
  index, r = simplify(index), rs[which]
  step = graph_rewrite(index.substitute({r: r + 1}) - index, symbolic, name="test")
  assert heuristic.unit_stride.__wrapped__(index, r) == (step.op is Ops.CONST and step.arg == 1), index
