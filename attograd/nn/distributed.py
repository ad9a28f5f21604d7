"""Training across processes and machines, with torch.distributed's names, over MPI (mpi4py and an MPI library such as
OpenMPI: pip install 'attograd[distributed]', scripts/install_deps.sh installs OpenMPI).

  mpirun -n 2 python train.py         # as root, OpenMPI wants --allow-run-as-root; --oversubscribe for more ranks than cores

  from attograd.nn import distributed as dist
  dist.init_process_group()           # reads the MPI environment mpirun set
  dist.all_reduce(grad, op=dist.ReduceOp.AVG)   # in place, as torch: grad holds the average afterwards

Data moves with the buffer protocol: a realized tensor's device memory (in place on host devices, Buffer.host_view) is
handed to MPI as it is, no pickling and no numpy. Every collective is nonblocking underneath and waited on with a
deadline (init_process_group(timeout=...), env ATTOGRAD_DIST_TIMEOUT in seconds, default 120): a rank that died, hangs
or called another collective makes the others raise DistBackendError naming the operation and what each other rank was
doing, and the job is then aborted at exit (MPI_Abort), so no rank is left waiting forever."""
from __future__ import annotations
import atexit, datetime, enum, faulthandler, os, time
from typing import Any, Sequence
from attograd.tensor import Tensor
from attograd.dtype import DType, dtypes
from attograd.engine.realize import buffer_of, capturing, JitError
from attograd.schedule.schedule import is_contiguous_buffer
from attograd.codegen.opt import THREADS

class DistError(RuntimeError): pass
class DistBackendError(DistError): pass

class ReduceOp(str, enum.Enum):
  """torch.distributed.ReduceOp's names; the plain strings ("sum", "avg", ...) work too."""
  SUM = "sum"; AVG = "avg"; PRODUCT = "product"; MIN = "min"; MAX = "max"; BAND = "band"; BOR = "bor"; BXOR = "bxor"

# op -> the MPI op it runs (AVG is a SUM divided by the world size afterwards)
_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVG: "SUM", ReduceOp.PRODUCT: "PROD", ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX",
            ReduceOp.BAND: "BAND", ReduceOp.BOR: "BOR", ReduceOp.BXOR: "BXOR"}
# bool is reduced as bytes of 0/1: sum and max are "any", product and min "all" (MPI's arithmetic ops refuse C_BOOL)
_BOOL_OPS = {ReduceOp.SUM: "MAX", ReduceOp.MAX: "MAX", ReduceOp.BOR: "MAX", ReduceOp.PRODUCT: "MIN", ReduceOp.MIN: "MIN",
             ReduceOp.BAND: "MIN", ReduceOp.BXOR: "BXOR"}
_BITWISE = {ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR}
# dtype -> MPI datatype. float16 and bfloat16 have no MPI type with arithmetic: they are reduced in float32
_MPI_TYPES = {dtypes.float32: "FLOAT", dtypes.float64: "DOUBLE", dtypes.int8: "INT8_T", dtypes.uint8: "UINT8_T",
              dtypes.int16: "INT16_T", dtypes.uint16: "UINT16_T", dtypes.int32: "INT32_T", dtypes.uint32: "UINT32_T",
              dtypes.int64: "INT64_T", dtypes.uint64: "UINT64_T", dtypes.bool: "UINT8_T"}
# environment variables a launcher sets in every rank (OpenMPI's mpirun, MPICH/Intel MPI's Hydra, PMIx launchers)
_LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")
_LOCAL_SIZE_ENV = ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")  # ranks on this machine
DEFAULT_TIMEOUT = 120.0  # seconds: above a cold first step's compile time on a loaded machine (ranks compile alike)
_QUERY, _ANSWER = 1, 2   # tags on the status communicator: "what are you waiting in?" and its reply

