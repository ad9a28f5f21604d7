"""Training step time of examples/mnist.py's convnet, attograd against the same model in torch,
same batch, measured in one run (medians of N steps after warm-up). --model beautiful times examples/beautiful_mnist.py's
step as that tinygrad program runs it (TinyJit, a batch of MNIST drawn and gathered on the device each step), torch's
the same way."""
from __future__ import annotations
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

def time_steps(step, n: int) -> float:
  times = []
  for _ in range(n):
    st = time.perf_counter(); step(); times.append(time.perf_counter() - st)
  return statistics.median(times) * 1e3

def mnist_train():
  from attograd.nn.datasets import mnist
  X, Y, _, _ = mnist()
  return X, Y

def attograd_step(bs: int, beautiful: bool = False):
  from mnist import ConvNet
  from beautiful_mnist import Net
  from attograd import Tensor, TinyJit
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  Tensor.manual_seed(0)
  model = Net() if beautiful else ConvNet()
  opt = optim.Adam(get_parameters(model), lr=1e-3)
  if beautiful:  # as the tinygrad program runs it: TinyJit, the batch drawn and gathered on the device inside the step
    X, Y = mnist_train()
    @TinyJit
    @Tensor.train()
    def jitted():
      opt.zero_grad()
      samples = Tensor.randint(bs, high=X.shape[0])
      loss = model(X[samples]).sparse_categorical_crossentropy(Y[samples]).backward()
      return loss.realize(*opt.schedule_step())
    return lambda: jitted().item()
  x, y = Tensor.randn(bs, 1, 28, 28).realize(), Tensor.randint(bs, high=10).realize()
  def step():
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      loss.realize(*opt.schedule_step())
    return loss.item()
  return step

def torch_step(bs: int, beautiful: bool = False):
  import torch
  torch.manual_seed(0)
  nn = torch.nn
  if beautiful:  # examples/beautiful_mnist.py's Net
    block = lambda cin, cout, k: [nn.Conv2d(cin, cout, k), nn.ReLU(), nn.Conv2d(cout, cout, k), nn.ReLU(), nn.BatchNorm2d(cout), nn.MaxPool2d(2)]
    model = nn.Sequential(*block(1, 32, 5), *block(32, 64, 3), nn.Flatten(), nn.Linear(576, 10))
    model.train()
  else: model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 16, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 10))
  opt = torch.optim.Adam(model.parameters(), lr=1e-3)
  if beautiful:  # the same data, a batch drawn and gathered each step
    X, Y = (torch.from_numpy(t.numpy()) for t in mnist_train())
    def sampled():
      opt.zero_grad()
      samples = torch.randint(0, X.shape[0], (bs,))
      loss = torch.nn.functional.cross_entropy(model(X[samples].float()), Y[samples].long())
      loss.backward()
      opt.step()
      return loss.item()
    return sampled
  x, y = torch.randn(bs, 1, 28, 28), torch.randint(0, 10, (bs,))
  def step():
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss.item()
  return step

def main() -> None:
  """--model beautiful: examples/beautiful_mnist.py's 4-conv + 2-BatchNorm net (batch 512 by default)."""
  beautiful = "--model" in sys.argv and sys.argv[sys.argv.index("--model") + 1] == "beautiful"
  bs, n = int(os.getenv("BS", 512 if beautiful else 128)), int(os.getenv("STEPS", 20))
  ours, theirs = attograd_step(bs, beautiful), torch_step(bs, beautiful)
  for _ in range(3): ours(), theirs()   # compile, warm caches
  a, t = time_steps(ours, n), time_steps(theirs, n)
  print(f"mnist {'beautiful (4 conv, 2 batchnorm)' if beautiful else 'convnet'} training step, batch {bs}, median of {n}")
  print(f"  attograd {a:8.2f} ms\n  torch    {t:8.2f} ms\n  attograd/torch {a / t:.2f}x ({'faster' if a < t else 'slower'})")

if __name__ == "__main__": main()
