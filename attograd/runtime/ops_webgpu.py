"""WEBGPU device: WGSL compute shaders run through the `wgpu` package (wgpu-native). Headless; in CI
on Mesa's lavapipe, a software Vulkan driver (Debian: mesa-vulkan-drivers libvulkan1).

Buffers are GPUBuffers padded to whole 4-byte words (WGSL storage is word addressed). Kernel
scalars go through one uniform buffer per program, rewritten before each dispatch: the queue keeps
the write ordered after earlier dispatches and before this one."""
from __future__ import annotations
import functools, re, struct
from typing import Any
from attograd.runtime.device import Allocator, Compiler, Compiled
from attograd.renderer.wgsl import WGSLRenderer

# the optional dtypes of the renderer, as adapter features (wgpu-native names)
OPTIONAL_FEATURES = ("shader-f16", "shader-int64", "shader-f64")
# limits worth raising to what the adapter allows: kernels with many inputs, big buffers
RAISED_LIMITS = ("max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size", "max-buffer-size",
                 "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                 "max-compute-workgroup-size-x", "max-compute-workgroup-size-y", "max-compute-workgroup-size-z")

# llvmpipe (lavapipe) ends a shader's loop nest after this many iterations, silently
LLVMPIPE_LOOP_LIMIT = 65535

def _round4(n: int) -> int: return (n + 3) // 4 * 4

@functools.cache
def wgpu_device() -> tuple[Any, Any, Any]:
  """(wgpu module, GPUAdapter, GPUDevice), made once per process."""
  try: import wgpu
  except ImportError as e:
    raise RuntimeError("the WEBGPU device needs the wgpu package: pip install 'attograd[webgpu]' (or pip install wgpu)") from e
  adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
  if adapter is None:
    raise RuntimeError("WEBGPU found no adapter: install a Vulkan driver (Debian: apt-get install mesa-vulkan-drivers libvulkan1)")
  features = [f for f in OPTIONAL_FEATURES if f in adapter.features]
  limits = {k: adapter.limits[k] for k in RAISED_LIMITS if k in adapter.limits}
  return wgpu, adapter, adapter.request_device_sync(required_features=features, required_limits=limits)

class WebgpuAllocator(Allocator):
  def __init__(self, wgpu: Any, device: Any):
    self.wgpu, self.device = wgpu, device
  def alloc(self, nbytes: int) -> Any:
    usage = self.wgpu.BufferUsage.STORAGE | self.wgpu.BufferUsage.COPY_SRC | self.wgpu.BufferUsage.COPY_DST
    # at least one 8-byte element: an array<i64> binding of an empty tensor must still hold one
    return self.device.create_buffer(size=max(_round4(nbytes), 8), usage=usage)
  def copyin(self, dest: Any, src: memoryview) -> None:
    data = bytes(src.cast("B"))
    if not data: return
    if len(data) % 4:  # writes are whole words: keep the bytes after the data as they are
      tail = self.device.queue.read_buffer(dest, len(data) // 4 * 4, 4)
      data += bytes(tail)[len(data) % 4:]
    self.device.queue.write_buffer(dest, 0, data)
  def copyout(self, dest: memoryview, src: Any) -> None:
    dest.cast("B")[:] = memoryview(self.device.queue.read_buffer(src, 0, _round4(dest.nbytes))).cast("B")[:dest.nbytes]

# the renderer declares one binding per line: storage buffers (read or read_write) then the uniform
_BINDING = re.compile(r"@binding\((\d+)\) var<(storage, read_write|storage, read|uniform)>")

class WebgpuProgram:
  def __init__(self, device: Any, wgpu: Any, name: str, lib: bytes):
    self.device, self.wgpu, self.name = device, wgpu, name
    src = lib.decode()
    try: module = device.create_shader_module(code=src)
    except Exception as e: raise RuntimeError(f"WEBGPU failed to compile a kernel: {e}\n--- source ---\n{src}") from e
    kinds = {"storage, read_write": wgpu.BufferBindingType.storage, "storage, read": wgpu.BufferBindingType.read_only_storage,
             "uniform": wgpu.BufferBindingType.uniform}
    entries = [{"binding": int(b), "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kinds[k]}} for b, k in _BINDING.findall(src)]
    self.layout = device.create_bind_group_layout(entries=entries)
    layout = device.create_pipeline_layout(bind_group_layouts=[self.layout])
    self.pipeline = device.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": name})
    # uniform scalars: the renderer's struct holds them in order, each aligned to its size
    self.var_fields = re.findall(r"v\d+: (\w+)", src.split("struct Vars", 1)[1].split("}", 1)[0]) if "struct Vars" in src else []
    self.uniform = None
    if self.var_fields:
      self.uniform = device.create_buffer(size=max(16, _round4(8 * len(self.var_fields))),
                                          usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)

  def pack_vars(self, vals: list[int]) -> bytes:
    out = b""
    for t, v in zip(self.var_fields, vals):
      fmt = {"i32": "<i", "u32": "<I", "i64": "<q", "u64": "<Q"}[t]
      size = struct.calcsize(fmt)
      out += b"\0" * (-len(out) % size) + struct.pack(fmt, v)
    return out + b"\0" * (-len(out) % 16)

  def __call__(self, bufs: list[Any], vals: list[int], groups: tuple[int, ...] = (1, 1, 1), local: tuple[int, ...] = (1, 1, 1)) -> None:
    # the work-group size is in the shader (@workgroup_size): only the count of work-groups is dispatched
    if 0 in groups: return
    if (big := max((b.size for b in bufs), default=0)) > (limit := self.device.limits["max-storage-buffer-binding-size"]):
      raise RuntimeError(f"WEBGPU can bind at most {limit} bytes per buffer to a kernel on this adapter; this kernel needs {big}")
    entries = [{"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}} for i, b in enumerate(bufs)]
    if self.uniform is not None:
      self.device.queue.write_buffer(self.uniform, 0, self.pack_vars(vals))
      entries.append({"binding": len(bufs), "resource": {"buffer": self.uniform, "offset": 0, "size": self.uniform.size}})
    bind_group = self.device.create_bind_group(layout=self.layout, entries=entries)
    encoder = self.device.create_command_encoder()
    cpass = encoder.begin_compute_pass()
    cpass.set_pipeline(self.pipeline)
    cpass.set_bind_group(0, bind_group)
    cpass.dispatch_workgroups(*groups)
    cpass.end()
    self.device.queue.submit([encoder.finish()])

class WebgpuDevice(Compiled):
  def __init__(self, name: str):
    wgpu, adapter, device = wgpu_device()
    self.device = device
    # pipelines are cached by source: ASTs that render alike share one
    program = functools.cache(functools.partial(WebgpuProgram, device, wgpu))
    renderer = WGSLRenderer(frozenset(device.features), LLVMPIPE_LOOP_LIMIT if "llvmpipe" in adapter.info["device"] else None)
    lim = device.limits
    renderer.global_max = (lim["max-compute-workgroups-per-dimension"],) * 3
    renderer.local_max = (lim["max-compute-workgroup-size-x"], lim["max-compute-workgroup-size-y"], lim["max-compute-workgroup-size-z"])
    renderer.workgroup_max = lim["max-compute-invocations-per-workgroup"]
    super().__init__(name, WebgpuAllocator(wgpu, device), renderer, Compiler(), program)
  def synchronize(self) -> None:
    # reading a buffer back waits for the work queued before it (wgpu 0.32's on_submitted_work_done_sync
    # passes a callback of the wrong type to wgpu-native)
    if not hasattr(self, "_fence"): self._fence = self.allocator.alloc(4)
    self.device.queue.read_buffer(self._fence, 0, 4)
