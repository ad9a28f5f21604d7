"""torch.optim.lr_scheduler's schedulers, with its update rules step by step (the same recursive formulas, so the
values agree to float rounding). Each sets group["lr"], which writes the Tensor the update kernels read: no recompile,
and a TinyJit replay sees the new rate."""
from __future__ import annotations
import bisect, math
from collections import Counter
from typing import Any, Callable, Sequence

class LRScheduler:
  def __init__(self, optimizer: Any, last_epoch: int = -1):
    self.optimizer = optimizer
    if last_epoch == -1:
      for g in optimizer.param_groups: g.setdefault("initial_lr", g["lr"])
    elif any("initial_lr" not in g for g in optimizer.param_groups):
      raise KeyError("param group without 'initial_lr': resuming (last_epoch != -1) needs the groups a scheduler made")
    self.base_lrs: list[float] = [g["initial_lr"] for g in optimizer.param_groups]
    self.last_epoch = last_epoch
    self._step_count = 0
    self._initial_step()
  def _initial_step(self) -> None:
    self._step_count = 0
    self.step()
  def get_lr(self) -> list[float]: raise NotImplementedError
  def get_last_lr(self) -> list[float]: return self._last_lr
  def step(self, epoch: int | None = None) -> None:
    self._step_count += 1
    if epoch is None:
      self.last_epoch += 1
      values = self.get_lr()
    else:  # (torch deprecates this form; SequentialLR uses it to restart a scheduler)
      self.last_epoch = epoch
      values = self._closed_form() if hasattr(self, "_closed_form") else self.get_lr()
    for g, lr in zip(self.optimizer.param_groups, values): g["lr"] = lr
    self._last_lr = [g["lr"] for g in self.optimizer.param_groups]
  def _lrs(self) -> list[float]: return [g["lr"] for g in self.optimizer.param_groups]
  def state_dict(self) -> dict[str, Any]:
    return {k: v for k, v in self.__dict__.items() if k != "optimizer" and not callable(v) and k != "lr_lambdas"}
  def load_state_dict(self, state_dict: dict[str, Any]) -> None: self.__dict__.update(state_dict)
_LRScheduler = LRScheduler

def _per_group(v: Any, n: int, what: str) -> list[Any]:
  if isinstance(v, (list, tuple)):
    if len(v) != n: raise ValueError(f"expected {n} values of {what}, one per param group, got {len(v)}")
    return list(v)
  return [v] * n

class LambdaLR(LRScheduler):
  def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]], last_epoch: int = -1):
    self.lr_lambdas = _per_group(lr_lambda, len(optimizer.param_groups), "lr_lambda")
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]: return [b * f(self.last_epoch) for b, f in zip(self.base_lrs, self.lr_lambdas)]

class MultiplicativeLR(LRScheduler):
  def __init__(self, optimizer: Any, lr_lambda: Callable[[int], float] | Sequence[Callable[[int], float]], last_epoch: int = -1):
    self.lr_lambdas = _per_group(lr_lambda, len(optimizer.param_groups), "lr_lambda")
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch > 0: return [lr * f(self.last_epoch) for lr, f in zip(self._lrs(), self.lr_lambdas)]
    return self._lrs()

