"""attograd: a small, fast, hackable deep learning framework."""
from attograd import uop as _uop  # installs the symbolic rules on UOp
from attograd.dtype import dtypes, DType
from attograd.helpers import Context, GlobalCounters, DEBUG, getenv
from attograd.runtime.device import Device
from attograd.tensor import Tensor
from attograd.uop.ops import UOp, Ops
from attograd.jit import TinyJit, JitError
Variable = UOp.variable  # Variable('pos', 0, 1023).bind(5): a value kernels take as an argument

__all__ = ["Tensor", "dtypes", "DType", "Device", "Context", "GlobalCounters", "UOp", "Ops", "TinyJit", "JitError", "Variable"]
__version__ = "0.1.0"
