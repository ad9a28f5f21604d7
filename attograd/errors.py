"""The errors the front end raises, each also a RuntimeError: PyTorch raises RuntimeError for bad shapes and
arguments and for out-of-range gathers, so code written against torch (`except RuntimeError`) catches ours, while
code written for tinygrad/Python conventions (`except ValueError`, `except IndexError`) keeps working."""

class ArgumentError(ValueError, RuntimeError):
  """A shape or an argument the op can't take (shapes that don't broadcast, a bad size, an unknown mode)."""

class IndexOutOfRange(IndexError, RuntimeError):
  """An index value outside its axis."""

class UnsupportedDtype(TypeError, NotImplementedError):
  """An op the tensor's dtype doesn't have (a shift or bitwise op on floats, a gather by a float index), or data no dtype
  fits (`Tensor(object())`): torch raises NotImplementedError or RuntimeError (NotImplementedError is one), Python
  conventions a TypeError; this is all three."""
