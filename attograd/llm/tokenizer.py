"""A tokenizer from a GGUF file's metadata (tokenizer.ggml.*), run by the `tokenizers` package, and the model's
chat template (tokenizer.chat_template) rendered with jinja2.

Byte-level BPE vocabularies (tokenizer.ggml.model "gpt2") are supported with the pre-tokenizer presets below,
keyed by tokenizer.ggml.pre as llama.cpp names them; SentencePiece-style ones ("llama": pieces with scores, spaces
as ▁, bytes outside the vocabulary as <0xNN> tokens) as a BPE whose merges are ranked by the merged piece's score.
Control and user-defined tokens are special: matched whole in the text, as llama.cpp does with special=True."""
from __future__ import annotations
from typing import Any, Sequence

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

def _bpe(kind: str, tokens: Sequence[str], types: Sequence[int], meta: dict[str, Any]) -> Any:
  """The BPE model of a vocabulary (tokenizers.models.BPE). What it is built from lives only in here."""
  from tokenizers import models
  vocab = {t: i for i, t in enumerate(tokens)}
  if kind == "llama":
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    return models.BPE(vocab, spm_merges(tokens, meta["tokenizer.ggml.scores"], types), unk_token=unk, fuse_unk=True, byte_fallback=True)
  pre = meta.get("tokenizer.ggml.pre", "default")
  merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
  return models.BPE(vocab, merges, fuse_unk=False, ignore_merges=pre in ("llama-bpe", "llama3"))

def spm_merges(tokens: list[str], scores: list[float], types: list[int]) -> list[tuple[str, str]]:
  """SentencePiece's BPE joins, at each step, the adjacent pair of pieces whose join is the vocabulary piece of highest
  score (leftmost on a tie). As BPE merges: every split of a normal piece into two normal pieces, ranked by the
  joined piece's score (then by its id)."""
  normal = {t: i for i, t in enumerate(tokens) if types[i] in (NORMAL, USER_DEFINED)}
  ranked = [(-scores[i], i, normal[t[:k]], (t[:k], t[k:])) for t, i in normal.items() for k in range(1, len(t)) if t[:k] in normal and t[k:] in normal]
  return [m[3] for m in sorted(ranked)]

class GGUFTokenizer:
  def __init__(self, meta: dict[str, Any], path: str = "<gguf>"):
    try: import tokenizers
    except ImportError: raise ImportError("the GGUF tokenizer needs the `tokenizers` package: pip install 'attograd[llm]'") from None
    from tokenizers import Tokenizer, Regex, AddedToken, models, pre_tokenizers, decoders
    from tokenizers import normalizers
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
      raise NotImplementedError(f"{path}: tokenizer.ggml.model {kind!r}: supported are byte-level BPE ('gpt2') and SentencePiece-style ('llama') vocabularies")
    if "tokenizer.ggml.tokens" not in meta: raise ValueError(f"{path}: metadata tokenizer.ggml.tokens is missing")
    # read in order, never indexed: nn.state.GGUFStrings (the file's bytes, a string made as it is read) or a list
    tokens: Sequence[str] = meta["tokenizer.ggml.tokens"]
    types: Sequence[int] = meta.get("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
    self.kind, self.n_tokens = kind, len(tokens)
    pre = meta.get("tokenizer.ggml.pre", "default")
    if kind == "llama":
      scores = meta.get("tokenizer.ggml.scores")
      if scores is None or len(scores) != len(tokens): raise ValueError(f"{path}: a 'llama' vocabulary needs tokenizer.ggml.scores, one per token")
    elif pre not in PRE_TOKENIZERS: raise NotImplementedError(f"{path}: tokenizer.ggml.pre {pre!r}; known presets: {', '.join(PRE_TOKENIZERS)}")
    # the tokenizer object first and its BPE model after: what the build makes (100k strings, the vocabulary and merges as
    # tokenizers takes them) is freed together, not beside objects that stay
    tok = Tokenizer(models.BPE())
    tok.model = _bpe(kind, tokens, types, meta)
    # what the vocabulary's strings decide is asked of the BPE model from here on (it holds each string, ~8 MiB in Rust);
    # only an id whose string a later id has too is kept (the BPE maps the string to that one)
    self._tok, self._repeated = tok, {}
    if tok.get_vocab_size(with_added_tokens=False) != len(tokens):
      self._repeated = {i: t for i, t in enumerate(tokens) if tok.token_to_id(t) != i}
    if kind == "llama":
      # llama.cpp: a space before the text and after each special token (tokenizer.ggml.add_space_prefix), spaces as ▁
      self.space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
      tok.normalizer = normalizers.Sequence(([normalizers.Prepend(SPACE)] if self.space_prefix else []) + [normalizers.Replace(" ", SPACE)])
      tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()] +
                                      ([decoders.Strip(" ", 1, 0)] if self.space_prefix else []))
      self._byte_of = {i: bytes([int(t[3:5], 16)]) for i, ty in enumerate(types) if ty == BYTE and len(t := self.piece(i)) == 6 and t.startswith("<0x")}
    else:
      digits, regex = PRE_TOKENIZERS[pre]
      steps = ([pre_tokenizers.Digits(individual_digits=True)] if digits else []) + [
        pre_tokenizers.Split(Regex(regex), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
      tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
      tok.decoder = decoders.ByteLevel()
    self.special_ids = {i for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED)}
    tok.add_special_tokens([AddedToken(self.piece(i), special=True, normalized=False) for i in sorted(self.special_ids)])
    self.bos_id, self.eos_id = meta.get("tokenizer.ggml.bos_token_id"), meta.get("tokenizer.ggml.eos_token_id")
    self.add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    eot = meta.get("tokenizer.ggml.eot_token_id")
    # generation ends at EOS, EOT, and the end-of-turn tokens chat templates use
    ends = (tok.token_to_id(t) for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"))
    self.stop_ids = {i for i in (self.eos_id, eot, *ends) if i is not None}
    self.chat_template: str | None = meta.get("tokenizer.chat_template")

  def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None: ids = [self.bos_id] + ids
    return ids

  def decode(self, ids: list[int], skip_special: bool = False) -> str:
    return self._tok.decode(ids, skip_special_tokens=skip_special)

  def token_bytes(self, i: int) -> bytes:
    """The bytes of one token (byte-level BPE maps each byte to a printable character; a SentencePiece piece has ▁ for
    a space, or is one byte as <0xNN>)."""
    if i in self.special_ids: return self._tok.decode([i], skip_special_tokens=False).encode("utf-8", "surrogatepass")
    if self.kind == "llama": return b if (b := self._byte_of.get(i)) is not None else self.piece(i).replace(SPACE, " ").encode()
    return bytes(_BYTE_OF[c] for c in self.piece(i))

  def piece(self, i: int) -> str:
    """Token i as the vocabulary spells it (tokenizer.ggml.tokens[i])."""
    if not 0 <= i < self.n_tokens: raise IndexError(f"token id {i} is outside the vocabulary of {self.n_tokens}")
    return t if (t := self._repeated.get(i)) is not None else self._tok.id_to_token(i)

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
