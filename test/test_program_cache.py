"""The disk caches: a second process loads every schedule and every kernel's lowered program (no scheduling, no Opts
chosen, no lowering) and gets the same results; a damaged BEAM winner is searched again (every other kind of damage:
test_cache_robust.py); CACHELEVEL turns the caches off; keys are the same in every process; long compiles show progress.
Every test uses a cache directory of its own."""
from __future__ import annotations
import json, math, os, pathlib, shutil, subprocess, sys
import numpy as np
import pytest
from attograd import Tensor, Context, Variable
from attograd.dtype import dtypes
from attograd.helpers import Progress, cache_read, cache_write, atomic_write
from attograd.uop.ops import UOp, Ops, BufferArg
from attograd.uop.serialize import graph_data, graph_from_data, graph_key
from attograd.engine import realize, search, progcache
from attograd.codegen.heuristic import cores
from attograd.runtime.device import Device
from helpers import available

REPO = pathlib.Path(__file__).resolve().parents[1]

# a few kernels of each kind: a matmul, a reduce the heuristics thread (a core_id variable), a symbolic size
SCRIPT = """
import json, sys
import attograd.engine.realize as realize, attograd.schedule.schedule as schedule
calls = {"to_program": 0, "heuristics": 0, "schedules": 0}
def counted(name, f):
  def g(*a, **k):
    calls[name] += 1
    return f(*a, **k)
  return g
realize.to_program = counted("to_program", realize.to_program)
realize.heuristic_opts = counted("heuristics", realize.heuristic_opts)
schedule.realize_points = counted("schedules", schedule.realize_points)
from attograd import Tensor, Variable
import numpy as np
rng = np.random.default_rng(0)
a, b = Tensor(rng.standard_normal((48, 40), dtype=np.float32)), Tensor(rng.standard_normal((40, 24), dtype=np.float32))
big = Tensor(rng.standard_normal((640, 256), dtype=np.float32))
n = Variable("n", 1, 48).bind(7)
out = {"matmul": (a @ b).relu().tolist(), "rows": (big.sin() * 3).sum(1).tolist(), "symbolic": (a[:n] * 2 + 1).exp().sum(1).tolist()}
kernels = sorted([ck.name, ck.src, repr(ck.opts), ck.ops, [v.arg for v in ck.variables], repr(ck.launch), ck.threads]
                 for ck in realize._kernel_cache.values())
print(json.dumps({"out": out, "kernels": kernels, "calls": calls}))
"""

def run(script: str, cache: pathlib.Path, **env: str) -> tuple[dict, str]:
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "ATTOGRAD_CACHE": str(cache), "DEBUG": "0", "PROGRESS": "0", **env})
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout.splitlines()[-1]), proc.stderr

@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[pathlib.Path, dict]:
  """A cache filled by one process, and what that process computed (copy it before changing it)."""
  cache = tmp_path_factory.mktemp("warm")
  first, err = run(SCRIPT, cache)
  assert first["calls"]["to_program"] >= 3 and first["calls"]["heuristics"] >= 3 and first["calls"]["schedules"] >= 3
  assert "warning" not in err
  return cache, first

def test_second_process_does_no_lowering(warm, tmp_path):
  cache, first = warm
  shutil.copytree(cache, tmp_path / "c")
  second, err = run(SCRIPT, tmp_path / "c")
  assert second["calls"] == {"to_program": 0, "heuristics": 0, "schedules": 0}  # nor scheduling
  assert second["out"] == first["out"] and second["kernels"] == first["kernels"]  # same kernels, down to variables and op counts
  assert any(k[6] > 1 for k in first["kernels"]) and any("'n'" in repr(k[4]) for k in first["kernels"])  # threaded, symbolic
  assert err == ""

# (damaged entries, processes filling one cache at once, a process killed while writing: test_cache_robust.py)

def _garble(b: bytes) -> bytes:
  mid = len(b) // 2
  return b[:mid] + bytes(x ^ 0x5A for x in b[mid:mid + 64]) + b[mid + 64:]

def test_cachelevel_turns_disk_caches_off(tmp_path):
  for level, kinds in (("0", set()), ("1", {"cc", "lib"})):
    c = tmp_path / level
    first, _ = run(SCRIPT, c, CACHELEVEL=level)
    assert {p.name for p in c.rglob("*") if p.is_dir() and any(p.iterdir())} == kinds  # level 0: no directory at all
    second, _ = run(SCRIPT, c, CACHELEVEL=level)
    assert second["calls"] == first["calls"] and second["calls"]["to_program"] >= 3  # lowered again
    assert second["out"] == first["out"]

# ***** in one process: the entry format, keys, BEAM's cache, progress *****

def _kernel_ast(t: Tensor) -> UOp:
  (si,) = [si for si in t.schedule() if si.ast.op is not Ops.COPY]
  return si.ast

