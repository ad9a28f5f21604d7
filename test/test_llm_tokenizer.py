"""The GGUF tokenizer on a SentencePiece-style vocabulary (tokenizer.ggml.model "llama": scored pieces, ▁ for spaces,
<0xNN> byte fallback): a small SentencePiece BPE model trained in the test, written to a GGUF file with gguf.GGUFWriter,
read back by attograd; its ids checked against SentencePiece's own encoder and against llama.cpp's tokenizer on the same
file (with special tokens), and decoding round-trips."""
import io
import pytest
spm = pytest.importorskip("sentencepiece")
gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")
from attograd.nn.state import gguf_load
from attograd.llm.tokenizer import GGUFTokenizer

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
