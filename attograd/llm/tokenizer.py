"""A tokenizer from a GGUF file's metadata (tokenizer.ggml.*), and the model's chat template (tokenizer.chat_template)
rendered with jinja2.

Byte-level BPE vocabularies (tokenizer.ggml.model "gpt2") are supported with the pre-tokenizer presets below,
keyed by tokenizer.ggml.pre as llama.cpp names them; SentencePiece-style ones ("llama": pieces with scores, spaces
as ▁, bytes outside the vocabulary as <0xNN> tokens) as a BPE whose merges are ranked by the merged piece's score.
Control and user-defined tokens are special: matched whole in the text, as llama.cpp does with special=True.

The BPE runs here, over the vocabulary kept as one buffer of its UTF-8 bytes and the merges as two sorted arrays (1.3 MiB
for SmolLM2's 49k tokens and 49k merges); it gives the ids of the `tokenizers` package's BPE (the same merge order:
the lowest-ranked adjacent pair first, the leftmost of equal ones). Built by `tokenizers`, the same vocabulary held
15.5 MiB of the process while generating: its library (6.7 MiB of pages with libstdc++) and its Rust BPE (8.4 MiB: the
vocabulary twice as hash maps, the merges as a third). The pre-tokenizer regexes run on the standard library's `re`,
with \\p{L} and \\p{N} spelled out as ranges from `unicodedata` and \\s as Unicode's White_Space (see `stdlib_regex`): a
letter that Python's Unicode tables and Oniguruma's in `tokenizers` disagree on (one added in a newer version) splits
differently."""
from __future__ import annotations
import array, bisect, functools, heapq, itertools, re, unicodedata
from typing import Any, Iterator, Sequence

# llama.cpp's pre-tokenizer regexes, by tokenizer.ggml.pre
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# preset -> (split each digit apart first, the regex whose matches are the pieces)
PRE_TOKENIZERS: dict[str, tuple[bool, str]] = {
  "default": (False, _GPT2), "gpt2": (False, _GPT2), "smollm": (True, _GPT2),
  "llama-bpe": (False, _LLAMA3), "llama3": (False, _LLAMA3), "qwen2": (False, _QWEN2),
}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # tokenizer.ggml.token_type values
SPACE = "\u2581"  # ▁, SentencePiece's space

def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
  """SentencePiece's BPE joins, at each step, the adjacent pair of pieces whose join is the vocabulary piece of highest
  score (leftmost on a tie). As BPE merges: every split of a normal piece into two normal pieces, ranked by the
  joined piece's score (then by its id)."""
  normal = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
  ranked = [(-scores[i], i, normal[t[:k]], (t[:k], t[k:])) for t, i in normal.items() for k in range(1, len(t)) if t[:k] in normal and t[k:] in normal]
  return [m[3] for m in sorted(ranked)]

class _Vocab:
  """Token strings by id as one buffer of their UTF-8 bytes (49k Python strings were ~3.4 MiB, this is under 1 MiB), and,
  when encoding needs it, the id of a string by binary search over the ids in the strings' order (a string that several
  ids spell: the last of them, as a dict built in id order has it)."""
  def __init__(self, blob: bytes, ends: bytes, order: bytes | None):
    self.blob, self.ends = blob, _array("I", ends)
    self.order = None if order is None else _array("I", order)
  def bytes_of(self, i: int) -> bytes: return self.blob[self.ends[i]:self.ends[i + 1]]
  def id_of(self, b: bytes) -> int | None:
    assert self.order is not None, "built without lookups"
    j = bisect.bisect_left(self.order, b, key=self.bytes_of)
    return self.order[j] if j < len(self.order) and self.bytes_of(self.order[j]) == b else None

class _Merges:
  """BPE merges: (left id, right id) -> (rank, merged id), as two sorted arrays (a dict of 49k pairs was ~6 MiB)."""
  def __init__(self, keys: bytes, vals: bytes): self.keys, self.vals = _array("Q", keys), _array("Q", vals)
  def get(self, a: int, b: int) -> tuple[int, int] | None:
    k = a << 32 | b
    j = bisect.bisect_left(self.keys, k)
    if j == len(self.keys) or self.keys[j] != k: return None
    v = self.vals[j]
    return v >> 32, v & 0xFFFFFFFF

