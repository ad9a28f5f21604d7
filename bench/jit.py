"""Python overhead and memory, issue 7: JIT replay cost per kernel, the schedule cache, the MNIST
training step with TinyJit against torch, and the peak memory of a 16-layer MLP forward.
Medians; torch measured in the same run."""
from __future__ import annotations
import os, statistics, sys, time
sys.path.insert(0, os.path.dirname(__file__))
from attograd import Tensor, TinyJit, GlobalCounters

def median_ms(fn, n: int) -> float:
  times = []
  for _ in range(n):
    st = time.perf_counter(); fn(); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e3

def replay_overhead(kernels: int = 100) -> tuple[float, float]:
  """us per kernel: a replay of `kernels` tiny kernels, and the kernels alone (called directly)."""
  @TinyJit
  def chain(x: Tensor) -> Tensor:
    for _ in range(kernels): x = (x + 1).contiguous()
    return x.realize()
  x = Tensor.zeros(16).contiguous().realize()
  for _ in range(3): chain(x)
  replay = median_ms(lambda: chain(x), 200) * 1e3 / kernels
  calls = [(ei.runner.program, ei.raw) for ei in chain.replay.plan.items]
  def bare():
    for program, raw in calls: program(raw, [])
  return replay, median_ms(bare, 200) * 1e3 / kernels

def schedule_cache() -> tuple[float, float]:
  """ms of Python to schedule a 20-op graph: the first time, and again with new buffers."""
  from attograd.schedule.schedule import create_schedule, _schedule_cache
  def graph() -> Tensor:
    a, b = Tensor.empty(64, 64).contiguous(), Tensor.empty(64, 64).contiguous()
    Tensor.realize_all([a, b])
    x = a
    for i in range(10): x = ((x @ b).relu() + i).softmax(1)
    return x
  firsts, agains = [], []
  for _ in range(5):
    _schedule_cache.clear()
    x = graph(); st = time.perf_counter(); create_schedule([x.uop]); firsts.append(time.perf_counter() - st)
    x = graph(); st = time.perf_counter(); create_schedule([x.uop]); agains.append(time.perf_counter() - st)
  return statistics.median(firsts) * 1e3, statistics.median(agains) * 1e3

def mnist_steps(bs: int = 128, n: int = 20) -> tuple[float, float, float]:
  from mnist_step import attograd_step, torch_step
  from mnist import ConvNet
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  Tensor.manual_seed(0)
  model = ConvNet()
  opt = optim.Adam(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      loss.realize(*opt.schedule_step())
    return loss
  x, y = Tensor.randn(bs, 1, 28, 28).realize(), Tensor.randint(bs, high=10).realize()
  eager, theirs = attograd_step(bs), torch_step(bs)
  for _ in range(3): step(x, y), eager(), theirs()
  return median_ms(lambda: step(x, y).item(), n), median_ms(eager, n), median_ms(theirs, n)

def mlp_memory(layers: int = 16, width: int = 1024, batch: int = 256) -> float:
  """Peak memory the forward adds, in layer outputs."""
  import gc
  x, w = Tensor.rand(batch, width).realize(), Tensor.rand(width, width).realize()
  gc.collect()  # earlier garbage freed now, not in the middle of the measurement (it would lower the peak)
  GlobalCounters.reset()
  before = GlobalCounters.mem_used
  y = x
  for _ in range(layers): y = (y @ w).relu() * (1 / width)
  y.realize()
  return (GlobalCounters.mem_peak - before) / (batch * width * 4)

def main() -> None:
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
  replay, bare = replay_overhead()
  print(f"JIT replay, 100 tiny kernels: {replay:.2f} us per kernel ({bare:.2f} us of it the kernel call itself); target <= 5 us")
  first, again = schedule_cache()
  print(f"schedule a 20-op graph: first {first:.2f} ms, same structure again {again:.3f} ms ({first / again:.1f}x); target >= 5x")
  jit, eager, torch_ms = mnist_steps()
  print(f"mnist training step, batch 128: TinyJit {jit:.2f} ms, eager {eager:.2f} ms, torch {torch_ms:.2f} ms "
        f"(TinyJit {torch_ms / jit:.2f}x torch's speed)")
  peak = mlp_memory()
  # a big matmul packs the column panels of its right operand inside its kernel, on each call's stack;
  # the activations share two planned buffers, and the output takes the memory of the layer two before it
  print(f"16-layer MLP forward (256x1024): peak added memory {peak:.1f} layer outputs; target <= 3")

if __name__ == "__main__": main()
