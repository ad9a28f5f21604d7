"""Optimizers. One step() realizes every parameter update (and optimizer state) together, and the
learning rate is a Tensor, so a schedule changing it reuses the same compiled kernels."""
from __future__ import annotations
from attograd.tensor import Tensor
from attograd.dtype import dtypes

class Optimizer:
  def __init__(self, params: list[Tensor], lr: float):
    # like tinygrad: parameters handed to an optimizer require grad unless explicitly set False
    for p in params:
      if p.requires_grad is None: p.requires_grad = True
    self.params = [p for p in dict.fromkeys(params) if p.requires_grad]
    if not self.params: raise ValueError("optimizer got no parameters that require grad")
    self.lr = Tensor([lr], dtype=dtypes.float32, device=self.params[0].device).realize()
    self.state: list[Tensor] = []  # buffers realized with the parameters on each step
  def zero_grad(self) -> None:
    for p in self.params: p.grad = None
  def step(self) -> None:
    Tensor.realize_all(self.schedule_step())
  def schedule_step(self) -> list[Tensor]:
    """Assign the updates lazily and return everything that must be realized for them."""
    for i, p in enumerate(self.params):
      if p.grad is None: continue
      p.assign(self._update(i, p, p.grad.detach().cast(p.dtype)).cast(p.dtype))
    return [*self.params, *self.state]
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor: raise NotImplementedError
  def _zeros_like_params(self) -> list[Tensor]:
    return [Tensor.zeros(*p.shape, dtype=p.dtype, device=p.device).contiguous().realize() for p in self.params]

class SGD(Optimizer):
  def __init__(self, params: list[Tensor], lr: float = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
    super().__init__(params, lr)
    if nesterov and momentum <= 0: raise ValueError("nesterov momentum needs momentum > 0")
    self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
    self.buf = self._zeros_like_params() if momentum else []
    self.state = self.buf
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    if self.weight_decay: g = g + self.weight_decay * p
    if self.momentum:
      b = self.buf[i].assign(self.momentum * self.buf[i] + g)  # torch's first step sets buf = g: same as 0*m + g
      g = g + self.momentum * b if self.nesterov else b
    return p - self.lr * g

class LAMB(Optimizer):
  """Adam moments with a per-parameter trust ratio ||p|| / ||update|| (LAMB); adam=True skips the
  ratio and gives AdamW's decoupled weight decay."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False):
    super().__init__(params, lr)
    self.b1, self.b2, self.eps, self.weight_decay, self.adam = b1, b2, eps, weight_decay, adam
    dev = self.params[0].device
    self.b1_t, self.b2_t = Tensor([1.0], device=dev).realize(), Tensor([1.0], device=dev).realize()
    self.m, self.v = self._zeros_like_params(), self._zeros_like_params()
    self.state = [self.b1_t, self.b2_t, *self.m, *self.v]
  def schedule_step(self) -> list[Tensor]:
    self.b1_t.assign(self.b1_t * self.b1)
    self.b2_t.assign(self.b2_t * self.b2)
    return super().schedule_step()
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor:
    m = self.m[i].assign(self.b1 * self.m[i] + (1 - self.b1) * g)
    v = self.v[i].assign(self.b2 * self.v[i] + (1 - self.b2) * g.square())
    m_hat, v_hat = m / (1 - self.b1_t), v / (1 - self.b2_t)
    up = m_hat / (v_hat.sqrt() + self.eps)
    if self.adam: return p * (1 - self.lr * self.weight_decay) - self.lr * up if self.weight_decay else p - self.lr * up
    up = up + self.weight_decay * p
    pn, un = p.square().sum().sqrt(), up.square().sum().sqrt()
    trust = ((pn > 0) & (un > 0)).where(pn / un, 1.0)
    return p - self.lr * trust * up

def AdamW(params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.01) -> LAMB:
  return LAMB(params, lr, b1, b2, eps, weight_decay, adam=True)

class Adam(LAMB):
  """torch.optim.Adam: weight_decay is L2, added to the gradient (AdamW decouples it)."""
  def __init__(self, params: list[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0):
    super().__init__(params, lr, b1, b2, eps, 0.0, adam=True)
    self.l2 = weight_decay
  def _update(self, i: int, p: Tensor, g: Tensor) -> Tensor: return super()._update(i, p, g + self.l2 * p if self.l2 else g)
