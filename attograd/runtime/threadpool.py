"""The CPU devices' thread pools (one a device): one call runs a threaded kernel's slices (the THREAD opt, codegen/opt.py) on
several cores. Native threads, created on the first threaded launch, and one ctypes call per launch: the GIL
is released for the whole run, and a launch costs a few microseconds instead of a Python thread's wakeup.
Kernels are called through the entry point the renderers add to threaded kernels, one C type for all:
void <name>_slice(void *const *bufs, const long long *vals, long long core)."""
from __future__ import annotations
import atexit, ctypes, functools, os, threading
from typing import Any, Callable
from attograd.runtime.cc import find_c_compiler, compile_c, load_library

SRC = r"""
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

typedef void (*slice_fn)(void *const *bufs, const long long *vals, long long core);
#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield")
#else
#define RELAX() ((void)0)
#endif
/* an idle thread polls this long before it sleeps: the launches of a training step find it awake,
   and a shared machine gets the core back soon after the last one */
#define SPIN_NS 50000

/* a kernel of a run of steps (run_steps) */
struct step { slice_fn fn; void *const *bufs; long long *vals; const int *vars; int nvals, n; };

/* a pool: its own workers and launches, so two devices (CPU:0, CPU:1) each run their kernels on their own share of the
   cores at once; a launch into a pool another thread's launch holds runs its slices on the calling thread */
struct pool {
  pthread_mutex_t launch_mu, mu;
  pthread_cond_t work_cv, done_cv;
  slice_fn job_fn;
  void *const *job_bufs;
  const long long *job_vals;
  _Atomic uint64_t word;  /* the launch and the slices not taken yet (take_one) */
  atomic_int remaining, helpers, sleepers, caller_waits;
  int workers;
  struct pool *next;
  /* the runner: a thread of its own that runs a run of steps handed over by pool_submit, while the caller goes back to
     Python (engine/realize.py: an eager step's kernels run while the next step's graph is built) */
  pthread_mutex_t run_mu;
  pthread_cond_t run_cv, ran_cv;
  int runner, job_ready, job_count, job_cores, held;  /* held: the runner starts no job (pool_hold) */
  const struct step *job_steps;
  const long long *job_table;
  atomic_int progress, pending, waiters;  /* steps of the job done; a job handed over and not finished; pool_wait's */
};
struct start { struct pool *p; int me; uint32_t seen; };
static struct pool *pools;  /* every pool made, for after_fork */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;

static int64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

static void pool_init(struct pool *p) {
  pthread_mutex_init(&p->launch_mu, NULL); pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->work_cv, NULL); pthread_cond_init(&p->done_cv, NULL);
  p->workers = 0;
  atomic_store(&p->sleepers, 0); atomic_store(&p->caller_waits, 0);
  pthread_mutex_init(&p->run_mu, NULL); pthread_cond_init(&p->run_cv, NULL); pthread_cond_init(&p->ran_cv, NULL);
  p->runner = p->job_ready = p->held = 0;
  atomic_store(&p->progress, 0); atomic_store(&p->pending, 0); atomic_store(&p->waiters, 0);
}

/* a new pool (never freed: a device lives as long as the process) */
struct pool *pool_new(void) {
  struct pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  pool_init(p);
  pthread_mutex_lock(&pools_mu); p->next = pools; pools = p; pthread_mutex_unlock(&pools_mu);
  return p;
}

/* the launch word: launch number << 40 | next slice from the front << 20 | one past the next slice from the back */
#define SLICE_BITS 20
#define SLICE_MASK ((1u << SLICE_BITS) - 1)
static uint32_t launch_of(uint64_t w) { return (uint32_t)(w >> (2 * SLICE_BITS)); }

/* takes one slice of this launch, from the front (the caller: 0, 1, ...) or the back (workers: n-1, n-2, ...), by a
   compare-exchange that names its launch, so a worker late from an earlier launch never takes a slice of a later one.
   The ends keep the cores on the same rows kernel after kernel (an elementwise chain over a (2048, 128) activation
   split in 2: the caller's half stays in its own L2), where one counter handed slices out in whatever order the cores
   came; and a core that falls behind still leaves the rest to the others */
static int take_one(struct pool *p, uint32_t launch, int front, uint32_t *slice) {
  for (uint64_t w = atomic_load(&p->word); launch_of(w) == launch;) {
    uint32_t f = (uint32_t)(w >> SLICE_BITS) & SLICE_MASK, b = (uint32_t)w & SLICE_MASK;
    if (f >= b) return 0;
    if (atomic_compare_exchange_weak(&p->word, &w, front ? w + (1ull << SLICE_BITS) : w - 1)) { *slice = front ? f : b - 1; return 1; }
  }
  return 0;
}

/* the job is stable while a slice of it is taken and not finished: the launch can't end before */
static void take_slices(struct pool *p, uint32_t launch, int front) {
  for (uint32_t slice; take_one(p, launch, front, &slice);) {
    p->job_fn(p->job_bufs, p->job_vals, slice);
    if (atomic_fetch_sub(&p->remaining, 1) == 1 && atomic_load(&p->caller_waits)) {
      pthread_mutex_lock(&p->mu); pthread_cond_signal(&p->done_cv); pthread_mutex_unlock(&p->mu);
    }
  }
}

static void *worker(void *arg) {
  struct start st = *(struct start *)arg;
  free(arg);
  struct pool *p = st.p;
  int me = st.me, poll = 1;
  uint32_t seen = st.seen;
  for (;;) {
    uint64_t w = atomic_load(&p->word);
    for (int64_t end = poll ? now_ns() + SPIN_NS : 0; launch_of(w) == seen && now_ns() < end; w = atomic_load(&p->word)) RELAX();
    if (launch_of(w) == seen) {
      pthread_mutex_lock(&p->mu);
      atomic_fetch_add(&p->sleepers, 1);  /* before looking again: the caller then sees a sleeper, or we see its launch */
      while (launch_of(w = atomic_load(&p->word)) == seen) pthread_cond_wait(&p->work_cv, &p->mu);
      atomic_fetch_sub(&p->sleepers, 1);
      pthread_mutex_unlock(&p->mu);
    }
    seen = launch_of(w);
    poll = me < atomic_load(&p->helpers);  /* a worker that THREADS leaves out sleeps right away */
    if (poll) take_slices(p, seen, 0);
  }
  return NULL;
}

/* a detached thread with a big stack that takes no signals (they go to the threads Python runs); 0 when none could be made */
static int start_thread(void *(*fn)(void *), void *arg) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 8 << 20);  /* kernels keep their packed panels on the stack, as on the main thread's */
  sigset_t all, old;  /* signals go to the threads Python runs, not to these */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  int made = pthread_create(&t, &attr, fn, arg) == 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
  return made;
}

static void start_worker(struct pool *p, uint32_t seen) {
  struct start *st = malloc(sizeof *st);
  if (!st) return;
  st->p = p; st->me = p->workers; st->seen = seen;
  if (start_thread(worker, st)) p->workers++;
  else free(st);
}

/* a forked child has only the thread that forked: no workers, and no launch in flight */
static void after_fork(void) {
  pthread_mutex_init(&pools_mu, NULL);
  for (struct pool *p = pools; p; p = p->next) pool_init(p);
}
__attribute__((constructor)) static void init(void) { pthread_atfork(NULL, NULL, after_fork); }

/* runs fn for core = 0..n-1 on up to `cores` threads of pool p, the calling one included; returns when all are done */
void pool_run(struct pool *p, slice_fn fn, void *const *bufs, const long long *vals, int n, int cores) {
  /* one core, or another thread's launch has the pool: the slices run here, one after another */
  if (cores <= 1 || n <= 1 || (unsigned)n > SLICE_MASK || pthread_mutex_trylock(&p->launch_mu) != 0) {
    for (int i = 0; i < n; i++) fn(bufs, vals, i);
    return;
  }
  uint32_t launch = (launch_of(atomic_load(&p->word)) + 1) & ((1u << (64 - 2 * SLICE_BITS)) - 1);  /* (24 bits: it wraps) */
  while (p->workers < cores - 1 && p->workers < 0xffff) {
    int before = p->workers;
    start_worker(p, launch - 1);
    if (p->workers == before) break;  /* no more threads to be had: fewer cores help */
  }
  p->job_fn = fn; p->job_bufs = bufs; p->job_vals = vals;
  atomic_store(&p->remaining, n);
  atomic_store(&p->helpers, cores - 1);
  atomic_store(&p->word, (uint64_t)launch << (2 * SLICE_BITS) | (uint32_t)n);
  if (atomic_load(&p->sleepers)) { pthread_mutex_lock(&p->mu); pthread_cond_broadcast(&p->work_cv); pthread_mutex_unlock(&p->mu); }
  take_slices(p, launch, 1);
  /* the last slices may still be running on workers */
  for (int64_t end = now_ns() + SPIN_NS; atomic_load(&p->remaining) && now_ns() < end;) RELAX();
  if (atomic_load(&p->remaining)) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_waits, 1);
    while (atomic_load(&p->remaining)) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->caller_waits, 0);
    pthread_mutex_unlock(&p->mu);
  }
  pthread_mutex_unlock(&p->launch_mu);
}

/* a run of consecutive kernels of a replayed plan (engine/realize.py ExecPlan), called once for all of them: each step's
   entry point, its buffers' addresses (rebinding memory writes them), its values (filled here from the replay's table of
   Variable values, by number) and its slices. Threaded steps go to the pool without a trip through Python between them:
   its workers, still polling from the step before, take the next one's slices at once */
static void run_step(struct pool *p, const struct step *s, const long long *table, int cores) {
  for (int k = 0; k < s->nvals; k++) s->vals[k] = table[s->vars[k]];
  if (s->n <= 1) s->fn(s->bufs, s->vals, 0);
  else pool_run(p, s->fn, s->bufs, s->vals, s->n, s->n < cores ? s->n : cores);
}
void run_steps(struct pool *p, const struct step *s, int count, const long long *table, int cores) {
  for (const struct step *end = s + count; s < end; s++) run_step(p, s, table, cores);
}

/* the runner's loop: each job's steps in order, counting them in `progress` (pool_wait reads it) */
static void *runner_main(void *arg) {
  struct pool *p = arg;
  pthread_mutex_lock(&p->run_mu);
  for (;;) {
    while (!p->job_ready || p->held) pthread_cond_wait(&p->run_cv, &p->run_mu);
    p->job_ready = 0;
    const struct step *s = p->job_steps;
    const long long *table = p->job_table;
    int count = p->job_count, cores = p->job_cores;
    pthread_mutex_unlock(&p->run_mu);
    for (int i = 0; i < count; i++) {
      run_step(p, s + i, table, cores);
      atomic_store(&p->progress, i + 1);
      /* a waiter counted itself before looking at progress: it saw this step, or it is told here */
      if (atomic_load(&p->waiters)) { pthread_mutex_lock(&p->run_mu); pthread_cond_broadcast(&p->ran_cv); pthread_mutex_unlock(&p->run_mu); }
    }
    pthread_mutex_lock(&p->run_mu);
    atomic_store(&p->pending, 0);
    pthread_cond_broadcast(&p->ran_cv);
  }
  return NULL;
}

/* hands count steps to the pool's runner and returns at once (1; 0: no thread could be made, nothing ran). The caller
   waited for the job before (pool_wait): one at a time. The steps, their arrays and the table must stay as they are
   until it is done */
int pool_submit(struct pool *p, const struct step *s, int count, const long long *table, int cores) {
  if (!p->runner) {
    if (!start_thread(runner_main, p)) return 0;
    p->runner = 1;
  }
  pthread_mutex_lock(&p->run_mu);
  while (atomic_load(&p->pending)) pthread_cond_wait(&p->ran_cv, &p->run_mu);  /* (the callers wait first: in case one didn't) */
  p->job_steps = s; p->job_count = count; p->job_table = table; p->job_cores = cores;
  atomic_store(&p->progress, 0);
  atomic_store(&p->pending, 1);
  p->job_ready = 1;
  pthread_cond_signal(&p->run_cv);
  pthread_mutex_unlock(&p->run_mu);
  return 1;
}

/* the runner starts no job while held (tests: a run stays in flight as long as they need) */
void pool_hold(struct pool *p, int held) {
  pthread_mutex_lock(&p->run_mu);
  p->held = held;
  pthread_cond_broadcast(&p->run_cv);
  pthread_mutex_unlock(&p->run_mu);
}

/* returns when the runner's job finished its first `upto` steps (or all of them) */
void pool_wait(struct pool *p, int upto) {
  #define RUNNING() (atomic_load(&p->pending) && atomic_load(&p->progress) < upto)
  for (int64_t end = now_ns() + SPIN_NS; RUNNING() && now_ns() < end;) RELAX();
  if (!RUNNING()) return;
  pthread_mutex_lock(&p->run_mu);
  atomic_fetch_add(&p->waiters, 1);
  while (RUNNING()) pthread_cond_wait(&p->ran_cv, &p->run_mu);
  atomic_fetch_sub(&p->waiters, 1);
  pthread_mutex_unlock(&p->run_mu);
  #undef RUNNING
}
"""