class _Group:
  """The default process group: the data communicator, a second one for status queries (so they never match user or
  data messages), and the collective in progress."""
  def __init__(self, MPI: Any, timeout: float):
    self.MPI, self.timeout = MPI, timeout
    self.rank, self.size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    self.calls, self.current = 0, "nothing"
    self.failed: str | None = None
    self.sends: list[Any] = []  # status replies in flight: kept alive until they complete
    # joining is a collective too: a rank that never arrives must not leave the others waiting forever
    (self.comm, joined), (self.status, joined2) = MPI.COMM_WORLD.Idup(), MPI.COMM_WORLD.Idup()
    deadline = time.monotonic() + timeout
    while not MPI.Request.Testall([joined, joined2]):
      if time.monotonic() >= deadline:
        _fail(self, f"rank {self.rank}: init_process_group() did not complete within {timeout:g} s: some of the {self.size} "
                    "ranks never called it (they exited, crashed or hang before it)")
      time.sleep(0.001)

_group: _Group | None = None
_failed_mpi: Any = None  # the MPI module when a collective failed: the job is aborted at exit

def is_available() -> bool:
  try: import mpi4py  # noqa: F401  (importing mpi4py.MPI would initialize MPI)
  except ImportError: return False
  return True

def is_initialized() -> bool: return _group is not None

def _seconds(timeout: float | datetime.timedelta | None) -> float:
  if timeout is None: return float(os.getenv("ATTOGRAD_DIST_TIMEOUT", DEFAULT_TIMEOUT))
  t = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
  if not t > 0: raise ValueError(f"timeout must be positive seconds (or a timedelta), not {timeout!r}")
  return t

