"""Every op x every dtype (13 of them) on CPU: each combination either matches PyTorch (values, shape and
dtype), or, where PyTorch refuses the dtype, matches numpy (or torch on the values widened to int64/float32),
or refuses with a clear TypeError/ValueError at graph-building time; never a crash, a C compile error or a
silently wrong value. Refusing what torch computes fails the sweep.

PINNED_REFUSALS lists what attograd refuses (torch refuses all of it too) and KNOWN_DIFF the deliberate dtype
differences: a change in either is a behaviour change to look at. To stay fast, the results for one input dtype
are realized in a few kernels: everything with the same output dtype is flattened and concatenated into one
tensor (one compile instead of dozens). test_every_cast does every dtype pair, in and out of range."""
from __future__ import annotations
import math, warnings
import numpy as np
import pytest
import torch
from attograd import Tensor, dtypes
from helpers import ALL_DTYPES, TORCH_DTYPES, FROM_TORCH, to_numpy

CLEAR = (TypeError, ValueError, NotImplementedError)

# name: (attograd fn, torch fn, numpy fn or None); a and b are (2, 3) tensors of one dtype, c a bool mask
UNARY = {
  "neg": (lambda a: -a, lambda a: -a, lambda a: ~a if a.dtype == bool else np.negative(a)),  # tinygrad's -bool: logical_not "abs": (lambda a: a.abs(), torch.abs, np.abs),
  "sign": (lambda a: a.sign(), torch.sign, np.sign), "exp": (lambda a: a.exp(), torch.exp, None),
  "exp2": (lambda a: a.exp2(), torch.exp2, None), "log": (lambda a: a.log(), torch.log, None),
  "log2": (lambda a: a.log2(), torch.log2, None), "sqrt": (lambda a: a.sqrt(), torch.sqrt, None),
  "rsqrt": (lambda a: a.rsqrt(), torch.rsqrt, None), "sin": (lambda a: a.sin(), torch.sin, None),
  "cos": (lambda a: a.cos(), torch.cos, None), "tan": (lambda a: a.tan(), torch.tan, None),
  "reciprocal": (lambda a: a.reciprocal(), torch.reciprocal, None), "square": (lambda a: a.square(), torch.square, np.square),
  "relu": (lambda a: a.relu(), torch.relu, None), "sigmoid": (lambda a: a.sigmoid(), torch.sigmoid, None),
  "tanh": (lambda a: a.tanh(), torch.tanh, None), "floor": (lambda a: a.floor(), torch.floor, None),
  "ceil": (lambda a: a.ceil(), torch.ceil, None), "round": (lambda a: a.round(), torch.round, None),
  "trunc": (lambda a: a.trunc(), torch.trunc, None), "logical_not": (lambda a: a.logical_not(), torch.logical_not, np.logical_not),
  "bitwise_not": (lambda a: ~a, lambda a: ~a, np.invert), "isnan": (lambda a: a.isnan(), torch.isnan, np.isnan),
  "isinf": (lambda a: a.isinf(), torch.isinf, np.isinf), "erf": (lambda a: a.erf(), torch.erf, None),
  "log1p": (lambda a: a.log1p(), torch.log1p, None), "expm1": (lambda a: a.expm1(), torch.expm1, None),
  "clip": (lambda a: a.clip(1, 3), lambda a: a.clip(1, 3), lambda a: np.clip(a, 1, 3)),
}
BINARY = {
  "add": (lambda a, b: a + b, lambda a, b: a + b, np.add), "sub": (lambda a, b: a - b, lambda a, b: a - b, np.subtract),
  "mul": (lambda a, b: a * b, lambda a, b: a * b, np.multiply), "div": (lambda a, b: a / b, lambda a, b: a / b, None),
  "floor_divide": (lambda a, b: a // b, lambda a, b: a // b, np.floor_divide), "mod": (lambda a, b: a % b, lambda a, b: a % b, np.mod),
  "pow": (lambda a, b: a ** b, lambda a, b: a ** b, None), "maximum": (lambda a, b: a.maximum(b), torch.maximum, np.maximum),
  "minimum": (lambda a, b: a.minimum(b), torch.minimum, np.minimum), "eq": (lambda a, b: a == b, lambda a, b: a == b, np.equal),
  "ne": (lambda a, b: a != b, lambda a, b: a != b, np.not_equal), "lt": (lambda a, b: a < b, lambda a, b: a < b, np.less),
  "le": (lambda a, b: a <= b, lambda a, b: a <= b, np.less_equal), "gt": (lambda a, b: a > b, lambda a, b: a > b, np.greater),
  "ge": (lambda a, b: a >= b, lambda a, b: a >= b, np.greater_equal), "and": (lambda a, b: a & b, lambda a, b: a & b, np.bitwise_and),
  "or": (lambda a, b: a | b, lambda a, b: a | b, np.bitwise_or), "xor": (lambda a, b: a ^ b, lambda a, b: a ^ b, np.bitwise_xor),
  "lshift": (lambda a, b: a << b, lambda a, b: a << b, np.left_shift), "rshift": (lambda a, b: a >> b, lambda a, b: a >> b, np.right_shift),
  "logical_and": (lambda a, b: a.logical_and(b), torch.logical_and, np.logical_and),
  "where": (lambda a, b: (a > b).where(a, b), lambda a, b: torch.where(a > b, a, b), lambda a, b: np.where(a > b, a, b)),
  "add_scalar": (lambda a, b: a + 2, lambda a, b: a + 2, None), "mul_float": (lambda a, b: a * 1.5, lambda a, b: a * 1.5, None),
  "matmul": (lambda a, b: a @ b.T, lambda a, b: a @ b.T, None),
}
REDUCE = {
  "sum": (lambda a: a.sum(1), lambda a: a.sum(1), None),
  "prod": (lambda a: a.prod(0), lambda a: a.prod(0), None), "max": (lambda a: a.max(), lambda a: a.max(), np.max),
  "min": (lambda a: a.min(axis=0), lambda a: a.amin(0), lambda a: np.min(a, 0)),
  "mean": (lambda a: a.mean(1), lambda a: a.mean(1), None), "argmax": (lambda a: a.argmax(1), lambda a: a.argmax(1), None),
  "argmin": (lambda a: a.argmin(), lambda a: a.argmin(), None), "any": (lambda a: a.any(1), lambda a: a.any(1), None),
  "all": (lambda a: a.all(), lambda a: a.all(), None), "var": (lambda a: a.var(1), lambda a: a.var(1), None),
  "cumsum": (lambda a: a.cumsum(1), lambda a: a.cumsum(1), None), "cumprod": (lambda a: a.cumprod(0), lambda a: a.cumprod(0), None),
  "cummax": (lambda a: a.cummax(1)[0], lambda a: a.cummax(1)[0], lambda a: np.maximum.accumulate(a, 1)),
  "sort": (lambda a: a.sort(1)[0], lambda a: torch.sort(a, dim=1, stable=True)[0], lambda a: np.sort(a, 1, kind="stable")),
  "topk": (lambda a: a.topk(1, 1)[0], lambda a: torch.topk(a, 1, 1)[0], lambda a: np.max(a, 1, keepdims=True)),
  "softmax": (lambda a: a.softmax(1), lambda a: a.softmax(1), None),
}
MOVE = {
  "reshape": (lambda a: a.reshape(3, 2), lambda a: a.reshape(3, 2), lambda a: a.reshape(3, 2)),
  "permute": (lambda a: a.permute(1, 0), lambda a: a.permute(1, 0), lambda a: a.T),
  "expand": (lambda a: a.reshape(2, 1, 3).expand(2, 2, 3), lambda a: a.reshape(2, 1, 3).expand(2, 2, 3), lambda a: np.broadcast_to(a.reshape(2, 1, 3), (2, 2, 3))),
  "pad": (lambda a: a.pad(((1, 0), (0, 2))), lambda a: torch.nn.functional.pad(a, (0, 2, 1, 0)), lambda a: np.pad(a, ((1, 0), (0, 2)))),
  "slice": (lambda a: a[:, 1:3], lambda a: a[:, 1:3], lambda a: a[:, 1:3]), "flip": (lambda a: a.flip(1), lambda a: a.flip(1), lambda a: a[:, ::-1]),
  "cat": (lambda a: a.cat(a, dim=1), lambda a: torch.cat([a, a], 1), lambda a: np.concatenate([a, a], 1)),
  "stack": (lambda a: a.stack(a), lambda a: torch.stack([a, a]), lambda a: np.stack([a, a])),
  "repeat": (lambda a: a.repeat(2, 1), lambda a: a.repeat(2, 1), lambda a: np.tile(a, (2, 1))),
  "roll": (lambda a: a.roll(1, 1), lambda a: a.roll(1, 1), lambda a: np.roll(a, 1, 1)),
  "tril": (lambda a: a.tril(), lambda a: a.tril(), np.tril), "contiguous": (lambda a: a.T.contiguous(), lambda a: a.T.contiguous(), lambda a: a.T),
  "getitem_int": (lambda a: a[1], lambda a: a[1], lambda a: a[1]),
  "getitem_tensor": (lambda a: a[Tensor([1, 0, 1])], lambda a: a[torch.tensor([1, 0, 1])], lambda a: a[[1, 0, 1]]),
  "gather": (lambda a: a.gather(1, Tensor([[0, 2], [1, 1]])), lambda a: a.gather(1, torch.tensor([[0, 2], [1, 1]])), None),
  "masked_fill": (lambda a: a.masked_fill(Tensor([[True, False, True]] * 2), 1), lambda a: a.masked_fill(torch.tensor([[True, False, True]] * 2), 1), None),
}

# deliberate differences from torch (documented in README "Semantics"), by (op, dtype name)
KNOWN_DIFF = {("any", "uint8"): "always bool", ("all", "uint8"): "always bool",
              **{(op, dt): "unsigned sums stay unsigned (uint64), torch's go to int64" for op in ("sum",) for dt in ("uint32", "uint64")}}

OURS_ONLY: dict[str, list[str]] = {}  # what attograd computes and torch refuses (checked against numpy / widened torch)

def widened(ft, targs) -> np.ndarray | None:
  for wide in (torch.int64, torch.float32):
    try: return to_numpy(ft(*(t.to(wide) for t in targs)))
    except Exception: pass  # noqa: BLE001
  return None

def inputs(dt):
  rng = np.random.default_rng(0)
  if dt == dtypes.bool: a, b = rng.random((2, 3)) < 0.5, rng.random((2, 3)) < 0.5
  elif dtypes.is_unsigned(dt): a, b = rng.integers(0, 9, (2, 3)), rng.integers(1, 4, (2, 3))
  elif dtypes.is_int(dt): a, b = rng.integers(-4, 6, (2, 3)), rng.integers(1, 4, (2, 3)) * np.array([1, -1, 1])
  else: a, b = rng.uniform(-3, 3, (2, 3)).round(2), rng.uniform(0.5, 3, (2, 3)).round(2) * np.array([1, -1, 1])
  return a, b

def pair(arr, dt):
  t = torch.from_numpy(np.ascontiguousarray(arr)).to(TORCH_DTYPES[dt])
  if dt == dtypes.bfloat16: return Tensor(arr.astype(np.float32)).cast(dt), t
  return Tensor(to_numpy(t)), t

def tol(dt):
  return {dtypes.float16: (2e-3, 2e-3), dtypes.bfloat16: (2e-2, 2e-2), dtypes.float32: (1e-5, 1e-6), dtypes.float64: (1e-6, 1e-7)}.get(dt, (0, 0))

def run_group(kind: str, ops: dict, dt) -> list[str]:
  """Problems found for every op of `ops` on dtype dt (empty: all fine)."""
  (na, nb), problems = inputs(dt), []
  (a, ta), (b, tb) = pair(na, dt), pair(nb, dt)
  npa, npb = to_numpy(ta), to_numpy(tb)
  built: dict[str, tuple[Tensor, object]] = {}
  for name, (fa, ft, fn) in ops.items():
    args, targs, nargs = ((a, b), (ta, tb), (npa, npb)) if kind == "binary" else ((a,), (ta,), (npa,))
    try: ref = ft(*targs); terr = None
    except Exception as e: ref, terr = None, e  # noqa: BLE001 (torch refuses in many ways)
    try: out = fa(*args); oerr = None
    except CLEAR as e: out, oerr = None, e
    except Exception as e:  # noqa: BLE001
      problems.append(f"{name}[{dt}]: crashed building the graph: {type(e).__name__}: {e}"); continue
    if oerr is not None:
      if terr is None: problems.append(f"{name}[{dt}]: refused ({type(oerr).__name__}: {oerr}) but torch computes it")
      continue
    if terr is not None:
      # torch refuses the dtype (uint16/32/64, bool): numpy's op, else torch's on the values widened to int64 (or float32)
      OURS_ONLY.setdefault(name, []).append(dt.name)
      if fn is not None:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
          warnings.simplefilter("ignore")
          ref = fn(*nargs)
      else: ref = widened(ft, targs)
      if ref is None: problems.append(f"{name}[{dt}]: computed, but no reference has it (torch: {str(terr)[:80]})"); continue
    built[name] = (out, ref)
  # realize: one kernel per output dtype (everything flattened and concatenated), each op alone if that fails
  by_dtype: dict = {}
  for name, (out, _) in built.items(): by_dtype.setdefault(out.dtype, []).append(name)
  values: dict[str, np.ndarray] = {}
  for odt, names in by_dtype.items():
    flat = [built[n][0].flatten() for n in names]
    try:
      joined = to_numpy(flat[0].cat(*flat[1:]) if len(flat) > 1 else flat[0].contiguous())
      off = 0
      for n, f in zip(names, flat): values[n] = joined[off:off + f.numel()].reshape(built[n][0].shape); off += f.numel()
    except Exception:  # noqa: BLE001
      for n in names:
        try: values[n] = to_numpy(built[n][0])
        except Exception as e: problems.append(f"{n}[{dt}]: failed to run: {type(e).__name__}: {str(e)[:200]}")  # noqa: BLE001
  for name, (out, ref) in built.items():
    if name not in values or ref is None: continue
    got = values[name]
    if isinstance(ref, torch.Tensor):
      if out.dtype != FROM_TORCH[ref.dtype]:
        if (name, dt.name) not in KNOWN_DIFF: problems.append(f"{name}[{dt}]: dtype {out.dtype}, torch gives {ref.dtype}")
        continue
      want = to_numpy(ref)
    else:  # a reference in another dtype: compare the values as attograd's dtype holds them (wrapping like it)
      with np.errstate(all="ignore"): want = np.asarray(ref).astype(got.dtype)
    if got.shape != want.shape: problems.append(f"{name}[{dt}]: shape {got.shape}, reference {want.shape}"); continue
    rtol, atol = tol(out.dtype)
    try:
      if rtol == 0: np.testing.assert_array_equal(got, want)
      else: np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    except AssertionError as e: problems.append(f"{name}[{dt}]: wrong values {str(e).splitlines()[-2:]}")
  return problems

@pytest.mark.parametrize("kind, ops", [("unary", UNARY), ("binary", BINARY), ("reduce", REDUCE), ("move", MOVE)], ids=["unary", "binary", "reduce", "move"])
def test_every_op_every_dtype(kind, ops):
  problems = [p for dt in ALL_DTYPES for p in run_group(kind, ops, dt)]
  assert not problems, f"{len(problems)} problem(s):\n" + "\n".join(problems)

PINNED_REFUSALS = {  # attograd refuses these; so does torch (the sweep fails otherwise)
  **{op: ["bfloat16", "float16", "float32", "float64"] for op in ("and", "or", "xor", "bitwise_not", "lshift", "rshift")},
  # defined where torch refuses and tinygrad computes (its rule wins there): the mean and var of ints and bools (a
  # float, tinygrad's (pred == y).mean()), -bool (logical_not)
  "floor_divide": ["bool"], "mod": ["bool"], "sub": ["bool"]}

def test_sweep_report():
  """What attograd refuses, pinned so a change shows."""
  refused: dict[str, list[str]] = {}
  for kind, ops in (("unary", UNARY), ("binary", BINARY), ("reduce", REDUCE), ("move", MOVE)):
    for dt in ALL_DTYPES:
      (a, _), (b, _) = (pair(x, dt) for x in inputs(dt))
      for name, (fa, _, _) in ops.items():
        try: fa(a, b) if kind == "binary" else fa(a)  # refusals happen while building the graph: nothing runs here
        except CLEAR: refused.setdefault(name, []).append(dt.name)
  assert {k: sorted(v) for k, v in refused.items()} == PINNED_REFUSALS

# ***** casts: every dtype to every dtype *****

CAST_VALUES = [-3.7, -1.0, -0.0, 0.0, 0.5, 1.0, 2.5, 100.9, 127.0, 255.0, 300.7, -200.0, 65535.0, 70000.0, -2.0**31, 3e9, 2.0**63, 1e10, -1e19,
               math.nan, math.inf, -math.inf]
INT_CAST_VALUES = [-2**63, -2**31, -70000, -300, -129, -1, 0, 1, 127, 128, 255, 256, 65535, 70000, 2**31 - 1, 2**32 + 5, 2**63 - 1]

def test_every_cast():
  """x.cast(to) for every pair of dtypes, on values in and out of the target's range: CPU agrees with the PYTHON
  reference everywhere (a float out of an int type's range truncates and wraps, NaN/inf give 0: README), and with
  torch wherever torch's result is defined (in range; out-of-range float -> int is machine-dependent there)."""
  srcs = {}
  for dt in ALL_DTYPES:
    if dtypes.is_float(dt): vals = np.array(CAST_VALUES)
    elif dt == dtypes.bool: vals = np.array([True, False, True])
    else: vals = np.array([v for v in INT_CAST_VALUES if dtypes.min(dt) <= v <= dtypes.max(dt)], dtype=object)
    srcs[dt] = vals
  problems = []
  for to in ALL_DTYPES:
    outs = {}
    for dev in ("CPU", "PYTHON"):
      parts = []
      for dt, vals in srcs.items():
        x = Tensor([float(v) for v in vals], device=dev, dtype=dtypes.float64).cast(dt) if dtypes.is_float(dt) else Tensor(vals.tolist(), device=dev, dtype=dt)
        parts.append(x.cast(to))
      joined = to_numpy(parts[0].cat(*parts[1:]))
      outs[dev], off = {}, 0
      for dt, p in zip(srcs, parts): outs[dev][dt] = joined[off:off + p.numel()]; off += p.numel()
    for dt, vals in srcs.items():
      cpu, ref = outs["CPU"][dt], outs["PYTHON"][dt]
      if not np.array_equal(cpu, ref, equal_nan=dtypes.is_float(to)): problems.append(f"{dt}->{to}: CPU {cpu.tolist()} != PYTHON {ref.tolist()}")
      t = torch.tensor([float(v) for v in vals], dtype=torch.float64).to(TORCH_DTYPES[dt]) if dtypes.is_float(dt) else torch.tensor(vals.tolist(), dtype=TORCH_DTYPES[dt])
      try: want = to_numpy(t.to(TORCH_DTYPES[to]))
      except Exception: continue  # noqa: BLE001 (torch can't convert this pair)
      src_vals = to_numpy(t).astype(np.float64) if dtypes.is_float(dt) else None
      defined = np.ones(len(vals), bool) if src_vals is None or not dtypes.is_int(to) else \
        np.isfinite(src_vals) & (np.trunc(np.nan_to_num(src_vals)) >= dtypes.min(to)) & (np.trunc(np.nan_to_num(src_vals)) <= dtypes.max(to))
      if not np.array_equal(cpu[defined], want[defined], equal_nan=dtypes.is_float(to)):
        problems.append(f"{dt}->{to}: {cpu[defined].tolist()} != torch {want[defined].tolist()}")
  assert not problems, "\n".join(problems)
