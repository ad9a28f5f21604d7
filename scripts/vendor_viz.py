"""Vendor the visualizer's JavaScript libraries: for each package pinned in attograd/viz/package.json, `npm pack` it
(the npm registry through the ordinary client), check the tarball against the registry's integrity hash, and copy its
built file and license into attograd/viz/static/vendor/, recording name, version, license and hashes in
static/vendor/VENDORED.json. Run it again after changing a version; the page itself never touches the network.

  python scripts/vendor_viz.py"""
import base64, hashlib, json, pathlib, subprocess, sys, tarfile, tempfile

VIZ = pathlib.Path(__file__).resolve().parent.parent / "attograd" / "viz"
OUT = VIZ / "static" / "vendor"
# the built file to ship from each package's tarball (a browser script defining one global), and the name it gets
BUILT = {"@dagrejs/dagre": ("package/dist/dagre.min.js", "dagre.min.js"), "d3": ("package/dist/d3.min.js", "d3.min.js")}

def npm(*args: str, cwd: str | None = None) -> str:
  return subprocess.run(["npm", *args], check=True, capture_output=True, text=True, cwd=cwd).stdout

def main() -> None:
  deps = json.loads((VIZ / "package.json").read_text())["dependencies"]
  OUT.mkdir(parents=True, exist_ok=True)
  record = {}
  for name, version in deps.items():
    if name not in BUILT: sys.exit(f"{name}: no built file listed in BUILT (scripts/vendor_viz.py)")
    info = json.loads(npm("view", f"{name}@{version}", "--json", "license", "dist.integrity", "dist.tarball"))
    with tempfile.TemporaryDirectory() as tmp:
      tgz = pathlib.Path(tmp) / npm("pack", f"{name}@{version}", "--silent", cwd=tmp).strip().splitlines()[-1]
      algo, want = info["dist.integrity"].split("-", 1)
      if base64.b64encode(hashlib.new(algo, tgz.read_bytes()).digest()).decode() != want: sys.exit(f"{name}@{version}: tarball integrity mismatch")
      src, dst = BUILT[name]
      with tarfile.open(tgz) as tar:
        built = tar.extractfile(src).read()
        lic = next((tar.extractfile(m).read() for m in tar.getmembers() if m.name.lower() in ("package/license", "package/license.md", "package/license.txt")), b"")
    (OUT / dst).write_bytes(built)
    (OUT / f"{dst.split('.')[0]}.LICENSE.txt").write_bytes(lic)
    record[name] = {"version": version, "license": info["license"], "file": dst, "from": src, "tarball": info["dist.tarball"],
                    "integrity": info["dist.integrity"], "sha256": hashlib.sha256(built).hexdigest()}
    print(f"{name}@{version} ({info['license']}): {dst}, {len(built)} bytes")
  (OUT / "VENDORED.json").write_text(json.dumps(record, indent=2) + "\n")

if __name__ == "__main__": main()
