"""A/B of a training step in one process: the step captured twice by TinyJit, under two settings of module constants
(a schedule, heuristics or front-end rule's switch or threshold), then run alternately. One thread, CPU time (on a machine
shared with other work, the two see the same noise). Prints each step's time (median, range), and the sum over the
kernels of each one's least time over KROUNDS rounds with the plan run in order: each kernel finds the caches as the
kernels before it left them, as in a step. A kernel timed alone, again and again, finds its inputs in the caches: a
matmul tile measured 1.5x faster alone ran slower in the step (16 rows by one register for a d=64 model's x @ w.T).
  python bench/step_ab.py --model gpt --a attograd.codegen.heuristic.PACK_MIN_ROWS=128 --b attograd.codegen.heuristic.PACK_MIN_ROWS=64
  --model small|gpt|bert|large   bench/transformer.py's small and large models, examples/gpt.py's default GPT, BERT's encode
  N=10 KROUNDS=10 TOP=12   steps timed, rounds of the kernels, kernel names listed (by the larger of the two sums)
Values are Python literals. The disk caches are off for both builds: a program cached under the same AST and switches
would be the other setting's."""
from __future__ import annotations
import argparse, ast, collections, importlib, os, pathlib, random, statistics, sys, time
from typing import Any, Callable
os.environ.setdefault("THREADS", "1")
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples"), str(ROOT / "bench")]
N, KROUNDS, TOP = int(os.getenv("N", 10)), int(os.getenv("KROUNDS", 10)), int(os.getenv("TOP", 12))

def gpt() -> tuple[Callable[[], Any], Any]:
  from models import gpt_trainers
  args, ours, _ = gpt_trainers()
  rng = random.Random(0)
  batch = ([[rng.randrange(84) for _ in range(args.ctx)] for _ in range(args.batch)],) * 2
  return (lambda: ours.train_step(*batch)), ours._step

def small() -> tuple[Callable[[], Any], Any]:
  import transformer
  from attograd import Tensor
  cfg = transformer.CONFIGS["small"]
  step = transformer.attograd_step(cfg, jit=True)
  x, y = transformer.batches(cfg, 1)[0]
  return (lambda: step(Tensor(x), Tensor(y)).item()), step

def bert() -> tuple[Callable[[], Any], Any]:
  """bench/models.py's BERT case: all-MiniLM-L6-v2 embeddings of one batch of 64 short sentences (its TinyJit)."""
  from models import sentences
  from attograd.models.bert import SentenceEncoder
  enc, s = SentenceEncoder.from_pretrained(), sentences(64, 0)
  class Jit:  # the one TinyJit the batch's shape uses, made by the first call
    @property
    def replay(self): return next(iter(enc._jits.values())).replay
    @property
    def var_vals(self): return next(iter(enc._jits.values())).var_vals
  return (lambda: enc.encode(s, batch_size=64).numpy()), Jit()

def large() -> tuple[Callable[[], Any], Any]:
  """bench/transformer.py's large model (6 layers, d 384, context 256, batch 16): its training step."""
  import transformer
  from attograd import Tensor
  cfg = transformer.CONFIGS["large"]
  step = transformer.attograd_step(cfg, jit=True)
  x, y = transformer.batches(cfg, 1)[0]
  return (lambda: step(Tensor(x), Tensor(y)).item()), step

MODELS: dict[str, Callable[[], tuple[Callable[[], Any], Any]]] = {"gpt": gpt, "small": small, "bert": bert, "large": large}

def setting(text: str) -> tuple[Any, str, Any]:
  """'package.module.NAME=literal' -> (the module, NAME, the value)"""
  where, _, value = text.partition("=")
  mod, _, name = where.rpartition(".")
  m = importlib.import_module(mod)
  if not hasattr(m, name): raise SystemExit(f"{mod} has no {name}")
  return m, name, ast.literal_eval(value)

def build(model: str, settings: list[str]) -> tuple[Callable[[], Any], Any]:
  import attograd.schedule.schedule as sched
  from attograd.engine import realize
  sched.CACHELEVEL = realize.CACHELEVEL = 1
  for m, name, value in map(setting, settings): setattr(m, name, value)
  sched._schedule_cache.clear(); realize._kernel_cache.clear()
  step, jit = MODELS[model]()
  for _ in range(3): step()  # the capture is on the second call
  return step, jit

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", choices=sorted(MODELS), default="gpt")
  ap.add_argument("--a", nargs="*", default=[], help="settings of A (module.NAME=value)")
  ap.add_argument("--b", nargs="*", default=[], help="settings of B")
  args = ap.parse_args()
  (sa, ja), (sb, jb) = build(args.model, args.a), build(args.model, args.b)
  plans = [ja.replay.plan.items, jb.replay.plan.items]
  times: list[list[float]] = [[], []]
  for _ in range(N):
    for k, step in enumerate((sa, sb)):
      st = time.thread_time(); step(); times[k].append(time.thread_time() - st)
  least = [[float("inf")] * len(p) for p in plans]
  for _ in range(KROUNDS):
    for items, m, jit in zip(plans, least, (ja, jb)):
      for i, ei in enumerate(items):
        st = time.thread_time(); ei.runner(ei.raw, jit.var_vals); m[i] = min(m[i], time.thread_time() - st)
  by_name = [collections.Counter(), collections.Counter()]
  for k in range(2):
    for ei, t in zip(plans[k], least[k]): by_name[k][ei.runner.name] += t * 1e3
  for k, label in enumerate("AB"):
    t = times[k]
    print(f"{label} {' '.join((args.a, args.b)[k]) or '(as is)'}: {len(plans[k])} kernels, step {statistics.median(t) * 1e3:.1f} ms "
          f"({min(t) * 1e3:.1f}-{max(t) * 1e3:.1f}), kernels in order {sum(least[k]) * 1e3:.1f} ms")
  print(f"B/A: step {statistics.median(times[1]) / statistics.median(times[0]):.3f}, kernels in order {sum(least[1]) / sum(least[0]):.3f}")
  names = sorted(set(by_name[0]) | set(by_name[1]), key=lambda n: -max(by_name[0][n], by_name[1][n]))[:TOP]
  for n in names: print(f"  {by_name[0][n]:8.3f} {by_name[1][n]:8.3f}  {n}")

if __name__ == "__main__": main()