class StepLR(LRScheduler):
  def __init__(self, optimizer: Any, step_size: int, gamma: float = 0.1, last_epoch: int = -1):
    self.step_size, self.gamma = step_size, gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch == 0 or self.last_epoch % self.step_size: return self._lrs()
    return [lr * self.gamma for lr in self._lrs()]
  def _closed_form(self) -> list[float]: return [b * self.gamma ** (self.last_epoch // self.step_size) for b in self.base_lrs]

class MultiStepLR(LRScheduler):
  def __init__(self, optimizer: Any, milestones: Sequence[int], gamma: float = 0.1, last_epoch: int = -1):
    self.milestones, self.gamma = Counter(milestones), gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch not in self.milestones: return self._lrs()
    return [lr * self.gamma ** self.milestones[self.last_epoch] for lr in self._lrs()]
  def _closed_form(self) -> list[float]:
    k = bisect.bisect_right(sorted(self.milestones.elements()), self.last_epoch)
    return [b * self.gamma ** k for b in self.base_lrs]

class ConstantLR(LRScheduler):
  def __init__(self, optimizer: Any, factor: float = 1.0 / 3, total_iters: int = 5, last_epoch: int = -1):
    if not 0 <= factor <= 1: raise ValueError(f"ConstantLR's factor must be in [0, 1], got {factor}")
    self.factor, self.total_iters = factor, total_iters
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch == 0: return [lr * self.factor for lr in self._lrs()]
    if self.last_epoch != self.total_iters: return self._lrs()
    return [lr * (1.0 / self.factor) for lr in self._lrs()]
  def _closed_form(self) -> list[float]:
    return [b * (self.factor + (self.last_epoch >= self.total_iters) * (1 - self.factor)) for b in self.base_lrs]

class LinearLR(LRScheduler):
  def __init__(self, optimizer: Any, start_factor: float = 1.0 / 3, end_factor: float = 1.0, total_iters: int = 5, last_epoch: int = -1):
    if not 0 < start_factor <= 1: raise ValueError(f"LinearLR's start_factor must be in (0, 1], got {start_factor}")
    if not 0 <= end_factor <= 1: raise ValueError(f"LinearLR's end_factor must be in [0, 1], got {end_factor}")
    self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch == 0: return [lr * self.start_factor for lr in self._lrs()]
    if self.last_epoch > self.total_iters: return self._lrs()
    d = self.end_factor - self.start_factor
    return [lr * (1.0 + d / (self.total_iters * self.start_factor + (self.last_epoch - 1) * d)) for lr in self._lrs()]
  def _closed_form(self) -> list[float]:
    return [b * (self.start_factor + (self.end_factor - self.start_factor) * min(self.total_iters, self.last_epoch) / self.total_iters)
            for b in self.base_lrs]

class ExponentialLR(LRScheduler):
  def __init__(self, optimizer: Any, gamma: float, last_epoch: int = -1):
    self.gamma = gamma
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]: return self._lrs() if self.last_epoch == 0 else [lr * self.gamma for lr in self._lrs()]
  def _closed_form(self) -> list[float]: return [b * self.gamma ** self.last_epoch for b in self.base_lrs]

class PolynomialLR(LRScheduler):
  def __init__(self, optimizer: Any, total_iters: int = 5, power: float = 1.0, last_epoch: int = -1):
    self.total_iters, self.power = total_iters, power
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    if self.last_epoch == 0 or self.last_epoch > self.total_iters: return self._lrs()
    f = ((1.0 - self.last_epoch / self.total_iters) / (1.0 - (self.last_epoch - 1) / self.total_iters)) ** self.power
    return [lr * f for lr in self._lrs()]
  def _closed_form(self) -> list[float]:
    return [b * (1.0 - min(self.total_iters, self.last_epoch) / self.total_iters) ** self.power for b in self.base_lrs]

class CosineAnnealingLR(LRScheduler):
  def __init__(self, optimizer: Any, T_max: int, eta_min: float = 0.0, last_epoch: int = -1):
    self.T_max, self.eta_min = T_max, eta_min
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    e, T, lo = self.last_epoch, self.T_max, self.eta_min
    if e == 0: return self._lrs()
    if self._step_count == 1 and e > 0:  # resumed at epoch e: the closed form
      return [lo + (b - lo) * (1 + math.cos(e * math.pi / T)) / 2 for b in self.base_lrs]
    if (e - 1 - T) % (2 * T) == 0: return [lr + (b - lo) * (1 - math.cos(math.pi / T)) / 2 for lr, b in zip(self._lrs(), self.base_lrs)]
    return [(1 + math.cos(math.pi * e / T)) / (1 + math.cos(math.pi * (e - 1) / T)) * (lr - lo) + lo for lr in self._lrs()]
  def _closed_form(self) -> list[float]:
    return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.last_epoch / self.T_max)) / 2 for b in self.base_lrs]