def _array(code: str, b: bytes) -> array.array:
  a = array.array(code); a.frombytes(b); return a

def _tables(kind: str, tokens: Sequence[str], types: Sequence[int], meta: dict[str, Any], special: list[int], names: list[str],
            lookups: bool, path: str) -> tuple[bytes, bytes, bytes | None, bytes, bytes, bytes]:
  """A vocabulary's tables as buffers, made from its strings and a dict of them (~6 MiB for 49k, all freed here): the
  pieces' UTF-8 bytes, where each ends, the ids in the pieces' order (if encoding looks pieces up), the merges' keys
  (left id << 32 | right id) sorted and their values (rank << 32 | merged id), and the ids (-1: none) of the special
  tokens and of the names asked for."""
  strs = list(tokens)
  ids = {t: i for i, t in enumerate(strs)}  # a string several ids spell: the last, as tokenizers' BPE has it
  if kind == "llama": pairs: Iterator[tuple[str, str]] | list[tuple[str, str]] = spm_merges(strs, meta["tokenizer.ggml.scores"], types)
  else: pairs = ((a, b) for a, _, b in map(str.partition, meta.get("tokenizer.ggml.merges", []), itertools.repeat(" ")))
  try: table = {ids[a] << 32 | ids[b]: r << 32 | ids[a + b] for r, (a, b) in enumerate(pairs)}  # a pair listed twice: the later rank
  except KeyError as e: raise ValueError(f"{path}: a merge's piece {e.args[0]!r} is not in the vocabulary") from None
  keys = array.array("Q", sorted(table))
  vals = array.array("Q", map(table.__getitem__, keys))
  ends = array.array("I", itertools.accumulate((len(t.encode()) for t in strs), initial=0))
  order = array.array("I", map(ids.__getitem__, sorted(ids))).tobytes() if lookups else None  # code point order is UTF-8's
  found = array.array("q", (ids.get(t, -1) for t in itertools.chain((strs[i] for i in special), names)))
  return "".join(strs).encode(), ends.tobytes(), order, keys.tobytes(), vals.tobytes(), found.tobytes()

def merge(ids: list[int], merges: _Merges) -> list[int]:
  """BPE on one word's symbols: the adjacent pair of lowest rank merges first, the leftmost of equal ranks (tokenizers'
  order: a heap of candidate pairs, each checked still current when taken)."""
  n = len(ids)
  if n < 2: return ids
  ids, prev, nxt = list(ids), list(range(-1, n - 1)), list(range(1, n + 1))
  heap = [(m[0], i, m[1]) for i in range(n - 1) if (m := merges.get(ids[i], ids[i + 1])) is not None]
  heapq.heapify(heap)
  while heap:
    _, i, new = heapq.heappop(heap)
    j = nxt[i]
    if ids[i] < 0 or j >= n: continue
    m = merges.get(ids[i], ids[j])
    if m is None or m[1] != new: continue  # a pair merged away since it was queued
    ids[i], ids[j] = new, -1
    nxt[i] = nxt[j]
    if nxt[i] < n: prev[nxt[i]] = i
    if prev[i] >= 0 and (m := merges.get(ids[prev[i]], new)) is not None: heapq.heappush(heap, (m[0], prev[i], m[1]))
    if nxt[i] < n and (m := merges.get(new, ids[nxt[i]])) is not None: heapq.heappush(heap, (m[0], i, m[1]))
  return [t for t in ids if t >= 0]

