"""A loop's kept plan (engine/realize.py PlannedRun) runs on its pool's runner thread (runtime/threadpool.py Deferred):
realize returns before the kernels are done, and whatever reads or writes their memory from the host, or runs other
kernels, waits for them first. The values are those of a run that waited."""
import contextlib, os, threading
import numpy as np
import pytest
from attograd import Context, Tensor, nn
from attograd.nn import optim
from attograd.engine import realize
from attograd.runtime import threadpool
from attograd.codegen.opt import THREADS

N = 128

def _chain(w: Tensor, x: Tensor, n: int = 6) -> Tensor:
  """n products with w, then x read by the last kernel."""
  h = w
  for _ in range(n): h = (h @ w).relu() * (1 / N)
  return (h * x).sum(1)

def _want(w: np.ndarray, x: np.ndarray, n: int = 6) -> np.ndarray:
  h = w.astype(np.float64)
  for _ in range(n): h = np.maximum(h @ w, 0) * (1 / N)
  return (h * x).sum(1)

def _close(got: np.ndarray, want: np.ndarray) -> None:
  # (sums of terms of both signs: an element near 0 keeps the rounding of its terms)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())

@contextlib.contextmanager
def _held(seconds: float = 0.5):
  """The CPU runner starts nothing for `seconds`: what is handed to it meanwhile is in flight that long. A wait that is
  missing reads or writes memory before the kernels did."""
  threadpool.hold("CPU", True)
  timer = threading.Timer(seconds, threadpool.hold, ("CPU", False))
  timer.start()
  try: yield
  finally:
    timer.cancel()
    threadpool.hold("CPU", False)

@pytest.fixture(autouse=True)
def two_cores(monkeypatch):
  monkeypatch.setattr(THREADS, "value", 2)  # (at THREADS=1 the kernels run on the thread that realizes: nothing deferred)

@pytest.fixture
def w() -> Tensor: return Tensor(np.random.default_rng(0).uniform(0, 1, (N, N)).astype(np.float32)).realize()

@pytest.fixture
def xs() -> list[np.ndarray]: return [np.random.default_rng(i).standard_normal((N, N)).astype(np.float32) for i in range(3)]

def test_kept_plan_returns_before_its_kernels_and_reads_wait(w, xs):
  outs = [_chain(w, Tensor(x)).realize() for x in xs[:2]]
  with _held():
    outs.append(_chain(w, Tensor(xs[2])).realize())  # the third run: the kept plan's, handed to the runner
    assert threadpool._inflight is not None
    for o, x in zip(outs, xs): _close(o.numpy(), _want(w.numpy(), x))
  assert threadpool._inflight is None  # the last read waited for all of it

def test_a_run_waits_for_the_one_in_flight(w, xs):
  outs = [_chain(w, Tensor(x)).realize() for x in xs[:2]]
  with _held():
    outs.append(_chain(w, Tensor(xs[2])).realize())
    outs.append(_chain(w, Tensor(xs[1])).realize())  # (rebinds the memory of the plan in flight)
  for o, x in zip(outs, [*xs, xs[1]]): _close(o.numpy(), _want(w.numpy(), x))

def test_not_deferred_when_switched_off_or_on_one_core(w, xs, monkeypatch):
  monkeypatch.setattr(realize, "DEFER", 0)
  for x in xs: _chain(w, Tensor(x)).realize()
  assert threadpool._inflight is None
  monkeypatch.setattr(realize, "DEFER", 1)
  monkeypatch.setattr(THREADS, "value", 1)
  for x in xs: _chain(w, Tensor(x)).realize()
  assert threadpool._inflight is None

def test_host_write_waits_for_the_kernels_reading_the_memory(w, xs):
  # x is read by the last kernel: a copy into its memory right after realize returns must not be seen by it
  ts = [Tensor(x).realize() for x in xs]
  outs = [_chain(w, t).realize() for t in ts[:2]]
  with _held():
    outs.append(_chain(w, ts[2]).realize())
    assert threadpool._inflight is not None
    realize.buffer_of(ts[2].uop.base).copyin(memoryview(np.zeros((N, N), np.float32)).cast("B"))
  _close(outs[2].numpy(), _want(w.numpy(), xs[2]))
  np.testing.assert_array_equal(ts[2].numpy(), 0)

def test_other_kernels_and_copies_wait(w, xs):
  for _ in range(2): (Tensor(xs[0][0]) * 2 + 1).realize()
  outs = [_chain(w, Tensor(x)).realize() for x in xs[:2]]
  with _held():
    outs.append(_chain(w, Tensor(xs[2])).realize())
    with Context(DEBUG=1):  # (a run each item of which is timed: its kernels called one by one from Python)
      y = (outs[2] * 2 + 1).realize()
  _close(y.numpy(), _want(w.numpy(), xs[2]) * 2 + 1)
  with _held():
    outs.append(_chain(w, Tensor(xs[1])).realize())
    _close(outs[3].to("PYTHON").numpy(), _want(w.numpy(), xs[1]))  # a copy to another device

@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_waits_for_the_run_in_flight(w, xs):
  outs = [_chain(w, Tensor(x)).realize() for x in xs[:2]]
  want = _want(w.numpy(), xs[2])
  with _held():
    outs.append(_chain(w, Tensor(xs[2])).realize())
    assert threadpool._inflight is not None
    if (pid := os.fork()) == 0:  # the child has no runner thread: its memory is as the fork found it
      ok = False
      try:
        got = np.frombuffer(bytes(realize.buffer_of(outs[2].uop.base).ensure_allocated()._buf.data), np.float32)
        ok = np.allclose(got, want, rtol=1e-4, atol=1e-6 * np.abs(want).max())
      finally: os._exit(0 if ok else 1)
  _, status = os.waitpid(pid, 0)
  assert os.waitstatus_to_exitcode(status) == 0

def test_training_step_loss_is_read_before_the_update_finishes():
  # the loss a step's .item() reads is written by a kernel of the forward pass, run before the backward's and the
  # optimizer's (Tensor.realize_all puts pending tensors first): the read waits for those alone
  Tensor.manual_seed(0)
  layers = [nn.Linear(32, 64), nn.Linear(64, 8)]
  params = [p for l in layers for p in (l.weight, l.bias)]
  opt = optim.AdamW(params, lr=1e-2)
  x, y = Tensor.randn(16, 32).realize(), Tensor.randn(16, 8).realize()
  for _ in range(4):
    with Tensor.train():
      opt.zero_grad()
      loss = (layers[1](layers[0](x).gelu()) - y).square().mean().backward()
      opt.step()
  d = threadpool._inflight
  assert d is not None
  writes, _ = d.uses()
  assert writes[id(realize.buffer_of(loss.uop.base).ensure_allocated()._buf)] < d.count // 2
  loss.item()
