"""The CPU devices' thread pool: one call runs a threaded kernel's slices (the THREAD opt, codegen/opt.py) on
several cores. Native threads, created on the first threaded launch, and one ctypes call per launch: the GIL
is released for the whole run, and a launch costs a few microseconds instead of a Python thread's wakeup.
Kernels are called through the entry point the renderers add to threaded kernels, one C type for all:
void <name>_slice(void *const *bufs, const long long *vals, long long core)."""
from __future__ import annotations
import ctypes, functools
from typing import Callable
from attograd.runtime.cc import find_c_compiler, compile_c, load_library

SRC = r"""
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
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

static pthread_mutex_t launch_mu = PTHREAD_MUTEX_INITIALIZER, mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t work_cv = PTHREAD_COND_INITIALIZER, done_cv = PTHREAD_COND_INITIALIZER;
static slice_fn job_fn;
static void *const *job_bufs;
static const long long *job_vals;
/* launch number << 32 | slices not taken yet: a slice is taken by a compare-exchange that names its launch,
   so a worker late from an earlier launch never takes a slice of a later one */
static _Atomic uint64_t word;
static atomic_int remaining, helpers, sleepers, caller_waits;
static int workers;

static uint32_t launch_of(uint64_t w) { return (uint32_t)(w >> 32); }
static int64_t now_ns(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }

/* the job is stable while a slice of it is taken and not finished: the launch can't end before */
static void take_slices(uint32_t launch) {
  for (uint64_t w = atomic_load(&word); launch_of(w) == launch && (uint32_t)w > 0;) {
    if (!atomic_compare_exchange_weak(&word, &w, w - 1)) continue;
    job_fn(job_bufs, job_vals, (uint32_t)w - 1);
    if (atomic_fetch_sub(&remaining, 1) == 1 && atomic_load(&caller_waits)) {
      pthread_mutex_lock(&mu); pthread_cond_signal(&done_cv); pthread_mutex_unlock(&mu);
    }
    w = atomic_load(&word);
  }
}

static void *worker(void *arg) {
  int me = (int)((uintptr_t)arg & 0xffff), poll = 1;
  uint32_t seen = (uint32_t)((uintptr_t)arg >> 16);
  for (;;) {
    uint64_t w = atomic_load(&word);
    for (int64_t end = poll ? now_ns() + SPIN_NS : 0; launch_of(w) == seen && now_ns() < end; w = atomic_load(&word)) RELAX();
    if (launch_of(w) == seen) {
      pthread_mutex_lock(&mu);
      atomic_fetch_add(&sleepers, 1);  /* before looking again: the caller then sees a sleeper, or we see its launch */
      while (launch_of(w = atomic_load(&word)) == seen) pthread_cond_wait(&work_cv, &mu);
      atomic_fetch_sub(&sleepers, 1);
      pthread_mutex_unlock(&mu);
    }
    seen = launch_of(w);
    poll = me < atomic_load(&helpers);  /* a worker that THREADS leaves out sleeps right away */
    if (poll) take_slices(seen);
  }
  return NULL;
}

static void start_worker(uint32_t seen) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 8 << 20);  /* kernels keep their packed panels on the stack, as on the main thread's */
  sigset_t all, old;  /* signals go to the threads Python runs, not to these */
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t t;
  if (pthread_create(&t, &attr, worker, (void *)((uintptr_t)seen << 16 | (uintptr_t)workers)) == 0) workers++;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  pthread_attr_destroy(&attr);
}

/* a forked child has only the thread that forked: no workers, and no launch in flight */
static void after_fork(void) {
  pthread_mutex_init(&launch_mu, NULL); pthread_mutex_init(&mu, NULL);
  pthread_cond_init(&work_cv, NULL); pthread_cond_init(&done_cv, NULL);
  workers = 0;
  atomic_store(&sleepers, 0); atomic_store(&caller_waits, 0);
}
__attribute__((constructor)) static void init(void) { pthread_atfork(NULL, NULL, after_fork); }

/* runs fn for core = 0..n-1 on up to `cores` threads, the calling one included; returns when all are done */
void pool_run(slice_fn fn, void *const *bufs, const long long *vals, int n, int cores) {
  /* one core, or another thread's launch has the pool: the slices run here, one after another */
  if (cores <= 1 || n <= 1 || pthread_mutex_trylock(&launch_mu) != 0) {
    for (int i = 0; i < n; i++) fn(bufs, vals, i);
    return;
  }
  uint32_t launch = launch_of(atomic_load(&word)) + 1;
  while (workers < cores - 1 && workers < 0xffff) {
    int before = workers;
    start_worker(launch - 1);
    if (workers == before) break;  /* no more threads to be had: fewer cores help */
  }
  job_fn = fn; job_bufs = bufs; job_vals = vals;
  atomic_store(&remaining, n);
  atomic_store(&helpers, cores - 1);
  atomic_store(&word, (uint64_t)launch << 32 | (uint32_t)n);
  if (atomic_load(&sleepers)) { pthread_mutex_lock(&mu); pthread_cond_broadcast(&work_cv); pthread_mutex_unlock(&mu); }
  take_slices(launch);
  /* the last slices may still be running on workers */
  for (int64_t end = now_ns() + SPIN_NS; atomic_load(&remaining) && now_ns() < end;) RELAX();
  if (atomic_load(&remaining)) {
    pthread_mutex_lock(&mu);
    atomic_store(&caller_waits, 1);
    while (atomic_load(&remaining)) pthread_cond_wait(&done_cv, &mu);
    atomic_store(&caller_waits, 0);
    pthread_mutex_unlock(&mu);
  }
  pthread_mutex_unlock(&launch_mu);
}
"""

@functools.cache
def _pool_run() -> Callable[..., None]:
  fn = load_library(compile_c(find_c_compiler(), SRC, ["-O2", "-fPIC", "-shared", "-pthread"], "the thread pool")).pool_run
  fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int], None
  return fn

def run_slices(entry: int, addrs: list[int], vals: list[int], n: int, cores: int) -> None:
  """Calls the slice entry point at address `entry` for core = 0..n-1, on up to `cores` cores, and returns when all
  are done. Each core takes the next slice when it finished one: a core another process holds back does fewer."""
  _pool_run()(entry, (ctypes.c_void_p * len(addrs))(*addrs), (ctypes.c_int64 * len(vals))(*vals), n, cores)