class GGUFTokenizer:
  def __init__(self, meta: dict[str, Any], path: str = "<gguf>"):
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
      raise NotImplementedError(f"{path}: tokenizer.ggml.model {kind!r}: supported are byte-level BPE ('gpt2') and SentencePiece-style ('llama') vocabularies")
    if "tokenizer.ggml.tokens" not in meta: raise ValueError(f"{path}: metadata tokenizer.ggml.tokens is missing")
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    self.kind, self.n_tokens = kind, len(tokens)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind == "llama":
      scores = meta.get("tokenizer.ggml.scores")
      if scores is None or len(scores) != len(tokens): raise ValueError(f"{path}: a 'llama' vocabulary needs tokenizer.ggml.scores, one per token")
    elif pre not in PRE_TOKENIZERS: raise NotImplementedError(f"{path}: tokenizer.ggml.pre {pre!r}; known presets: {', '.join(PRE_TOKENIZERS)}")
    # a SentencePiece word's characters, and llama3's whole words, are looked up in the vocabulary while encoding
    self._whole_words = kind == "gpt2" and pre in ("llama-bpe", "llama3")  # a word in the vocabulary is one token (tokenizers' ignore_merges)
    special = sorted(i for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED))
    names = [*(f"<0x{b:02X}>" for b in range(256)), *_CHAR_OF, "<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"]
    blob, ends, order, keys, vals, found = _tables(kind, tokens, types, meta, special, names, kind == "llama" or self._whole_words, path)
    # what stays is made from the tables after what built them is freed: made beside it (the special tokens' strings and
    # ids, the tables' objects), it kept pools of that memory resident (an idle engine 128 MiB over before loading, not 124)
    self._vocab, self._merges = _Vocab(blob, ends, order), _Merges(keys, vals)
    del blob, ends, order, keys, vals
    got = [None if i < 0 else i for i in _array("q", found)]  # the id of each special token, then of each name
    fallback, byte_ids, ends_ids = got[len(special):len(special) + 256], got[len(special) + 256:len(special) + 512], got[len(special) + 512:]
    if kind == "llama":
      # llama.cpp: a space before the text and after each special token (tokenizer.ggml.add_space_prefix), spaces as ▁
      self.space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
      unk = next((i for i, ty in enumerate(types) if ty == UNKNOWN), None)
      self._unk = None if unk is None else self._vocab.id_of(self._vocab.bytes_of(unk))
      self._fallback = fallback
      self._byte_of = {i: bytes([int(t[3:5], 16)]) for i, ty in enumerate(types) if ty == BYTE and len(t := self.piece(i)) == 6 and t.startswith("<0x")}
    else:
      digits, rx = PRE_TOKENIZERS[pre]
      self._digits, self._split = stdlib_regex(r"\p{N}") if digits else None, stdlib_regex(rx)
      self._byte_ids = byte_ids  # byte -> the id of its printable character
    self.special_ids = set(special)
    # special tokens, matched whole in the text: the longest one where several start at the same place
    self._special = {p: got[k] for k, i in enumerate(special) if (p := self.piece(i))}
    self._special_re = re.compile(_trie(list(self._special), re.escape)) if self._special else None
    self.bos_id, self.eos_id = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    eot = meta.get("tokenizer.ggml.eot_token_id")
    # generation ends at EOS, EOT, and the end-of-turn tokens chat templates use
    self.stop_ids = {i for i in (self.eos_id, eot, *ends_ids) if i is not None}
    self.chat_template: str | None = meta.get("tokenizer.chat_template")

  def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
    ids = [self.bos_id] if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None else []
    pos = 0
    for m in self._special_re.finditer(text) if self._special_re is not None else ():
      if m.start() > pos: ids += self._encode_text(text[pos:m.start()])
      ids.append(self._special[m.group()]); pos = m.end()
    if pos < len(text): ids += self._encode_text(text[pos:])
    return ids

  def _encode_text(self, text: str) -> list[int]:
    """Text without special tokens: SentencePiece-style, one word of its pieces (▁ for spaces); byte-level, the
    pre-tokenizer's pieces (digits apart first, if the preset says so), each one word of its bytes."""
    if self.kind == "llama": return merge(self._spm_symbols((SPACE if self.space_prefix else "") + text.replace(" ", SPACE)), self._merges)
    out: list[int] = []
    done: dict[str, list[int]] = {}  # words seen before in this text
    for part in _isolate(self._digits, text) if self._digits is not None else (text,):
      for word in _isolate(self._split, part):
        if (ids := done.get(word)) is None:
          raw = word.encode()
          if self._whole_words and (i := self._vocab.id_of(raw.decode("latin-1").translate(_BYTE_CHARS).encode())) is not None: ids = [i]
          else: ids = merge([i for b in raw if (i := self._byte_ids[b]) is not None], self._merges)
          done[word] = ids
        out += ids
    return out

  def _spm_symbols(self, word: str) -> list[int]:
    """A word's first symbols: each character's piece, else its bytes' <0xNN> pieces, else the unknown piece (a run of
    unknown characters as one, added when a known character follows: tokenizers' order)."""
    out: list[int] = []
    unk = False  # an unknown piece is pending
    known: dict[str, int | None] = {}  # characters seen before in this word
    for ch in word:
      if ch not in known: known[ch] = self._vocab.id_of(ch.encode())
      if (i := known[ch]) is not None:
        if unk: out.append(self._unk); unk = False  # type: ignore[arg-type]
        out.append(i)
      elif None not in (fb := [self._fallback[b] for b in ch.encode()]): out += fb  # type: ignore[misc]
      elif self._unk is not None: unk = True
    return out + [self._unk] if unk else out  # type: ignore[list-item]

  def decode(self, ids: list[int], skip_special: bool = False) -> str:
    pieces = [self.piece(i) for i in ids if 0 <= i < self.n_tokens and not (skip_special and self.piece(i) in self._special)]
    if self.kind == "gpt2":
      return b"".join(bytes(_BYTE_OF[c] for c in p) if all(c in _BYTE_OF for c in p) else p.encode() for p in pieces).decode("utf-8", "replace")
    out, run = [], bytearray()  # runs of <0xNN> pieces are bytes of UTF-8 text (each byte a U+FFFD if the run is not)
    for p in pieces:
      if len(p) == 6 and p.startswith("<0x") and p.endswith(">") and all(c in "0123456789abcdefABCDEF" for c in p[3:5]): run.append(int(p[3:5], 16)); continue
      if run: out.append(_utf8_or_replacements(run)); run = bytearray()
      out.append(p.replace(SPACE, " "))
    if run: out.append(_utf8_or_replacements(run))
    text = "".join(out)
    return text[1:] if self.space_prefix and text.startswith(" ") else text

  def token_bytes(self, i: int) -> bytes:
    """The bytes of one token (byte-level BPE maps each byte to a printable character; a SentencePiece piece has ▁ for
    a space, or is one byte as <0xNN>)."""
    if i in self.special_ids: return self.decode([i]).encode("utf-8", "surrogatepass")
    if self.kind == "llama": return b if (b := self._byte_of.get(i)) is not None else self.piece(i).replace(SPACE, " ").encode()
    return bytes(_BYTE_OF[c] for c in self.piece(i))

  def piece(self, i: int) -> str:
    """Token i as the vocabulary spells it (tokenizer.ggml.tokens[i])."""
    if not 0 <= i < self.n_tokens: raise IndexError(f"token id {i} is outside the vocabulary of {self.n_tokens}")
    return self._vocab.bytes_of(i).decode()

  def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The prompt text for a conversation, from the model's own template (ChatML when the file has none)."""
    import jinja2, jinja2.sandbox
    def raise_exception(msg: str) -> None: raise jinja2.exceptions.TemplateError(msg)
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    tpl = env.from_string(self.chat_template or _CHATML)
    name = lambda i: self.piece(i) if i is not None and 0 <= i < self.n_tokens else ""
    return tpl.render(messages=messages, add_generation_prompt=add_generation_prompt, bos_token=name(self.bos_id), eos_token=name(self.eos_id))