@functools.cache
def _library() -> ctypes.CDLL:
  lib = load_library(compile_c(find_c_compiler(), SRC, ["-O2", "-fPIC", "-shared", "-pthread"], "the thread pool"))
  lib.pool_run.argtypes, lib.pool_run.restype = [ctypes.c_void_p] * 4 + [ctypes.c_int, ctypes.c_int], None
  lib.pool_new.argtypes, lib.pool_new.restype = [], ctypes.c_void_p
  lib.run_steps.argtypes, lib.run_steps.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int], None
  lib.pool_submit.argtypes, lib.pool_submit.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int], ctypes.c_int
  lib.pool_wait.argtypes, lib.pool_wait.restype = [ctypes.c_void_p, ctypes.c_int], None
  lib.pool_hold.argtypes, lib.pool_hold.restype = [ctypes.c_void_p, ctypes.c_int], None
  return lib

@functools.cache
def array_type(ctype: type, n: int) -> type:
  """ctypes' type of an array of n ctype, made once and kept: ctypes holds its array types only weakly, and each is a
  reference cycle, so an array of a length no live array had made a type only the garbage collector freed (an eager step's
  run made two, a threaded launch one)."""
  return ctype * n

_pools: dict[str, int] = {}
def pool(name: str = "") -> int:
  """The native pool of this name (a device's; "" the shared one), made on first use: each device's threaded kernels run
  on workers of its own, so devices side by side (engine/lanes.py) don't queue for one pool."""
  if (p := _pools.get(name)) is None:
    if not (p := _library().pool_new()): raise MemoryError("no memory for a thread pool")
    _pools[name] = p
  return p

