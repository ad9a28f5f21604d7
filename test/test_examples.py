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
