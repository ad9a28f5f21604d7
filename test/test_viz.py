"""VIZ's recorder (uop/trace.py): every graph_rewrite a named pass with the rules that fired and where they are written,
steps that replay to the pass's output, kernels with their passes and source, one timeline event per launch; and
nothing recorded (nor any recording code run) when it is off."""
import linecache, pathlib
import numpy as np
from attograd import Tensor
from attograd.codegen import PASSES, to_program
from attograd.runtime.device import Device
from attograd.uop import patterns, trace
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import PatternMatcher, UPat, graph_rewrite
from attograd.uop.symbolic import symbolic
from attograd.dtype import dtypes

def _program(n: int):
  # each test its own shapes: kernels lowered earlier in the process are not lowered (nor recorded) again. Data from
  # numpy, not Tensor.rand: the random state's kernel is the same in every test, and another test may have lowered it
  rng = np.random.default_rng(n)
  a, b = Tensor(rng.random((n, 8), dtype=np.float32)), Tensor(rng.random((8, 4), dtype=np.float32))
  return (a @ b).relu().sum(1).softmax(0).numpy()

def test_records_kernels_passes_and_launches():
  with trace.recording() as tr: _program(16)
  kernels = [g for g in tr.groups if g.kind == "kernel"]
  assert kernels and all(g.info["name"] and "void" in g.info["src"] or g.info["src"] for g in kernels)
  for k in kernels:
    mine = [p.name for p in tr.passes if p.group == tr.groups.index(k) and p.parent == -1]
    assert mine == [n for n, _ in PASSES], mine  # every named pass of lowering, in order, even those that did nothing
  # each schedule lists its items; every kernel it ran was lowered in this recording
  scheds = [g for g in tr.groups if g.kind == "schedule"]
  assert scheds and all(tr.kernel_of.get((si.ast, si.bufs[0].arg.device)) is not None for g in scheds for si in g.info["items"])
  # one event per launch, each linked to the kernel it ran
  assert tr.events and all(tr.groups[e.group].info["name"] == e.name for e in tr.events)
  # a kernel's steps name real rules: the line at file:line is the rule's code
  fired = {(r, p.name) for p in tr.passes for s in p.steps if (r := s.rule) >= 0}
  assert fired
  for r, _ in fired:
    pm, i = tr.rules[r]
    file, line = pm.locations[i].rsplit(":", 1)
    assert pathlib.Path(file).exists() and linecache.getline(file, int(line)).strip()

def test_rule_location_and_steps():
  here = __file__
  pm = PatternMatcher([
    (UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(None, 0))), lambda x: x),  # x + 0 -> x
    (UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(None, 1))), lambda x: x),  # x * 1 -> x
  ])
  x = UOp.variable("x", 0, 10)
  g = UOp(Ops.MUL, dtypes.int32, (UOp(Ops.ADD, dtypes.int32, (x, UOp.const(dtypes.int32, 0))), UOp.const(dtypes.int32, 1)))
  with trace.recording() as tr: out = graph_rewrite(g, pm, name="my_pass")
  assert out is x
  (p,) = [p for p in tr.passes if p.name == "my_pass"]
  assert p.input is g and p.output is x and len(p.steps) == 2
  locs = [tr.rules[s.rule][0].locations[tr.rules[s.rule][1]] for s in p.steps]
  assert [linecache.getline(here, int(l.rsplit(":", 1)[1])).strip().split("#")[1].strip() for l in locs] == ["x + 0 -> x", "x * 1 -> x"]
  assert all(l.startswith(here + ":") for l in locs)
  # the graph after the first step: the ADD is gone, the MUL is not
  mid = trace.replay(p.input, p.steps[:1])
  assert mid.op is Ops.MUL and mid.src[0] is x

def test_steps_replay_to_each_pass_output():
  with trace.recording() as tr: _program(24)
  checked = 0
  for p in tr.passes:
    if not p.rewrite: continue
    assert trace.replay(p.input, p.steps) is p.output, p.name
    checked += bool(p.steps)
  assert checked > 5

def test_recording_changes_no_result():
  """The recording copy of the rewrite loop gives what the engine gives: the same sources for the same kernels."""
  ast = (Tensor.empty(16, 32) @ Tensor.empty(32, 8)).exp().sum(1).schedule()[-1].ast
  r = Device["CPU"].renderer
  plain = to_program(ast, r)[1]
  with trace.recording(): traced = to_program(ast, r)[1]
  assert traced == plain
  expr = (UOp.variable("a", 0, 7) * 4 + UOp.variable("b", 0, 3)) // 4 % 8
  with trace.recording() as tr: got = graph_rewrite(expr, symbolic, name="s")
  assert got is graph_rewrite(expr, symbolic, name="s") and tr.passes

