"""Where a training step's time goes, kernel by kernel, next to torch's ops, one thread each, CPU time (time.thread_time:
on a machine shared with other work, wall-clock time measures the queue for the cores). attograd's kernels come from
the TinyJit replay of the step, each run alone REPS times (the minimum); torch's aten ops are timed the same way through
a dispatch mode around a whole step. Compare each big kernel with torch's op of the same shapes.
  python bench/step_kernels.py                  # examples/beautiful_mnist.py's model, batch 512 (BS=n)
  python bench/step_kernels.py --model gpt      # examples/gpt.py's default GPT (4 layers, 4 heads, d 128, context 64, batch 32)
  python bench/step_kernels.py --model bert     # all-MiniLM-L6-v2 sentence embeddings of 64 short sentences (bench/models.py's)
  python bench/step_kernels.py --model large    # bench/transformer.py's large model (6 layers, d 384, 6 heads, context 256, batch 16)
  REPS=5 MIN_MS=0.5 TOP=40                      # runs per timing, the smallest time listed, rows listed"""
from __future__ import annotations
import argparse, os, pathlib, random, sys, time
from typing import Callable
os.environ.setdefault("THREADS", "1")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "bench")]
REPS, MIN_MS, TOP = int(os.getenv("REPS", 5)), float(os.getenv("MIN_MS", 0.5)), int(os.getenv("TOP", 40))

# each model: () -> (attograd's step, its TinyJit, torch's step), both steps called with no arguments

def beautiful():
  from beautiful_mnist import Net
  from mnist_step import torch_step
  from attograd import Tensor, TinyJit
  from attograd.nn import optim
  from attograd.nn.state import get_parameters
  bs = int(os.getenv("BS", 512))
  Tensor.manual_seed(0)
  model = Net()
  opt = optim.Adam(get_parameters(model), lr=1e-3)
  x, y = Tensor.randn(bs, 1, 28, 28).realize(), Tensor.randint(bs, high=10).realize()
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
      opt.zero_grad()
      loss = model(x).cross_entropy(y).backward()
      return loss.realize(*opt.schedule_step())
  return (lambda: step(x, y)), step, torch_step(bs, True)

def gpt():
  from models import gpt_trainers
  args, ours, theirs = gpt_trainers()
  rng = random.Random(0)
  batch = ([[rng.randrange(84) for _ in range(args.ctx)] for _ in range(args.batch)],) * 2
  return (lambda: ours.train_step(*batch)), ours._step, (lambda: theirs.train_step(*batch))

def bert():
  """bench/models.py's BERT case: SentenceEncoder.encode of one batch of 64 short sentences (its TinyJit replayed)."""
  from models import sentences
  from attograd.models.bert import SentenceEncoder, default_model_path
  from sentence_transformers import SentenceTransformer
  import torch
  ours, theirs, s = SentenceEncoder.from_pretrained(), SentenceTransformer(str(default_model_path()), device="cpu"), sentences(64, 0)
  def run_theirs():
    with torch.inference_mode(): return theirs.encode(s, batch_size=64, convert_to_numpy=True)
  class Jits:  # the one TinyJit the batch's shape uses, looked up after the warm-up calls made it
    @property
    def replay(self): return next(iter(ours._jits.values())).replay
    @property
    def var_vals(self): return next(iter(ours._jits.values())).var_vals
  return (lambda: ours.encode(s, batch_size=64).numpy()), Jits(), run_theirs

def large():
  """bench/transformer.py's large model: its TinyJit'd training step (AdamW, clipping) on one batch."""
  import transformer
  from attograd import Tensor
  cfg = transformer.CONFIGS["large"]
  x, y = transformer.batches(cfg, 1)[0]
  ours, theirs = transformer.attograd_step(cfg, jit=True), transformer.torch_step(cfg)
  import torch
  xa, ya, xt, yt = Tensor(x), Tensor(y), torch.tensor(x), torch.tensor(y)
  return (lambda: ours(xa, ya)), ours, (lambda: theirs(xt, yt))

MODELS: dict[str, Callable] = {"beautiful": beautiful, "gpt": gpt, "bert": bert, "large": large}

def best_of(fn: Callable[[], object], reps: int) -> float:
  """The least CPU time of reps calls, in ms."""
  best = float("inf")
  for _ in range(reps):
    st = time.thread_time(); fn(); best = min(best, time.thread_time() - st)
  return best * 1e3

def aten_ms(step: Callable[[], object]) -> dict[tuple[str, tuple], float]:
  """torch's ms per (aten op, input shapes) over one step (the least of REPS steps)."""
  import torch
  from torch.utils._python_dispatch import TorchDispatchMode
  acc: dict[tuple[str, tuple], list[float]] = {}
  class Timed(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
      st = time.thread_time(); out = func(*args, **(kwargs or {})); t = time.thread_time() - st
      acc.setdefault((str(func), tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))[:3]), []).append(t)
      return out
  per: dict[tuple[str, tuple], float] = {}
  for _ in range(REPS):
    acc.clear()
    with Timed(): step()
    for k, v in acc.items(): per[k] = min(per.get(k, float("inf")), sum(v) * 1e3)
  return per

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", choices=sorted(MODELS), default="beautiful")
  import torch
  torch.set_num_threads(1)
  ours, jit, theirs = MODELS[ap.parse_args().model]()
  for _ in range(3): ours(); theirs()
  per = aten_ms(theirs)
  print(f"torch, one thread, ms per (op, shapes) over a step (min of {REPS}), total {sum(per.values()):.2f} ms:")
  for (op, shapes), ms in sorted(per.items(), key=lambda kv: -kv[1])[:TOP]:
    if ms >= MIN_MS: print(f"  {ms:8.3f}  {op:45s} {shapes}")
  items = jit.replay.plan.items
  rows = [(i, ei.runner.name, best_of(lambda: ei.runner(ei.raw, jit.var_vals), REPS), ei.runner.ops, getattr(ei.runner, "opts", []))
          for i, ei in enumerate(items)]
  print(f"attograd, one thread, ms per kernel (min of {REPS}), {len(rows)} kernels, total {sum(r[2] for r in rows):.2f} ms:")
  for i, name, ms, ops, opts in sorted(rows, key=lambda r: -r[2])[:TOP]:
    if ms >= MIN_MS: print(f"  {ms:8.3f} {i:3d} {name:36s} {ops / ms / 1e6:6.1f} GFLOPS  {opts}")
  wo, wt = best_of(ours, 5), best_of(theirs, 5)
  print(f"whole step, one thread, CPU time: attograd {wo:.1f} ms, torch {wt:.1f} ms, attograd/torch {wo / wt:.2f}x")

if __name__ == "__main__": main()
