"""The kernel ASTs the op suite makes, for the compile-only backends (CUDA, PTX). The op suite: every
test file parametrized over helpers.DEVICES (test_ops.py, test_elementwise.py, ...).

Collected by running those files once on CPU in a pytest subprocess with this module as a plugin: it
wraps engine/realize.get_kernel and records every kernel AST that reaches it. The result is cached
on disk, keyed by the source of attograd and of the op tests, so the xdist workers (and later runs)
share one collection."""
from __future__ import annotations
import fcntl, os, pathlib, pickle, subprocess, sys, tempfile
from typing import Callable
from attograd.helpers import content_hash
from attograd.uop.ops import UOp, Ops

TEST_DIR = pathlib.Path(__file__).parent
ROOT = TEST_DIR.parent
DUMP = "ATTOGRAD_KERNEL_DUMP"

# ***** the plugin side (runs in the subprocess) *****

_seen: dict[UOp, None] = {}

def pytest_configure(config) -> None:
  from attograd.engine import realize
  get_kernel = realize.get_kernel
  def recording(ast: UOp, *args, **kwargs):
    _seen.setdefault(ast)
    return get_kernel(ast, *args, **kwargs)
  realize.get_kernel = recording

def pytest_sessionfinish(session, exitstatus) -> None:
  pathlib.Path(os.environ[DUMP]).write_bytes(pickle.dumps(list(_seen)))

# ***** the caller's side *****

def op_test_files() -> list[pathlib.Path]:
  return sorted(f for f in TEST_DIR.glob("test_*.py") if 'parametrize("device", DEVICES)' in f.read_text())

def _key() -> str:
  files = sorted((ROOT / "attograd").rglob("*.py")) + op_test_files() + [TEST_DIR / "helpers.py", TEST_DIR / "conftest.py", pathlib.Path(__file__)]
  return content_hash(*(f"{f.relative_to(ROOT)}\n{f.read_text()}" for f in files))

def op_suite_asts() -> list[UOp]:
  """Every distinct kernel AST (SINK) the op suite runs on CPU, in first-use order."""
  out = pathlib.Path(tempfile.gettempdir()) / f"attograd-op-kernels-{os.getuid()}"
  out.mkdir(exist_ok=True)
  dump = out / f"{_key()}.pkl"
  with open(out / "lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # the other xdist worker waits for this one's collection
    if not dump.exists():
      env = {**os.environ, "TEST_DEVICES": "CPU", DUMP: str(dump), "PYTHONPATH": os.pathsep.join(filter(None, [str(TEST_DIR), os.getenv("PYTHONPATH")]))}
      proc = subprocess.run([sys.executable, "-m", "pytest", *(str(f.relative_to(ROOT)) for f in op_test_files()), "-q", "-p", "op_suite_kernels", "-p", "no:cacheprovider",
                             "-p", "no:xdist", "-p", "no:randomly"], cwd=ROOT, env=env, capture_output=True, text=True)
      # 1: some op test failed (the suite itself reports that); the kernels it ran are still collected
      if proc.returncode not in (0, 1) or not dump.exists():
        raise RuntimeError(f"running the op suite to collect its kernels failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  return [ast for ast in pickle.loads(dump.read_bytes()) if ast.op is Ops.SINK]

def render_each(asts: list[UOp], render: Callable[[UOp], str]) -> tuple[list[str], dict[str, int]]:
  """Each kernel's source (distinct ones, in order), and the errors of those the renderer refuses
  (refusing is an exception naming the problem: the count of kernels per message)."""
  srcs: dict[str, None] = {}
  refused: dict[str, int] = {}
  for ast in asts:
    try: srcs.setdefault(render(ast))
    except Exception as e:  # noqa: BLE001  listed (and failed on unless expected) by the caller
      msg = f"{type(e).__name__}: {e}"  # (named first: an assignment evaluates its value before its target)
      refused[msg] = refused.get(msg, 0) + 1
  return list(srcs), refused
