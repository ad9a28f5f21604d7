"""Several devices in one process, the ground sharding will stand on: CPU:1, LLVM:1, PYTHON:1 are devices of their own,
values copy between them exactly, and gradients flow back through copies to the device a value came from (torch as
the oracle). Tensor.shard and the in-graph all-reduce are tested in test/test_shard.py."""
import numpy as np
import pytest
from attograd import Tensor
from attograd.runtime.device import Device

def test_indexed_devices_are_distinct():
  assert Device.canonicalize("cpu:0") == "CPU" and Device.canonicalize("CPU:1") == "CPU:1"
  assert Device["CPU:1"] is not Device["CPU"] and Device["CPU:1"].name == "CPU:1"
  assert Tensor([1.0], device="CPU:1").device == "CPU:1"
  with pytest.raises(Exception, match="different devices"): (Tensor([1.0], device="CPU:1") + Tensor([1.0])).realize()

@pytest.mark.parametrize("chain", [("CPU:1",), ("CPU:1", "PYTHON:1"), ("LLVM:1", "CPU:2")])
def test_copies_between_indexed_devices_are_exact(chain):
  if any(d.startswith("LLVM") for d in chain): pytest.importorskip("llvmlite")
  x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
  t = Tensor(x)
  for d in chain: t = t.to(d) * 1.0
  assert t.device == chain[-1]
  np.testing.assert_array_equal(t.to("CPU").numpy(), x)

def test_gradient_flows_back_through_copies():
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(1)
  xa, xw = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
  a, w = Tensor(xa, requires_grad=True), Tensor(xw, device="CPU:1", requires_grad=True)
  (a.to("CPU:1") @ w).relu().to("CPU").sum().backward()
  assert a.grad.device == "CPU" and w.grad.device == "CPU:1"
  ta, tw = torch.tensor(xa, requires_grad=True), torch.tensor(xw, requires_grad=True)
  (ta @ tw).relu().sum().backward()
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-6)
  np.testing.assert_allclose(w.grad.numpy(), tw.grad.numpy(), rtol=1e-6)

def test_two_device_data_parallel_gradient_equals_one_device():
  """The batch split over CPU and CPU:1 with the weight copied to each: the summed per-device gradients equal the
  one-device gradient of the whole batch."""
  rng = np.random.default_rng(2)
  x, xw = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
  w = Tensor(xw, requires_grad=True)
  (Tensor(x) @ w).tanh().square().mean().backward()
  one = w.grad.numpy()
  w2 = Tensor(xw, requires_grad=True)
  parts = [(Tensor(rows, device=d) @ w2.to(d)).tanh().square().sum().to("CPU") for d, rows in (("CPU", x[:3]), ("CPU:1", x[3:]))]
  ((parts[0] + parts[1]) / (6 * 3)).backward()
  np.testing.assert_allclose(w2.grad.numpy(), one, rtol=1e-5, atol=1e-7)
