"""Tensor methods grouped by what they do, as mixins of attograd.tensor.Tensor. They build on the
primitives in tensor.py (through self and type(self)) and never import it: tensor.py imports them."""
