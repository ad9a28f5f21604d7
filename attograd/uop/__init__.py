from attograd.uop.ops import UOp, Ops, GroupOp, sym_infer, exec_alu
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite
from attograd.uop import symbolic as symbolic  # installs UOp.simplify
