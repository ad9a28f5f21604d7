"""The rewrite engine: UPat matching, PatternMatcher dispatch, graph_rewrite and hash-consing."""
import pickle
import pytest
from attograd import dtypes
from attograd.uop.ops import UOp, Ops
from attograd.uop.patterns import UPat, PatternMatcher, graph_rewrite, RewriteLoopError

I32, F32 = dtypes.int32, dtypes.float32
def c(v, dt=I32): return UOp.const(dt, v)
x, y = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)
def add(a, b): return UOp(Ops.ADD, a.dtype, (a, b))
def mul(a, b): return UOp(Ops.MUL, a.dtype, (a, b))
def matches(pat, u): return list(pat.match(u, {}))

# ***** UPat *****

def test_match_op_dtype_arg():
  assert matches(UPat(Ops.ADD), add(x, y)) and not matches(UPat(Ops.MUL), add(x, y))
  assert matches(UPat({Ops.ADD, Ops.MUL}), mul(x, y)) and matches(UPat((Ops.ADD, Ops.MUL)), add(x, y))
  assert matches(UPat(dtype=I32), x) and not matches(UPat(dtype=F32), x)
  assert matches(UPat(dtype=(F32, I32)), x)
  assert matches(UPat(Ops.CONST, arg=3), c(3)) and not matches(UPat(Ops.CONST, arg=4), c(3))
  assert matches(UPat.const(I32, 3), c(3)) and not matches(UPat.const(F32, 3), c(3))
  assert matches(UPat(), x) and matches(UPat(), c(1.5, F32))  # no constraint matches anything

def test_name_binding():
  (store,) = matches(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k")), name="root"), add(x, c(2)))
  assert store == {"a": x, "k": c(2), "root": add(x, c(2))}
  assert matches(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))), add(x, y)) == []

def test_same_name_must_bind_same_node():
  twice = UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("a")))
  assert matches(twice, add(x, x)) == [{"a": x}]
  assert matches(twice, add(x, y)) == []
  # across depths too: (a*k) + a
  nested = UPat(Ops.ADD, src=(UPat(Ops.MUL, src=(UPat.var("a"), UPat.cvar("k"))), UPat.var("a")))
  assert matches(nested, add(mul(x, c(3)), x)) and not matches(nested, add(mul(x, c(3)), y))
  # a binding passed in by the caller constrains the match as well
  assert list(UPat.var("a").match(x, {"a": y})) == []

def test_src_tuple_is_ordered():
  pat = UPat(Ops.ADD, src=(UPat(Ops.DEFINE_VAR), UPat(Ops.CONST)))
  assert matches(pat, add(x, c(1))) and not matches(pat, add(c(1), x))

def test_src_list_matches_any_order():
  pat = UPat(Ops.ADD, src=[UPat(Ops.DEFINE_VAR, name="v"), UPat(Ops.CONST, name="k")])
  assert matches(pat, add(x, c(1))) == [{"v": x, "k": c(1)}]
  assert matches(pat, add(c(1), x)) == [{"v": x, "k": c(1)}]
  assert matches(pat, add(x, y)) == []
  # every way of matching is offered: with two variables both assignments come out
  both = matches(UPat(Ops.ADD, src=[UPat.var("a"), UPat.var("b")]), add(x, y))
  assert {(s["a"], s["b"]) for s in both} == {(x, y), (y, x)}

def test_operator_built_patterns_are_commutative():
  pat = UPat.var("a") + UPat.cvar("k")
  assert matches(pat, add(c(5), y)) == [{"a": y, "k": c(5)}]

def test_src_single_upat_repeats():
  all_const = UPat(Ops.ADD, src=UPat(Ops.CONST))
  assert matches(all_const, add(c(1), c(2))) and not matches(all_const, add(c(1), x))
  sink = UOp(Ops.SINK, dtypes.void, (c(1), c(2), c(3), c(4)))
  assert matches(UPat(Ops.SINK, src=UPat(Ops.CONST)), sink)
  assert matches(UPat(Ops.SINK, src=UPat(Ops.CONST, name="k")), sink) == []  # one name can't be four nodes
  assert matches(UPat(Ops.SINK, src=UPat(Ops.CONST)), UOp(Ops.SINK, dtypes.void, ()))  # vacuously

