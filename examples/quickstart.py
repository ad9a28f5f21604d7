"""A first look at attograd: lazy tensors, fused kernels, and what ran.
Run it with DEBUG=2 to see each kernel with its time, DEBUG=4 to see the generated C."""
from attograd import Tensor, GlobalCounters, dtypes

Tensor.manual_seed(0)
x = Tensor.randn(256, 64)
w = Tensor.randn(64, 10) * (1 / 8)
b = Tensor.arange(10, dtype=dtypes.float32) * 0.1
x.realize(), w.realize(), b.realize()

GlobalCounters.reset()
logits = (x @ w + b).relu()          # nothing runs yet: this builds a graph of UOps
probs = logits.softmax(axis=1)
pred = probs.argmax(axis=1).realize()   # realize once, then read it ten times
counts = [(pred == k).sum().item() for k in range(10)]   # reading a value runs what it needs
print(f"prediction counts per class: {counts} (total {sum(counts)})")
print(f"row sums of softmax ~ 1: {probs.sum(axis=1)[:4].tolist()}")
print(f"kernels run: {GlobalCounters.kernel_count}, time in kernels: {GlobalCounters.time_sum * 1e3:.2f} ms")
assert sum(counts) == 256
