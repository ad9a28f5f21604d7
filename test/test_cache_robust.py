"""Every disk cache survives what disks and processes do to it. Each kind of entry (schedule, lowered program, compiled
library, loadable library, LLVM or OpenCL binary, BEAM winner, downloaded dataset) truncated, zeroed, garbled or whole
but of another format is rebuilt with a one-line warning and the results stay right; processes filling one empty cache at once all work; a process killed
in the middle of writing an entry leaves no half-written entry and loses nothing it finished; a cache that can't be
written is run without. Every run is a fresh process on a cache directory of its own."""
from __future__ import annotations
import hashlib, json, os, pathlib, shutil, subprocess, sys, time
import numpy as np
import pytest
from helpers import available

REPO = pathlib.Path(__file__).resolve().parents[1]

# small kernels of the kinds the caches hold: a matmul, a reduce the heuristics split over cores (the thread pool's
# library too), a max. Integer-valued data, so every choice of Opts gives exactly numpy's answer
SCRIPT = """
import json, os
import numpy as np
from attograd import Tensor
import attograd.engine.realize as realize
rng = np.random.default_rng(0)
na, nb, nbig = (rng.integers(-3, 4, s).astype(np.float32) for s in ((24, 16), (16, 8), (1024, 512)))
a, b, big = Tensor(na), Tensor(nb), Tensor(nbig)
got = {"matmul": (a @ b).relu().tolist(), "rows": (big * 2).sum(1).tolist(), "max": (a - 1).max(axis=0).tolist()}
want = {"matmul": np.maximum(na @ nb, 0).tolist(), "rows": (nbig * 2).sum(1).tolist(), "max": (na - 1).max(0).tolist()}
threaded = any(ck.threads > 1 for ck in realize._kernel_cache.values())
print(json.dumps({"ok": got == want, "threaded": threaded, "kernels": len(realize._kernel_cache)}))
"""

def run(cache: pathlib.Path, script: str = SCRIPT, **env: str) -> tuple[dict, str]:
  proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "ATTOGRAD_CACHE": str(cache), "DEBUG": "0", "PROGRESS": "0", **env})
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout.splitlines()[-1]), proc.stderr

def entries(cache: pathlib.Path, kind: str) -> list[pathlib.Path]:
  return sorted(p for p in (cache / kind).glob("*") if not p.name.startswith("."))

def temporaries(cache: pathlib.Path) -> list[pathlib.Path]: return sorted(p for p in cache.rglob(".*") if p.is_file())

def whole(path: pathlib.Path) -> bool:
  """Whether an entry is complete: a lib/ file hashes to its name, every other one has a header that checks."""
  from attograd.helpers import cache_read, content_hash
  if path.parent.name == "lib": return content_hash(path.read_bytes()) == path.stem
  return cache_read(path) is not None