def test_src_length_and_allow_any_len():
  sink = UOp(Ops.SINK, dtypes.void, (x, y, c(1)))
  two = (UPat(Ops.DEFINE_VAR), UPat(Ops.DEFINE_VAR))
  assert matches(UPat(Ops.SINK, src=two), sink) == []
  assert matches(UPat(Ops.SINK, src=two, allow_any_len=True), sink)
  assert matches(UPat(Ops.SINK, src=two + (UPat(), UPat()), allow_any_len=True), sink) == []  # too few sources
  assert matches(UPat(Ops.CONST, src=()), c(1)) and not matches(UPat(Ops.SINK, src=()), sink)

# ***** PatternMatcher *****

class CountingUPat(UPat):
  """A UPat that counts how often the matcher tries it."""
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.tries = 0
  def match(self, u, store):
    self.tries += 1
    return super().match(u, store)

def test_dispatch_on_op():
  mul_pats = [CountingUPat(Ops.MUL, src=(UPat.var("a"), UPat.const(I32, i))) for i in range(200)]
  add_pat = CountingUPat(Ops.ADD, src=(UPat.var("a"), UPat.const(I32, 0)))
  pm = PatternMatcher([(p, lambda a: a) for p in mul_pats] + [(add_pat, lambda a: a)])
  assert pm.rewrite(add(x, c(0))) is x
  assert add_pat.tries == 1 and sum(p.tries for p in mul_pats) == 0  # rules for other ops are never tried
  assert pm.rewrite(UOp(Ops.SUB, I32, (x, c(0)))) is None
  assert pm.rewrite(mul(x, c(7))) is x

def test_rule_order_and_fallthrough():
  seen = []
  pm = PatternMatcher([
    (UPat(Ops.ADD, name="u"), lambda u: seen.append("first")),  # returns None: the next rule is tried
    (UPat(Ops.ADD, name="u"), lambda u: u),                      # returns the node itself: no rewrite either
    (UPat(Ops.ADD, src=(UPat.var("a"), UPat())), lambda a: a),
    (UPat(Ops.ADD, src=(UPat(), UPat.var("b"))), lambda b: b),
  ])
  assert pm.rewrite(add(x, y)) is x and seen == ["first"]
  assert pm.rewrite(mul(x, y)) is None

def test_first_result_is_a_rule_table_lookup():
  # a spec's or autograd's rules return what they are for (a bool, a tuple of gradients), not a node: first_result
  # gives the first such answer; rewrite() only ever gives a node
  spec = PatternMatcher([
    (UPat(Ops.ADD, name="u"), lambda u: None),  # no answer: the next rule is asked
    (UPat(Ops.ADD, src=(UPat.cvar(), UPat())), lambda: False),
    (UPat(Ops.ADD), lambda: True),
    (UPat(Ops.MUL, name="u"), lambda ctx, u: (ctx, u)),
  ])
  assert spec.first_result(add(x, y)) is True and spec.first_result(add(c(1), y)) is False
  assert spec.first_result(mul(x, y), ctx=3) == (3, mul(x, y)) and spec.first_result(x) is None

def test_match_any_op_and_ctx_and_add():
  pm = PatternMatcher([(UPat(Ops.CONST, name="k"), lambda ctx, k: c(k.arg + ctx))])
  assert pm.rewrite(c(1), ctx=10) is c(11)
  anything = PatternMatcher([(UPat(name="u"), lambda u: c(99) if u.op is Ops.DEFINE_VAR else None)])
  assert anything.rewrite(x) is c(99) and anything.rewrite(c(1)) is None
  both = pm + anything
  assert both.rewrite(x) is c(99) and both.rewrite(c(1), ctx=1) is c(2)

