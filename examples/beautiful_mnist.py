"""MNIST the way a tinygrad program is written: the model is a list of callables (layers and Tensor methods), Adam
over nn.state.get_parameters (which includes BatchNorm's int counter: the optimizer skips it), a TinyJit training
step decorated with @Tensor.train(), a trange progress bar, accuracy as (pred == Y).mean().

  python examples/beautiful_mnist.py            # 70 steps of batch 512 (about 98% test accuracy)
  STEPS=3 BS=64 TEST_SIZE=512 python examples/beautiful_mnist.py   # what CI runs

Environment: STEPS, BS (batch size), LR, EVAL_EVERY (steps between test evaluations), TEST_SIZE (test images used),
TARGET (exit with an error when the final accuracy is below it)."""
from attograd import Tensor, TinyJit, nn, GlobalCounters
from attograd.helpers import getenv, colored, trange
from attograd.nn.datasets import mnist

def conv_block(cin: int, cout: int, k: int) -> list:
  """Two convolutions with relus, a batch norm and a 2x2 max pool."""
  return [nn.Conv2d(cin, cout, k), Tensor.relu, nn.Conv2d(cout, cout, k), Tensor.relu, nn.BatchNorm(cout), Tensor.max_pool2d]

class Net:
  def __init__(self):
    # 28x28 -> 5x5 convs -> 20x20 -> pool 10x10 -> 3x3 convs -> 6x6 -> pool 3x3, 64 channels
    self.layers = [*conv_block(1, 32, 5), *conv_block(32, 64, 3), lambda x: x.flatten(1), nn.Linear(64 * 3 * 3, 10)]
  def __call__(self, x: Tensor) -> Tensor: return x.sequential(self.layers)

def main() -> float:
  steps, bs, lr = getenv("STEPS", 70), getenv("BS", 512), getenv("LR", 1e-3)
  eval_every, test_size = getenv("EVAL_EVERY", 10), getenv("TEST_SIZE", 10000)
  X_train, Y_train, X_test, Y_test = mnist()
  X_test, Y_test = X_test[:test_size].realize(), Y_test[:test_size].realize()

  Tensor.manual_seed(0)
  model = Net()
  opt = nn.optim.Adam(nn.state.get_parameters(model), lr=lr)

  @TinyJit
  @Tensor.train()
  def train_step() -> Tensor:
    opt.zero_grad()
    samples = Tensor.randint(bs, high=X_train.shape[0])  # drawn on the device: the batch is a gather inside the step
    loss = model(X_train[samples]).sparse_categorical_crossentropy(Y_train[samples]).backward()
    return loss.realize(*opt.schedule_step())

  @TinyJit
  def test_accuracy() -> Tensor: return (model(X_test).argmax(axis=1) == Y_test).mean() * 100

  acc = float("nan")
  for i in (t := trange(steps)):
    GlobalCounters.reset()
    loss = train_step()
    if i % eval_every == eval_every - 1 or i == steps - 1: acc = test_accuracy().item()
    t.set_description(f"loss: {loss.item():6.2f} test_accuracy: {acc:5.2f}%")

  if (target := getenv("TARGET", 0.0)) and acc < target: raise SystemExit(colored(f"test accuracy {acc:.2f}% is below the target {target}%", "red"))
  print(f"test accuracy after {steps} steps: {acc:.2f}%")
  return acc

if __name__ == "__main__": main()
