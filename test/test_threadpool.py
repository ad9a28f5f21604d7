"""The native thread pool that runs threaded kernels (runtime/threadpool.py): every slice runs once, whatever the
number of slices and cores, on both CPU backends, with symbolic variables, across THREADS changes, forks and exit."""
import os, pathlib, subprocess, sys, threading
import numpy as np
import pytest
from attograd import Tensor, Context, Variable, dtypes
from attograd.codegen.opt import Opt, OptOps
from attograd.engine import realize
from attograd.runtime.device import Buffer
from attograd.runtime.ops_cpu import CPUCompiler, CPUProgram
from attograd.schedule.schedule import create_schedule
from attograd.engine.realize import runnable
from attograd.uop.ops import Ops
from helpers import DEVICES

THREADED = [d for d in DEVICES if d in ("CPU", "LLVM")]  # the backends with the THREAD opt (LLVM where llvmlite is installed)

rng = np.random.default_rng(3)
X = rng.standard_normal((96, 64), dtype=np.float32)

def _item(t: Tensor):
  *before, si = t.schedule()
  realize.run_schedule(before)
  return si

def _exec(ck, si, var_vals=None) -> np.ndarray:
  out = Buffer(si.bufs[0].arg.device, si.bufs[0].arg.size, si.bufs[0].dtype).ensure_allocated()
  ck([out._buf] + [realize.buffer_of(b).ensure_allocated()._buf for b in si.bufs[1:]], var_vals or {})
  return np.frombuffer(out.as_bytes(), dtype=np.float32).copy()

@pytest.mark.parametrize("device", THREADED)
def test_many_launches_varying_slices(device):
  x = rng.standard_normal((768, 512), dtype=np.float32)  # big enough that a launch returning early would be seen
  si = _item((Tensor(x, device=device) * 3).exp2())
  want = _exec(realize.compile_kernel(si.ast, device, []), si)
  np.testing.assert_allclose(want, np.exp2(x * 3).reshape(-1), rtol=1e-6)
  kernels = {n: realize.compile_kernel(si.ast, device, [Opt(OptOps.THREAD, 0, n)]) for n in (2, 3, 4, 8, 12, 32, 96)}
  assert all(ck.threads == n for n, ck in kernels.items())
  # back to back, so workers are caught spinning as well as asleep, with every slice count after every other
  for i, n in enumerate(rng.choice(list(kernels), 300)):
    with Context(THREADS=int(1 + i % 3)):
      np.testing.assert_array_equal(_exec(kernels[n], si), want, err_msg=f"launch {i}, {n} slices")

# a kernel's slice entry point that counts its calls per core id, each call sleeping first (the last slice, a worker's
# first, 3 times longer): a launch that returned before its last slice finished, or ran a slice twice or never, shows
# in the counts however loaded the machine is
PROBE = """#include <time.h>
void probe(void) {}
void probe_slice(void *const *bufs, const long long *vals, long long core) {
  struct timespec t = {0, core + 1 < vals[1] ? vals[0] : 3 * vals[0]};
  nanosleep(&t, 0);
  __atomic_fetch_add((int *)bufs[0] + core, 1, __ATOMIC_SEQ_CST);
}
"""

@pytest.mark.parametrize("n, cores", [(2, 2), (5, 2), (16, 3), (4, 1)])
def test_launch_returns_when_every_slice_ran_once(n, cores):
  prog = CPUProgram("probe", CPUCompiler().compile(PROBE))
  for sleep_ns in (0, 2_000_000):
    counts = Buffer("CPU", n, dtypes.int32).ensure_allocated()
    prog.run_slices([counts._buf], [sleep_ns, n], n, cores)
    assert np.frombuffer(counts.as_bytes(), dtype=np.int32).tolist() == [1] * n

# each slice notes the thread that ran it
WHO = """#define _GNU_SOURCE
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
void who(void) {}
void who_slice(void *const *bufs, const long long *vals, long long core) {
  struct timespec t = {0, vals[0]};
  nanosleep(&t, 0);
  ((long long *)bufs[0])[core] = syscall(SYS_gettid);
}
"""

def test_caller_takes_slices_from_the_front():
  # the calling thread runs the first slices and the workers the last ones, launch after launch (so a core keeps the
  # same rows of a chain of kernels in its own cache): whatever the machine's load splits them at, the caller's
  # slices are a prefix (a pool handing out slices in any order would interleave them)
  prog = CPUProgram("who", CPUCompiler().compile(WHO))
  me = threading.get_native_id()
  for _ in range(5):
    tids = Buffer("CPU", 8, dtypes.int64).ensure_allocated()
    prog.run_slices([tids._buf], [200_000], 8, 2)
    mine = [t == me for t in np.frombuffer(tids.as_bytes(), dtype=np.int64).tolist()]
    assert mine == sorted(mine, reverse=True) and mine[0], mine

def test_threads_one_after_threaded_launch():
  si = _item(Tensor(X) + 1)
  ck = realize.compile_kernel(si.ast, "CPU", [Opt(OptOps.THREAD, 0, 4)])
  with Context(THREADS=2): np.testing.assert_array_equal(_exec(ck, si), (X + 1).reshape(-1))
  with Context(THREADS=1):  # no worker takes part: the caller runs all 4 slices
    np.testing.assert_array_equal(_exec(ck, si), (X + 1).reshape(-1))
  with Context(THREADS=3): np.testing.assert_array_equal(_exec(ck, si), (X + 1).reshape(-1))