class CosineAnnealingWarmRestarts(LRScheduler):
  def __init__(self, optimizer: Any, T_0: int, T_mult: int = 1, eta_min: float = 0.0, last_epoch: int = -1):
    if T_0 <= 0 or not isinstance(T_0, int): raise ValueError(f"T_0 must be a positive integer, got {T_0}")
    if T_mult < 1 or not isinstance(T_mult, int): raise ValueError(f"T_mult must be an integer >= 1, got {T_mult}")
    self.T_0, self.T_i, self.T_mult, self.eta_min, self.T_cur = T_0, T_0, T_mult, eta_min, last_epoch
    super().__init__(optimizer, last_epoch)
  def get_lr(self) -> list[float]:
    return [self.eta_min + (b - self.eta_min) * (1 + math.cos(math.pi * self.T_cur / self.T_i)) / 2 for b in self.base_lrs]
  def step(self, epoch: float | None = None) -> None:
    if epoch is None:
      epoch = self.last_epoch + 1
      self.T_cur += 1
      if self.T_cur >= self.T_i: self.T_cur, self.T_i = self.T_cur - self.T_i, self.T_i * self.T_mult
    elif epoch >= self.T_0:
      if self.T_mult == 1: self.T_cur = epoch % self.T_0
      else:
        n = int(math.log(epoch / self.T_0 * (self.T_mult - 1) + 1, self.T_mult))
        self.T_cur, self.T_i = epoch - self.T_0 * (self.T_mult ** n - 1) / (self.T_mult - 1), self.T_0 * self.T_mult ** n
    else: self.T_i, self.T_cur = self.T_0, epoch
    self.last_epoch = math.floor(epoch)
    self._step_count += 1
    for g, lr in zip(self.optimizer.param_groups, self.get_lr()): g["lr"] = lr
    self._last_lr = self._lrs()

