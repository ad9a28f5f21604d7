"""The Python around each decoded token: one-thread CPU time (thread_time) of a greedy decode loop minus the time inside
the native kernel runs (threadpool.Steps), per token. Two loops: Engine._generate (sampling, utf-8, stop scan) and the
bare _greedy loop bench/llm.py times (the argmax on the device). NOKERN=1 skips the kernels (the same Python with warm caches: the gap to
the real run is the cache misses of Python after the kernels streamed the weights).

  THREADS=1 python bench/decode_python.py           # N=200 tokens, R=5 rounds; PROFILE=1 adds a cProfile of one loop"""
import os, sys, time, statistics
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from attograd.llm.generate import Engine, Sampling
from attograd.runtime import threadpool

N, R = int(os.getenv("N", 200)), int(os.getenv("R", 5))
inside = [0.0]
run_steps = threadpool.Steps.__call__
def timed_steps(self, table, cores) -> None:
  t0 = time.thread_time(); run_steps(self, table, cores); inside[0] += time.thread_time() - t0
threadpool.Steps.__call__ = timed_steps

engine = Engine()
engine.tok.stop_ids = set()  # every loop decodes N tokens
ids = engine.tok.encode("Once upon a time")
def generate() -> None:
  for _ in engine._generate(list(ids), Sampling(max_new_tokens=N)): pass
def greedy_loop() -> None:
  toks = list(ids); engine.cached = []; engine._logits(toks)
  for _ in range(N): toks.append(engine._greedy(toks))
for f in (generate, generate, greedy_loop): f()  # compile, capture
if os.getenv("NOKERN"): run_steps = lambda self, table, cores: None
res: dict[str, list[float]] = {"generate": [], "_greedy loop": []}
for _ in range(R):
  for name, f in (("generate", generate), ("_greedy loop", greedy_loop)):
    inside[0] = 0.0; t0 = time.thread_time(); f(); res[name].append((time.thread_time() - t0 - inside[0]) / N * 1e3)
for name, v in res.items(): print(f"{name:13s} Python ms a token outside the kernels: median {statistics.median(v):.3f} (min {min(v):.3f}, max {max(v):.3f})")
if os.getenv("PROFILE"):
  import cProfile, pstats
  pr = cProfile.Profile(); pr.enable(); generate(); pr.disable()
  pstats.Stats(pr).sort_stats("tottime").print_stats(25)