def test_graph_data_round_trips_to_the_same_nodes():
  x = Tensor.rand(16, 8).realize()
  asts = [_kernel_ast(x.softmax(1)), _kernel_ast((x @ x.T).relu()), _kernel_ast(x[:Variable("k", 1, 16).bind(3)].sum(0))]
  odd = [UOp.const(dtypes.float32, v) for v in (math.inf, -math.inf, 1e-45, 0.1)]
  odd += [UOp(Ops.BUFFER, dtypes.float16, (), BufferArg(3, "CPU", 10, 4)), UOp(Ops.DEFINE_REG, dtypes.float32.vec(4).ptr(8, "reg"), (), 0),
          UOp(Ops.NOOP, dtypes.void, (), (Ops.ADD, frozenset({"b", "a"}), True, None, dtypes.int8)), UOp.const(dtypes.int64, -2**63)]
  for roots in ([*asts, *odd], odd[::-1]):
    data = json.loads(json.dumps(graph_data(roots)))  # through text, as on disk
    back = graph_from_data(data)
    assert len(back) == len(roots) and all(a is b for a, b in zip(back, roots))
  # NaN is no node's equal (hash-consing can't find it again) and -0.0 is 0.0's: their bits still survive
  (nan,) = graph_from_data(json.loads(json.dumps(graph_data([UOp.const(dtypes.float32, math.nan).sink()]))))
  assert math.isnan(nan.src[0].arg)
  assert json.loads(json.dumps(graph_data([UOp(Ops.NOOP, dtypes.void, (), (-0.0, 1.0))])))["nodes"][0][3] == [{"f": "-0.0"}, {"f": "1.0"}]

def test_graph_key_is_the_same_in_every_process():
  x = Tensor.rand(16, 8).realize()
  script = ("from attograd import Tensor, Variable\nfrom attograd.uop.serialize import graph_key\n"
            "x = Tensor.rand(16, 8).realize()\n"
            "ts = [x.softmax(1), (x @ x.T).relu(), x[:Variable('k', 1, 16).bind(3)].sum(0)]\n"
            "print([graph_key([si.ast for si in t.schedule() if si.ast.op.name != 'COPY'][0]) for t in ts])")
  here = [graph_key(_kernel_ast(t)) for t in (x.softmax(1), (x @ x.T).relu(), x[:Variable("k", 1, 16).bind(3)].sum(0))]
  assert len(set(here)) == 3
  for seed in ("1", "2"):
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONHASHSEED": seed})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == repr(here)

def test_graph_key_of_a_big_graph_spilled_and_with_renamed_leaves():
  # a graph of more than SPILL_ROWS nodes is hashed as it is written; naming its leaves as others (a schedule's inputs as
  # placeholders) gives the key of the substituted graph without building it; a change deep inside changes the key
  from attograd.uop.serialize import SPILL_ROWS
  from attograd.schedule.schedule import _placeholder
  x = Tensor.rand(4, 4).realize()
  def chain(k: int) -> UOp:
    y = x
    for i in range(SPILL_ROWS): y = (y + (i if i != 700 else k)).relu()
    return y.uop
  g = chain(700)
  assert len(g.toposort) > 2 * SPILL_ROWS
  leaves = {b: _placeholder(i, b) for i, b in enumerate(u for u in g.toposort if u.op is Ops.BUFFER)}
  assert graph_key(g, leaves) == graph_key(g.substitute(leaves)) != graph_key(g)
  assert graph_key(g) == graph_key(chain(700)) != graph_key(chain(701))

def test_key_names_what_the_program_depends_on(monkeypatch):
  ast = _kernel_ast(Tensor.rand(64, 64).realize().sum(1))
  r = Device["CPU"].renderer
  keys = {progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r))}
  with Context(THREADS=1): keys.add(progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r)))
  with Context(NOOPT=1): keys.add(progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r)))
  with Context(BEAM=2): keys.add(progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r)))
  keys.add(progcache.program_key(ast, "CPU", r, realize.opts_choice([], r)))
  keys.add(progcache.program_key(ast, "LLVM", r, realize.opts_choice(None, r)))
  monkeypatch.setattr(progcache, "code_version", lambda: "another version of attograd")
  keys.add(progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r)))
  assert len(keys) == 7
  monkeypatch.setattr(r, "rewrites", search)  # not data: such a renderer's programs aren't cached
  assert progcache.program_key(ast, "CPU", r, realize.opts_choice(None, r)) is None

def test_program_entry_keeps_symbolic_launch_dims(tmp_path, monkeypatch):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  n, core = Variable("n", 1, 64), Variable("core_id", 0, 3)
  launch = ((n * 4 + 3, 2, 1), (16, 1, 1))
  progcache.write_program("k", "r_n", "src", [], 12, [core, n], launch)
  e = progcache.read_program("k")
  assert e["variables"][0] is core and e["variables"][1] is n and e["launch"] == launch and e["launch"][0][0] is launch[0][0]
  assert progcache.read_program("another key") is None

