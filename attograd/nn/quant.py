"""GGML block quantizations (as GGUF files store them) decoded with Tensor ops.

Each decoder takes the raw bytes as a uint8 Tensor of shape (blocks, block_bytes) and returns float32 values of
shape (blocks, block_elements). It is written only with slices, shifts, masks, casts and a bitcast, so it stays
a lazy expression: used in a matmul, the scheduler fuses it into the matmul's kernel, and the weights stay
quantized in memory (a decode step reads each quantized byte, not a float32 copy).

The layouts follow ggml's block structs (ggml-common.h); the test checks every type against the `gguf`
package's numpy dequantization."""
from __future__ import annotations
from typing import Callable, NamedTuple
from attograd.dtype import dtypes
from attograd.tensor import Tensor
from attograd.gradient import no_grad

__all__ = ["GGMLType", "GGML_TYPES", "dequantize", "split_fields"]

# ***** the fields of a block *****

class Blocks:
  """The bytes of a quantized tensor as (blocks, block_bytes) uint8, read by field: `cols` for a run of bytes, `f16`
  for a float16 scale. `split()` realizes every field a decoder reads as its own buffer once (a float16 scale as float16:
  the same bytes in memory), but the decode in a matmul then loads a scale instead of rebuilding it from two bytes per
  weight, which the scheduler would store to a buffer on every run instead of repeating. Decoders write scale * q + offset
  as one mul_add (a fused multiply-add: one instruction a weight less)."""
  def __init__(self, raw: Tensor, parts: dict[tuple[str, int, int], Tensor] | None = None):
    self.raw, self.parts, self.shape = raw, parts, raw.shape
    self.asked: list[tuple[str, int, int]] = []
  def _part(self, key: tuple[str, int, int], make) -> Tensor:
    self.asked.append(key)
    return self.parts[key] if self.parts is not None and key in self.parts else make()
  def cols(self, start: int, n: int) -> Tensor: return self._part(("u8", start, n), lambda: self.raw[:, start:start + n])
  def half(self, start: int) -> Tensor:
    """The little-endian float16 at byte `start` of each block, of shape (blocks, 1)."""
    def make() -> Tensor:
      lo, hi = self.raw[:, start:start + 1].cast(dtypes.uint16), self.raw[:, start + 1:start + 2].cast(dtypes.uint16)
      return (lo | (hi << 8)).bitcast(dtypes.float16)
    return self._part(("f16", start, 2), make)
  def f16(self, start: int) -> Tensor:
    """The little-endian float16 at byte `start` of each block, as float32 of shape (blocks, 1)."""
    return self.half(start).cast(dtypes.float32)

ROW_GROUP = 16  # rows split_fields interleaves block by block (see there)
# the types whose rows split_fields interleaves: a matvec over them is light enough to wait on memory. One core, 576x1536,
# us a matvec (weights hot in cache / from DRAM), GGUF order -> interleaved: Q4_0 33.2/47.7 -> 28.3/32.7, Q8_0
# 32.6/71.0 -> 21.3/54.8 (Q4_1 as Q4_0); slower: Q5_0 283/297 -> 322/339, Q5_1 288/307 -> 328/332 (their fifth bits
# cost more than memory), Q4_K 48.8/70.3 -> 55.6/93.2, Q6_K 77.8/125 -> 77.5/163 (their kernels take another shape)
ROW_GROUPED = {"Q4_0", "Q4_1", "Q8_0"}

