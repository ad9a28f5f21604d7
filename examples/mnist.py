"""Train a small convnet on MNIST and report test accuracy.

  pip install -e '.[mnist]' && python examples/mnist.py

EPOCHS, BS (batch size) and LR can be set in the environment. DEBUG=2 shows every kernel."""
import os, time
import numpy as np
from tqdm import trange
from attograd import Tensor, TinyJit, nn, GlobalCounters
from attograd.nn import optim
from attograd.nn.datasets import mnist
from attograd.nn.state import get_parameters

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

def main() -> float:
  epochs, bs, lr = int(os.getenv("EPOCHS", 3)), int(os.getenv("BS", 128)), float(os.getenv("LR", 2e-3))
  X_train, Y_train, X_test, Y_test = mnist()
  x_train, y_train = X_train.numpy(), Y_train.numpy().astype(np.int64)
  x_test, y_test = X_test.numpy(), Y_test.numpy().astype(np.int64)
  Tensor.manual_seed(0)
  model = ConvNet()
  opt = optim.Adam(get_parameters(model), lr=lr)

  @TinyJit  # scheduled and compiled once; later steps only launch the recorded kernels
  def train_step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      loss.realize(*opt.schedule_step())   # the loss and every parameter update in one schedule
    return loss

  rng = np.random.default_rng(0)
  st = time.perf_counter()
  for epoch in range(epochs):
    opt.lr.assign(lr * 0.5 ** epoch)   # decay per epoch: lr is a Tensor, so no kernel is compiled again
    perm = rng.permutation(len(x_train))
    for i in (bar := trange(len(x_train) // bs, desc=f"epoch {epoch + 1}/{epochs}")):
      idx = perm[i * bs:(i + 1) * bs]
      loss = train_step(normalize(x_train[idx]), Tensor(y_train[idx]))
      if i % 20 == 0: bar.set_postfix(loss=f"{loss.item():.3f}")
  train_time = time.perf_counter() - st

  correct = 0
  for i in range(0, len(x_test), 1000):
    pred = model(normalize(x_test[i:i + 1000])).argmax(1)
    correct += int((pred == Tensor(y_test[i:i + 1000])).sum().item())
  acc = correct / len(x_test)
  print(f"trained {epochs} epochs in {train_time:.1f} s ({GlobalCounters.kernel_count} kernels run)")
  print(f"test accuracy: {acc:.4f}")
  return acc

if __name__ == "__main__": main()