def _truncate(b: bytes) -> bytes: return b[:len(b) // 2]
def _zero(b: bytes) -> bytes: return bytes(len(b))
def _garble(b: bytes) -> bytes:
  # bytes changed in the middle: a header that looks fine over a payload that isn't (what a bad disk block does)
  mid = len(b) // 2
  return b[:mid] + bytes(x ^ 0x5A for x in b[mid:mid + 64]) + b[mid + 64:]
def _random(b: bytes) -> bytes: return np.random.default_rng(len(b)).bytes(100)  # the report: 100 random bytes
DAMAGE = pytest.mark.parametrize("damage", [_truncate, _zero, _garble, _random], ids=["truncated", "zeroed", "garbled", "random"])

def foreign(path: pathlib.Path) -> None:
  """A whole entry (its header checks) holding what another version might have written there."""
  from attograd.helpers import cache_write
  cache_write(path, b'{"format": "0", "key": "another"}')

def check_rebuilt(cache: pathlib.Path, kind: str, damage, script: str = SCRIPT, **env: str) -> None:
  """Damage every entry of kind in cache; the next process must compute the same with one warning a damaged entry,
  and the one after it must find everything whole."""
  damaged = entries(cache, kind)
  assert damaged, f"no {kind} entries to damage"
  for p in damaged:
    if damage is foreign: foreign(p)
    else: p.write_bytes(damage(p.read_bytes()))
  second, err = run(cache, script, **env)
  assert second["ok"], second
  warnings = err.splitlines()
  assert len(warnings) == len(damaged), err  # one line per damaged entry
  assert all(w.startswith("attograd: warning: cache entry") and str(cache / kind) in w and "rebuilding it" in w for w in warnings), err
  assert entries(cache, kind) == damaged and all(whole(p) for p in damaged)  # written whole again
  third, err = run(cache, script, **env)
  assert err == "" and third["ok"]

@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> pathlib.Path:
  """A cache one process filled (copy it before changing it)."""
  cache = tmp_path_factory.mktemp("warm")
  first, err = run(cache)
  assert first["ok"] and first["threaded"] and err == ""
  return cache

@DAMAGE
@pytest.mark.parametrize("kind", ["schedule", "program", "cc", "lib"])
def test_damaged_entry_is_rebuilt_with_one_warning(warm, tmp_path, kind, damage):
  shutil.copytree(warm, cache := tmp_path / "c")
  check_rebuilt(cache, kind, damage)

@pytest.mark.parametrize("kind", ["schedule", "program"])
def test_whole_entry_of_another_format_is_rebuilt(warm, tmp_path, kind):
  shutil.copytree(warm, cache := tmp_path / "c")
  check_rebuilt(cache, kind, foreign)

# one small kernel: BEAM compiles a few dozen candidates of it
BEAM_SCRIPT = """
import json
import numpy as np
from attograd import Tensor
import attograd.engine.search as search
search.MAX_ROUNDS = 1
na = np.random.default_rng(0).integers(-3, 4, (32, 16)).astype(np.float32)
print(json.dumps({"ok": (Tensor(na) - 1).max(axis=0).tolist() == (na - 1).max(0).tolist()}))
"""
BEAM_ENV = {"BEAM": "1", "CACHELEVEL": "1"}  # binaries and BEAM winners: else the program cache answers first

@pytest.fixture(scope="module")
def warm_beam(tmp_path_factory) -> pathlib.Path:
  cache = tmp_path_factory.mktemp("warm_beam")
  first, err = run(cache, BEAM_SCRIPT, **BEAM_ENV)
  assert first["ok"] and err == "" and entries(cache, "beam")
  return cache

@pytest.mark.parametrize("damage", [_truncate, _zero, _garble, _random, foreign], ids=["truncated", "zeroed", "garbled", "random", "foreign"])
def test_damaged_beam_winner_is_searched_again(warm_beam, tmp_path, damage):
  shutil.copytree(warm_beam, cache := tmp_path / "c")
  check_rebuilt(cache, "beam", damage, BEAM_SCRIPT, **BEAM_ENV)

@pytest.mark.parametrize("device", ["LLVM", "CL"])
def test_damaged_binary_of_another_device_is_rebuilt(tmp_path, device):
  if not available(device): pytest.skip(f"{device} can't run here")
  first, err = run(tmp_path, BEAM_SCRIPT, DEV=device, CACHELEVEL="1")  # (its one kernel: PoCL takes 0.3 s a kernel)
  assert first["ok"] and err == ""
  check_rebuilt(tmp_path, device.lower(), _random, BEAM_SCRIPT, DEV=device, CACHELEVEL="1")

def test_damaged_download_is_fetched_again_with_a_warning(tmp_path, capsys, monkeypatch):
  # a dataset in the cache is checked against its published checksum each time it is loaded
  import gzip, http.server, functools, threading
  import attograd.nn.datasets as datasets
  from attograd.nn.datasets import download_mnist, MNIST_FILES
  monkeypatch.setattr(datasets, "_check_mnist", lambda *a, **k: None)  # tiny stand-ins, not 60000 images
  # IDX files of 6 bytes each: magic (uint8, one dimension), the size, the bytes
  blobs = {fn: gzip.compress(bytes([0, 0, 8, 1, 0, 0, 0, 6, i, 1, 2, 3, 4, 5])) for i, fn in enumerate(MNIST_FILES)}
  (www := tmp_path / "www").mkdir()
  for fn, blob in blobs.items(): (www / fn).write_bytes(blob)
  checksums = {fn: "sha256:" + hashlib.sha256(blob).hexdigest() for fn, blob in blobs.items()}
  class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(www)))
  threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
  url, dest = f"http://127.0.0.1:{httpd.server_address[1]}", tmp_path / "cache"
  load = lambda: [a.tolist() for a in download_mnist(base_url=url, checksums=checksums, directory=dest, timeout=5)]
  try:
    want = load()
    assert want[1] == [1, 1, 2, 3, 4, 5]
    for damage in (_truncate, _zero, _garble, _random):
      (p := dest / MNIST_FILES[1]).write_bytes(damage(p.read_bytes()))
      capsys.readouterr()
      assert load() == want
      err = capsys.readouterr().err.splitlines()
      assert len(err) == 1 and err[0].startswith(f"attograd: warning: cache entry {p} is damaged"), err
      assert p.read_bytes() == blobs[MNIST_FILES[1]] and sorted(q.name for q in dest.iterdir()) == sorted(MNIST_FILES)
  finally: httpd.shutdown(); httpd.server_close()

def test_processes_filling_one_empty_cache_at_once_all_work(tmp_path):
  env = {**os.environ, "ATTOGRAD_CACHE": str(tmp_path), "PROGRESS": "0", "DEBUG": "0"}
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(3)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0, 0], [err for _, err in outs]
  assert all(json.loads(out.splitlines()[-1])["ok"] for out, _ in outs) and all(err == "" for _, err in outs)
  assert temporaries(tmp_path) == [] and all(whole(p) for p in tmp_path.glob("*/*") if not p.name.startswith("."))
  after, err = run(tmp_path)
  assert after["ok"] and err == ""

