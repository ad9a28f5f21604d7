"""Invariant 1 (DESIGN §4): the same graph gives byte-identical kernel source, within a process
and across processes (whatever Python's hash seed)."""
import json, os, pathlib, subprocess, sys
from attograd import Context
from attograd.codegen import to_program
from attograd.runtime.device import Device

REPO = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = """
from attograd import Tensor, Ops
from attograd.engine.realize import get_kernel
def graphs():
  a, b, v = Tensor.empty(16, 8), Tensor.empty(8, 12), Tensor.empty(8, dtype="int32")
  yield (a @ b).relu()
  yield a.softmax(1)
  yield (a.pad(((1, 1), (2, 0))).flip(1)[::2] * 3).contiguous()
  yield a.sum(0) + a.max(axis=1).sum()
  yield (v.reshape(2, 4).permute(1, 0) // 3 % 2).contiguous()
  yield Tensor.arange(24).reshape(4, 6).T.contiguous() + 1
def schedules(): return [g.schedule() for g in graphs()]
def sources(rev=False):  # rev: compile in the opposite order, so no cache or counter is warmed the same way
  scheds = schedules()[::-1] if rev else schedules()
  out = [[get_kernel(si.ast, "CPU").src for si in s if si.ast.op is not Ops.COPY] for s in scheds]
  return out[::-1] if rev else out
"""

def in_process() -> dict:
  ns: dict = {}
  exec(SCRIPT, ns)
  return ns

def in_subprocess(hash_seed: int, rev: bool = False) -> list:
  # CACHELEVEL=1: every kernel lowered here, not loaded from the program cache an earlier run filled
  env = {**os.environ, "DEBUG": "0", "PYTHONHASHSEED": str(hash_seed), "CACHELEVEL": "1"}
  out = subprocess.run([sys.executable, "-c", SCRIPT + f"import json; print(json.dumps(sources({rev})))"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr
  return json.loads(out.stdout.strip().splitlines()[-1])

def test_same_graph_same_ast():
  ns = in_process()
  first, second = ns["schedules"](), ns["schedules"]()
  assert [len(s) for s in first] == [len(s) for s in second] and all(len(s) for s in first)
  for s1, s2 in zip(first, second):
    for a, b in zip(s1, s2):
      assert a.ast is b.ast  # kernels see PARAMs, not buffers: new buffers give the same AST

def test_same_ast_same_source():
  ns = in_process()
  renderer = Device["CPU"].renderer
  for sched in ns["schedules"]():
    for si in sched:
      name1, src1, _ = to_program(si.ast, renderer)
      name2, src2, _ = to_program(si.ast, renderer)
      assert (name1, src1) == (name2, src2) and "void " + name1 in src1

def test_same_source_across_processes():
  with Context(CACHELEVEL=1): here = in_process()["sources"]()
  one, two = in_subprocess(1), in_subprocess(2, rev=True)
  assert one == two, "kernel source depends on the process (hash seed 1 vs 2, compile order reversed)"
  assert one == here, "kernel source in a fresh process differs from this one's"
  assert sum(len(s) for s in here) >= 7
