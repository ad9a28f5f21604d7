"""An OpenAI-compatible HTTP API over one Engine: GET /v1/models, POST /v1/chat/completions and /v1/completions
(with "stream": true as server-sent events), and a small chat page at /. Requests run one at a time (the engine's
lock): concurrent clients queue, and never share a KV cache. Bad requests get HTTP 400 with an OpenAI-style error."""
from __future__ import annotations
import json, time, uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from attograd.llm.generate import Engine, Sampling, Done

class BadRequest(Exception):
  def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
    super().__init__(message); self.param, self.status, self.code = param, status, code

# request field -> (accepted Python types, Sampling attribute); None values mean "default"
FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
  "max_tokens": ((int,), "max_new_tokens"), "max_completion_tokens": ((int,), "max_new_tokens"),
  "temperature": ((int, float), "temperature"), "top_p": ((int, float), "top_p"), "top_k": ((int,), "top_k"),
  "seed": ((int,), "seed"), "stop": ((str, list), "stop"),
}

def sampling_of(body: dict[str, Any]) -> Sampling:
  s = Sampling(max_new_tokens=256, temperature=1.0)  # OpenAI's default temperature is 1
  for k, (types, attr) in FIELDS.items():
    if body.get(k) is None: continue
    v = body[k]
    if not isinstance(v, types) or isinstance(v, bool): raise BadRequest(f"'{k}' must be of type {' or '.join(t.__name__ for t in types)}, got {type(v).__name__}", k)
    if k == "stop":
      v = [v] if isinstance(v, str) else v
      if not all(isinstance(x, str) for x in v): raise BadRequest("'stop' must be a string or a list of strings", k)
    setattr(s, attr, v)
  try: s.check()
  except ValueError as e: raise BadRequest(str(e)) from None
  return s

def make_handler(engine: Engine) -> type[BaseHTTPRequestHandler]:
  class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args: Any) -> None: pass  # quiet

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
      self.send_response(status)
      self.send_header("Content-Type", ctype); self.send_header("Content-Length", str(len(body)))
      self.end_headers(); self.wfile.write(body)
    def _json(self, status: int, obj: Any) -> None: self._send(status, json.dumps(obj).encode())
    def _error(self, e: BadRequest) -> None:
      self._json(e.status, {"error": {"message": str(e), "type": "invalid_request_error", "param": e.param, "code": e.code}})

    def do_GET(self) -> None:
      if self.path.rstrip("/") == "/v1/models":
        return self._json(200, {"object": "list", "data": [{"id": engine.name, "object": "model", "created": 0, "owned_by": "attograd"}]})
      if self.path in ("/", "/index.html"): return self._send(200, CHAT_PAGE.encode(), "text/html; charset=utf-8")
      self._error(BadRequest(f"no route GET {self.path}", status=404, code="not_found"))

    def do_POST(self) -> None:
      try:
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        try: body = json.loads(raw)
        except ValueError as e: raise BadRequest(f"the request body is not valid JSON ({e})") from None
        if not isinstance(body, dict): raise BadRequest("the request body must be a JSON object")
        route = self.path.rstrip("/")
        if route not in ("/v1/chat/completions", "/v1/completions"): raise BadRequest(f"no route POST {self.path}", status=404, code="not_found")
        model = body.get("model", engine.name)
        if model != engine.name: raise BadRequest(f"the model {model!r} does not exist; this server has {engine.name!r}", "model", 400, "model_not_found")
        s = sampling_of(body)
        stream = body.get("stream", False)
        if not isinstance(stream, bool): raise BadRequest("'stream' must be a boolean", "stream")
        if route == "/v1/chat/completions":
          msgs = body.get("messages")
          if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in msgs):
            raise BadRequest("'messages' must be a non-empty list of {role: string, content: string}", "messages")
          prompt: Any = engine.tok.encode(engine.tok.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in msgs]))
        else:
          prompt = body.get("prompt")
          if not isinstance(prompt, str): raise BadRequest("'prompt' must be a string", "prompt")
        try: gen = engine.stream(prompt, s)
        except ValueError as e: raise BadRequest(str(e)) from None
        self._respond(route == "/v1/chat/completions", gen, s, stream)
      except BadRequest as e: self._error(e)
      except (BrokenPipeError, ConnectionResetError): pass  # the client left: nothing to answer
      except ValueError as e: self._error(BadRequest(str(e)))

    def _respond(self, chat: bool, gen, s: Sampling, stream: bool) -> None:
      rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}", int(time.time())
      obj = "chat.completion" if chat else "text_completion"
      def usage(d: Done) -> dict: return {"prompt_tokens": d.prompt_tokens, "completion_tokens": d.completion_tokens, "total_tokens": d.prompt_tokens + d.completion_tokens}
      if not stream:
        try: d = next(x for x in gen if isinstance(x, Done))
        except ValueError as e: raise BadRequest(str(e)) from None
        choice = {"index": 0, "message": {"role": "assistant", "content": d.text}} if chat else {"index": 0, "text": d.text}
        return self._json(200, {"id": rid, "object": obj, "created": created, "model": engine.name,
                                "choices": [{**choice, "finish_reason": d.finish_reason, "logprobs": None}], "usage": usage(d)})
      self.send_response(200)
      self.send_header("Content-Type", "text/event-stream"); self.send_header("Cache-Control", "no-cache")
      self.send_header("Connection", "close"); self.end_headers()
      self.close_connection = True
      def event(choice: dict, extra: dict | None = None) -> None:
        o = {"id": rid, "object": obj + ".chunk" if chat else obj, "created": created, "model": engine.name, "choices": [choice], **(extra or {})}
        self.wfile.write(f"data: {json.dumps(o)}\n\n".encode()); self.wfile.flush()
      try:
        if chat: event({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})
        for x in gen:
          if isinstance(x, Done):
            event({"index": 0, "delta": {}, "finish_reason": x.finish_reason} if chat else {"index": 0, "text": "", "finish_reason": x.finish_reason}, {"usage": usage(x)})
          else: event({"index": 0, "delta": {"content": x}, "finish_reason": None} if chat else {"index": 0, "text": x, "finish_reason": None})
        self.wfile.write(b"data: [DONE]\n\n"); self.wfile.flush()
      finally: gen.close()  # a client gone mid-stream ends the generation (and frees the engine)
  return Handler