class OneCycleLR(LRScheduler):
  """The 1cycle policy: the rate climbs from max_lr/div_factor to max_lr over pct_start of the steps, then anneals to
  initial/final_div_factor; momentum (or Adam's beta1) cycles the other way between max_momentum and base_momentum."""
  def __init__(self, optimizer: Any, max_lr: float | Sequence[float], total_steps: int | None = None, epochs: int | None = None,
               steps_per_epoch: int | None = None, pct_start: float = 0.3, anneal_strategy: str = "cos", cycle_momentum: bool = True,
               base_momentum: float | Sequence[float] = 0.85, max_momentum: float | Sequence[float] = 0.95, div_factor: float = 25.0,
               final_div_factor: float = 1e4, three_phase: bool = False, last_epoch: int = -1):
    if total_steps is None:
      if epochs is None or steps_per_epoch is None: raise ValueError("OneCycleLR needs total_steps, or epochs and steps_per_epoch")
      total_steps = epochs * steps_per_epoch
    if total_steps <= 0: raise ValueError(f"OneCycleLR's total_steps must be positive, got {total_steps}")
    if not 0 <= pct_start <= 1: raise ValueError(f"pct_start must be in [0, 1], got {pct_start}")
    if anneal_strategy not in ("cos", "linear"): raise ValueError(f"anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}")
    self.total_steps, self.cycle_momentum = total_steps, cycle_momentum
    self._anneal = self._cos if anneal_strategy == "cos" else self._linear
    p = float(pct_start * total_steps)
    if three_phase:
      self._phases = [(p - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"), (2 * p - 2, "max_lr", "initial_lr", "base_momentum", "max_momentum"),
                      (total_steps - 1, "initial_lr", "min_lr", "max_momentum", "max_momentum")]
    else: self._phases = [(p - 1, "initial_lr", "max_lr", "max_momentum", "base_momentum"), (total_steps - 1, "max_lr", "min_lr", "base_momentum", "max_momentum")]
    groups = optimizer.param_groups
    if last_epoch == -1:
      for g, m in zip(groups, _per_group(max_lr, len(groups), "max_lr")):
        g["initial_lr"], g["max_lr"] = m / div_factor, m
        g["min_lr"] = g["initial_lr"] / final_div_factor
    if cycle_momentum:
      self._beta = "betas" in optimizer.defaults
      if not self._beta and "momentum" not in optimizer.defaults: raise ValueError("cycle_momentum needs an optimizer with momentum or betas")
      for g, mo, bm in zip(groups, _per_group(max_momentum, len(groups), "max_momentum"), _per_group(base_momentum, len(groups), "base_momentum")):
        if last_epoch == -1: self._set_momentum(g, mo)
        g["max_momentum"], g["base_momentum"] = mo, bm
    super().__init__(optimizer, last_epoch)
  @staticmethod
  def _cos(start: float, end: float, pct: float) -> float: return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
  @staticmethod
  def _linear(start: float, end: float, pct: float) -> float: return (end - start) * pct + start
  def _set_momentum(self, g: Any, m: float) -> None:
    if self._beta: g["betas"] = (m, *g["betas"][1:])
    else: g["momentum"] = m
  def get_lr(self) -> list[float]:
    step = self.last_epoch
    if step > self.total_steps: raise ValueError(f"OneCycleLR stepped {step} times, more than total_steps={self.total_steps}")
    out = []
    for g in self.optimizer.param_groups:
      start = 0.0
      for i, (end, lr0, lr1, m0, m1) in enumerate(self._phases):
        if step <= end or i == len(self._phases) - 1:
          pct = (step - start) / (end - start)
          out.append(self._anneal(g[lr0], g[lr1], pct))
          if self.cycle_momentum: self._set_momentum(g, self._anneal(g[m0], g[m1], pct))
          break
        start = end
    return out

class SequentialLR(LRScheduler):
  """Runs schedulers[i] from milestones[i-1] on; each after the first restarts at its epoch 0 when its turn comes."""
  def __init__(self, optimizer: Any, schedulers: Sequence[LRScheduler], milestones: Sequence[int], last_epoch: int = -1):
    if len(schedulers) < 1: raise ValueError("SequentialLR needs at least one scheduler")
    if any(s.optimizer is not optimizer for s in schedulers): raise ValueError("SequentialLR's schedulers must all use its optimizer")
    if len(milestones) != len(schedulers) - 1:
      raise ValueError(f"SequentialLR needs {len(schedulers) - 1} milestones for {len(schedulers)} schedulers, got {len(milestones)}")
    self.optimizer, self._schedulers, self._milestones, self.last_epoch = optimizer, list(schedulers), list(milestones), last_epoch + 1
    for g in optimizer.param_groups: g["lr"] = g["initial_lr"]  # undo what constructing the schedulers did
    for s in self._schedulers: s.last_epoch -= 1
    self._schedulers[0]._initial_step()
    self._last_lr = self._schedulers[0].get_last_lr()
  def step(self, epoch: int | None = None) -> None:
    self.last_epoch += 1
    i = bisect.bisect_right(self._milestones, self.last_epoch)
    s = self._schedulers[i]
    if i > 0 and self._milestones[i - 1] == self.last_epoch: s.step(0)
    else: s.step()
    self._last_lr = s.get_last_lr()

class ChainedScheduler(LRScheduler):
  def __init__(self, schedulers: Sequence[LRScheduler], optimizer: Any = None):
    self._schedulers = list(schedulers)
    self.optimizer = optimizer or self._schedulers[0].optimizer
    self._last_lr = self._lrs()
  def step(self, epoch: int | None = None) -> None:
    for s in self._schedulers: s.step()
    self._last_lr = self._lrs()

class ReduceLROnPlateau:
  """Divide the rate by 1/factor when a metric stops improving for `patience` steps (torch's rule, its thresholds)."""
  def __init__(self, optimizer: Any, mode: str = "min", factor: float = 0.1, patience: int = 10, threshold: float = 1e-4,
               threshold_mode: str = "rel", cooldown: int = 0, min_lr: float | Sequence[float] = 0.0, eps: float = 1e-8):
    if factor >= 1.0: raise ValueError(f"ReduceLROnPlateau's factor must be < 1, got {factor}")
    if mode not in ("min", "max") or threshold_mode not in ("rel", "abs"): raise ValueError(f"bad mode {mode!r} or threshold_mode {threshold_mode!r}")
    self.optimizer, self.mode, self.factor, self.patience, self.threshold = optimizer, mode, factor, patience, threshold
    self.threshold_mode, self.cooldown, self.eps = threshold_mode, cooldown, eps
    self.min_lrs = _per_group(min_lr, len(optimizer.param_groups), "min_lr")
    self.best, self.num_bad_epochs, self.cooldown_counter, self.last_epoch = (math.inf if mode == "min" else -math.inf), 0, 0, 0
    self._last_lr = [g["lr"] for g in optimizer.param_groups]
  def _better(self, a: float, best: float) -> bool:
    if self.mode == "min": return a < (best * (1 - self.threshold) if self.threshold_mode == "rel" else best - self.threshold)
    return a > (best * (1 + self.threshold) if self.threshold_mode == "rel" else best + self.threshold)
  def step(self, metrics: Any) -> None:
    current = float(metrics)
    self.last_epoch += 1
    if self._better(current, self.best): self.best, self.num_bad_epochs = current, 0
    else: self.num_bad_epochs += 1
    if self.cooldown_counter > 0: self.cooldown_counter, self.num_bad_epochs = self.cooldown_counter - 1, 0
    if self.num_bad_epochs > self.patience:
      for g, lo in zip(self.optimizer.param_groups, self.min_lrs):
        new = max(g["lr"] * self.factor, lo)
        if g["lr"] - new > self.eps: g["lr"] = new
      self.cooldown_counter, self.num_bad_epochs = self.cooldown, 0
    self._last_lr = [g["lr"] for g in self.optimizer.param_groups]
  def get_last_lr(self) -> list[float]: return self._last_lr
