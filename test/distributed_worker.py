"""Run by test_distributed.py under `mpirun -n 2`: each rank runs the collectives and one data-parallel training step
and saves what it got (OUT/rank<r>.npz); the test compares with numpy and a one-process step. `dead` as the first
argument: rank 1 leaves without joining, rank 0's all_reduce must raise within the timeout (`dead late`: rank 1
hangs before init_process_group, rank 0's must raise)."""
import os, sys, time
import numpy as np
from attograd import Tensor, nn, dtypes
from attograd.nn import optim, distributed as dist

GLOBAL_BATCH, IN, HIDDEN, OUT_F = 8, 5, 7, 3

def rank_input(rank: int, shape: tuple[int, ...]) -> np.ndarray:
  return (np.random.default_rng(100 + rank).standard_normal(shape)).astype(np.float32)

def global_batch() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(7)
  return rng.standard_normal((GLOBAL_BATCH, IN)).astype(np.float32), rng.integers(0, OUT_F, GLOBAL_BATCH)

def model_and_opt() -> tuple[nn.Sequential, optim.Optimizer]:
  Tensor.manual_seed(3)
  model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT_F))
  return model, optim.SGD(model.parameters(), lr=0.5, momentum=0.9)

def train_step(model: nn.Sequential, opt: optim.Optimizer, x: np.ndarray, y: np.ndarray, distributed: bool) -> float:
  """One SGD step on (x, y); distributed: this rank's rows, gradients averaged over the ranks."""
  opt.zero_grad()
  loss = model(Tensor(x)).cross_entropy(Tensor(y)).backward()
  if distributed:
    for p in opt.params: dist.all_reduce(p.grad, dist.ReduceOp.AVG)
  opt.step()
  return float(loss.item())

def main(out: str) -> None:
  dist.init_process_group(timeout=float(os.getenv("DIST_TEST_TIMEOUT", 120)))  # generous: CI runs tests side by side
  rank, world = dist.get_rank(), dist.get_world_size()
  got: dict[str, np.ndarray] = {}
  for op in ("sum", "avg", "max", "min", "product"):
    t = Tensor(rank_input(rank, (3, 4)))
    dist.all_reduce(t, op)
    got[f"all_reduce_{op}"] = t.numpy()
  t = Tensor(rank_input(rank, (6,)))
  dist.all_reduce(t, dist.ReduceOp.SUM)   # torch's enum works as the op too
  got["all_reduce_enum_sum"] = t.numpy()
  t = Tensor((np.arange(5) * (rank + 1)).astype(np.int64))
  dist.all_reduce(t)
  got["all_reduce_int64"] = t.numpy()
  t = Tensor(rank_input(rank, (2, 3)))
  dist.broadcast(t, src=1)
  got["broadcast"] = t.numpy()
  parts = [Tensor.zeros(2, 2) for _ in range(world)]
  dist.all_gather(parts, Tensor(rank_input(rank, (2, 2))))
  got["all_gather"] = np.stack([p.numpy() for p in parts])
  dist.barrier()
  # a data-parallel step: rank r takes rows [r*B/world, (r+1)*B/world) of the global batch
  model, opt = model_and_opt()
  x, y = global_batch()
  rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
  for _ in range(2): train_step(model, opt, x[rows], y[rows], distributed=True)
  for i, p in enumerate(opt.params): got[f"param{i}"] = p.numpy()
  np.savez(os.path.join(out, f"rank{rank}.npz"), **got)
  dist.destroy_process_group()

def dead() -> None:
  if os.getenv("OMPI_COMM_WORLD_RANK") == "1" and "late" in sys.argv: time.sleep(120)   # hangs before joining
  # (a rank that exits without joining is caught by mpirun itself, which ends the job)
  dist.init_process_group(timeout=float(os.getenv("DIST_TEST_TIMEOUT", 2)))
  if dist.get_rank() == 1: sys.exit(0)   # leaves without joining the all_reduce below
  st = time.monotonic()
  try: dist.all_reduce(Tensor.ones(4))
  except dist.DistBackendError as e:
    print(f"raised after {time.monotonic() - st:.1f} s: {e}", flush=True)
    raise

if __name__ == "__main__":
  if sys.argv[1].startswith("dead"): dead()
  else: main(sys.argv[1])