def run_slices(entry: int, addrs: list[int], vals: list[int], n: int, cores: int, pool_name: str = "") -> None:
  """Calls the slice entry point at address `entry` for core = 0..n-1, on up to `cores` cores of the named pool, and returns
  when all are done. Each core takes the next slice when it finished one: a core another process holds back does fewer."""
  if _inflight is not None: wait_all()  # (kernels run in order)
  _library().pool_run(pool(pool_name), entry, array_type(ctypes.c_void_p, len(addrs))(*addrs), array_type(ctypes.c_int64, len(vals))(*vals), n, cores)

class Step(ctypes.Structure):
  _fields_ = [("fn", ctypes.c_void_p), ("bufs", ctypes.c_void_p), ("vals", ctypes.c_void_p), ("vars", ctypes.c_void_p),
              ("nvals", ctypes.c_int), ("n", ctypes.c_int)]

class Steps:
  """Consecutive kernels on one pool's device, run by one native call (run_steps). Each kernel is given as (the address of
  its slice entry, the array of its buffers' addresses, the numbers of its Variables in the table each call passes, its
  slice count). The address arrays are read at every run: writing one of their entries rebinds that buffer's memory."""
  def __init__(self, pool_name: str, steps: list[tuple[int, ctypes.Array, list[int], int]]):
    self.pool, self.count, self.steps = pool(pool_name), len(steps), array_type(Step, len(steps))()
    self.keep: list[ctypes.Array] = []  # the arrays the steps point into
    for st, (entry, addrs, numbers, n) in zip(self.steps, steps):
      vals, idx = array_type(ctypes.c_int64, max(len(numbers), 1))(), array_type(ctypes.c_int, max(len(numbers), 1))(*numbers)
      st.fn, st.bufs, st.vals, st.vars = entry, ctypes.addressof(addrs), ctypes.addressof(vals), ctypes.addressof(idx)
      st.nvals, st.n = len(numbers), n
      self.keep += [addrs, vals, idx]
    self.run = _library().run_steps
  def __call__(self, table: ctypes.Array, cores: int) -> None:
    """Run them all, the Variables' values in table, each threaded one on up to `cores` cores."""
    if _inflight is not None: wait_all()
    self.run(self.pool, self.steps, self.count, table, cores)
  def submit(self, table: ctypes.Array, cores: int, uses: Callable[[], tuple[dict[int, int], dict[int, int]]], keep: Any) -> None:
    """Run them all on the pool's runner thread and return at once (Deferred). `uses` gives, when asked, for the memory
    the steps read or write (by id), the index of the last step that writes it and of the last that touches it; `keep`
    holds that memory (and this object, the table) until they are done."""
    global _inflight
    with _deferred_lock:
      if _inflight is not None: _wait_all()
      if _library().pool_submit(self.pool, self.steps, self.count, table, cores):
        _inflight = Deferred(self.pool, self.count, uses, (self, table, keep))
        return
    self(table, cores)  # (no thread to be had: here)

