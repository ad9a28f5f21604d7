"""VIZ's costs.

1. Rewriting: bench/rewrite.py's cleanup pass over a transformer block's kernels, timed with the recorder off and on,
   alternating in one process (the same graphs, caches on the nodes dropped before each run), best of N. VIZ off runs
   the engine's own loop (patterns.tracker is None); on, the recording copy of it (uop/trace.py).
2. With --browser: the trace of two MNIST training steps (bench/mnist_step.py's convnet, batch 64) served and opened in
   headless Chromium (Playwright, /usr/bin/chromium or $CHROMIUM): the time until the kernel list is in, and to open the
   pass with the most steps (its graph drawn), and to draw the timeline.

  python bench/viz.py [rounds] [--browser]"""
import json, os, sys, threading, time
from attograd import dtypes
from attograd.uop import trace
from attograd.uop.patterns import graph_rewrite
import attograd.schedule.schedule as sched
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rewrite import kernels_to_simplify

def rewriting(rounds: int) -> None:
  ks = kernels_to_simplify()
  raws = [sched._pushdown(value, shape, out_buf, dtypes.int32, cleanup=False)[0] for value, shape, out_buf in ks]
  def run() -> float:
    for raw in raws:
      for u in raw.toposort: u.__dict__.pop("_range", None); u.__dict__.pop("_fixed", None)
    st = time.perf_counter()
    outs = [graph_rewrite(raw, sched.kernel_cleanup, name="kernel_cleanup") for raw in raws]
    dt = time.perf_counter() - st
    for o in outs:
      for u in o.toposort: u.__dict__.pop("_range", None); u.__dict__.pop("_fixed", None)
    return dt
  off, on, steps = [], [], 0
  for _ in range(rounds):
    off.append(run())
    with trace.recording() as tr: on.append(run())
    steps = sum(len(p.steps) for p in tr.passes)
  print(f"cleanup of {len(raws)} kernels ({sum(len(r.toposort) for r in raws)} nodes, {steps} steps recorded), best of {rounds}:")
  print(f"VIZ off {min(off) * 1e3:.2f} ms, VIZ on {min(on) * 1e3:.2f} ms: {min(on) / min(off):.2f}x")

def browser() -> None:
  from playwright.sync_api import sync_playwright
  from attograd.uop.tracefile import to_json
  from attograd.viz.serve import make_server
  from mnist_step import attograd_step
  with trace.recording() as tr:
    step = attograd_step(64)
    for _ in range(2): step()
  data = json.loads(json.dumps(to_json(tr)))
  srv = make_server(data, 0)
  threading.Thread(target=srv.serve_forever, daemon=True).start()
  url = f"http://127.0.0.1:{srv.server_address[1]}/"
  big = max(range(len(data["passes"])), key=lambda i: len(data["passes"][i]["steps"]))
  flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"]
  with sync_playwright() as p:
    b = p.chromium.launch(executable_path=os.getenv("CHROMIUM", "/usr/bin/chromium"), args=flags)
    page = b.new_page(viewport={"width": 1400, "height": 850})
    st = time.perf_counter()
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    t_open = time.perf_counter() - st
    st = time.perf_counter()
    page.click(f".group-item[data-i='{data['passes'][big]['group']}'] > .label")
    page.click(f".pass-item[data-i='{big}'] > .label")
    page.wait_for_selector("#replay-check")
    page.wait_for_selector("#graph svg g.node")  # the worker's first layout, drawn
    t_pass = time.perf_counter() - st
    st = time.perf_counter()
    page.click("#tab-timeline")
    page.wait_for_selector("#tl-svg rect.launch")
    t_tl = time.perf_counter() - st
    b.close()
  srv.shutdown()
  print(f"MNIST training steps: {len(data['passes'])} passes, {len(data['nodes'])} nodes, {len(data['events'])} launches")
  print(f"page ready in {t_open:.2f} s (target < 2 s); the biggest pass ({data['passes'][big]['name']}, "
        f"{len(data['passes'][big]['steps'])} steps) drawn in {t_pass:.2f} s, the timeline ({len(data['passes'])} passes, "
        f"{len(data['events'])} launches, {len(data.get('memory', []))} memory samples) in {t_tl:.2f} s")

if __name__ == "__main__":
  args = [a for a in sys.argv[1:] if not a.startswith("--")]
  rewriting(int(args[0]) if args else 7)
  if "--browser" in sys.argv: browser()
