"""Models over the public Tensor API (nothing in the core imports them)."""
