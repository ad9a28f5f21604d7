"""Train a small convnet on MNIST and report test accuracy.

  pip install -e '.[mnist]' && python examples/mnist.py

EPOCHS, BS (batch size), LR and STEPS (at most this many steps an epoch) can be set in the environment. DEBUG=2
shows every kernel.
Data parallel over MPI processes (pip install -e '.[mnist,distributed]', OpenMPI from scripts/install_deps.sh):

  mpirun -n 2 python examples/mnist.py --distributed     # as root: mpirun --allow-run-as-root ...

each rank trains on its slice of every global batch of BS and the gradients are averaged (all_reduce), so every rank
holds the same parameters after each step; only rank 0 prints and writes the checkpoint (CKPT=path, safetensors).
Data parallel over devices of one process:

  python examples/mnist.py --devices 2     # CPU:0 and CPU:1

shards every batch along its rows over the devices (Tensor.shard) and replicates the model: the gradients' sums over
the batch become all-reduces in the schedule, and the whole step is still one TinyJit."""
import os, sys, time
import numpy as np
from tqdm import trange
from attograd import Tensor, TinyJit, nn, GlobalCounters
from attograd.nn import optim
from attograd.nn.datasets import mnist
from attograd.nn.state import get_parameters, get_state_dict, safe_save

class ConvNet:
  def __init__(self):
    self.c1 = nn.Conv2d(1, 8, 3)
    self.c2 = nn.Conv2d(8, 16, 3)
    self.fc = nn.Linear(16 * 5 * 5, 10)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.c1(x).relu().max_pool2d(2)     # 28 -> 26 -> 13
    x = self.c2(x).relu().max_pool2d(2)     # 13 -> 11 -> 5
    return self.fc(x.flatten(1))

def normalize(images: np.ndarray) -> Tensor:
  return (Tensor(images).float() * (1 / 255) - 0.1307) * (1 / 0.3081)

def data_parallel_step(model: ConvNet, opt: optim.Optimizer):
  """A training step over MPI ranks: each computes the gradients of its slice of the batch (one TinyJit), they are
  averaged in one all_reduce of all gradients laid end to end, and every rank applies the same update (a second
  TinyJit). Equal slices make the average of the ranks' mean losses' gradients the global batch's gradient."""
  from attograd.nn import distributed as dist
  params = opt.params
  for p in params: dist.broadcast(p, 0)   # start from rank 0's parameters, as torch's DistributedDataParallel does

  @TinyJit
  def local_grads(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      # the gradients in memory first: a cat of the lazy ones becomes one kernel recomputing their reductions for
      # every element it writes (1.2 s a step instead of 1 ms)
      Tensor.realize_all([loss, *(p.grad for p in params)])
      return loss, Tensor.cat(*[p.grad.flatten() for p in params]).realize()

  @TinyJit
  def apply(grads: Tensor) -> None:
    with Tensor.train():
      at = 0
      for p in params:
        p.grad, at = grads[at:at + p.numel()].reshape(p.shape), at + p.numel()
      Tensor.realize_all(opt.schedule_step())

  def step(x: Tensor, y: Tensor) -> Tensor:
    loss, grads = local_grads(x, y)
    grads, loss = Tensor(grads.uop), Tensor(loss.uop)  # new tensors take the results: the jit refills its outputs
    dist.all_reduce(grads, dist.ReduceOp.AVG)
    apply(grads)
    return loss
  return step

def main() -> float:
  epochs, bs, lr = int(os.getenv("EPOCHS", 3)), int(os.getenv("BS", 128)), float(os.getenv("LR", 2e-3))
  rank, world = 0, 1
  if distributed := "--distributed" in sys.argv[1:]:
    from attograd.nn import distributed as dist
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    if bs % world: raise SystemExit(f"BS={bs} must be a multiple of the {world} ranks: each takes an equal slice of every batch")
  X_train, Y_train, X_test, Y_test = mnist()
  x_train, y_train = X_train.numpy(), Y_train.numpy().astype(np.int64)
  x_test, y_test = X_test.numpy(), Y_test.numpy().astype(np.int64)
  Tensor.manual_seed(0)
  model = ConvNet()
  devices = None
  if "--devices" in sys.argv[1:]:
    n = int(sys.argv[sys.argv.index("--devices") + 1])
    devices = tuple(f"CPU:{i}" for i in range(n))
    for p in get_parameters(model): p.shard_(devices)   # the model replicated: a copy on each device
  def batch(x: Tensor) -> Tensor: return x if devices is None else x.shard(devices, 0)   # each device takes a slice of the rows
  opt = optim.Adam(get_parameters(model), lr=lr)

  @TinyJit  # scheduled and compiled once; later steps only launch the recorded kernels
  def train_step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      loss.realize(*opt.schedule_step())   # the loss and every parameter update in one schedule
    return loss
  if distributed: train_step = data_parallel_step(model, opt)
  local = slice(rank * (bs // world), (rank + 1) * (bs // world))  # this rank's slice of every global batch

  rng = np.random.default_rng(0)
  st = time.perf_counter()
  for epoch in range(epochs):
    opt.lr.assign(lr * 0.5 ** epoch)   # decay per epoch: lr is a Tensor, so no kernel is compiled again
    perm = rng.permutation(len(x_train))
    for i in (bar := trange(min(len(x_train) // bs, int(os.getenv("STEPS", 1 << 30))), desc=f"epoch {epoch + 1}/{epochs}", disable=rank != 0)):
      idx = perm[i * bs:(i + 1) * bs][local]
      loss = train_step(batch(normalize(x_train[idx])), batch(Tensor(y_train[idx])))
      if i % 20 == 0:
        if distributed: dist.all_reduce(loss, dist.ReduceOp.AVG)   # every rank, in step: the global batch's loss
        if rank == 0: bar.set_postfix(loss=f"{loss.item():.3f}")
  train_time = time.perf_counter() - st

  correct = 0
  for i in range(rank * 1000, len(x_test), world * 1000):   # each rank scores its share of the test set
    pred = model(batch(normalize(x_test[i:i + 1000]))).argmax(1)
    correct += int((pred == batch(Tensor(y_test[i:i + 1000]))).sum().item())
  if distributed:
    dist.all_reduce(total := Tensor([correct]))
    correct = int(total.item())
    flat = Tensor.cat(*[p.flatten() for p in opt.params])
    dist.all_reduce(hi := flat.clone(), "max"), dist.all_reduce(lo := flat.clone(), "min")
    same = bool((hi == lo).all().item())
    if rank == 0: print(f"parameters identical on all {world} ranks: {same}")
  acc = correct / len(x_test)
  if rank == 0:
    print(f"trained {epochs} epochs in {train_time:.1f} s ({GlobalCounters.kernel_count} kernels run{' on rank 0' if distributed else ''})")
    print(f"test accuracy: {acc:.4f}")
    if (ckpt := os.getenv("CKPT")): safe_save(get_state_dict(model), ckpt); print(f"saved {ckpt}")
  if distributed: dist.destroy_process_group()
  return acc

if __name__ == "__main__": main()