# ***** graph_rewrite *****

fold = PatternMatcher([
  (UPat(Ops.ADD, src=(UPat.cvar("a"), UPat.cvar("b"))), lambda a, b: c(a.arg + b.arg)),
  (UPat(Ops.ADD, src=[UPat.var("v"), UPat.const(I32, 0)]), lambda v: v),
  (UPat(Ops.MUL, src=[UPat.var("v"), UPat.const(I32, 2)]), lambda v: add(v, v)),
  (UPat(Ops.ADD, src=(UPat.var("v"), UPat.var("v"))), lambda v: UOp(Ops.SHL, I32, (v, c(1)))),
])

def test_graph_rewrite_bottom_up_folding():
  assert graph_rewrite(add(add(c(1), c(2)), add(c(3), c(4))), fold, name="test") is c(10)
  assert graph_rewrite(add(add(add(x, c(0)), c(0)), add(c(-1), c(1))), fold, name="test") is x

def test_graph_rewrite_reaches_fixed_point():
  # x*2 -> x+x -> x<<1: a rule's result is rewritten again, and the parent sees the final form
  out = graph_rewrite(UOp(Ops.NEG, I32, (mul(x, c(2)),)), fold, name="test")
  assert out is UOp(Ops.NEG, I32, (UOp(Ops.SHL, I32, (x, c(1))),))
  # (x + (1 + -1)) * 2: the child folds to x + 0, then to x, only then does the parent's rule apply
  assert graph_rewrite(mul(add(x, add(c(1), c(-1))), c(2)), fold, name="test") is UOp(Ops.SHL, I32, (x, c(1)))
  assert graph_rewrite(out, fold, name="test") is out  # a fixed point is a fixed point

def test_graph_rewrite_children_first():
  order = []
  pm = PatternMatcher([(UPat(name="u"), lambda ctx, u: ctx.append(u))])
  g = UOp(Ops.SINK, dtypes.void, (add(mul(x, y), c(1)), mul(x, y), add(y, c(1))))
  assert graph_rewrite(g, pm, ctx=order, name="test") is g
  assert set(order) == set(g.toposort)
  pos = {u: i for i, u in enumerate(order)}
  assert all(pos[s] < pos[u] for u in order for s in u.src)

def test_graph_rewrite_memoizes_shared_nodes():
  calls = {}
  def count(ctx, u):
    ctx[u] = ctx.get(u, 0) + 1
    return None
  shared = add(x, y)
  g = UOp(Ops.SINK, dtypes.void, (mul(shared, shared), add(shared, c(1)), UOp(Ops.NEG, I32, (shared,))))
  graph_rewrite(g, PatternMatcher([(UPat(name="u"), count)]), ctx=calls, name="test")
  assert calls[shared] == 1 and all(v == 1 for v in calls.values())

def test_graph_rewrite_rewrites_shared_node_once():
  fired = []
  def to_sub(a, b):
    fired.append((a, b))
    return UOp(Ops.SUB, I32, (a, b))
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat(Ops.DEFINE_VAR, name="a"), UPat(Ops.DEFINE_VAR, name="b"))), to_sub)])
  shared = add(x, y)
  out = graph_rewrite(UOp(Ops.SINK, dtypes.void, (mul(shared, c(3)), mul(shared, c(4)), shared)), pm, name="test")
  sub = UOp(Ops.SUB, I32, (x, y))
  assert fired == [(x, y)]
  assert out.src == (mul(sub, c(3)), mul(sub, c(4)), sub)
  assert out.src[0].src[0] is out.src[1].src[0] is out.src[2]  # still one shared node

def test_graph_rewrite_loop_is_an_error():
  grow = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("v"), UPat.cvar("k"))), lambda v, k: add(v, c(k.arg + 1)))])
  with pytest.raises(RewriteLoopError, match="pass 'grow' did not reach a fixed point"):
    graph_rewrite(add(x, c(0)), grow, name="grow", max_steps=1000)