_CHATML = ("{% for m in messages %}{{'<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{'<|im_start|>assistant\n'}}{% endif %}")

def _byte_table() -> dict[str, int]:
  """GPT-2's byte <-> printable character map: printable Latin-1 bytes map to themselves, the rest to 256+."""
  keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  out, n = {}, 0
  for b in range(256):
    if b in keep: out[chr(b)] = b
    else: out[chr(256 + n)] = b; n += 1
  return out
_BYTE_OF = _byte_table()
_CHAR_OF = sorted(_BYTE_OF, key=_BYTE_OF.__getitem__)  # byte -> its printable character
_BYTE_CHARS = str.maketrans({b: c for b, c in enumerate(_CHAR_OF)})  # latin-1 text of the bytes -> the characters

# Unicode's White_Space property (what \\s means to Oniguruma; Python's re also counts \\x1c-\\x1f as space), unchanged
# since Unicode 6.3
_WHITE_SPACE = "\\t\\n\\x0b\\x0c\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"

@functools.cache
def _category_ranges(major: str) -> str:
  """The body of a character class for every code point whose general category is `major` (L: letters, N: numbers),
  as ranges. (Letters and numbers end before U+40000 in every Unicode version so far: 0.06 s for the 262k below it.)"""
  out, start, category = [], None, unicodedata.category
  for cp in range(0x40001):
    if cp < 0x40000 and category(chr(cp))[0] == major:
      if start is None: start = cp
    elif start is not None:
      out.append(f"\\U{start:08x}" + (f"-\\U{cp - 1:08x}" if cp - 1 > start else "")); start = None
  return "".join(out)

