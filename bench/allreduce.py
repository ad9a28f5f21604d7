"""all_reduce (sum) of 64 MiB of float32 over 2 local MPI ranks: attograd.nn.distributed next to its peers in the same
run, raw mpi4py Allreduce (and Iallreduce, the call attograd makes) on numpy buffers and torch.distributed's gloo
backend. Rounds interleave them, so load on the machine falls on each alike. Prints the algorithm bandwidth (bytes reduced / time) in GB/s: median and range.

  python bench/allreduce.py            # launches itself under mpirun -n 2 (RANKS=n, SIZE_MB=64, ROUNDS=9)

First, in this process: the all-reduce schedule item of sharded tensors (engine/allreduce.py) across CPU:0 and CPU:1, ring
and direct, next to a plain memory copy of the same 64 MiB (memcpy, through a memoryview), rounds interleaved; and a
whole `x.sum(0)` of a tensor split over the two devices (the per-device sums, then the all-reduce).

  python bench/allreduce.py --local    # only that"""
import os, shutil, socket, statistics, subprocess, sys, time

RANKS, SIZE_MB, ROUNDS = int(os.getenv("RANKS", 2)), int(os.getenv("SIZE_MB", 64)), int(os.getenv("ROUNDS", 9))

def launch() -> None:
  if (mpirun := shutil.which("mpirun")) is None: raise SystemExit("bench/allreduce.py needs mpirun (OpenMPI: scripts/install_deps.sh)")
  root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
  raise SystemExit(subprocess.call([mpirun, *root, "--oversubscribe", "-n", str(RANKS), sys.executable, *sys.argv]))

def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]

def main() -> None:
  import numpy as np
  from attograd import Tensor
  from attograd.nn import distributed as dist
  dist.init_process_group()   # first: it sets OpenMPI's options, read when MPI starts (importing mpi4py.MPI)
  from mpi4py import MPI
  comm, rank, n = MPI.COMM_WORLD, dist.get_rank(), SIZE_MB * (1 << 20) // 4
  # torch's gloo, connected through a TCP store on rank 0 at a port rank 0 picked
  import torch, torch.distributed as tdist
  os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(comm.bcast(free_port() if rank == 0 else None)),
                    RANK=str(rank), WORLD_SIZE=str(comm.Get_size()))
  tdist.init_process_group("gloo")
  torch.set_num_threads(1)

  a, b = np.ones(n, np.float32), np.empty(n, np.float32)
  ours = Tensor(a).realize()
  theirs = torch.ones(n)
  cases = {"attograd all_reduce": lambda: dist.all_reduce(ours),
           "mpi4py Allreduce (numpy)": lambda: comm.Allreduce(a, b),
           "mpi4py Iallreduce (numpy)": lambda: comm.Iallreduce(a, b).Wait(),  # the call attograd makes, bare
           "torch gloo all_reduce": lambda: tdist.all_reduce(theirs)}
  times: dict[str, list[float]] = {k: [] for k in cases}
  for r in range(ROUNDS + 1):  # round 0 warms up (first touch of memory, connections)
    for name, fn in cases.items():
      comm.Barrier()
      st = time.perf_counter(); fn(); dt = time.perf_counter() - st
      dt = comm.allreduce(dt, op=MPI.MAX)  # a collective is done when its slowest rank is
      if r: times[name].append(dt)
      if name.startswith("attograd"): ours = Tensor(a).realize()  # the same values each round (sums would grow)
      if name.startswith("torch"): theirs.fill_(1.0)
  assert float(ours.numpy()[0]) == 1.0
  if rank == 0:
    gbs = {k: [4 * n / t / 1e9 for t in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in gbs.items()}
    print(f"all_reduce(sum) of {SIZE_MB} MiB float32 over {comm.Get_size()} local ranks, {ROUNDS} rounds, algorithm bandwidth (GB/s)")
    for k, v in gbs.items(): print(f"  {k:26s} median {med[k]:6.3f}   range {min(v):.3f} - {max(v):.3f}")
    ours_k, mpi_k, impi_k, gloo_k = list(cases)
    print(f"attograd / mpi4py Allreduce: {med[ours_k] / med[mpi_k]:.2f}x (target >= 0.9)   attograd / mpi4py Iallreduce: "
          f"{med[ours_k] / med[impi_k]:.2f}x   attograd / gloo: {med[ours_k] / med[gloo_k]:.2f}x (target > 1)")
  tdist.destroy_process_group()
  dist.destroy_process_group()

def local() -> None:
  from attograd import Tensor
  from attograd.uop.ops import Ops
  from attograd.dtype import dtypes
  from attograd.runtime.device import Buffer
  from attograd.engine.allreduce import AllReduce
  devices, n = ("CPU", "CPU:1"), SIZE_MB * (1 << 20) // 4
  bufs = [Buffer(d, n, dtypes.float32).ensure_allocated() for d in devices]
  for b in bufs: b.host_view()[:] = b"\0" * b.nbytes
  raw = [b._buf for b in bufs]
  src, dst = bufs[0].host_view(), bufs[1].host_view()
  x = Tensor.ones(2 * 1024, n // 1024).contiguous().shard(devices, 0).realize()  # half the rows on each device
  ring, direct = AllReduce(Ops.ADD, dtypes.float32, devices, n), AllReduce(Ops.ADD, dtypes.float32, devices, n)
  ring.ring, direct.ring = True, False
  cases = {"all-reduce item, ring": lambda: ring(raw, None), "all-reduce item, direct": lambda: direct(raw, None),
           "memory copy (memcpy)": lambda: dst.__setitem__(slice(None), src),
           "x.sum(0), x split in 2": lambda: x.sum(0).realize()}
  times: dict[str, list[float]] = {k: [] for k in cases}
  for r in range(ROUNDS + 1):  # round 0 warms up (first touch of memory, compiling)
    for name, fn in cases.items():
      st = time.perf_counter(); fn(); dt = time.perf_counter() - st
      if r: times[name].append(dt)
  print(f"in one process, {SIZE_MB} MiB float32 on each of {', '.join(devices)}, {ROUNDS} rounds, GB/s (bytes reduced or copied / time; "
        "x.sum(0): bytes of x / time), on a shared machine")
  gbs = {k: [4 * n / t / 1e9 for t in v] for k, v in times.items()}
  gbs["x.sum(0), x split in 2"] = [2 * 4 * n / t / 1e9 for t in times["x.sum(0), x split in 2"]]
  med = {k: statistics.median(v) for k, v in gbs.items()}
  for k, v in gbs.items(): print(f"  {k:26s} median {med[k]:6.3f}   range {min(v):.3f} - {max(v):.3f}")
  print(f"all-reduce / memcpy: ring {med['all-reduce item, ring'] / med['memory copy (memcpy)']:.2f}x, direct "
        f"{med['all-reduce item, direct'] / med['memory copy (memcpy)']:.2f}x")

if __name__ == "__main__":
  if not any(k in os.environ for k in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK")):
    local()
    if "--local" in sys.argv[1:]: raise SystemExit(0)
    launch()
  main()