def split_fields(raw: Tensor, ggml_type: int, shape: tuple[int, ...] | None = None) -> dict[tuple[str, int, int], Tensor]:
  """Every field the decoder of `ggml_type` reads, as realized buffers (raw's bytes, its float16 scales as float16).
  Given the tensor's `shape` (numpy order), a type of ROW_GROUPED has its rows in groups of ROW_GROUP interleaved block
  by block: a field is kept as (row groups, blocks of a row, ROW_GROUP, bytes), the scales all in one buffer (..., scales,
  ROW_GROUP), and each field handed back as a view in the block order the decoder reads. A matrix-vector product that
  computes a group's rows together then reads two runs of memory front to back (the bytes, the scales) instead of three
  per row (the hardware prefetcher follows a few streams, and a row of SmolLM2's is 12 cache lines: one core, a Q4_1
  576x1536 matvec whose weights come from DRAM, 16 rows in one group 33-34 us against 43-67 as 4 rows of the GGUF order),
  and a block's scales of one kind for the group's rows are a contiguous run, which the matvec converts to float32 as a
  vector (codegen/opt.py WIDEN)."""
  t = GGML_TYPES[ggml_type]
  probe = Blocks(raw.reshape(-1, t.block_bytes))
  t.decode(probe)
  keys = list(dict.fromkeys(probe.asked))
  nb = probe.shape[0]
  rows = 1
  for d in (shape or (1,))[:-1]: rows *= d
  per_row = nb // rows if shape is not None and shape[-1] % t.block_elements == 0 else 0
  grouped = t.name in ROW_GROUPED and per_row > 0 and rows % ROW_GROUP == 0
  def field(key: tuple[str, int, int]) -> Tensor:
    kind, start, n = key
    # a scale stays float16 (2 bytes a block; float32 was +14 MiB resident for SmolLM2-135M Q4_1): the matvec converts a
    # block's scales for its group of rows at once, in a vector loop (codegen/opt.py WIDEN), where each row's copy of the
    # loop body converted its own. One core, a Q4_1 576x1536 matvec hot in cache / from DRAM, medians of 3 processes:
    # float32 scales 27.7-29.2 / 36.4-38.2 us, float16 converted per row 35.7-36.1 / 41.8-42.3, at once 28.4-30.2 /
    # 36.9-38.1. A SmolLM2 decode step's kernels run in sequence: Q4_1 matvecs 3-5% slower (the conversion loop), the
    # Q8_0 output 13% faster (2 bytes a block less from DRAM), the step 7.95-8.20 ms either way
    return probe.raw[:, start:start + n] if kind == "u8" else Blocks(probe.raw).half(start)
  scales = [k for k in keys if k[0] == "f16"] if grouped else []
  if not grouped: stored = {key: field(key).contiguous() for key in keys}
  else:
    def interleave(x: Tensor) -> Tensor:  # (blocks, n) in row order -> (groups, per_row, ROW_GROUP, n)
      return x.reshape(rows // ROW_GROUP, ROW_GROUP, per_row, x.shape[1]).permute(0, 2, 1, 3)
    stored = {k: interleave(field(k)).contiguous() for k in keys if k[0] == "u8"}
    if scales: stored["scales"] = Tensor.cat(*[interleave(field(k)).permute(0, 1, 3, 2) for k in scales], dim=2).contiguous()
  # without gradients: a realized tensor would keep the graph it came from (for backward), and with it the raw bytes
  # (the weights twice in memory)
  with no_grad(): Tensor.realize_all(list(stored.values()))
  # the views are taken after the realize: a view made before it holds the lazy graph (the raw bytes and the interleave),
  # so every use recomputed the layout from the raw bytes and kept them resident (SmolLM2: decode 7-8 -> 18 ms a token,
  # resident while generating 210 -> 293 MiB)
  if not grouped: return stored
  def view(x: Tensor) -> Tensor: return x.permute(0, 2, 1, 3).reshape(nb, x.shape[3])  # back to (blocks, n) row order
  handed = {k: view(stored[k]) for k in keys if k[0] == "u8"}
  handed.update((k, view(stored["scales"][:, :, i:i + 1, :].permute(0, 1, 3, 2))) for i, k in enumerate(scales))
  return {k: handed[k] for k in keys}

def _cols(raw: Blocks, start: int, n: int) -> Tensor: return raw.cols(start, n)
def _f16(raw: Blocks, start: int) -> Tensor: return raw.f16(start)

def _split_bits(q: Tensor, bits: int, count: int) -> Tensor:
  """(blocks, n) bytes -> (blocks, count, n): the `bits`-wide fields at shifts 0, bits, 2*bits, ... of every byte."""
  mask = (1 << bits) - 1
  return Tensor.stack(*[(q >> (bits * i)) & mask if bits * i else q & mask for i in range(count)], dim=1)

def _scale_min_k4(s: Tensor) -> tuple[Tensor, Tensor]:
  """The 8 six-bit scales and 8 six-bit mins packed in the 12 bytes of a Q4_K/Q5_K block (ggml's get_scale_min_k4):
  bytes 0-3 hold scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7, bytes 4-7 the same for the mins,
  bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble)."""
  d, m, md = s[:, 0:4], s[:, 4:8], s[:, 8:12]
  sc = Tensor.cat(d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30), dim=1)
  mn = Tensor.cat(m & 0x3F, (md >> 4) | ((m >> 2) & 0x30), dim=1)
  return sc.cast(dtypes.float32), mn.cast(dtypes.float32)

