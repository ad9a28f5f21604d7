"""A forked child process that answers requests: the engine schedules big new graphs and lowers kernels in one
(engine/realize.py).

Scheduling a graph and lowering a kernel make and drop hundreds of thousands of small objects. In the process that keeps
a model, the few that live on (caches on long-lived nodes, programs, a module imported on first use) land among them,
and CPython returns a 1 MiB arena of small objects to the system only when nothing in it lives: SmolLM2's first run,
scheduling its prompt pass and decode step and lowering their kernels, stays 157 MiB resident where a run with every
template and program cached stays 144. A child forked from this process does that work instead (147), and its garbage
dies with it.

Requests and replies are JSON, each a 4-byte length and the text, on two pipes. The child answers in order; a thread of
this process reads the replies as they come, hands each to `on_reply` (to start compiling it at once) and keeps it for
`result`. Nothing of the child's outlives a reply: it exits when the requests end (`close`), when this process ends,
or when it fails, and `result` then says so instead of waiting."""
from __future__ import annotations
import gc, json, os, struct, sys, threading
from typing import Any, Callable

_LEN = struct.Struct("<I")

def _write(fd: int, msg: Any) -> None:
  data = json.dumps(msg, separators=(",", ":")).encode()
  data = _LEN.pack(len(data)) + data
  while data: data = data[os.write(fd, data):]

def _read(fd: int) -> Any:
  """The next message, or None at the end of the pipe (the other side closed it, or died)."""
  head = _read_exactly(fd, _LEN.size)
  if head is None: return None
  body = _read_exactly(fd, _LEN.unpack(head)[0])
  return None if body is None else json.loads(body)

def _read_exactly(fd: int, n: int) -> bytes | None:
  parts, got = [], 0
  while got < n:
    if not (part := os.read(fd, min(n - got, 1 << 20))): return None
    parts.append(part); got += len(part)
  return b"".join(parts)

class ChildGone(RuntimeError): pass

# this process's ends of the live workers' pipes: a child forked later closes them, or a worker would never see its
# requests end while another child held their write end open
_parent_fds: set[int] = set()

def tell_parent(msg: dict) -> None:
  """(In a child, while it serves a request) send the parent a message before the reply: its worker's `on_told` takes it."""
  assert _replies_fd is not None, "tell_parent: not in a forked worker's child"
  _write(_replies_fd, {"told": msg})

_replies_fd: int | None = None  # (in a child) its end of the replies' pipe

class ForkedWorker:
  """A child forked now, answering each request with `serve(request)` (JSON data in and out; an exception's text goes
  back as {"error": ...}). `on_reply(i, reply)` runs on this process's reader thread as reply i arrives: what it
  returns is kept with the reply (keep it short, and make no UOps there: hash-consing is the main thread's). What the
  child tells while it serves (tell_parent) goes to `on_told(msg)` on the same thread, in order with the replies."""
  def __init__(self, serve: Callable[[Any], Any], on_reply: Callable[[int, Any], Any], on_told: Callable[[Any], None] | None = None):
    self.on_reply, self.on_told = on_reply, on_told
    self.replies: dict[int, tuple[Any, Any]] = {}
    self.sent, self.ended = 0, False
    self.cond = threading.Condition()
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    try: self.pid = os.fork()
    except OSError:
      for fd in (req_r, req_w, rep_r, rep_w): os.close(fd)
      raise
    if self.pid == 0:  # the child: serve until the requests end, then leave without running this process's exit work
      code = 1
      try:
        for fd in (req_w, rep_r, *_parent_fds): os.close(fd)
        # its own output streams: the copies of this process's hold its unwritten output, which is not the child's to write
        sys.stdout, sys.stderr = open(1, "w", buffering=1, closefd=False), open(2, "w", buffering=1, closefd=False)
        gc.freeze()  # what the fork copied is never collected here: the collector walks only what the child makes
        _serve(req_r, rep_w, serve)
        code = 0
      finally: os._exit(code)
    os.close(req_r); os.close(rep_w)
    self.requests, self.replies_fd = req_w, rep_r
    _parent_fds.update((req_w, rep_r))
    # (the thread isn't kept: it would hold this worker, which held it, a cycle; it ends with the replies)
    threading.Thread(target=self._read_replies, name="forked-replies", daemon=True).start()

  def submit(self, request: Any) -> int:
    """Send a request; its number, for result()."""
    _write(self.requests, request)
    self.sent += 1
    return self.sent - 1

  def close(self) -> None:
    """No more requests: the child answers what it has and exits."""
    if self.requests >= 0:
      _parent_fds.discard(self.requests)
      os.close(self.requests)
      self.requests = -1

  def result(self, i: int) -> tuple[Any, Any]:
    """(reply i, what on_reply returned for it), waiting for it; ChildGone if the child ended before answering."""
    with self.cond:
      while i not in self.replies:
        if self.ended: raise ChildGone(f"the forked child (pid {self.pid}) ended before answering request {i}")
        self.cond.wait()
      return self.replies.pop(i)

  def _read_replies(self) -> None:
    i = 0
    try:
      while (reply := _read(self.replies_fd)) is not None:
        if "told" in reply:
          try:
            if self.on_told is not None: self.on_told(reply["told"])
          except Exception: pass  # (what it told is only a head start: the parent asks again for what it needs)
          continue
        kept = None
        if "error" not in reply:
          try: kept = self.on_reply(i, reply)
          except Exception as e: reply = {"error": f"{type(e).__name__} taking the reply: {e}"}
        with self.cond:
          self.replies[i] = (reply, kept)
          self.cond.notify_all()
        i += 1
    finally:
      _parent_fds.discard(self.replies_fd)
      os.close(self.replies_fd)
      os.waitpid(self.pid, 0)
      with self.cond:
        self.ended = True
        self.cond.notify_all()

def _serve(requests: int, replies: int, serve: Callable[[Any], Any]) -> None:
  global _replies_fd
  _replies_fd = replies
  while (req := _read(requests)) is not None:
    try: reply = serve(req)
    except Exception as e: reply = {"error": f"{type(e).__name__}: {e}"}
    _write(replies, reply)