@pytest.mark.skipif(not available("CL"), reason="needs an OpenCL driver")
def test_gpu_kernel_loads_with_its_launch_dims(tmp_path):
  script = ("import json\nfrom attograd import Tensor, Variable\nimport attograd.engine.realize as realize\n"
            "x = Tensor.ones(16, 4, device='CL')[:Variable('n', 1, 16).bind(5)]\n"
            "out = ((x * 2).sum(1) + 1).tolist()\n"
            "print(json.dumps({'out': out, 'kernels': sorted([ck.src, repr(ck.launch), ck.ops] for ck in realize._kernel_cache.values())}))")
  first, _ = run(script, tmp_path)
  second, err = run(script, tmp_path)
  assert first == second and err == "" and first["out"] == [9.0] * 5 and "n" in first["kernels"][0][1]

def test_cache_read_checks_the_payload(tmp_path, capsys):
  p = tmp_path / "x"
  assert cache_read(p) is None and capsys.readouterr().err == ""  # nothing there: no warning
  cache_write(p, b"payload\n\x00bytes")
  assert cache_read(p) == b"payload\n\x00bytes"
  raw = p.read_bytes()
  for bad in (raw[:-1], raw + b"x", raw[:10], b"", bytes(len(raw)), raw.replace(b"payload", b"paYload")):
    p.write_bytes(bad)
    assert cache_read(p) is None
    assert capsys.readouterr().err.count("\n") == 1
  atomic_write(p, b"new")
  assert p.read_bytes() == b"new" and [f.name for f in tmp_path.iterdir()] == ["x"]  # no temporary file left behind

def test_unused_inputs_are_part_of_the_schedule_key(monkeypatch, tmp_path):
  # a CALL whose body reads a source only through a derivative (a gradient's: gradient.py) is, once scheduled, the same
  # graph as one over fewer inputs; a template numbers the buffers it makes after its inputs, so the disk key must count
  # them: read with the smaller graph's template, the kernel wrote the result into the unused input
  from attograd.uop.ops import Template
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  a, b = Tensor([1.0, 2.0]).realize(), Tensor([10.0, 20.0]).realize()
  assert (a + 1).tolist() == [2.0, 3.0]
  body = Template((a.uop, b.uop), UOp(Ops.WITH_DERIVATIVE, dtypes.float32, ((a + 1).uop, a.uop, b.uop)))
  assert body.used == (0, 1)
  a2, b2 = Tensor([3.0, 4.0]).realize(), Tensor([30.0, 40.0]).realize()
  assert Tensor(body.calls(a2.uop, b2.uop)[0]).tolist() == [4.0, 5.0]
  assert b2.tolist() == [30.0, 40.0]

def test_damaged_beam_winner_is_searched_again(monkeypatch, tmp_path, capsys):
  monkeypatch.setenv("ATTOGRAD_CACHE", str(tmp_path))
  monkeypatch.setattr(search, "MAX_ROUNDS", 1)
  x = Tensor.rand(32, 32).realize()
  ast = _kernel_ast(x @ x)
  winner = search.beam_search(ast, "CPU", 1, realize.compile_kernel)
  path = search._cache_path(ast, "CPU", 1, cores(Device["CPU"].renderer))
  path.write_bytes(_garble(path.read_bytes()))
  searched = []
  def compile_kernel(*a): searched.append(a); return realize.compile_kernel(*a)
  assert search.beam_search(ast, "CPU", 1, compile_kernel) is not None and searched
  assert "warning" in capsys.readouterr().err
  assert search._read_winner(path) is not None  # written whole again

def test_progress_shows_only_for_long_work(capsys):
  quick = Progress(50, "compiling kernels")
  for _ in range(50): quick.update(1)
  quick.close()
  assert capsys.readouterr().err == ""
  slow = Progress(3, "compiling kernels", delay=0.0)
  for i in range(3): slow.update(1, f"k{i}")
  slow.close()
  err = capsys.readouterr().err
  assert err.endswith("\n") and err.count("\n") == 1 and "compiling kernels: 3/3 kernels" in err.split("\r")[-1]
  with Context(PROGRESS=0):
    off = Progress(3, "compiling kernels", delay=0.0)
    off.update(1); off.close()
  assert capsys.readouterr().err == ""

def test_long_compile_shows_a_progress_bar(tmp_path):
  script = ("import attograd.helpers as h\nfrom attograd import Tensor\nx = Tensor.rand(8, 8).realize()\n"
            "orig = h.Progress.__init__\nh.Progress.__init__ = lambda self, *a, **k: orig(self, *a, **{**k, 'delay': 0.0})\n"
            "ys = [((x * i).sin() + (x + i).exp2()).sum(0) for i in range(4)]\nTensor.realize_all(ys)\nprint(ys[3].tolist())")
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "ATTOGRAD_CACHE": str(tmp_path)})
  assert proc.returncode == 0 and "compiling kernels" in proc.stderr, proc.stderr