class Deferred:
  """The run of steps on a pool's runner thread (Steps.submit), until a wait finds it done. One at a time: whatever runs
  kernels or reads or writes device memory from the host waits for it first: all of it (wait_all: another run, a kernel
  called from Python), or the steps up to the last that writes the memory read (wait_for: a tensor's .item() or
  .numpy(), ops_cpu.CPUAllocator) or that touches the memory written."""
  __slots__ = ("pool", "count", "uses", "keep", "last")
  def __init__(self, pool: int, count: int, uses: Callable[[], tuple[dict[int, int], dict[int, int]]], keep: Any):
    self.pool, self.count, self.uses, self.keep = pool, count, uses, keep
    self.last: tuple[dict[int, int], dict[int, int]] | None = None
_inflight: Deferred | None = None
# held while a run is handed over or waited for: threads that realize side by side (a data loader's) see one run in flight
_deferred_lock = threading.RLock()

def _wait(pool: int, upto: int) -> None:
  """Return when the pool's runner finished the first `upto` steps of its run (bench/eager_step.py times these waits)."""
  _library().pool_wait(pool, upto)

def _wait_all() -> None:
  global _inflight
  if (d := _inflight) is None: return
  _wait(d.pool, d.count)
  _inflight = None  # (what it kept alive can go)

def wait_all() -> None:
  """Return when the run handed to a runner thread (if any) is done."""
  if _inflight is None: return
  with _deferred_lock: _wait_all()

def wait_for(mem: Any, write: bool) -> None:
  """Before the host reads (write False) or writes memory `mem`: wait for the steps in flight that write it (or, for a
  write, that read or write it)."""
  if _inflight is None: return
  with _deferred_lock:
    if (d := _inflight) is None: return
    if d.last is None: d.last = d.uses()
    if (i := d.last[write].get(id(mem))) is not None:
      if i + 1 == d.count: _wait_all()
      else: _wait(d.pool, i + 1)

def hold(pool_name: str, held: bool) -> None:
  """Hold the named pool's runner thread: it starts no run handed to it until let go (for tests: a run stays in flight)."""
  _library().pool_hold(pool(pool_name), int(held))

# a forked child has no runner thread, and memory half written; at exit the interpreter frees memory the runner may be writing
atexit.register(wait_all)
os.register_at_fork(before=wait_all)