@pytest.mark.parametrize("device", THREADED)
def test_symbolic_variables_and_core_id(device):
  # two Variables and the core id: the slice entry point must put each value in its own argument
  x = Tensor(rng.standard_normal((64, 16, 8), dtype=np.float32), device=device).realize()
  a, z = Variable("a", 1, 16), Variable("z", 1, 8)
  # the kernel as realize() gets it: variables unbound, their values passed at the call
  (si,), _ = create_schedule(list(runnable((x[:, :a.bind(5), :z.bind(3)] * 2 + 1).uop.sink())[0].src))
  ck = realize.compile_kernel(si.ast, device, [Opt(OptOps.THREAD, 0, 4)])
  assert [v.arg[0] for v in ck.variables[:2]] == ["a", "z"] and ck.variables[2].op is Ops.CORE_ID and ck.threads == 4
  for av, zv in ((5, 3), (16, 8), (1, 1), (7, 2)):
    got = _exec(ck, si, {v: {"a": av, "z": zv}[v.arg[0]] for v in ck.user_vars})
    np.testing.assert_array_equal(got[:64 * av * zv].reshape(64, av, zv), x.numpy()[:, :av, :zv] * 2 + 1)

@pytest.mark.parametrize("device", THREADED)
@pytest.mark.parametrize("name", ["core_id", "core", "data0", "alu0", "r0", "a b", "n"])
def test_variable_named_like_the_core_id_or_a_generated_name(device, name):
  # the core id was a DEFINE_VAR recognised by its name: a user's Variable("core_id") was taken for it (its value
  # replaced by 0); names the C renderer makes up (data0, alu0) clashed with the Variable's
  v = Variable(name, 1, 10).bind(5)
  assert (Tensor.zeros(4, device=device) + v).tolist() == [5.0] * 4
  x = rng.standard_normal((64, 96), dtype=np.float32)
  # the Variable and the core id in one threaded kernel, as realize() gets it: the Variable unbound
  (si,), _ = create_schedule(list(runnable((Tensor(x, device=device).realize()[:, :v] + v).uop.sink())[0].src))
  ck = realize.compile_kernel(si.ast, device, [Opt(OptOps.THREAD, 0, 4)])
  assert ck.threads == 4 and len(ck.user_vars) == 1
  np.testing.assert_array_equal(_exec(ck, si, {ck.user_vars[0]: 5})[:64 * 5].reshape(64, 5), x[:, :5] + 5)

def test_two_variables_of_one_name():
  a, b = Variable("n", 1, 10), Variable("n", 2, 20)
  assert (Tensor.zeros(2) + a.bind(3) + b.bind(7)).tolist() == [10.0, 10.0]

def test_launches_from_two_python_threads():
  si = _item(Tensor(X).abs().sqrt())
  ck = realize.compile_kernel(si.ast, "CPU", [Opt(OptOps.THREAD, 0, 8)])
  want, bad = np.sqrt(np.abs(X)).reshape(-1), []
  def run():  # one thread has the pool, the other runs its slices itself: both exact
    for _ in range(200):
      if not np.array_equal(_exec(ck, si), want): bad.append(1)
  with Context(THREADS=2):
    ts = [threading.Thread(target=run) for _ in range(2)]
    for t in ts: t.start()
    for t in ts: t.join()
  assert not bad

CHILD = """
import os, sys, numpy as np
from attograd import Tensor, Context
from attograd.codegen.opt import Opt, OptOps
from attograd.engine import realize
from attograd.runtime.device import Buffer
from attograd.runtime.ops_cpu import CPUCompiler, CPUProgram
x = Tensor(np.arange(96 * 64, dtype=np.float32).reshape(96, 64)).realize()
si = (x + 1).schedule()[-1]
ck = realize.compile_kernel(si.ast, "CPU", [Opt(OptOps.THREAD, 0, 8)])
def run():
  out = Buffer("CPU", si.bufs[0].arg.size, si.bufs[0].dtype).ensure_allocated()
  with Context(THREADS=2): ck([out._buf, realize.buffer_of(si.bufs[1])._buf], {})
  return np.frombuffer(out.as_bytes(), dtype=np.float32)
want = np.arange(96 * 64, dtype=np.float32) + 1
assert np.array_equal(run(), want)
if sys.argv[1] == "fork":  # the child has no workers: the pool starts new ones there
  if (pid := os.fork()) == 0: os._exit(0 if np.array_equal(run(), want) and np.array_equal(run(), want) else 3)
  assert os.waitpid(pid, 0)[1] == 0, "the forked child got a wrong result"
  assert np.array_equal(run(), want)
print("ok")
"""

@pytest.mark.parametrize("mode", ["exit", "fork"])
def test_pool_in_a_new_process(mode):
  # exit: the workers (asleep or spinning) must not keep the interpreter from exiting
  env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[1])}
  proc = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", CHILD, mode], capture_output=True, text=True, timeout=120, env=env)
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
