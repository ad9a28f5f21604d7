"""attograd: a small, fast, hackable deep learning framework."""
from attograd import uop as _uop  # installs the symbolic rules on UOp
from attograd.dtype import dtypes, DType
from attograd.helpers import Context, GlobalCounters, DEBUG, getenv
from attograd.runtime.device import Device
from attograd.tensor import Tensor
from attograd.uop.ops import UOp, Ops
from attograd.jit import TinyJit, JitError
from attograd.gradient import no_grad, enable_grad, inference_mode, is_grad_enabled, set_grad_enabled
Variable = UOp.variable  # Variable('pos', 0, 1023).bind(5): a value kernels take as an argument

__all__ = ["Tensor", "dtypes", "DType", "Device", "Context", "GlobalCounters", "UOp", "Ops", "TinyJit", "JitError", "Variable",
           "no_grad", "enable_grad", "inference_mode", "is_grad_enabled", "set_grad_enabled"]
__version__ = "0.1.0"