def _nibbles(qs: Tensor, groups: int) -> Tensor:
  """(blocks, groups*n) bytes -> (blocks, groups, 2, n): per group of n bytes, the low nibbles then the high ones."""
  nb, n = qs.shape[0], qs.shape[1] // groups
  return _split_bits(qs.reshape(nb * groups, n), 4, 2).reshape(nb, groups, 2, n)

# ***** the 32-element types *****

def _q4_0(raw: Blocks) -> Tensor:
  q = _split_bits(_cols(raw, 2, 16), 4, 2).reshape(raw.shape[0], 32)
  d = _f16(raw, 0)
  return d.mul_add(q.cast(dtypes.float32), d * -8)  # d * (q - 8), rounded alike: d * -8 and q - 8 are exact

def _q4_1(raw: Blocks) -> Tensor:
  q = _split_bits(_cols(raw, 4, 16), 4, 2).reshape(raw.shape[0], 32)
  return _f16(raw, 0).mul_add(q.cast(dtypes.float32), _f16(raw, 2))

def _q5(raw: Blocks, qh_at: int) -> Tensor:
  """The 5-bit value of each element: its low nibble from qs, its fifth bit j from the 32-bit qh."""
  nb = raw.shape[0]
  low = _split_bits(_cols(raw, qh_at + 4, 16), 4, 2).reshape(nb, 32)
  high = _split_bits(_cols(raw, qh_at, 4), 1, 8).permute(0, 2, 1).reshape(nb, 32)  # bit j of the little-endian word
  return (low | (high << 4)).cast(dtypes.float32)

def _q5_0(raw: Blocks) -> Tensor:
  d = _f16(raw, 0)
  return d.mul_add(_q5(raw, 2), d * -16)
def _q5_1(raw: Blocks) -> Tensor: return _f16(raw, 0).mul_add(_q5(raw, 4), _f16(raw, 2))
def _q8_0(raw: Blocks) -> Tensor: return _f16(raw, 0) * _cols(raw, 2, 32).bitcast(dtypes.int8).cast(dtypes.float32)

# ***** the 256-element K-quants *****

def _q2_k(raw: Blocks) -> Tensor:
  # scales[16] qs[64] d dmin: 16 groups of 16; group g (half h = g//8, shift j = (g//2)%4, part p = g%2) reads
  # bits 2j of qs[32h + 16p + l]
  nb = raw.shape[0]
  sc = _cols(raw, 0, 16)
  dl = _f16(raw, 80) * (sc & 0xF).cast(dtypes.float32)
  ml = _f16(raw, 82) * (sc >> 4).cast(dtypes.float32)
  q = _split_bits(_cols(raw, 16, 64).reshape(nb * 2, 32), 2, 4).reshape(nb, 16, 16).cast(dtypes.float32)
  return dl.reshape(nb, 16, 1).mul_add(q, -ml.reshape(nb, 16, 1)).reshape(nb, 256)

def _q3_k(raw: Blocks) -> Tensor:
  # hmask[32] qs[64] scales[12] d: 16 six-bit scales (offset by 32), 2 low bits from qs, the third from hmask
  # (set means +0, clear means -4)
  nb = raw.shape[0]
  s = _cols(raw, 96, 12)
  low = _split_bits(s[:, 0:8], 4, 2).reshape(nb, 16)
  high = _split_bits(s[:, 8:12], 2, 4).reshape(nb, 16)
  scales = (low | (high << 4)).cast(dtypes.float32) - 32
  ql = _split_bits(_cols(raw, 32, 64).reshape(nb * 2, 32), 2, 4).reshape(nb, 16, 16)
  qh = _split_bits(_cols(raw, 0, 32), 1, 8).reshape(nb, 16, 16)
  q = ql.cast(dtypes.float32) - (1 - qh.cast(dtypes.float32)) * 4
  return ((_f16(raw, 108) * scales).reshape(nb, 16, 1) * q).reshape(nb, 256)

def _q4_k(raw: Blocks) -> Tensor:
  # d dmin scales[12] qs[128]: 8 groups of 32; qs in 4 chunks of 32 bytes, low nibbles then high ones
  nb = raw.shape[0]
  sc, mn = _scale_min_k4(_cols(raw, 4, 12))
  q = _nibbles(_cols(raw, 16, 128), 4).reshape(nb, 8, 32).cast(dtypes.float32)
  return (_f16(raw, 0) * sc).reshape(nb, 8, 1).mul_add(q, -(_f16(raw, 2) * mn).reshape(nb, 8, 1)).reshape(nb, 256)

