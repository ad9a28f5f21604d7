"""Where a GPT training step's time goes, kernel by kernel, next to torch's ops: examples/gpt.py's default model (4 layers,
4 heads, d 128, context 64, batch 32), one thread each, CPU time (time.thread_time: on a machine shared with other work,
wall-clock time measures the queue for the cores). attograd's kernels come from the TinyJit replay of the step, each run
alone REPS times (the minimum); torch's aten ops are timed the same way through a dispatch mode around a whole step.
  python bench/gpt_kernels.py          # REPS=5 MIN_MS=0.1 TOP=40 to change them"""
from __future__ import annotations
import importlib.util, os, pathlib, random, sys, time
os.environ.setdefault("THREADS", "1")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
REPS, MIN_MS, TOP = int(os.getenv("REPS", 5)), float(os.getenv("MIN_MS", 0.1)), int(os.getenv("TOP", 40))

def trainers():
  spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
  ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)  # type: ignore[union-attr]
  from attograd.models.gpt import GPTConfig
  args = ex.get_args([])
  cfg = GPTConfig(vocab_size=84, block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
  ours = ex.AttogradTrainer(args, cfg)
  rng = random.Random(0)
  batch = ([[rng.randrange(84) for _ in range(args.ctx)] for _ in range(args.batch)],) * 2
  return ours, ex.TorchTrainer(args, cfg, ours.state()), batch

def main() -> None:
  import torch
  from torch.utils._python_dispatch import TorchDispatchMode
  torch.set_num_threads(1)
  ours, theirs, batch = trainers()
  for _ in range(3): ours.train_step(*batch); theirs.train_step(*batch)
  acc: dict[tuple[str, tuple], list[float]] = {}
  class Timed(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
      st = time.thread_time(); out = func(*args, **(kwargs or {})); t = time.thread_time() - st
      shapes = tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor))[:3]
      acc.setdefault((str(func), shapes), []).append(t)
      return out
  per: dict[tuple[str, tuple], float] = {}
  for _ in range(REPS):
    acc.clear()
    with Timed(): theirs.train_step(*batch)
    for k, v in acc.items(): per[k] = min(per.get(k, float("inf")), sum(v) * 1e3)
  print(f"torch, one thread, ms per (op, shapes) over a step (min of {REPS}), total {sum(per.values()):.2f} ms:")
  for (op, shapes), ms in sorted(per.items(), key=lambda kv: -kv[1])[:TOP]:
    if ms >= MIN_MS: print(f"  {ms:8.3f}  {op:45s} {shapes}")
  rows = []
  for i, ei in enumerate(ours._step.replay.plan.items):
    best = float("inf")
    for _ in range(REPS):
      st = time.thread_time(); ei.runner(ei.raw, {}); best = min(best, time.thread_time() - st)
    rows.append((i, ei.runner.name, best * 1e3, ei.runner.ops, getattr(ei.runner, "opts", [])))
  print(f"attograd, one thread, ms per kernel (min of {REPS}), {len(rows)} kernels, total {sum(r[2] for r in rows):.2f} ms:")
  for i, name, ms, ops, opts in sorted(rows, key=lambda r: -r[2])[:TOP]:
    if ms >= MIN_MS: print(f"  {ms:8.3f} {i:3d} {name:36s} {ops / ms / 1e6:6.1f} GFLOPS  {opts}")
  wo, wt = float("inf"), float("inf")
  for _ in range(5):
    st = time.thread_time(); ours.train_step(*batch); wo = min(wo, time.thread_time() - st)
    st = time.thread_time(); theirs.train_step(*batch); wt = min(wt, time.thread_time() - st)
  print(f"whole step, one thread, CPU time: attograd {wo * 1e3:.1f} ms, torch {wt * 1e3:.1f} ms, torch/attograd {wt / wo:.2f}x")

if __name__ == "__main__": main()
