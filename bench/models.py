"""The models of attograd.models against the same models in torch eager float32, measured in one run, interleaved (so
the machine's noise hits both alike), both on THREADS threads (default 2):

  BERT  all-MiniLM-L6-v2 sentence embeddings (SentenceEncoder.encode vs sentence-transformers' encode, tokenizing
        included in both) on batches of 64 short sentences: sentences/s
  GPT   examples/gpt.py's default model (4 layers, 4 heads, d 128, context 64, batch 32), one training step (AdamW,
        LambdaLR, clipping; attograd under TinyJit) on the same batches: steps/s and tokens/s

  python bench/models.py              both;  MODELS=bert or MODELS=gpt for one;  REPS=n timed repetitions
Prints medians with the (min-max) range and the ratio attograd / torch. With THREADS=1 also the CPU time of the calling
thread (time.thread_time: both run their kernels there), which a loaded machine inflates far less than wall clock."""
from __future__ import annotations
import os, pathlib, random, statistics, sys, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
THREADS = int(os.getenv("THREADS", "2"))
os.environ.setdefault("THREADS", str(THREADS))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORDS = ("the a man woman child dog cat eats runs sees reads a book quickly slowly in park city house today music "
         "plays guitar river flows over stones bright morning light falls on quiet street").split()

def sentences(n: int, seed: int) -> list[str]:
  rng = random.Random(seed)
  return [" ".join(rng.choice(WORDS) for _ in range(rng.randrange(5, 13))).capitalize() + "." for _ in range(n)]

CPU: dict[str, list[float]] = {}  # thread_time of each timed call, by label (THREADS=1)

def timed(fn, label: str = "") -> float:
  st, cpu = time.perf_counter(), time.thread_time()
  fn()
  CPU.setdefault(label, []).append(time.thread_time() - cpu)
  return time.perf_counter() - st

def cpu_line(ours: str, theirs: str, per: str) -> str:
  if THREADS != 1: return ""
  a, t = statistics.median(CPU[ours]) * 1e3, statistics.median(CPU[theirs]) * 1e3
  return f"  one-thread CPU time (thread_time) per {per}: torch {t:.1f} ms, attograd {a:.1f} ms   {t / a:.2f}x torch"

def fmt(xs: list[float], unit: str) -> str: return f"{statistics.median(xs):9.1f} {unit}  ({min(xs):.1f}-{max(xs):.1f})"

def bench_bert(reps: int) -> None:
  import torch
  from attograd.models.bert import SentenceEncoder, default_model_path
  from sentence_transformers import SentenceTransformer
  torch.set_num_threads(THREADS)
  ours, theirs = SentenceEncoder.from_pretrained(), SentenceTransformer(str(default_model_path()), device="cpu")
  batches = [sentences(64, seed) for seed in range(reps + 2)]
  run_ours = lambda s: ours.encode(s, batch_size=64).numpy()
  def run_theirs(s):
    with torch.inference_mode(): return theirs.encode(s, batch_size=64, convert_to_numpy=True)
  for s in batches[:2]: run_ours(s); run_theirs(s)  # warm-up: compiles attograd's kernels for these shapes
  a, t = [], []
  for s in batches[2:]:
    a.append(64 / timed(lambda: run_ours(s), "bert ours"))
    t.append(64 / timed(lambda: run_theirs(s), "bert torch"))
  import numpy as np
  e1, e2 = run_ours(batches[-1]), run_theirs(batches[-1])
  cos = float((e1 * e2).sum(1).min())
  print(f"BERT all-MiniLM-L6-v2, batches of 64 short sentences (min cosine to torch {cos:.6f})")
  print(f"  torch eager float32  {fmt(t, 'sentences/s')}")
  print(f"  attograd             {fmt(a, 'sentences/s')}   {statistics.median(a) / statistics.median(t):.2f}x torch")
  if line := cpu_line("bert ours", "bert torch", "batch of 64"): print(line)

def gpt_trainers():
  """examples/gpt.py's default GPT (its arguments), trained by attograd and by torch from the same weights."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
  ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex)  # type: ignore[union-attr]
  from attograd.models.gpt import GPTConfig
  args = ex.get_args([])
  cfg = GPTConfig(vocab_size=84, block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
  ours = ex.AttogradTrainer(args, cfg)
  return args, ours, ex.TorchTrainer(args, cfg, ours.state())

def bench_gpt(reps: int) -> None:
  import torch
  torch.set_num_threads(THREADS)
  args, ours, theirs = gpt_trainers()
  rng = random.Random(0)
  def batch():
    return ([[rng.randrange(84) for _ in range(args.ctx)] for _ in range(args.batch)],) * 2
  for _ in range(3): ours.train_step(*batch()); theirs.train_step(*batch())  # warm-up; TinyJit captures on the 2nd call
  a, t = [], []
  for _ in range(reps):
    for _ in range(3):
      b = batch()
      a.append(1 / timed(lambda: ours.train_step(*b), "gpt ours"))
      t.append(1 / timed(lambda: theirs.train_step(*b), "gpt torch"))
  tok = args.batch * args.ctx
  print(f"GPT {args.layers} layers, {args.heads} heads, d {args.d}, context {args.ctx}, batch {args.batch}: training steps")
  print(f"  torch eager          {fmt(t, 'steps/s')}   {statistics.median(t) * tok:,.0f} tokens/s")
  print(f"  attograd TinyJit     {fmt(a, 'steps/s')}   {statistics.median(a) * tok:,.0f} tokens/s   "
        f"{statistics.median(a) / statistics.median(t):.2f}x torch")
  if line := cpu_line("gpt ours", "gpt torch", "step"): print(line)

def main() -> None:
  which, reps = os.getenv("MODELS", "bert,gpt").split(","), int(os.getenv("REPS", "10"))
  print(f"{THREADS} threads each; wall-clock under whatever else runs on this machine")
  if "bert" in which: bench_bert(reps)
  if "gpt" in which: bench_gpt(reps)

if __name__ == "__main__": main()