def stdlib_regex(rx: str) -> re.Pattern:
  """A pre-tokenizer regex in Oniguruma's syntax compiled by `re`: \\p{L} and \\p{N} become their ranges, \\s and \\S
  White_Space and its complement, inside a class or standing alone."""
  body = {"p{L}": lambda: _category_ranges("L"), "p{N}": lambda: _category_ranges("N"), "s": lambda: _WHITE_SPACE}
  out, in_class, i = [], False, 0
  while i < len(rx):
    c = rx[i]
    if c == "\\":
      name = rx[i + 1:i + 5] if rx.startswith("p{", i + 1) else rx[i + 1]
      if name in body: out.append(body[name]() if in_class else f"[{body[name]()}]")
      elif name == "S" and not in_class: out.append(f"[^{_WHITE_SPACE}]")
      else: assert name != "S", "\\S inside a class"; out.append(rx[i:i + 2]); name = rx[i + 1]
      i += 1 + len(name); continue
    if c == "[": in_class = True
    elif c == "]": in_class = False
    out.append(c); i += 1
  return re.compile("".join(out))

def _isolate(rx: Any, text: str) -> Iterator[str]:
  """The regex's matches and the text between them, in order (tokenizers' Split with behavior "isolated")."""
  pos = 0
  for m in rx.finditer(text):
    if m.start() > pos: yield text[pos:m.start()]
    if m.end() > m.start(): yield m.group()
    pos = m.end()
  if pos < len(text): yield text[pos:]

def _trie(words: list[str], escape: Any) -> str:
  """A regex for any of the words, the longest where several start at the same place: their trie as nested groups, a
  word's end optional (greedy) where longer ones go on. A plain alternation tried each word at each place: 3256 special
  tokens took 135 ms to compile and 123 ms for 40k characters."""
  trie: dict[str, dict] = {}
  for w in words:
    node = trie
    for ch in w: node = node.setdefault(ch, {})
    node[""] = {}  # a word ends here
  return _trie_pattern(trie, escape)

def _trie_pattern(node: dict[str, dict], escape: Any) -> str:
  """The pattern of the words below a trie node ("" marks a word's end)."""
  alts = [escape(ch) + _trie_pattern(child, escape) for ch, child in node.items() if ch]
  if not alts: return ""
  body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
  return f"(?:{body})?" if "" in node else body

def _utf8_or_replacements(b: bytearray) -> str:
  try: return b.decode()
  except UnicodeDecodeError: return "\ufffd" * len(b)