def chain(n):
  u = x
  for i in range(n): u = add(u, c(i % 7))
  return u

def test_deep_graph_rewrite():
  deep = chain(5000)
  assert len(deep.toposort) > 5000
  swap = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("a"), UPat.cvar("k"))), lambda a, k: UOp(Ops.SUB, I32, (a, c(-k.arg))))])
  out = graph_rewrite(deep, swap, name="test")
  assert out.op is Ops.SUB and sum(1 for u in out.toposort if u.op is Ops.ADD) == 0
  assert graph_rewrite(deep, PatternMatcher([]), name="test") is deep
  assert graph_rewrite(deep, fold, name="test") is not None
  assert deep.substitute({x: y}).variables() == [y]

def test_deep_graph_simplify():
  assert chain(5000).simplify() is add(x, c(sum(i % 7 for i in range(5000))))

# ***** hash-consing *****

def test_hash_consing():
  assert add(x, c(1)) is add(x, c(1)) and x + 1 is x + 1
  assert UOp.variable("x", 0, 10) is x and c(1) is UOp.const(I32, 1)
  assert add(x, c(1)) is not add(x, c(2)) and c(1) is not c(1, dtypes.int64) and c(1) is not c(1.0, F32)
  assert UOp.variable("x", 0, 11) is not x
  assert chain(300) is chain(300)  # whole graphs built twice are one graph
  u = mul(add(x, y), c(3))
  assert pickle.loads(pickle.dumps(u)) is u
  assert u.replace(arg=None) is u and u.replace(op=Ops.ADD) is add(add(x, y), c(3))

def test_hash_consing_survives_collection():
  import gc
  UOp(Ops.ADD, I32, (x, c(123456)))
  gc.collect()  # the cache holds nodes weakly: a dropped node is built anew, and is again unique
  again = UOp(Ops.ADD, I32, (x, c(123456)))
  assert again is UOp(Ops.ADD, I32, (x, c(123456))) and again.src == (x, c(123456))

def test_uop_has_no_truth_value():
  with pytest.raises(TypeError): bool(x < 3)

def test_rewrite_skips_graphs_without_its_ops_and_fixed_points_it_made():
  # lowering rewrites big graphs with passes that have rules for a few ops, and with `symbolic` again after small
  # changes: neither may call a rule where none can apply, and both must give what a full walk gives
  seen: list[UOp] = []
  def fold_add(x: UOp, y: UOp) -> UOp | None:
    seen.append(x)
    return UOp.const(x.dtype, x.arg + y.arg) if x.op is Ops.CONST and y.op is Ops.CONST else None
  pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), fold_add)])
  a = UOp.variable("a", 0, 10)
  no_add = (a * 3).maximum(UOp.const(dtypes.int32, 1))
  assert graph_rewrite(no_add, pm, name="test", max_steps=0) is no_add and seen == []  # no ADD anywhere: not walked
  g = (a + (UOp.const(dtypes.int32, 2) + UOp.const(dtypes.int32, 3))) * 4
  out = graph_rewrite(g, pm, name="test")
  assert out is (a + 5) * 4 and len(seen) == 2
  seen.clear()
  assert graph_rewrite(out, pm, name="test", max_steps=0) is out and seen == []  # its own result is a fixed point: not walked again
  assert graph_rewrite(out.maximum(a + 1), pm, name="test", max_steps=2) is out.maximum(a + 1) and len(seen) == 1  # the new ADD, MAX
  with pytest.raises(RewriteLoopError): graph_rewrite(out, PatternMatcher(pm.rules), name="test", max_steps=1)  # another matcher walks it
  seen.clear()
  # with a ctx the rules may depend on it: no memo
  seen.clear()
  pmc = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("y"))), lambda ctx, x, y: fold_add(x, y))])
  graph_rewrite(out, pmc, ctx=1, name="test"); graph_rewrite(out, pmc, ctx=2, name="test")
  assert len(seen) == 2
