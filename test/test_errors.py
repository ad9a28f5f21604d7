"""Misuse refuses clearly (DESIGN §4.6): the right exception type, and a message naming the shapes,
axes, dtype or device involved. Integer division by zero gives a value, never a crash."""
import re
import numpy as np
import pytest
from attograd import Tensor, Context, Device, dtypes
from helpers import DEVICES

def raises(exc, *words):
  """pytest.raises whose message must contain every one of words (literally)."""
  return pytest.raises(exc, match="".join(f"(?=.*{re.escape(str(w))})" for w in words))

a = Tensor.empty(2, 3)

@pytest.mark.parametrize("f, words", [
  (lambda: a + Tensor.empty(4, 5), ("(2, 3)", "(4, 5)")),
  (lambda: a * Tensor.empty(3, 2), ("(2, 3)", "(3, 2)")),
  (lambda: a @ Tensor.empty(4, 5), ("(2, 3)", "(4, 5)")),
  (lambda: (a > 0).where(a, Tensor.empty(4, 5)), ("(2, 3)", "(4, 5)")),
  (lambda: a.expand(3, 3), ("(2, 3)", "(3, 3)")),
  (lambda: a.expand(3), ("(2, 3)", "(3,)")),
  (lambda: a.reshape(4, 2), ("(2, 3)", "(4, 2)")),
  (lambda: a.reshape(-1, 4), ("(2, 3)", "(-1, 4)")),
  (lambda: a.reshape(-1, -1), ("(-1, -1)",)),
  (lambda: a.reshape(7), ("(2, 3)", "(7,)")),
  (lambda: a.shrink(((0, 5), None)), ("(2, 3)", "(0, 5)")),
  (lambda: a.pad((1,)), ("(1,)",)),
  (lambda: a.permute(0, 0), ("(0, 0)",)),
  (lambda: a.sum((1, 1)), ("(1, 1)",)),
  (lambda: a.item(), ("(2, 3)",)),
  (lambda: Tensor.zeros(2, -1), ("(2, -1)",)),
  (lambda: Tensor([[1, 2], [3]]), ("rectangular",)),
  (lambda: Tensor.arange(0, 5, 0), ("step",)),
  (lambda: a.bitcast(dtypes.float64), ("float32", "float64")),
])
def test_bad_shapes_raise_value_error(f, words):
  with raises(ValueError, *words): f()

@pytest.mark.parametrize("f, axis", [
  (lambda: a.sum(2), 2), (lambda: a.sum(-3), -3), (lambda: a.max(5), 5), (lambda: a.permute(0, 2), 2),
  (lambda: a.transpose(0, 5), 5), (lambda: a.squeeze(3), 3), (lambda: a.unsqueeze(4), 4), (lambda: a.flip(2), 2),
  (lambda: a.softmax(4), 4), (lambda: a.argmax(3), 3), (lambda: a.size(2), 2), (lambda: a[5], 5), (lambda: a[:, -4], -4),
])
def test_bad_axes_raise_index_error(f, axis):
  with raises(IndexError, axis): f()

def test_too_many_indices():
  with raises(IndexError, "3", "2"): a[0, 0, 0]

@pytest.mark.parametrize("f, name", [
  (lambda: Tensor([1, 2], dtype="float33"), "float33"), (lambda: a.cast("notatype"), "notatype"),
  (lambda: Tensor.zeros(2, dtype="int31"), "int31"), (lambda: a.bitcast("complex"), "complex"),
])
def test_bad_dtype_names_raise_type_error(f, name):
  with raises(TypeError, name, "float32"): f()  # the message lists what would have worked

@pytest.mark.parametrize("f, words", [
  (lambda: Tensor(["a"]), ("str",)), (lambda: Tensor({1: 2}), ("dict",)), (lambda: a + "x", ("str",)),
  (lambda: Tensor([True]) - Tensor([False]), ("bool",)), (lambda: a @ 3, ("int",)),
])
def test_bad_types_raise_type_error(f, words):
  with raises(TypeError, *words): f()

@pytest.mark.parametrize("f, name", [
  (lambda: Tensor([1, 2], device="TPU"), "TPU"), (lambda: Tensor.empty(2, device="GPU9"), "GPU9"),
  (lambda: a.to("NOPE"), "NOPE"), (lambda: Device["FOO"], "FOO"),
])
def test_unknown_device_raises_value_error(f, name):
  with raises(ValueError, name, "CPU"): f()

def test_mixed_devices_raise():
  with raises(ValueError, "CPU", "PYTHON"): Tensor([1.0], device="CPU") + Tensor([1.0], device="PYTHON")

def test_unknown_context_switch_raises_key_error():
  with raises(KeyError, "NOT_A_SWITCH"):
    with Context(NOT_A_SWITCH=1): pass

def test_usable_after_errors():
  with pytest.raises(ValueError): a + Tensor.empty(4, 5)
  assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]

# ***** no crash in generated code *****

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64"])
def test_integer_division_by_zero_gives_a_value(device, dtype):
  x = Tensor([7, 0, 3, 100], dtype=dtype, device=device)
  zero = Tensor([0, 0, 0, 0], dtype=dtype, device=device)
  for out in (x // zero, x % zero, x.div(zero, rounding_mode="trunc"), x // 0, x % 0, (x + 1) // (x - x)):
    assert len(out.tolist()) == 4 and all(isinstance(v, int) for v in out.tolist())

@pytest.mark.parametrize("device", DEVICES)
def test_int_min_divided_by_minus_one_gives_a_value(device):
  imin = Tensor([-2**31, -2**31], dtype="int32", device=device)
  for out in (imin // Tensor([-1, -1], dtype="int32", device=device), imin // -1, imin % -1, imin.div(-1, rounding_mode="trunc")):
    assert all(isinstance(v, int) for v in out.tolist())

@pytest.mark.parametrize("device", DEVICES)
def test_float_division_by_zero_is_ieee(device):
  x, zero = Tensor([1.0, -1.0, 0.0], device=device), Tensor([0.0, 0.0, 0.0], device=device)
  np.testing.assert_equal((x / zero).numpy(), np.array([np.inf, -np.inf, np.nan], dtype=np.float32))
  np.testing.assert_equal((x // zero).numpy(), np.array([np.inf, -np.inf, np.nan], dtype=np.float32))
