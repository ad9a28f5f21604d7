"""A small character transformer trained the way a PyTorch user writes it, running on attograd: only the import block
differs from the torch program (`BACKEND=torch` runs this same file on torch). It has the usual pieces: nn.Module
subclasses (attention written out with F.softmax and masked_fill, an MLP with F.gelu), a DataLoader over a
TensorDataset, AdamW with betas, CosineAnnealingLR, clip_grad_norm_, an EMA of the weights kept with in-place mul_/add_
under no_grad, and no_grad evaluation of both models.

The weights start from a numpy generator (copied in with copy_ under no_grad) and the batches come in order, so the two
frameworks see the same numbers: test/test_torch_program.py runs both and compares the loss of every step.

  python examples/pytorch_transformer.py                 # attograd
  BACKEND=torch python examples/pytorch_transformer.py   # the same program on torch
  STEPS=50 python examples/pytorch_transformer.py        # shorter (the test runs it this way)
"""
import math, os
import numpy as np

if os.getenv("BACKEND", "attograd") == "torch":
  import torch
  from torch import nn, no_grad, tensor
  import torch.nn.functional as F
  from torch.optim import AdamW
  from torch.optim.lr_scheduler import CosineAnnealingLR
  from torch.utils.data import TensorDataset, DataLoader
else:
  from attograd import Tensor as tensor, nn, no_grad
  import attograd.nn.functional as F
  from attograd.nn.optim import AdamW
  from attograd.nn.optim.lr_scheduler import CosineAnnealingLR
  from attograd.utils.data import TensorDataset, DataLoader

# ---- everything below is plain PyTorch ----
STEPS, BATCH, CONTEXT, WIDTH, HEADS, LAYERS = int(os.getenv("STEPS", "300")), 16, 32, 48, 4, 2
TEXT = ("the quick brown fox jumps over the lazy dog. a lazy dog sleeps in the sun while the fox runs home. "
        "every morning the fox comes back, and every morning the dog is still asleep. ") * 8

class Attention(nn.Module):
  def __init__(self):
    super().__init__()
    self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
    self.proj = nn.Linear(WIDTH, WIDTH)
    self.register_buffer("causal", tensor(np.tril(np.ones((CONTEXT, CONTEXT), dtype=np.float32))), persistent=False)
  def forward(self, x):
    B, T, C = x.shape
    q, k, v = self.qkv(x).split(C, dim=2)
    q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(C // HEADS))
    att = att.masked_fill(self.causal[:T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return self.proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

class Block(nn.Module):
  def __init__(self):
    super().__init__()
    self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
    self.attn = Attention()
    self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
  def forward(self, x):
    x = x + self.attn(self.ln1(x))
    return x + self.out(F.gelu(self.fc(self.ln2(x))))

class CharLM(nn.Module):
  def __init__(self, vocab: int):
    super().__init__()
    self.tok = nn.Embedding(vocab, WIDTH)
    self.pos = nn.Embedding(CONTEXT, WIDTH)
    self.blocks = nn.ModuleList([Block() for _ in range(LAYERS)])
    self.ln = nn.LayerNorm(WIDTH)
    self.head = nn.Linear(WIDTH, vocab, bias=False)
  def forward(self, idx, targets=None):
    T = idx.shape[1]
    x = self.tok(idx) + self.pos(tensor(np.arange(T)))
    for block in self.blocks: x = block(x)
    logits = self.head(self.ln(x))
    if targets is None: return logits
    return logits, F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))

@no_grad()
def init_weights(model: nn.Module, seed: int) -> None:
  """GPT-2's scheme (normal(0, 0.02) matrices, zero biases, unit LayerNorm gains), drawn from numpy."""
  rng = np.random.default_rng(seed)
  for name, p in model.named_parameters():
    if name.endswith("bias"): p.zero_()
    elif p.dim() == 1: p.fill_(1.0)
    else: p.copy_(tensor(rng.normal(0.0, 0.02, tuple(p.shape)).astype(np.float32)))

@no_grad()
def evaluate(model: nn.Module, x, y) -> tuple[float, float]:
  model.eval()
  logits, loss = model(x, y)
  acc = (logits.argmax(dim=-1) == y).float().mean()
  model.train()
  return loss.item(), acc.item()

def windows(ids: np.ndarray, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
  starts = np.random.default_rng(seed).integers(0, len(ids) - CONTEXT - 1, n)
  x = np.stack([ids[s:s + CONTEXT] for s in starts])
  return x.astype(np.int64), np.stack([ids[s + 1:s + CONTEXT + 1] for s in starts]).astype(np.int64)

def main() -> None:
  chars = sorted(set(TEXT))
  ids = np.array([chars.index(c) for c in TEXT])
  xtr, ytr = windows(ids, STEPS * BATCH, seed=1)
  xte, yte = windows(ids, 64, seed=2)
  loader = DataLoader(TensorDataset(tensor(xtr), tensor(ytr)), batch_size=BATCH, shuffle=False, drop_last=True)

  model, ema = CharLM(len(chars)), CharLM(len(chars))
  init_weights(model, seed=0)
  ema.load_state_dict(model.state_dict())
  for p in ema.parameters(): p.requires_grad_(False)
  decay = 0.9
  opt = AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), weight_decay=0.1)
  sched = CosineAnnealingLR(opt, T_max=len(loader), eta_min=3e-4)

  model.train()
  for step, (xb, yb) in enumerate(loader):
    _, loss = model(xb, yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    with no_grad():
      for e, p in zip(ema.parameters(), model.parameters()): e.mul_(decay).add_(p, alpha=1 - decay)
    print(f"step {step:4d}  loss {loss.item():.6f}  lr {sched.get_last_lr()[0]:.6f}")
  test_loss, test_acc = evaluate(model, tensor(xte), tensor(yte))
  ema_loss, ema_acc = evaluate(ema, tensor(xte), tensor(yte))
  print(f"test loss {test_loss:.6f}  acc {test_acc * 100:.2f}%  ema loss {ema_loss:.6f}  ema acc {ema_acc * 100:.2f}%")

if __name__ == "__main__":
  main()
