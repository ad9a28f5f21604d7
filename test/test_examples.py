"""The tinygrad-style example trains end to end for a few steps (CI runs it through this test, with STEPS=)."""
import math, os, pathlib, re, subprocess, sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

def test_beautiful_mnist_runs_a_few_steps():
  env = {**os.environ, "STEPS": "3", "BS": "64", "TEST_SIZE": "512", "EVAL_EVERY": "2", "PROGRESS": "0",
         "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  r = subprocess.run([sys.executable, str(ROOT / "examples" / "beautiful_mnist.py")], env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-3000:]
  m = re.search(r"test accuracy after 3 steps: ([\d.]+)%", r.stdout)
  assert m and 0 <= float(m.group(1)) <= 100, r.stdout[-2000:]
  losses = [float(x) for x in re.findall(r"loss:\s+([\d.naif-]+)", r.stderr)]
  assert losses and all(math.isfinite(x) for x in losses), r.stderr[-2000:]

def _run_pytorch_style(backend: str) -> list[tuple[float, float, float]]:
  env = {**os.environ, "EPOCHS": "1", "BACKEND": backend, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  r = subprocess.run([sys.executable, str(ROOT / "examples" / "pytorch_style.py")], env=env, capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = re.findall(r"loss ([\d.]+) .*test acc ([\d.]+)%.*ema acc ([\d.]+)%", r.stdout)
  assert rows, r.stdout[-2000:]
  return [tuple(map(float, row)) for row in rows]

def test_pytorch_style_example_trains():
  """The PyTorch-style program (Module, DataLoader, AdamW, warmup + cosine, no_grad eval, in-place EMA) learns on attograd."""
  (loss, acc, ema_acc), = _run_pytorch_style("attograd")
  assert math.isfinite(loss) and loss < 1.0 and acc > 70 and ema_acc > 70, (loss, acc, ema_acc)

def test_pytorch_style_example_is_plain_torch():
  """The same file runs on torch itself: only its import block differs, so it is real PyTorch code."""
  pytest = __import__("pytest")
  pytest.importorskip("torch")
  (loss, acc, _), = _run_pytorch_style("torch")
  assert loss < 1.0 and acc > 70