# the child dies (SIGKILL: nothing of Python's shutdown runs) in its Nth cache write, when half of the entry's bytes
# are on disk: just before the rename that an atomic write ends with (a writer that writes in place would be caught
# with its entry half written)
KILL_HOOK = """
import os, signal
_writes, _kill_at, _replace = [0], int(os.environ["KILL_AT_WRITE"]), os.replace
def _dying(src, dst, *a, **k):
  _writes[0] += 1
  if _writes[0] == _kill_at:
    os.truncate(src, os.path.getsize(src) // 2)
    os.kill(os.getpid(), signal.SIGKILL)
  return _replace(src, dst, *a, **k)
os.replace = _dying
"""

@pytest.mark.parametrize("kill_at", [1, 3, 6])
def test_process_killed_while_writing_leaves_no_damage(tmp_path, kill_at):
  proc = subprocess.run([sys.executable, "-c", KILL_HOOK + SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300,
                        env={**os.environ, "ATTOGRAD_CACHE": str(tmp_path), "PROGRESS": "0", "KILL_AT_WRITE": str(kill_at)})
  assert proc.returncode == -9, proc.stderr  # killed in its write, not finished
  (left,) = temporaries(tmp_path)  # the half-written file is a temporary one, never an entry
  assert left.stat().st_size > 0
  done = {p: p.stat().st_ino for p in tmp_path.glob("*/*") if not p.name.startswith(".")}
  assert len(done) == kill_at - 1 and all(whole(p) for p in done)  # what it finished is whole
  after, err = run(tmp_path)
  assert after["ok"] and err == ""
  assert all(p.stat().st_ino == ino for p, ino in done.items())  # and kept: nothing it finished was written again
  again, err = run(tmp_path)
  assert again["ok"] and err == ""

def test_temporaries_of_killed_writers_are_swept(warm, tmp_path):
  shutil.copytree(warm, cache := tmp_path / "c")
  (cache / "cc" / ".x.so.old.tmp").write_bytes(b"half")
  (cache / "cc" / ".x.so.new.tmp").write_bytes(b"half")  # perhaps a live writer's: kept
  os.utime(cache / "cc" / ".x.so.old.tmp", (time.time() - 7200,) * 2)
  shutil.rmtree(cache / "program")  # (so that the next process writes: it sweeps where it writes)
  for p in entries(cache, "cc"): p.unlink()
  out, err = run(cache)
  assert out["ok"] and err == ""
  assert [p.name for p in temporaries(cache)] == [".x.so.new.tmp"]

@pytest.mark.parametrize("blocked", ["root", "lib"])
def test_cache_that_cannot_be_written_is_done_without(tmp_path, blocked):
  # root: the cache's place is a file, so no directory can be made there (a read-only or full disk fails as well);
  # lib: only the loadable libraries' directory can't be made: libraries are loaded from a private file instead
  (tmp_path / "c").mkdir()
  cache = tmp_path / "c" / "cache" if blocked == "root" else tmp_path / "c"
  (tmp_path / "c" / ("cache" if blocked == "root" else "lib")).write_bytes(b"a file")
  for _ in range(2):
    out, err = run(cache)
    assert out["ok"] and out["threaded"]
    assert len(err.splitlines()) == 1 and err.startswith("attograd: warning: can't write the disk cache"), err

def test_cache_needs_no_openssl_and_a_warm_process_no_compiler_thread(tmp_path):
  # hashlib loads OpenSSL's libcrypto on import (3.3 MiB resident, 2 ms): attograd's keys and entry checksums come from
  # CPython's own BLAKE2b, so a process that compiles kernels, writes their entries and reads them back never imports it.
  # A process whose kernels all come from the cache starts no compiler thread (each one's stack and malloc arena), nor
  # imports concurrent.futures (with logging: 0.75 MiB) or subprocess (0.5 MiB)
  script = "import sys, threading\nfrom attograd import Tensor\n" \
           "assert (Tensor([1.0, 2.0, 3.0]) * 2 + 1).tolist() == [3.0, 5.0, 7.0]\n" \
           "a, b = Tensor([[1.0, 2.0], [3.0, 4.0]]).sum(1) * 3, Tensor([5.0, 6.0]).max() + 1\n" \
           "Tensor.realize_all([a, b])  # (two kernels in one schedule: compiled ahead, on the pool)\n" \
           "assert a.tolist() == [9.0, 21.0] and b.item() == 7.0\n" \
           "print('{\"hashlib\": %s, \"compile_modules\": %s, \"compilers\": %d}' % (str(any(m in sys.modules for m in ('hashlib', '_hashlib'))).lower(), " \
           "str(any(m in sys.modules for m in ('concurrent.futures', 'subprocess'))).lower(), sum(t.name.startswith('compile') for t in threading.enumerate())))"
  cold, _ = run(tmp_path, script)
  assert cold["hashlib"] is False and cold["compilers"] > 0  # (cold: the kernels were compiled on the pool's threads)
  assert entries(tmp_path, "lib") and all(whole(p) for kind in ("lib", "cc") for p in entries(tmp_path, kind))
  warm, _ = run(tmp_path, script)  # entries read back and checked
  assert warm == {"hashlib": False, "compile_modules": False, "compilers": 0}
