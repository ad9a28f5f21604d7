"""GPT quality against torch: examples/gpt.py's model trained in attograd and in torch eager float32 from the same
starting weights, on the same batches (a function of seed and step), with the same AdamW, warmup + cosine schedule and
clipping, steps interleaved in one process; then both validation losses on the same validation batches and their
difference (the issue's bar: within 0.05 nats/char after the default 2,000 steps).

  python bench/gpt_quality.py                 the example's defaults: 4 layers, 4 heads, d 128, context 64, batch 32, 2000 steps
  STEPS=300 python bench/gpt_quality.py       fewer steps (the schedule spans them);  EVERY=n prints progress every n steps
  any examples/gpt.py option after the script name is passed on: python bench/gpt_quality.py --seed 1

Prints both sides' training loss every EVERY steps and the validation losses at the end (with the time each side took:
wall clock, so only a rough speed comparison on a shared machine; bench/models.py measures speed)."""
from __future__ import annotations
import importlib.util, json, os, pathlib, sys, time
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

def load_example():
  spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
  ex = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(ex)  # type: ignore[union-attr]
  return ex

def main(argv: list[str] | None = None) -> dict:
  ex = load_example()
  extra = sys.argv[1:] if argv is None else argv
  steps, every = os.getenv("STEPS"), int(os.getenv("EVERY", "250"))
  args = ex.get_args([*(["--steps", steps] if steps else []), *extra])
  import torch
  torch.manual_seed(args.seed)
  data = ex.CharData(ex.shakespeare_plays(args.data), args.ctx, args.batch, args.seed)
  cfg = ex.GPTConfig(vocab_size=len(data.chars), block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
  ours = ex.AttogradTrainer(args, cfg)
  theirs = ex.TorchTrainer(args, cfg, ours.state())  # torch starts from attograd's initial weights
  print(f"{args.steps} steps of {cfg} (batch {args.batch}, seed {args.seed}); torch {torch.__version__} eager float32, "
        f"{torch.get_num_threads()} threads", flush=True)
  secs = {"attograd": 0.0, "torch": 0.0}
  for step in range(args.steps):
    x, y = data.train_batch(step)
    st = time.perf_counter(); a = ours.train_step(x, y); secs["attograd"] += time.perf_counter() - st
    st = time.perf_counter(); t = theirs.train_step(x, y); secs["torch"] += time.perf_counter() - st
    if (step + 1) % every == 0 or step + 1 == args.steps:
      print(f"step {step + 1:5d}  train loss attograd {a:.4f}  torch {t:.4f}  ({secs['attograd']:.0f} s, {secs['torch']:.0f} s)", flush=True)
  val = data.val_batches(args.eval_batches)
  result = {"steps": args.steps, "seed": args.seed, "val_attograd": ours.val_loss(val), "val_torch": theirs.val_loss(val),
            "seconds_attograd": secs["attograd"], "seconds_torch": secs["torch"]}
  result["difference"] = result["val_attograd"] - result["val_torch"]
  print(f"validation loss ({args.eval_batches} batches of {args.batch} x {args.ctx} characters):  attograd {result['val_attograd']:.4f}  "
        f"torch {result['val_torch']:.4f}  difference {result['difference']:+.4f} nats/char")
  print(json.dumps(result))
  return result

if __name__ == "__main__": main()