def _q5_k(raw: Blocks) -> Tensor:
  # d dmin scales[12] qh[32] qs[128]: as Q4_K, with group g's fifth bits at bit g of qh
  nb = raw.shape[0]
  sc, mn = _scale_min_k4(_cols(raw, 4, 12))
  low = _nibbles(_cols(raw, 48, 128), 4).reshape(nb, 8, 32)
  high = _split_bits(_cols(raw, 16, 32), 1, 8)
  q = (low | (high << 4)).cast(dtypes.float32)
  return (_f16(raw, 0) * sc).reshape(nb, 8, 1).mul_add(q, -(_f16(raw, 2) * mn).reshape(nb, 8, 1)).reshape(nb, 256)

def _q6_k(raw: Blocks) -> Tensor:
  # ql[128] qh[64] scales[16] (int8) d: two halves of 128; in each, group g of 32 takes the low (g < 2) or high
  # nibbles of ql[64h + (g%2)*32 ...] and bits 2g of qh[32h ...]; 16 scales, one per 16 elements
  nb = raw.shape[0]
  low = _nibbles(_cols(raw, 0, 128), 2).reshape(nb, 2, 4, 32)
  high = _split_bits(_cols(raw, 128, 64).reshape(nb * 2, 32), 2, 4).reshape(nb, 2, 4, 32)
  q = (low | (high << 4)).cast(dtypes.float32).reshape(nb, 16, 16) - 32
  scales = _cols(raw, 192, 16).bitcast(dtypes.int8).cast(dtypes.float32)
  return ((_f16(raw, 208) * scales).reshape(nb, 16, 1) * q).reshape(nb, 256)

# ***** plain floats *****

def _f32(raw: Blocks) -> Tensor:
  b = _cols(raw, 0, 4).cast(dtypes.uint32)
  return (b[:, 0:1] | (b[:, 1:2] << 8) | (b[:, 2:3] << 16) | (b[:, 3:4] << 24)).bitcast(dtypes.float32)
def _f16s(raw: Blocks) -> Tensor: return _f16(raw, 0)
def _bf16(raw: Blocks) -> Tensor:
  b = _cols(raw, 0, 2).cast(dtypes.uint32)
  return ((b[:, 0:1] << 16) | (b[:, 1:2] << 24)).bitcast(dtypes.float32)

class GGMLType(NamedTuple):
  name: str
  block_elements: int
  block_bytes: int
  decode: Callable[[Blocks], Tensor]

# ggml type id -> layout and decoder (ids from ggml.h's enum ggml_type)
GGML_TYPES: dict[int, GGMLType] = {t[0]: GGMLType(*t[1:]) for t in [
  (0, "F32", 1, 4, _f32), (1, "F16", 1, 2, _f16s), (30, "BF16", 1, 2, _bf16),
  (2, "Q4_0", 32, 18, _q4_0), (3, "Q4_1", 32, 20, _q4_1), (6, "Q5_0", 32, 22, _q5_0), (7, "Q5_1", 32, 24, _q5_1),
  (8, "Q8_0", 32, 34, _q8_0), (10, "Q2_K", 256, 84, _q2_k), (11, "Q3_K", 256, 110, _q3_k), (12, "Q4_K", 256, 144, _q4_k),
  (13, "Q5_K", 256, 176, _q5_k), (14, "Q6_K", 256, 210, _q6_k)]}

def dequantize(raw: Tensor | dict, ggml_type: int, shape: tuple[int, ...]) -> Tensor:
  """float32 values of `shape` (numpy order: the GGUF dims reversed) from the raw uint8 bytes of a ggml tensor.
  Lazy: nothing runs until the result is used. `raw` may also be split_fields(raw, ggml_type): the fields apart."""
  if ggml_type not in GGML_TYPES:
    raise ValueError(f"unsupported ggml tensor type {ggml_type}; supported: {', '.join(f'{k} ({t.name})' for k, t in GGML_TYPES.items())}")
  t = GGML_TYPES[ggml_type]
  n = 1
  for s in shape: n *= s
  if n % t.block_elements: raise ValueError(f"{t.name} needs a multiple of {t.block_elements} elements, got shape {shape}")
  nb = n // t.block_elements
  if isinstance(raw, dict): return t.decode(Blocks(next(iter(raw.values())), raw)).reshape(shape)
  if raw.dtype != dtypes.uint8 or raw.numel() != nb * t.block_bytes:
    raise ValueError(f"{t.name} of shape {shape} needs {nb * t.block_bytes} uint8 bytes, got {raw.numel()} of {raw.dtype}")
  return t.decode(Blocks(raw.reshape(nb, t.block_bytes))).reshape(shape)
