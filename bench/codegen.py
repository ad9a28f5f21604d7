"""Code generation cost per kernel (issue 14's target: lowering + compile of any kernel under 100 ms): every kernel of
the transformer of bench/transformer.py's training step, its Opts chosen, lowered and compiled alone in a fresh process
(nothing remembered from an earlier lowering, no disk cache), in CPU time (the machine's other work doesn't count):
the worst kernels, the totals, and how many are over the target.

  python bench/codegen.py               the small model (2 layers, d 64)
  MODEL=large python bench/codegen.py   6 layers, d 384 (slow: its first steps compile for a minute or more)
  TOP=n                                 kernels listed (10)

A compile here is one compiler process per kernel: its fixed cost (process, prelude, link; printed as `base`) is
shared by a batch of kernels in a real run (engine/compilequeue.py), so `compile - base` is a kernel's own share."""
from __future__ import annotations
import json, os, subprocess, sys, tempfile, time

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_MS = 100

def _capture(model: str, path: str) -> None:
  """Run two jitted training steps and write every kernel AST they compiled to path (uop/serialize.py's format)."""
  sys.path.insert(0, HERE)
  import transformer as t
  from attograd import Tensor
  from attograd.engine import realize
  from attograd.uop.serialize import graph_data
  cfg = t.CONFIGS[model]
  step = t.attograd_step(cfg, jit=True)
  for x, y in t.batches(cfg, 3): step(Tensor(x), Tensor(y)).item()
  asts = list(dict.fromkeys(ast for ast, *_ in realize._kernel_cache))
  with open(path, "w") as f: json.dump(graph_data(asts), f)

def _measure(path: str) -> None:
  """Choose, lower and compile each kernel of path alone: one JSON line of (name, heuristics ms, lower ms, compile ms, uops)."""
  from attograd.helpers import Context, gc_paused
  from attograd.uop.serialize import graph_from_data
  from attograd.codegen import to_program
  from attograd.engine.realize import choose_opts
  from attograd.runtime.device import Device
  from attograd.runtime.cc import compiler_cpu
  with open(path) as f: asts = graph_from_data(json.load(f))
  dev = Device["CPU"]
  def compile_ms(src: str) -> float:
    st = compiler_cpu()
    with Context(CACHELEVEL=0): dev.compiler.compile(src)
    return (compiler_cpu() - st) * 1e3
  base = min(compile_ms(dev.compiler.prelude + f"void k{i}(float* restrict a) {{ a[0] = {i}.0f; }}\n") for i in range(3))
  rows = []
  for ast in asts:
    # the cycle collector paused as a real run pauses it (engine/realize.py: lowering is a burst of allocation, and a
    # collection then walks every graph alive): left on here, it doubled the worst kernel's lowering (46 vs 25 ms)
    with gc_paused():
      st = time.thread_time()
      opts = choose_opts(ast, "CPU")
      mid = time.thread_time()
      name, src, uops = to_program(ast, dev.renderer, opts)
      rows.append([name, (mid - st) * 1e3, (time.thread_time() - mid) * 1e3, compile_ms(src), len(uops)])
  print(json.dumps({"base": base, "rows": rows}))

def main() -> None:
  model, top = os.getenv("MODEL", "small"), int(os.getenv("TOP", 10))
  with tempfile.TemporaryDirectory() as tmp:
    path, env = os.path.join(tmp, "asts.json"), {**os.environ, "PROGRESS": "0"}
    run = lambda code, cache: subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {HERE!r}); import codegen; {code}"],
                                             capture_output=True, text=True, check=True, env={**env, "ATTOGRAD_CACHE": os.path.join(tmp, cache)})
    run(f"codegen._capture({model!r}, {path!r})", "capture")
    out = json.loads(run(f"codegen._measure({path!r})", "measure").stdout.splitlines()[-1])
  rows, base = out["rows"], out["base"]
  rows.sort(key=lambda r: -(r[2] + r[3]))
  total = lambda i: sum(r[i] for r in rows)
  print(f"codegen of the '{model}' transformer's {len(rows)} kernels (CPU ms, one process per compile: base {base:.0f} ms of it)")
  print(f"  totals: heuristics {total(1):.0f}  lowering {total(2):.0f}  compile {total(3):.0f} ({total(3) - base * len(rows):.0f} without base)")
  worst = rows[0]
  print(f"  worst lower+compile: {worst[0]} {worst[2]:.0f} + {worst[3]:.0f} ms = {worst[2] + worst[3]:.0f} ms "
        f"({worst[2] + worst[3] - base:.0f} without base; target {TARGET_MS}); "
        f"{sum(r[2] + r[3] - base > TARGET_MS for r in rows)} kernels over it")
  print(f"  {'kernel':34s} {'heur':>6s} {'lower':>6s} {'compile':>8s} {'uops':>6s}")
  for name, heur, lower, comp, n in rows[:top]: print(f"  {name:34s} {heur:6.1f} {lower:6.1f} {comp:8.1f} {n:6d}")

if __name__ == "__main__": main()