def test_off_records_nothing():
  assert trace.current is None and patterns.tracker is None
  out = _program(40)
  assert np.isfinite(out).all() and trace.current is None
  with trace.recording(): pass
  assert patterns.tracker is None  # switched back off

def test_opts_chooser_and_jit_replays():
  from attograd import TinyJit
  w = Tensor.rand(12, 6).realize()
  @TinyJit
  def f(x: Tensor) -> Tensor: return (x @ w).relu().realize()
  with trace.recording() as tr:
    for _ in range(4): f(Tensor.rand(5, 12).realize())
  kernels = [g for g in tr.groups if g.kind == "kernel"]
  assert kernels and all(g.info["chosen_by"] for g in kernels)
  assert any(g.info["chosen_by"].startswith(("heuristics", "noopt", "beam")) for g in kernels)
  assert any(e.jit for e in tr.events) and any(not e.jit for e in tr.events)

# ***** the server, without a browser *****
import json, os, re, signal, subprocess, sys, urllib.error, urllib.request
import pytest
from attograd.uop.tracefile import FORMAT, load, to_json
from attograd.viz.serve import TraceAPI

def test_json_api_and_bad_traces(tmp_path):
  with trace.recording() as tr: _program(48)
  data = json.loads(json.dumps(to_json(tr)))  # what a saved file holds
  assert data["format"] == FORMAT
  api = TraceAPI(data)
  s = api.summary()
  assert len(s["groups"]) == len(tr.groups) and all("steps" not in p for p in s["passes"])
  i = next(i for i, p in enumerate(data["passes"]) if p["steps"])
  p = json.loads(json.dumps(api.answer(f"/api/pass/{i}")))  # as the page gets it
  assert {str(x) for st in p["steps"] for x in st[:2]} <= set(p["nodes"]) and all(str(st[2]) in p["rules"] for st in p["steps"] if st[2] >= 0)
  assert api.answer("/api/pass/99999") is None and api.answer("/api/nothing") is None
  bad = tmp_path / "bad.json"
  bad.write_text('{"a": 1}')
  with pytest.raises(ValueError, match="not a VIZ trace"): load(str(bad))
  bad.write_text("garbage")
  with pytest.raises(ValueError, match="not a readable VIZ trace"): load(str(bad))

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def test_viz_1_saves_and_serves_at_exit(tmp_path):
  """VIZ=1: at exit the trace is saved and served (the URL printed) until Ctrl-C; only the page's own files are served."""
  env = {**os.environ, "PYTHONPATH": ROOT, "VIZ": "1", "VIZ_PORT": "0", "VIZ_TRACE": str(tmp_path / "t.json")}
  prog = "from attograd import Tensor; print((Tensor.rand(8, 3) + 1).sum().item())"
  proc = subprocess.Popen([sys.executable, "-c", prog], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stdout:
      if (m := re.search(r"http://127\.0\.0\.1:\d+", line)): break
    url = m.group(0)
    summary = json.loads(urllib.request.urlopen(url + "/api/summary", timeout=30).read())
    assert summary["events"] and any(g["kind"] == "kernel" for g in summary["groups"])
    assert b"attograd VIZ" in urllib.request.urlopen(url + "/", timeout=30).read()
    assert b"dagre" in urllib.request.urlopen(url + "/static/vendor/dagre.min.js", timeout=30).read()  # the vendored layout library
    for path in ("/static/../serve.py", "/static/nothing.js", "/etc/passwd", "/static/vendor/../../serve.py", "/static/vendor/VENDORED.json"):
      with pytest.raises(urllib.error.HTTPError): urllib.request.urlopen(url + path, timeout=30)
  finally:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 0
  assert load(str(tmp_path / "t.json"))["events"]

def test_schedule_says_why_each_buffer_exists():
  """Each schedule item names the scheduler's rule that made its output a buffer (schedule.REALIZE_WHY), recorded where
  realize_points decides it: a user's realize, contiguous(), a reduce broadcast along an outer axis, a reduce two kernels
  read, a costly value two kernels read."""
  from attograd.schedule.schedule import REALIZE_WHY
  rng = np.random.default_rng(7)
  with trace.recording() as tr:
    x = Tensor(rng.random((72, 40), dtype=np.float32)).realize()
    Tensor.realize(x / x.sum(0))                                   # the column sums, re-read per row: expand
    s = x.sum(1)
    Tensor.realize(s * 2, (s + 1).reshape(72, 1) * x)              # one row sum, two kernels: shared_reduce
    g = (x.exp().exp() * 3).sqrt()
    Tensor.realize(g.sum(0), g.sum(1))                             # a costly value, two kernels: shared_value
    (x + 1).contiguous().relu().numpy()                            # contiguous, then the user's output
  whys = [[w for w, _ in g.info["why"]] for g in tr.groups if g.kind == "schedule" and g.info.get("why")]
  assert ["expand", "output"] in whys and ["shared_reduce", "output", "output"] in whys and ["shared_value", "output", "output"] in whys
  assert ["contiguous", "output"] in whys
  assert all(len(g.info["why"]) == len(g.info["items"]) for g in tr.groups if g.kind == "schedule")
  data = to_json(tr)
  items = [it for g in data["groups"] if g["kind"] == "schedule" for it in g["items"]]
  assert all(it["why"][0] in REALIZE_WHY and it["why"][1] == REALIZE_WHY[it["why"][0]] for it in items)
  # a kernel's page says why its output is a buffer
  k = next(it["kernel"] for it in items if it["why"][0] == "shared_value" and it["kernel"] >= 0)
  assert ["shared_value", REALIZE_WHY["shared_value"]] in TraceAPI(data).group(k)["why"]

# ***** DEBUG=2's roofline *****
def test_debug2_roofline(tmp_path, monkeypatch, capsys):
  """DEBUG=2 prints GB/s and the fraction of this machine's roofline per kernel; the roof is measured once, kept in the
  disk cache beside the kernels, and never measured below DEBUG=2. Its numbers are checked against numpy on the same
  machine in the same test (the machine is shared: loose bounds)."""
  import time
  from attograd.engine import roofline
  from attograd.helpers import Context
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(roofline, "_roofs", {})
  rng = np.random.default_rng(3)
  x = rng.random((96, 64), dtype=np.float32)
  with Context(DEBUG=1): (Tensor(x) * 3).sum(1).numpy()
  assert not (tmp_path / "roofline").exists() and "roof" not in capsys.readouterr().out
  with Context(DEBUG=2): (Tensor(x) * 4).sum(1).numpy()
  out = capsys.readouterr().out
  assert "roofline: measuring" in out and re.search(r"GFLOPS +[\d.]+ GB/s +[\d.]+% of roof \((mem|flops)\)", out), out
  assert len(list((tmp_path / "roofline").iterdir())) == 1
  monkeypatch.setattr(roofline, "_roofs", {})  # a new process: read from the disk cache, not measured again
  with Context(DEBUG=2): (Tensor(x) * 5).sum(1).numpy()
  out = capsys.readouterr().out
  assert "measuring" not in out and "% of roof" in out
  # the roof against numpy's best on this machine: a peak is at least about what a tuned library reaches
  r = roofline.roof("CPU")
  def best(f) -> float:
    times = []
    for _ in range(3):
      st = time.perf_counter()
      f()
      times.append(time.perf_counter() - st)
    return min(times)
  a, m = np.ones(32 << 20, dtype=np.float32), rng.random((512, 512), dtype=np.float32)
  t_sum, t_mm = best(a.sum), best(lambda: m @ m)
  assert r.gbs > 0.25 * a.nbytes / t_sum * 1e-9 and r.gflops > 0.25 * 2 * 512 ** 3 / t_mm * 1e-9, (r, a.nbytes / t_sum * 1e-9, 2 * 512 ** 3 / t_mm * 1e-9)
  # the fraction: memory bound under the ridge point, compute bound over it
  f, bound = r.fraction(0, int(r.gbs * 1e9), 2.0)
  assert bound == "mem" and abs(f - 0.5) < 1e-6
  f, bound = r.fraction(int(r.gflops * 1e9), 1, 4.0)
  assert bound == "flops" and abs(f - 0.25) < 1e-6

def test_timeline_copies_transfers_and_memory():
  """The timeline has a copy between devices as a launch of the run loop, host<->device transfers (a tensor's data in,
  numpy() out) and the memory in use at each allocation and free, each with its time."""
  data = np.arange(6, dtype=np.float32)
  with trace.recording() as tr:
    y = (Tensor(data) + 1).to("PYTHON").realize()
    out = y.numpy()
    del y
  np.testing.assert_array_equal(out, data + 1)
  assert [e.name for e in tr.events if e.name.startswith("copy")] == ["copy CPU -> PYTHON"]
  assert ("CPU", "host -> CPU", 24) in [(e.device, e.name, e.nbytes) for e in tr.transfers]
  assert ("PYTHON", "PYTHON -> host", 24) in [(e.device, e.name, e.nbytes) for e in tr.transfers]
  times = [t for t, _ in tr.memory]
  assert len(tr.memory) >= 3 and times == sorted(times) and max(m for _, m in tr.memory) >= 48
  assert to_json(tr)["transfers"] and to_json(tr)["memory"]