def init_process_group(backend: str | None = None, init_method: str | None = None, timeout: float | datetime.timedelta | None = None,
                       world_size: int = -1, rank: int = -1, **kwargs: Any) -> None:
  """Join the job mpirun started: rank and world size come from MPI. backend may be None or "mpi"; world_size and rank,
  when given, must agree with MPI's. timeout (seconds or a timedelta) bounds every collective's wait."""
  global _group
  if _group is not None: raise RuntimeError("trying to initialize the default process group twice: call destroy_process_group() first")
  if backend not in (None, "mpi", "MPI"): raise ValueError(f"backend {backend!r}: attograd.nn.distributed runs over MPI only (backend='mpi' or None)")
  if init_method not in (None, "env://"): raise ValueError(f"init_method {init_method!r}: MPI's launcher (mpirun) connects the ranks; leave it None")
  seconds = _seconds(timeout)
  if not any(k in os.environ for k in _LAUNCHER_ENV) and world_size != 1:
    raise RuntimeError(f"init_process_group(): this process was not started by mpirun (none of {', '.join(_LAUNCHER_ENV)} is set): "
                       "launch it as `mpirun -n 2 python script.py` (as root add --allow-run-as-root); a single process can pass world_size=1")
  # MPI_Init (importing mpi4py.MPI) waits for every rank to start, in C and holding the GIL, where no deadline or
  # thread of ours can act: faulthandler's watchdog (a C thread) ends the process past the timeout, printing where it
  # waited (the function named below), and mpirun then ends the job
  # OpenMPI's nonblocking all-reduce as a ring (reduce-scatter, then all-gather), the bandwidth-optimal algorithm for
  # the large buffers gradients are: its default choice ran 64 MiB over 2 ranks at 0.33 GB/s here, the ring at 0.45
  # (read by MPI_Init from the environment; one set there wins)
  os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1")
  faulthandler.dump_traceback_later(seconds, exit=True)
  try: MPI = _mpi_init_waiting_for_every_rank_to_start()
  finally: faulthandler.cancel_dump_traceback_later()
  g = _Group(MPI, seconds)
  if world_size not in (-1, g.size) or rank not in (-1, g.rank):
    raise ValueError(f"init_process_group(world_size={world_size}, rank={rank}) disagrees with MPI: this is rank {g.rank} of {g.size}")
  _group = g
  # each rank takes its share of this machine's cores: n ranks each splitting kernels over every core would fight
  # for them (THREADS set in the environment wins)
  if "THREADS" not in os.environ and (local := next((int(os.environ[k]) for k in _LOCAL_SIZE_ENV if k in os.environ), 1)) > 1:
    THREADS.value = max(1, (os.cpu_count() or 1) // local)

def _mpi_init_waiting_for_every_rank_to_start() -> Any:
  try: from mpi4py import MPI
  except ImportError as e:
    raise RuntimeError(f"attograd.nn.distributed needs mpi4py and an MPI library ({e}): pip install 'attograd[distributed]', "
                       "and OpenMPI (apt-get install openmpi-bin libopenmpi-dev; scripts/install_deps.sh)") from None
  return MPI

def destroy_process_group(group: Any = None) -> None:
  """Leave the process group (MPI itself is finalized at exit). After a failed collective the job is aborted instead."""
  global _group
  g = _require("destroy_process_group", group, working=False)
  if g.failed is not None: g.MPI.COMM_WORLD.Abort(1)
  g.comm.Free(); g.status.Free()
  _group = None

def _require(what: str, group: Any = None, working: bool = True) -> _Group:
  if _group is None: raise RuntimeError(f"{what}(): the default process group has not been initialized: call init_process_group() first")
  if group is not None: raise NotImplementedError(f"{what}(group=...): only the default group (every rank) is supported")
  if working and _group.failed is not None: raise DistBackendError(f"{what}(): the process group failed earlier and can't be used: {_group.failed}")
  return _group

def get_rank(group: Any = None) -> int: return _require("get_rank", group, working=False).rank
def get_world_size(group: Any = None) -> int: return _require("get_world_size", group, working=False).size

# ***** waiting with a deadline *****

def _answer_queries(g: _Group) -> None:
  """Reply to every rank that asked what this one is waiting in (it timed out and wants to name who is missing)."""
  st = g.MPI.Status()
  while g.status.Iprobe(source=g.MPI.ANY_SOURCE, tag=_QUERY, status=st):
    g.status.recv(source=st.Get_source(), tag=_QUERY)
    g.sends.append(g.status.isend(g.current, dest=st.Get_source(), tag=_ANSWER))
  g.sends = [r for r in g.sends if not r.Test()]

def _wait(g: _Group, req: Any) -> None:
  """Wait for req, driving MPI's progress (Test), answering status queries, until the deadline; then fail naming who
  is missing. A blocking wait could not be given up."""
  start = time.monotonic()
  deadline, next_check = start + g.timeout, start + 0.05
  while not req.Test():
    now = time.monotonic()
    if now >= next_check:
      _answer_queries(g)
      next_check = now + 0.05
      if now >= deadline: _timed_out(g)
    # yield the core while waiting (on 2 cores the peer may need it); after a second, also stop spinning
    time.sleep(0 if now - start < 1.0 else 0.001)

def _timed_out(g: _Group) -> None:
  """Ask every other rank what it is waiting in, give them a moment to answer, and raise naming each."""
  for r in range(g.size):
    if r != g.rank: g.sends.append(g.status.isend(g.calls, dest=r, tag=_QUERY))
  answers: dict[int, str] = {}
  st, grace_end = g.MPI.Status(), time.monotonic() + min(5.0, max(1.0, g.timeout / 4))
  while len(answers) < g.size - 1 and time.monotonic() < grace_end:
    _answer_queries(g)  # a rank that timed out at the same moment asks us too
    while g.status.Iprobe(source=g.MPI.ANY_SOURCE, tag=_ANSWER, status=st):
      answers[st.Get_source()] = g.status.recv(source=st.Get_source(), tag=_ANSWER)
    time.sleep(0.01)
  others = [f"rank {r}: " + (f"waiting in {answers[r]}" if r in answers else "no answer (it exited, crashed, hangs, or is busy outside any collective)")
            for r in range(g.size) if r != g.rank]
  _fail(g, f"rank {g.rank}: {g.current} did not complete within {g.timeout:g} s; " + "; ".join(others))

def _fail(g: _Group, why: str) -> None:
  global _failed_mpi
  g.failed, _failed_mpi = why, g.MPI
  atexit.register(_abort_job)
  raise DistBackendError(why + ". The job is aborted when this process exits (MPI_Abort); set the timeout with "
                         "init_process_group(timeout=...) or ATTOGRAD_DIST_TIMEOUT")

def _abort_job() -> None:
  # MPI_Finalize would wait for the missing rank forever; aborting ends every rank of the job
  if _failed_mpi is not None: _failed_mpi.COMM_WORLD.Abort(1)

# ***** tensors as MPI buffers *****

def _check(what: str, t: Any) -> None:
  if not isinstance(t, Tensor): raise TypeError(f"{what} takes a Tensor, not {type(t).__name__}")
  if capturing() is not None:
    raise JitError(f"{what} inside a TinyJit function: a replay would not communicate. Return the tensor and call {what} outside")
  if t.uop.symbolic_shape: raise ValueError(f"{what} of a tensor with a symbolic shape {t.shape}: bind the Variable's value first")

def _input_bytes(t: Tensor) -> tuple[memoryview, Tensor]:
  """t's values as bytes, realized in contiguous memory: the buffer itself on host devices, else a copy; and the tensor
  whose buffer it is, which the caller holds until MPI is done with the bytes (a view of device memory doesn't keep its
  buffer: freed, its memory is the next buffer's, such as the collective's output, and MPI refused the same pointer)."""
  c = t.contiguous().realize()
  if not is_contiguous_buffer(c.uop): c = c.clone().realize()
  b = buffer_of(c.uop.base)
  mv = b.host_view()
  return (mv if mv is not None else b.as_bytes()), c

def _output(shape: tuple[int, ...], dtype: DType, device: str) -> tuple[Tensor, memoryview, Any]:
  """A fresh tensor, the bytes MPI writes into, and the buffer to copy them to afterwards (None when written in place)."""
  out = Tensor.empty(*shape, dtype=dtype, device=device)
  b = buffer_of(out.uop.base)
  if (mv := b.host_view()) is not None: return out, mv, None
  return out, memoryview(bytearray(b.nbytes)), b

def _finish(out: Tensor, data: memoryview, pending: Any) -> Tensor:
  if pending is not None: pending.copyin(data)
  return out

def _replace(t: Tensor, value: Tensor) -> None:
  """t takes value's values, as torch's in-place collectives do. A view writes through to its base (assign); a tensor of
  its own just takes the new memory, no copy (tensors computed from the old values keep them, as with assign)."""
  vo = t._view_of
  if vo is not None and (base := vo[0]()) is not None and base is not t: t.assign(value)
  else: t.uop = value.uop

def _op(op: Any) -> ReduceOp:
  try: return ReduceOp(op.lower() if isinstance(op, str) and not isinstance(op, ReduceOp) else op)
  except ValueError: raise ValueError(f"unknown reduce op {op!r}; one of {', '.join(o.value for o in ReduceOp)} (or ReduceOp.SUM, ...)") from None

def _start(g: _Group, what: str) -> None:
  g.calls += 1
  g.current = f"{what} (collective call #{g.calls})"

def all_reduce(tensor: Tensor, op: ReduceOp | str = ReduceOp.SUM, group: Any = None, async_op: bool = False) -> None:
  """Reduce tensor over every rank; each rank's tensor then holds the result (in place, as torch)."""
  g = _require("all_reduce", group)
  _check("all_reduce", tensor)
  if async_op: raise NotImplementedError("all_reduce(async_op=True): collectives here complete before they return")
  rop = _op(op)
  if tensor.dtype in (dtypes.float16, dtypes.bfloat16):  # no MPI arithmetic type: reduce in float32, keep the dtype
    wide = tensor.float()
    all_reduce(wide, rop, group)
    return _replace(tensor, wide.cast(tensor.dtype).realize())
  if tensor.dtype not in _MPI_TYPES: raise TypeError(f"all_reduce of a {tensor.dtype} tensor: MPI has no type for it")
  is_float = dtypes.is_float(tensor.dtype)
  if rop is ReduceOp.AVG and not is_float: raise TypeError(f"all_reduce with op AVG of an integer tensor ({tensor.dtype}): use SUM and divide")
  if rop in _BITWISE and is_float: raise TypeError(f"all_reduce with op {rop.name} of a float tensor ({tensor.dtype}): bitwise ops need integers")
  mpi_op = getattr(g.MPI, (_BOOL_OPS if tensor.dtype == dtypes.bool else _MPI_OPS)[rop])
  mpi_type = getattr(g.MPI, _MPI_TYPES[tensor.dtype])
  _start(g, f"all_reduce({rop.name} of {tensor.shape} {tensor.dtype})")
  src, held = _input_bytes(tensor)
  out, dst, pending = _output(tensor.shape, tensor.dtype, tensor.device)
  _wait(g, g.comm.Iallreduce([src, mpi_type], [dst, mpi_type], mpi_op))
  out = _finish(out, dst, pending)
  # the result in memory, as torch's: a parameter left a lazy graph would no longer be state of its own
  _replace(tensor, (out / g.size).realize() if rop is ReduceOp.AVG else out)

def broadcast(tensor: Tensor, src: int, group: Any = None, async_op: bool = False) -> None:
  """Every rank's tensor takes rank src's values (in place, as torch)."""
  g = _require("broadcast", group)
  _check("broadcast", tensor)
  if async_op: raise NotImplementedError("broadcast(async_op=True): collectives here complete before they return")
  if not 0 <= src < g.size: raise ValueError(f"broadcast(src={src}): there are {g.size} ranks")
  _start(g, f"broadcast(from rank {src}, {tensor.shape} {tensor.dtype})")
  if g.rank == src:
    data, held = _input_bytes(tensor)
    _wait(g, g.comm.Ibcast([data, g.MPI.BYTE], root=src))
    return
  out, dst, pending = _output(tensor.shape, tensor.dtype, tensor.device)
  _wait(g, g.comm.Ibcast([dst, g.MPI.BYTE], root=src))
  _replace(tensor, _finish(out, dst, pending))

def all_gather(tensor_list: list[Tensor], tensor: Tensor, group: Any = None, async_op: bool = False) -> None:
  """tensor_list[r] takes rank r's tensor, on every rank (torch's all_gather: the list holds world_size tensors shaped
  like tensor). They become views of one buffer MPI gathered into: no copies."""
  g = _require("all_gather", group)
  _check("all_gather", tensor)
  if async_op: raise NotImplementedError("all_gather(async_op=True): collectives here complete before they return")
  if not isinstance(tensor_list, list) or len(tensor_list) != g.size:
    raise ValueError(f"all_gather: tensor_list must be a list of world_size={g.size} tensors, got {type(tensor_list).__name__} "
                     f"of {len(tensor_list) if isinstance(tensor_list, Sequence) else '?'}")
  for i, t in enumerate(tensor_list):
    if not isinstance(t, Tensor) or t.shape != tensor.shape or t.dtype != tensor.dtype:
      raise ValueError(f"all_gather: tensor_list[{i}] must be a {tensor.shape} {tensor.dtype} tensor like the input, got {t!r}")
  _start(g, f"all_gather({tensor.shape} {tensor.dtype})")
  src, held = _input_bytes(tensor)
  out, dst, pending = _output((g.size, *tensor.shape), tensor.dtype, tensor.device)
  _wait(g, g.comm.Iallgather([src, g.MPI.BYTE], [dst, g.MPI.BYTE]))
  out = _finish(out, dst, pending)
  for i, t in enumerate(tensor_list): _replace(t, out[i])

def barrier(group: Any = None, async_op: bool = False, device_ids: Any = None) -> None:
  """Wait until every rank has called barrier()."""
  g = _require("barrier", group)
  _start(g, "barrier()")
  _wait(g, g.comm.Ibarrier())
