"""The visualizer's local web server: the page and its assets (static/, shipped in the package: works offline) and the
trace as JSON endpoints. Only 127.0.0.1 is bound.

  GET /api/summary      groups (kernels, schedules), passes without their steps, launches, rule count
  GET /api/pass/N       pass N with its steps, the rules they name and every node they touch
  GET /api/group/N      group N (a kernel: AST nodes, Opts, linear uops, source)"""
from __future__ import annotations
import json, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

def _reachable(nodes: list[list[Any]], roots: list[int]) -> dict[int, list[Any]]:
  """The node rows below these roots, by id."""
  out: dict[int, list[Any]] = {}
  stack = [r for r in roots if r >= 0]
  while stack:
    i = stack.pop()
    if i in out: continue
    out[i] = nodes[i]
    stack.extend(s for s in nodes[i][3] if s not in out)
  return out

class TraceAPI:
  """The JSON answers for one trace (loaded data: a saved file or a live Trace turned to JSON)."""
  def __init__(self, data: dict[str, Any]):
    self.data = data
  def summary(self) -> dict[str, Any]:
    d = self.data
    passes = [{k: v for k, v in p.items() if k != "steps"} | {"nsteps": len(p["steps"])} for p in d["passes"]]
    groups = [{k: v for k, v in g.items() if k not in ("src", "uops", "items")} for g in d["groups"]]
    return {"groups": groups, "passes": passes, "events": d["events"], "skipped": d["skipped"], "nrules": len(d["rules"]),
            "transfers": d.get("transfers", []), "memory": d.get("memory", [])}
  def pass_(self, i: int) -> dict[str, Any]:
    p = self.data["passes"][i]
    roots = [p["input"], p["output"]] + [x for s in p["steps"] for x in s[:2]]
    rules = {r: self.data["rules"][r] for s in p["steps"] if (r := s[2]) >= 0}
    return p | {"index": i, "nodes": _reachable(self.data["nodes"], roots), "rules": rules}
  def group(self, i: int) -> dict[str, Any]:
    g = self.data["groups"][i]
    # a kernel: why the schedules that ran it made its output a buffer (each reason once)
    why = {tuple(it["why"]): None for s in self.data["groups"] if s["kind"] == "schedule" for it in s.get("items", [])
           if it["kernel"] == i and it.get("why")} if g["kind"] == "kernel" else {}
    return g | {"index": i, "nodes": _reachable(self.data["nodes"], [g.get("ast", -1)]), "why": [list(w) for w in why]}
  def answer(self, path: str) -> dict[str, Any] | None:
    parts = path.strip("/").split("/")
    try:
      if parts == ["api", "summary"]: return self.summary()
      if len(parts) == 3 and parts[:2] == ["api", "pass"]: return self.pass_(int(parts[2]))
      if len(parts) == 3 and parts[:2] == ["api", "group"]: return self.group(int(parts[2]))
    except (ValueError, IndexError): return None
    return None

def make_server(data: dict[str, Any], port: int) -> ThreadingHTTPServer:
  api = TraceAPI(data)
  class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None: pass  # quiet: the terminal shows the URL, not every request
    def send(self, code: int, body: bytes, ctype: str) -> None:
      self.send_response(code)
      self.send_header("Content-Type", ctype)
      self.send_header("Content-Length", str(len(body)))
      self.send_header("Cache-Control", "no-store")
      self.end_headers()
      self.wfile.write(body)
    def do_GET(self) -> None:
      path = self.path.split("?", 1)[0]
      if path.startswith("/api/"):
        ans = api.answer(path)
        if ans is None: return self.send(404, b'{"error": "no such item"}', "application/json")
        return self.send(200, json.dumps(ans, separators=(",", ":")).encode(), "application/json")
      name = "index.html" if path in ("/", "/index.html") else path.removeprefix("/static/")
      # only the files shipped in static/ and static/vendor/, by plain name: no path reaches outside them
      folder, _, base = name.rpartition("/")
      if folder not in ("", "vendor") or base not in os.listdir(os.path.join(STATIC, folder)) or os.path.splitext(base)[1] not in TYPES:
        return self.send(404, b"not found", "text/plain")
      with open(os.path.join(STATIC, name), "rb") as f: self.send(200, f.read(), TYPES[os.path.splitext(name)[1]])
  return ThreadingHTTPServer(("127.0.0.1", port), Handler)

def serve(data: dict[str, Any], port: int) -> None:
  """Serve until Ctrl-C, printing the URL (port 0: a free port, the URL says which)."""
  try: srv = make_server(data, port)
  except OSError as e: raise SystemExit(f"VIZ: can't listen on 127.0.0.1:{port} ({e.strerror}); set VIZ_PORT to a free port") from None
  print(f"VIZ: serving at http://127.0.0.1:{srv.server_address[1]} (Ctrl-C to stop)", flush=True)
  try: srv.serve_forever()
  except KeyboardInterrupt: pass
  finally: srv.server_close()
