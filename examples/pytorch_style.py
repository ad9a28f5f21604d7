"""A PyTorch program, as a PyTorch user writes it, running on attograd. Only the import block differs: run it with
BACKEND=torch to see the same file train on torch. It trains a small classifier of 2-D points (three interleaved
spirals) with the usual pieces: an nn.Module subclass, F.*, a DataLoader over a TensorDataset (shuffled with a seeded
generator), AdamW with betas, a warmup + cosine schedule, gradient clipping, an EMA of the weights kept with in-place
mul_/add_ under no_grad, and a no_grad evaluation that reads torch's (values, indices) from max(dim=1).

  python examples/pytorch_style.py                 # attograd
  BACKEND=torch python examples/pytorch_style.py   # the same program on torch
  EPOCHS=2 python examples/pytorch_style.py        # shorter (the test runs it this way)
"""
import math, os
import numpy as np

if os.getenv("BACKEND", "attograd") == "torch":
  import torch
  from torch import nn, no_grad, tensor, Generator
  import torch.nn.functional as F
  from torch.optim import AdamW
  from torch.optim.lr_scheduler import LinearLR, CosineAnnealingLR, SequentialLR
  from torch.utils.data import TensorDataset, DataLoader
  manual_seed = torch.manual_seed
else:
  from attograd import Tensor as tensor, nn, no_grad
  import attograd.nn.functional as F
  from attograd.nn.optim import AdamW
  from attograd.nn.optim.lr_scheduler import LinearLR, CosineAnnealingLR, SequentialLR
  from attograd.utils.data import TensorDataset, DataLoader, Generator
  manual_seed = tensor.manual_seed

# ---- everything below is plain PyTorch ----
EPOCHS, BATCH, CLASSES, WIDTH = int(os.getenv("EPOCHS", "12")), 64, 3, 64

def spirals(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(seed)
  y = rng.integers(0, CLASSES, n)
  r = rng.random(n)
  theta = 3.5 * r + 2 * math.pi * y / CLASSES + rng.normal(0, 0.12, n)
  x = np.stack([r * np.cos(theta), r * np.sin(theta)], 1) * 2
  return x.astype(np.float32), y.astype(np.int64)

class Net(nn.Module):
  def __init__(self, width: int = WIDTH):
    super().__init__()
    self.inp = nn.Linear(2, width)
    self.blocks = nn.ModuleList([nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(2)])
    self.drop = nn.Dropout(0.1)
    self.out = nn.Linear(width, CLASSES)
  def forward(self, x):
    h = F.relu(self.inp(x))
    for block in self.blocks: h = h + block(h)
    return self.out(self.drop(h))

@no_grad()
def evaluate(model, x, y) -> tuple[float, float]:
  model.eval()
  logits = model(x)
  conf, pred = F.softmax(logits, dim=1).max(dim=1)  # torch's (values, indices)
  model.train()
  return (pred == y).float().mean().item(), conf.mean().item()

def main() -> None:
  manual_seed(0)
  xtr, ytr = spirals(1536, seed=1)
  xte, yte = spirals(512, seed=2)
  loader = DataLoader(TensorDataset(tensor(xtr), tensor(ytr)), batch_size=BATCH, shuffle=True, drop_last=True, generator=Generator().manual_seed(0))

  model, ema = Net(), Net()
  ema.load_state_dict(model.state_dict())
  for p in ema.parameters(): p.requires_grad_(False)
  opt = AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.99), weight_decay=1e-4)
  steps = EPOCHS * len(loader)
  warm = max(1, steps // 10)
  sched = SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=warm), CosineAnnealingLR(opt, T_max=steps - warm)], milestones=[warm])
  decay = 0.9

  model.train()
  for epoch in range(EPOCHS):
    total, n = 0.0, 0
    for xb, yb in loader:
      opt.zero_grad(set_to_none=True)
      loss = F.cross_entropy(model(xb), yb)
      loss.backward()
      nn.utils.clip_grad_norm_(model.parameters(), 1.0)
      opt.step()
      sched.step()
      with no_grad():
        for e, p in zip(ema.parameters(), model.parameters()): e.mul_(decay).add_(p, alpha=1 - decay)
      total, n = total + loss.item(), n + 1
    acc, conf = evaluate(model, tensor(xte), tensor(yte))
    ema_acc, _ = evaluate(ema, tensor(xte), tensor(yte))
    print(f"epoch {epoch + 1:2d}  loss {total / n:.4f}  lr {sched.get_last_lr()[0]:.5f}  test acc {acc * 100:.1f}%  "
          f"(confidence {conf:.2f})  ema acc {ema_acc * 100:.1f}%")

if __name__ == "__main__":
  main()