def serve(engine: Engine, port: int = 8000, host: str = "127.0.0.1", ready=None) -> ThreadingHTTPServer:
  httpd = ThreadingHTTPServer((host, port), make_handler(engine))
  httpd.daemon_threads = True
  if ready is not None: ready(httpd)
  return httpd

CHAT_PAGE = """<!doctype html><html><head><meta charset="utf-8"><title>attograd chat</title>
<style>body{font-family:sans-serif;max-width:46em;margin:2em auto}#log div{margin:.4em 0;white-space:pre-wrap}.user{color:#036}
.assistant{color:#222}form{display:flex;gap:.5em}input{flex:1;padding:.4em}</style></head><body><h3>attograd chat</h3>
<div id="log"></div><form id="f"><input id="q" autocomplete="off" placeholder="Ask something"><button>Send</button></form>
<script>
const msgs=[];const log=document.getElementById('log');
function add(role,text){const d=document.createElement('div');d.className=role;d.textContent=text;log.appendChild(d);return d;}
document.getElementById('f').onsubmit=async e=>{e.preventDefault();const q=document.getElementById('q');const text=q.value;if(!text)return;q.value='';
 msgs.push({role:'user',content:text});add('user','> '+text);const out=add('assistant','');
 const r=await fetch('/v1/chat/completions',{method:'POST',headers:{'Content-Type':'application/json'},body:JSON.stringify({messages:msgs,stream:true,temperature:0})});
 const rd=r.body.getReader();const dec=new TextDecoder();let buf='',answer='';
 for(;;){const {value,done}=await rd.read();if(done)break;buf+=dec.decode(value,{stream:true});let i;
  while((i=buf.indexOf('\\n\\n'))>=0){const line=buf.slice(0,i);buf=buf.slice(i+2);if(!line.startsWith('data: '))continue;const data=line.slice(6);
   if(data==='[DONE]')continue;const c=JSON.parse(data).choices[0];if(c.delta&&c.delta.content){answer+=c.delta.content;out.textContent=answer;}}}
 msgs.push({role:'assistant',content:answer});out.className='assistant done';};
</script></body></html>"""
