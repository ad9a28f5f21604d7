"""Hugging Face-style model directories: `config.json`, the weights (`model.safetensors`, a sharded
`model.safetensors.index.json`, or `pytorch_model.bin` read by the restricted unpickler of nn.state, never torch),
and `tokenizer.json` (read by the `tokenizers` package, the `[models]` extra).

Parameter names are mapped from Hugging Face's to a model's own by a table of (regex, replacement) rules, applied
in order, first match wins; a replacement of None drops the tensor (buffers a checkpoint carries that the model
recomputes, like BERT's position_ids). Unmatched names are kept as they are, so load_state_dict(strict=True)
names anything a map forgot."""
from __future__ import annotations
import json, os, pathlib, re
from typing import Any, Sequence
from attograd.tensor import Tensor
from attograd.nn.state import safe_load, torch_load

__all__ = ["NameMap", "model_dir", "load_config", "load_weights", "rename", "load_tokenizer"]

NameMap = Sequence[tuple[str, str | None]]

def model_dir(path: str | os.PathLike) -> pathlib.Path:
  p = pathlib.Path(path)
  if not p.is_dir(): raise FileNotFoundError(f"{p}: not a model directory (expected a folder with config.json and the weights)")
  return p

def load_config(path: str | os.PathLike) -> dict[str, Any]:
  """config.json of a model directory, as a dict."""
  f = model_dir(path) / "config.json"
  if not f.is_file(): raise FileNotFoundError(f"{f}: missing (every Hugging Face model directory has a config.json)")
  with open(f) as fh: return json.load(fh)

# the weight files, in the order Hugging Face itself prefers them
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

def _load_one(f: pathlib.Path) -> dict[str, Tensor]:
  if f.name.endswith(".safetensors"): return safe_load(f)
  sd = torch_load(f)
  if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
    raise ValueError(f"{f}: expected a state dict of tensors, got {type(sd).__name__}")
  return sd

def load_weights(path: str | os.PathLike) -> dict[str, Tensor]:
  """Every tensor of a model directory by its Hugging Face name, lazily on DISK (nothing is read until used)."""
  d = model_dir(path)
  for name in _WEIGHT_FILES:
    f = d / name
    if not f.is_file(): continue
    if not name.endswith(".index.json"): return _load_one(f)
    with open(f) as fh: shards = sorted(set(json.load(fh)["weight_map"].values()))
    out: dict[str, Tensor] = {}
    for s in shards: out.update(_load_one(d / s))
    return out
  raise FileNotFoundError(f"{d}: no weights found (looked for {', '.join(_WEIGHT_FILES)})")

def rename(state: dict[str, Tensor], name_map: NameMap) -> dict[str, Tensor]:
  """state with each name mapped by the first rule whose regex matches it in full (see the module doc)."""
  rules = [(re.compile(pat), repl) for pat, repl in name_map]
  out: dict[str, Tensor] = {}
  for k, v in state.items():
    for rx, repl in rules:
      if (m := rx.fullmatch(k)) is not None:
        if repl is not None: out[m.expand(repl)] = v
        break
    else: out[k] = v
  return out

def load_tokenizer(path: str | os.PathLike) -> Any:
  """The `tokenizers.Tokenizer` of tokenizer.json in a model directory, as the model was trained with it."""
  f = model_dir(path) / "tokenizer.json"
  try:
    from tokenizers import Tokenizer
  except ImportError as e: raise ImportError("reading tokenizer.json needs the `tokenizers` package: pip install 'attograd[models]'") from e
  if not f.is_file(): raise FileNotFoundError(f"{f}: missing")
  return Tokenizer.from_file(str(f))
