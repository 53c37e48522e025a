// The C floor of the GCD benchmark: the same libdispatch calls as the Swift
// variants, in plain C with blocks, built by `make bench` into a shared
// library that GCDBenchmarks loads with dlopen (a SwiftPM C target cannot
// include <dispatch/dispatch.h> or use -fblocks without unsafeFlags).
//
// Every timed function has the signature `double f(int64_t n, double *extra)`:
// it sets up outside the timed region, times `n` operations with
// CLOCK_MONOTONIC and returns nanoseconds per operation; `extra` (4 slots)
// carries inputs and secondary results where a function says so.

#define _GNU_SOURCE
#include <Block/Block.h>
#include <dispatch/dispatch.h>

#include <fcntl.h>
#include <malloc.h>
#include <signal.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/socket.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double per_op(int64_t start, int64_t end, int64_t n) { return (double)(end - start) / (double)(n > 0 ? n : 1); }

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "bench_c: check failed: %s\n", what);
    abort();
  }
}

static void increment(void *context) { (*(long *)context)++; }

// MARK: - Queues

/// dispatch_async of a block that captures a value (so dispatch_async must
/// heap-copy it, as real C code pays), onto a serial queue, then a drain.
EXPORT double bench_c_async(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.async", NULL);
  long count = 0;
  long *counter = &count;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_async(queue, ^{
      (*counter)++;
    });
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  check(count == n, "async count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_async_f of a function and a context pointer.
EXPORT double bench_c_async_f(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.async_f", NULL);
  long count = 0;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_async_f(queue, &count, increment);
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  check(count == n, "async_f count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_sync with a stack block that captures a value (never copied).
EXPORT double bench_c_sync(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.sync", NULL);
  long count = 0;
  long *counter = &count;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_sync(queue, ^{
      (*counter)++;
    });
  }
  int64_t end = now_ns();
  check(count == n, "sync count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_sync_f of a function and a context pointer.
EXPORT double bench_c_sync_f(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.sync_f", NULL);
  long count = 0;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_sync_f(queue, &count, increment);
  }
  int64_t end = now_ns();
  check(count == n, "sync_f count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_queue_create (serial, literal label) + dispatch_release.
EXPORT double bench_c_queue_create(int64_t n, double *extra) {
  (void)extra;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_release(dispatch_queue_create("bench.queue", NULL));
  }
  return per_op(start, now_ns(), n);
}

// MARK: - Semaphores and groups

/// dispatch_semaphore_signal + dispatch_semaphore_wait, uncontended.
EXPORT double bench_c_semaphore(int64_t n, double *extra) {
  (void)extra;
  dispatch_semaphore_t semaphore = dispatch_semaphore_create(0);
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_semaphore_signal(semaphore);
    dispatch_semaphore_wait(semaphore, DISPATCH_TIME_FOREVER);
  }
  int64_t end = now_ns();
  dispatch_release(semaphore);
  return per_op(start, end, n);
}

/// dispatch_group_enter + dispatch_group_leave.
EXPORT double bench_c_group_enter_leave(int64_t n, double *extra) {
  (void)extra;
  dispatch_group_t group = dispatch_group_create();
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_group_enter(group);
    dispatch_group_leave(group);
  }
  int64_t end = now_ns();
  dispatch_release(group);
  return per_op(start, end, n);
}

/// dispatch_group_async of a capturing block onto the default global queue
/// `n` times, then dispatch_group_wait.
EXPORT double bench_c_group_async(int64_t n, double *extra) {
  (void)extra;
  dispatch_group_t group = dispatch_group_create();
  dispatch_queue_t global = dispatch_get_global_queue(DISPATCH_QUEUE_PRIORITY_DEFAULT, 0);
  long count = 0;
  long *counter = &count;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_group_async(group, global, ^{
      __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
    });
  }
  dispatch_group_wait(group, DISPATCH_TIME_FOREVER);
  int64_t end = now_ns();
  check(__atomic_load_n(&count, __ATOMIC_RELAXED) == n, "group_async count");
  dispatch_release(group);
  return per_op(start, end, n);
}

// MARK: - Sources

/// dispatch_source_merge_data(1) into a DATA_ADD source `n` times, until the
/// handler (on a serial queue) has seen all of it.
EXPORT double bench_c_merge(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.merge", NULL);
  dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_DATA_ADD, 0, 0, queue);
  dispatch_semaphore_t done = dispatch_semaphore_create(0);
  long total = 0;
  long *sum = &total;
  dispatch_source_set_event_handler(source, ^{
    *sum += (long)dispatch_source_get_data(source);
    if (*sum == n) dispatch_semaphore_signal(done);
  });
  dispatch_activate(source);
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_source_merge_data(source, 1);
  }
  if (n > 0) dispatch_semaphore_wait(done, DISPATCH_TIME_FOREVER);
  int64_t end = now_ns();
  dispatch_source_cancel(source);
  dispatch_release(source);
  dispatch_sync(queue, ^{
  });
  dispatch_release(done);
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_source_create + dispatch_resume + dispatch_source_cancel +
/// dispatch_release of a source of `type` on `handle`, `n` times, then a
/// drain of the target queue.
// `handlers`: give each source an event and a cancel handler first, as a C program writes them:
// two blocks that capture a counter (each copied to the heap by libdispatch).
static double source_cycle_handlers(dispatch_source_type_t type, uintptr_t handle, int64_t n, bool handlers) {
  dispatch_queue_t queue = dispatch_queue_create("bench.source", NULL);
  __block int64_t fired = 0, cancelled = 0;
  int64_t *firedCount = &fired, *cancelledCount = &cancelled;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_source_t source = dispatch_source_create(type, handle, 0, queue);
    if (handlers) {
      dispatch_source_set_event_handler(source, ^{ (*firedCount)++; });
      dispatch_source_set_cancel_handler(source, ^{ (*cancelledCount)++; });
    }
    dispatch_resume(source);
    dispatch_source_cancel(source);
    dispatch_release(source);
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  dispatch_release(queue);
  return per_op(start, end, n);
}

static double source_cycle(dispatch_source_type_t type, uintptr_t handle, int64_t n) {
  return source_cycle_handlers(type, handle, n, false);
}

EXPORT double bench_c_source_timer(int64_t n, double *extra) {
  (void)extra;
  return source_cycle(DISPATCH_SOURCE_TYPE_TIMER, 0, n);
}

// The life cycle of a timer with an event handler and a cancel handler.
EXPORT double bench_c_source_timer_handlers(int64_t n, double *extra) {
  (void)extra;
  return source_cycle_handlers(DISPATCH_SOURCE_TYPE_TIMER, 0, n, true);
}

EXPORT double bench_c_source_read(int64_t n, double *extra) {
  (void)extra;
  int fds[2];
  check(pipe(fds) == 0, "pipe");
  double result = source_cycle(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)fds[0], n);
  close(fds[0]);
  close(fds[1]);
  return result;
}

EXPORT double bench_c_source_write(int64_t n, double *extra) {
  (void)extra;
  int fds[2];
  check(pipe(fds) == 0, "pipe");
  double result = source_cycle(DISPATCH_SOURCE_TYPE_WRITE, (uintptr_t)fds[1], n);
  close(fds[0]);
  close(fds[1]);
  return result;
}

EXPORT double bench_c_source_signal(int64_t n, double *extra) {
  (void)extra;
  return source_cycle(DISPATCH_SOURCE_TYPE_SIGNAL, SIGUSR2, n);
}

EXPORT double bench_c_source_data_add(int64_t n, double *extra) {
  (void)extra;
  return source_cycle(DISPATCH_SOURCE_TYPE_DATA_ADD, 0, n);
}

EXPORT double bench_c_source_data_or(int64_t n, double *extra) {
  (void)extra;
  return source_cycle(DISPATCH_SOURCE_TYPE_DATA_OR, 0, n);
}

EXPORT double bench_c_source_data_replace(int64_t n, double *extra) {
  (void)extra;
  return source_cycle(DISPATCH_SOURCE_TYPE_DATA_REPLACE, 0, n);
}

// A connection's read source, as a server has one: a socket pair, a read source on one end, the
// peer writes one byte, the handler reads it and cancels, the cancel handler closes the end.
static double connection_cycles(int64_t n, dispatch_queue_t queue) {
  dispatch_semaphore_t done = dispatch_semaphore_create(0);
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    int fds[2];
    check(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) == 0, "socketpair");
    int fd = fds[0];
    dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)fd, 0, queue);
    dispatch_source_set_event_handler(source, ^{
      char byte;
      (void)read(fd, &byte, 1);
      dispatch_source_cancel(source);
    });
    dispatch_source_set_cancel_handler(source, ^{
      close(fd);
      dispatch_semaphore_signal(done);
    });
    dispatch_resume(source);
    char byte = 'x';
    check(write(fds[1], &byte, 1) == 1, "write");
    dispatch_semaphore_wait(done, DISPATCH_TIME_FOREVER);
    dispatch_release(source);
    close(fds[1]);
  }
  int64_t end = now_ns();
  dispatch_release(done);
  return per_op(start, end, n);
}

EXPORT double bench_c_connection_cycle(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.connection", NULL);
  double result = connection_cycles(n, queue);
  dispatch_release(queue);
  return result;
}

// n times: a one-byte write(2) into `to`, then a one-byte read(2) from `from`; ns per time.
static double write_then_read(int64_t n, int to, int from) {
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    char byte = 1;
    check(write(to, &byte, 1) == 1, "write");
    check(read(from, &byte, 1) == 1, "read");
  }
  return per_op(start, now_ns(), n);
}

// The floor under `channel_upto_ready`: a one-byte write(2) and the read(2) of that byte on a
// non-blocking pipe, on one thread (what a hand-written engine that asks first pays).
EXPORT double bench_c_pipe_read_ready(int64_t n, double *extra) {
  (void)extra;
  int fds[2];
  check(pipe2(fds, O_NONBLOCK) == 0, "pipe2");
  double result = write_then_read(n, fds[1], fds[0]);
  close(fds[0]);
  close(fds[1]);
  return result;
}

struct bench_echo { int from; int to; };

static void *bench_echo_thread(void *argument) {
  struct bench_echo *echo = argument;
  char byte;
  while (read(echo->from, &byte, 1) == 1) check(write(echo->to, &byte, 1) == 1, "echo");
  return NULL;
}

// The floor under `channel_upto_wait`: a byte to an echo thread's pipe, its echo taken with a
// blocking read(2).
EXPORT double bench_c_pipe_echo(int64_t n, double *extra) {
  (void)extra;
  int toEcho[2], fromEcho[2];
  check(pipe(toEcho) == 0 && pipe(fromEcho) == 0, "pipe");
  struct bench_echo echo = {toEcho[0], fromEcho[1]};
  pthread_t thread;
  check(pthread_create(&thread, NULL, bench_echo_thread, &echo) == 0, "pthread_create");
  double result = write_then_read(n, toEcho[1], fromEcho[0]);
  close(toEcho[1]);
  pthread_join(thread, NULL);
  close(toEcho[0]);
  close(fromEcho[0]);
  close(fromEcho[1]);
  return result;
}

// A stream channel's one-byte read of a byte already in its pipe (`channel_read_ready`).
EXPORT double bench_c_channel_read_ready(int64_t n, double *extra) {
  (void)extra;
  int fds[2];
  check(pipe(fds) == 0, "pipe");
  dispatch_queue_t queue = dispatch_queue_create("bench.io.ready", NULL);
  dispatch_semaphore_t done = dispatch_semaphore_create(0);
  int readEnd = fds[0];
  dispatch_io_t channel = dispatch_io_create(DISPATCH_IO_STREAM, readEnd, queue, ^(int error) {
    (void)error;
    close(readEnd);
  });
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    char byte = 1;
    check(write(fds[1], &byte, 1) == 1, "write");
    dispatch_io_read(channel, 0, 1, queue, ^(bool finished, dispatch_data_t data, int error) {
      (void)data;
      (void)error;
      if (finished) dispatch_semaphore_signal(done);
    });
    dispatch_semaphore_wait(done, DISPATCH_TIME_FOREVER);
  }
  int64_t end = now_ns();
  dispatch_io_close(channel, 0);
  dispatch_release(channel);
  close(fds[1]);
  dispatch_release(done);
  dispatch_release(queue);
  return per_op(start, end, n);
}

// MARK: - Latency

static int compare_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/// Sorts `values` and stores mean, p99 and max in extra[0...2]; returns the median.
static double summarize(int64_t *values, int64_t count, double *extra) {
  if (count <= 0) return 0;
  qsort(values, (size_t)count, sizeof *values, compare_i64);
  double sum = 0;
  for (int64_t i = 0; i < count; i++) sum += (double)values[i];
  int64_t p99 = (count * 99 + 99) / 100 - 1;
  extra[0] = sum / (double)count;
  extra[1] = (double)values[p99 < count ? p99 : count - 1];
  extra[2] = (double)values[count - 1];
  return (double)values[count / 2];
}

struct timer_state {
  int64_t *fired;      // CLOCK_MONOTONIC of each handler run
  uint64_t *ordinal;   // the fire (1-based, counting merged fires) each run stands for
  int64_t runs, wanted;
  uint64_t total;
  dispatch_semaphore_t done;
};

/// A 10 ms repeating timer (leeway 0) on a serial queue, `n` handler runs:
/// returns the median lateness in ns of each run against start + k * 10 ms;
/// extra[0] mean, extra[1] p99, extra[2] max (ns).
EXPORT double bench_c_timer_lateness(int64_t n, double *extra) {
  const int64_t interval = 10 * 1000 * 1000;
  dispatch_queue_t queue = dispatch_queue_create("bench.timer", NULL);
  dispatch_source_t timer = dispatch_source_create(DISPATCH_SOURCE_TYPE_TIMER, 0, 0, queue);
  struct timer_state state = {
      .fired = calloc((size_t)n + 1, sizeof(int64_t)),
      .ordinal = calloc((size_t)n + 1, sizeof(uint64_t)),
      .wanted = n,
      .done = dispatch_semaphore_create(0),
  };
  struct timer_state *s = &state;
  dispatch_source_set_event_handler(timer, ^{
    if (s->runs >= s->wanted) return;
    s->fired[s->runs] = now_ns();
    s->total += dispatch_source_get_data(timer);
    s->ordinal[s->runs] = s->total;
    if (++s->runs == s->wanted) dispatch_semaphore_signal(s->done);
  });
  int64_t start = now_ns();
  dispatch_source_set_timer(timer, dispatch_time(DISPATCH_TIME_NOW, interval), (uint64_t)interval, 0);
  dispatch_resume(timer);
  if (n > 0) dispatch_semaphore_wait(state.done, DISPATCH_TIME_FOREVER);
  dispatch_source_cancel(timer);
  dispatch_release(timer);
  dispatch_sync(queue, ^{
  });
  for (int64_t i = 0; i < n; i++) {
    state.fired[i] -= start + (int64_t)state.ordinal[i] * interval;
  }
  double median = summarize(state.fired, n, extra);
  free(state.fired);
  free(state.ordinal);
  dispatch_release(state.done);
  dispatch_release(queue);
  return median;
}

struct latency_state {
  int64_t *latency;
  int64_t merged_at;
  int64_t runs;
  dispatch_semaphore_t handled;
};

/// Merge → handler latency of a DATA_ADD source on a serial queue, one
/// event at a time (`n` events): returns the median ns; extra[0] mean,
/// extra[1] p99, extra[2] max.
EXPORT double bench_c_event_latency(int64_t n, double *extra) {
  dispatch_queue_t queue = dispatch_queue_create("bench.latency", NULL);
  dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_DATA_ADD, 0, 0, queue);
  struct latency_state state = {.latency = calloc((size_t)n + 1, sizeof(int64_t)),
                                .handled = dispatch_semaphore_create(0)};
  struct latency_state *s = &state;
  dispatch_source_set_event_handler(source, ^{
    s->latency[s->runs++] = now_ns() - s->merged_at;
    dispatch_semaphore_signal(s->handled);
  });
  dispatch_activate(source);
  for (int64_t i = 0; i < n; i++) {
    s->merged_at = now_ns();
    dispatch_source_merge_data(source, 1);
    dispatch_semaphore_wait(state.handled, DISPATCH_TIME_FOREVER);
  }
  dispatch_source_cancel(source);
  dispatch_release(source);
  dispatch_sync(queue, ^{
  });
  double median = summarize(state.latency, state.runs, extra);
  free(state.latency);
  dispatch_release(state.handled);
  dispatch_release(queue);
  return median;
}

// MARK: - apply

/// The work of one iteration: `rounds` steps of a 64-bit LCG (0 rounds: a
/// trivial iteration). Kept out of line so every variant calls it.
__attribute__((noinline)) static uint64_t kernel(uint64_t seed, int64_t rounds) {
  uint64_t x = seed | 1;
  for (int64_t r = 0; r < rounds; r++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return x;
}

/// dispatch_apply of `n` iterations of kernel(i, extra[0] rounds) on the
/// default global queue: returns ns per iteration; extra[0] the speed-up
/// over a plain loop, extra[1] the plain loop's ns per iteration.
EXPORT double bench_c_apply(int64_t n, double *extra) {
  int64_t rounds = (int64_t)extra[0];
  uint64_t *out = calloc((size_t)n + 1, sizeof(uint64_t));
  dispatch_queue_t global = dispatch_get_global_queue(DISPATCH_QUEUE_PRIORITY_DEFAULT, 0);
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) out[i] = kernel((uint64_t)i, rounds);
  int64_t serial = now_ns() - start;
  start = now_ns();
  dispatch_apply((size_t)n, global, ^(size_t i) {
    out[i] = kernel((uint64_t)i, rounds);
  });
  int64_t parallel = now_ns() - start;
  free(out);
  extra[0] = (double)serial / (double)(parallel > 0 ? parallel : 1);
  extra[1] = per_op(0, serial, n);
  return per_op(0, parallel, n);
}

// MARK: - Memory

/// Bytes in use on the heap: every arena plus mmap'd chunks (mallinfo2).
EXPORT int64_t bench_c_heap_in_use(void) {
  struct mallinfo2 info = mallinfo2();
  return (int64_t)(info.uordblks + info.hblkhd);
}

/// The malloc size of the block at `pointer` (a Swift object's address).
EXPORT int64_t bench_c_usable_size(void *pointer) { return (int64_t)malloc_usable_size(pointer); }

/// Kinds of objects for the memory measurements, in GCDBenchmarks' order.
enum { KIND_QUEUE, KIND_GROUP, KIND_SEMAPHORE, KIND_TIMER, KIND_READ, KIND_WRITE, KIND_SIGNAL,
       KIND_DATA_ADD, KIND_DATA_OR, KIND_DATA_REPLACE };

/// Creates one object of `kind` (sources: created, not resumed) on `handle`.
EXPORT void *bench_c_make(int64_t kind, int64_t handle, void *queue) {
  dispatch_queue_t q = queue;
  switch (kind) {
  case KIND_QUEUE: return dispatch_queue_create("bench.queue", NULL);
  case KIND_GROUP: return dispatch_group_create();
  case KIND_SEMAPHORE: return dispatch_semaphore_create(0);
  case KIND_TIMER: return dispatch_source_create(DISPATCH_SOURCE_TYPE_TIMER, 0, 0, q);
  case KIND_READ: return dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)handle, 0, q);
  case KIND_WRITE: return dispatch_source_create(DISPATCH_SOURCE_TYPE_WRITE, (uintptr_t)handle, 0, q);
  case KIND_SIGNAL: return dispatch_source_create(DISPATCH_SOURCE_TYPE_SIGNAL, (uintptr_t)handle, 0, q);
  case KIND_DATA_ADD: return dispatch_source_create(DISPATCH_SOURCE_TYPE_DATA_ADD, 0, 0, q);
  case KIND_DATA_OR: return dispatch_source_create(DISPATCH_SOURCE_TYPE_DATA_OR, 0, 0, q);
  case KIND_DATA_REPLACE: return dispatch_source_create(DISPATCH_SOURCE_TYPE_DATA_REPLACE, 0, 0, q);
  default: return NULL;
  }
}

/// Releases an object made by bench_c_make (a source is resumed and
/// cancelled first: libdispatch traps on the release of an inactive one).
EXPORT void bench_c_free(int64_t kind, void *object) {
  if (kind >= KIND_TIMER) {
    dispatch_resume(object);
    dispatch_source_cancel(object);
  }
  dispatch_release(object);
}

/// The allocation-heavy workload of the peak-RSS measurement: `n` capturing
/// blocks queued on a suspended serial queue, then run and released.
EXPORT double bench_c_rss_queued(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.rss", NULL);
  long count = 0;
  long *counter = &count;
  dispatch_suspend(queue);
  for (int64_t i = 0; i < n; i++) {
    dispatch_async(queue, ^{
      (*counter)++;
    });
  }
  dispatch_resume(queue);
  dispatch_sync(queue, ^{
  });
  check(count == n, "rss count");
  dispatch_release(queue);
  return 0;
}

// MARK: - Dispatch blocks (work items)

/// dispatch_block_create of a capturing block + dispatch_async +
/// dispatch_block_notify onto the same serial queue + Block_release, then a
/// drain (two syncs: the last notify is queued while the last block runs).
EXPORT double bench_c_workitem_notify(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.workitem", NULL);
  long count = 0, notified = 0;
  long *counter = &count, *notifications = &notified;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_block_t block = dispatch_block_create(0, ^{
      (*counter)++;
    });
    dispatch_async(queue, block);
    dispatch_block_notify(block, queue, ^{
      (*notifications)++;
    });
    Block_release(block);
  }
  dispatch_sync(queue, ^{
  });
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  check(count == n && notified == n, "workitem_notify count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_block_create of a capturing block + dispatch_async + Block_release, then a drain.
EXPORT double bench_c_workitem_async(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.workitem", NULL);
  long count = 0;
  long *counter = &count;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_block_t block = dispatch_block_create(0, ^{
      (*counter)++;
    });
    dispatch_async(queue, block);
    Block_release(block);
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  check(count == n, "workitem_async count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_after(now) of a capturing block, then drains until all ran.
EXPORT double bench_c_after(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.after", NULL);
  long count = 0;
  long *counter = &count;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_after(DISPATCH_TIME_NOW, queue, ^{
      (*counter)++;
    });
  }
  __block long seen = 0;
  for (int tries = 0; tries < 100000; tries++) {
    dispatch_sync(queue, ^{
      seen = count;
    });
    if (seen == n) break;
    usleep(100);
  }
  int64_t end = now_ns();
  check(seen == n, "after count");
  dispatch_release(queue);
  return per_op(start, end, n);
}

/// dispatch_block_create + dispatch_after(1 s; 10 ms for n <= 10) +
/// dispatch_block_cancel + Block_release; the cancelled timers are drained
/// outside the timed region.
EXPORT double bench_c_after_cancel(int64_t n, double *extra) {
  (void)extra;
  dispatch_queue_t queue = dispatch_queue_create("bench.after_cancel", NULL);
  long count = 0;
  long *counter = &count;
  int64_t delay_ms = n <= 10 ? 10 : 1000;
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) {
    dispatch_block_t block = dispatch_block_create(0, ^{
      (*counter)++;
    });
    dispatch_after(dispatch_time(DISPATCH_TIME_NOW, delay_ms * 1000000), queue, block);
    dispatch_block_cancel(block);
    Block_release(block);
  }
  int64_t end = now_ns();
  usleep((useconds_t)(delay_ms * 1000 + 100000));
  dispatch_sync(queue, ^{
  });
  check(count == 0, "after_cancel: a cancelled block ran");
  dispatch_release(queue);
  return per_op(start, end, n);
}

// MARK: - I/O channels and dispatch data


#define BENCH_MIB (1 << 20)

/// One 1 MiB data object written `n` times (dispatch_io_write retains it; nothing is copied).
static dispatch_data_t bench_chunk(void) {
  void *memory = malloc(BENCH_MIB);
  check(memory != NULL, "malloc");
  memset(memory, 'x', BENCH_MIB);
  return dispatch_data_create(memory, BENCH_MIB, NULL, DISPATCH_DATA_DESTRUCTOR_FREE);
}

/// Copies `n` MiB through a pipe: a stream channel on the write end writes
/// one 1 MiB data object `n` times and is closed; a stream channel on the
/// read end reads to end of file. Returns ns per MiB. `extra[0]` (input):
/// the reader's low-water mark, 0 for libdispatch's default.
EXPORT double bench_c_io_pipe(int64_t n, double *extra) {
  int fds[2];
  check(pipe(fds) == 0, "pipe");
  int read_end = fds[0], write_end = fds[1];
  dispatch_queue_t queue = dispatch_queue_create("bench.io", NULL);
  dispatch_semaphore_t done = dispatch_semaphore_create(0);
  dispatch_semaphore_t cleaned = dispatch_semaphore_create(0);
  dispatch_io_t reader = dispatch_io_create(DISPATCH_IO_STREAM, read_end, queue, ^(int error) {
    (void)error;
    close(read_end);
    dispatch_semaphore_signal(cleaned);
  });
  dispatch_io_t writer = dispatch_io_create(DISPATCH_IO_STREAM, write_end, queue, ^(int error) {
    (void)error;
    close(write_end);
    dispatch_semaphore_signal(cleaned);
  });
  if (extra[0] > 0) dispatch_io_set_low_water(reader, (size_t)extra[0]);
  dispatch_data_t chunk = bench_chunk();
  __block int64_t received = 0;
  int64_t start = now_ns();
  dispatch_io_read(reader, 0, SIZE_MAX, queue, ^(bool finished, dispatch_data_t data, int error) {
    (void)error;
    if (data) received += (int64_t)dispatch_data_get_size(data);
    if (finished) dispatch_semaphore_signal(done);
  });
  for (int64_t i = 0; i < n; i++) {
    dispatch_io_write(writer, 0, chunk, queue, ^(bool finished, dispatch_data_t rest, int error) {
      (void)finished;
      (void)rest;
      (void)error;
    });
  }
  dispatch_io_close(writer, 0);
  dispatch_release(writer);
  dispatch_semaphore_wait(done, DISPATCH_TIME_FOREVER);
  int64_t end = now_ns();
  check(received == n * BENCH_MIB, "io_pipe: bytes received");
  dispatch_io_close(reader, 0);
  dispatch_release(reader);
  dispatch_semaphore_wait(cleaned, DISPATCH_TIME_FOREVER);
  dispatch_semaphore_wait(cleaned, DISPATCH_TIME_FOREVER);
  dispatch_release(chunk);
  dispatch_release(done);
  dispatch_release(cleaned);
  dispatch_release(queue);
  return per_op(start, end, n);
}

struct bench_writer {
  int fd;
  int64_t mebibytes;
  const char *bytes;
};

static void *bench_write_thread(void *context) {
  struct bench_writer *writer = context;
  for (int64_t i = 0; i < writer->mebibytes; i++) {
    size_t done = 0;
    while (done < BENCH_MIB) {
      ssize_t count = write(writer->fd, writer->bytes + done, BENCH_MIB - done);
      check(count > 0, "read loop: write");
      done += (size_t)count;
    }
  }
  close(writer->fd);
  return NULL;
}

/// The reference without libdispatch: a thread writes `n` MiB into a pipe
/// with write(2), the caller reads it with a 64 KiB read(2) loop. ns per MiB.
EXPORT double bench_c_read_loop(int64_t n, double *extra) {
  (void)extra;
  int fds[2];
  check(pipe(fds) == 0, "pipe");
  char *bytes = malloc(BENCH_MIB);
  memset(bytes, 'x', BENCH_MIB);
  char *buffer = malloc(64 * 1024);
  struct bench_writer writer = {fds[1], n, bytes};
  pthread_t thread;
  int64_t start = now_ns();
  check(pthread_create(&thread, NULL, bench_write_thread, &writer) == 0, "pthread_create");
  int64_t received = 0;
  for (;;) {
    ssize_t count = read(fds[0], buffer, 64 * 1024);
    if (count <= 0) break;
    received += count;
  }
  int64_t end = now_ns();
  pthread_join(thread, NULL);
  check(received == n * BENCH_MIB, "read loop: bytes received");
  close(fds[0]);
  free(buffer);
  free(bytes);
  return per_op(start, end, n);
}

/// Concatenates 1,000 buffers of 64 bytes into one (dispatch_data_create_concat,
/// releasing each intermediate) and walks its regions with dispatch_data_apply,
/// `n` times. ns per round.
EXPORT double bench_c_data_concat(int64_t n, double *extra) {
  (void)extra;
  enum { parts = 1000 };
  static char bytes[parts * 64];
  dispatch_data_t pieces[parts];
  for (int i = 0; i < parts; i++) pieces[i] = dispatch_data_create(bytes + i * 64, 64, NULL, DISPATCH_DATA_DESTRUCTOR_DEFAULT);
  __block size_t total = 0;
  int64_t start = now_ns();
  for (int64_t round = 0; round < n; round++) {
    dispatch_data_t all = dispatch_data_empty;
    for (int i = 0; i < parts; i++) {
      dispatch_data_t joined = dispatch_data_create_concat(all, pieces[i]);
      dispatch_release(all);
      all = joined;
    }
    dispatch_data_apply(all, ^bool(dispatch_data_t region, size_t offset, const void *buffer, size_t size) {
      (void)region;
      (void)offset;
      (void)buffer;
      total += size;
      return true;
    });
    dispatch_release(all);
  }
  int64_t end = now_ns();
  check(total == (size_t)n * parts * 64, "data_concat: bytes walked");
  for (int i = 0; i < parts; i++) dispatch_release(pieces[i]);
  return per_op(start, end, n);
}

/// Copies a 1,000-region buffer of 64,000 bytes into one contiguous buffer
/// (dispatch_data_apply + memcpy), `n` times. ns per copy.
EXPORT double bench_c_data_copy(int64_t n, double *extra) {
  (void)extra;
  enum { parts = 1000 };
  static char bytes[parts * 64];
  dispatch_data_t all = dispatch_data_empty;
  for (int i = 0; i < parts; i++) {
    dispatch_data_t piece = dispatch_data_create(bytes + i * 64, 64, NULL, DISPATCH_DATA_DESTRUCTOR_DEFAULT);
    dispatch_data_t joined = dispatch_data_create_concat(all, piece);
    dispatch_release(piece);
    dispatch_release(all);
    all = joined;
  }
  char *target = malloc(parts * 64);
  int64_t start = now_ns();
  for (int64_t round = 0; round < n; round++) {
    dispatch_data_apply(all, ^bool(dispatch_data_t region, size_t offset, const void *buffer, size_t size) {
      (void)region;
      memcpy(target + offset, buffer, size);
      return true;
    });
  }
  int64_t end = now_ns();
  free(target);
  dispatch_release(all);
  return per_op(start, end, n);
}

// MARK: - Scale (GCDBenchmarks --scale, Benchmarks/GCDBenchmarks/Scale.swift)
//
// Each function runs one point of a curve: `n` objects live at once.
// `extra[0]` in: 0 = timed (returns ns per operation), 1 = memory (returns
// heap bytes per live object, measured after the heap has settled).
// `extra[1]` in: a count of operations where the row says so.

/// Waits until the heap in use has not changed for three polls 2 ms apart
/// (libdispatch finishes registrations and teardowns on its own threads).
static void scale_settle(void) {
  int64_t last = bench_c_heap_in_use();
  int stable = 0;
  for (int polls = 0; stable < 3 && polls < 1000; polls++) {
    usleep(2000);
    int64_t now = bench_c_heap_in_use();
    stable = now == last ? stable + 1 : 0;
    last = now;
  }
}

struct scale_count {
  long value;
  long wanted;
  dispatch_semaphore_t done;
};

static void scale_count_event(void *context) {
  struct scale_count *count = context;
  if (++count->value == count->wanted) dispatch_semaphore_signal(count->done);
}

/// `n` one-shot timers on one serial queue, deadlines staggered 1 ns
/// apart: create + arm + fire + cancel + release. ns per timer. Memory:
/// `n` armed timers with deadlines an hour away.
EXPORT double bench_c_scale_timers(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.timers", NULL);
  dispatch_source_t *timers = malloc(sizeof(dispatch_source_t) * (size_t)n);
  struct scale_count count = {0, n, dispatch_semaphore_create(0)};
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  int64_t start = now_ns();
  dispatch_time_t base = dispatch_time(DISPATCH_TIME_NOW, memory ? 3600LL * 1000000000 : 0);
  for (int64_t i = 0; i < n; i++) {
    dispatch_source_t timer = dispatch_source_create(DISPATCH_SOURCE_TYPE_TIMER, 0, 0, queue);
    dispatch_set_context(timer, &count);
    dispatch_source_set_event_handler_f(timer, scale_count_event);
    dispatch_source_set_timer(timer, base + (dispatch_time_t)i, DISPATCH_TIME_FOREVER, 0);
    dispatch_activate(timer);
    timers[i] = timer;
  }
  double result;
  if (memory) {
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)n;
  } else {
    dispatch_semaphore_wait(count.done, DISPATCH_TIME_FOREVER);
  }
  for (int64_t i = 0; i < n; i++) {
    dispatch_source_cancel(timers[i]);
    dispatch_release(timers[i]);
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  if (!memory) {
    check(count.value == n, "scale timers fired");
    result = per_op(start, end, n);
  }
  free(timers);
  dispatch_release(count.done);
  dispatch_release(queue);
  return result;
}

/// The descriptors the socket rows use, set by GCDBenchmarks: pairs
/// (idle[2i] read by a source, idle[2i+1] its silent peer), then the active
/// pair and one spare descriptor for the churn row.
static int *scale_fds;
static int64_t scale_fd_pairs;
EXPORT void bench_c_scale_set_fds(int *fds, int64_t pairs) {
  scale_fds = fds;
  scale_fd_pairs = pairs;
}

static dispatch_source_t *scale_idle_sources(int64_t n, dispatch_queue_t queue) {
  check(n <= scale_fd_pairs, "scale: enough socket pairs");
  dispatch_source_t *sources = malloc(sizeof(dispatch_source_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    sources[i] = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)scale_fds[2 * i], 0, queue);
    dispatch_source_set_event_handler(sources[i], ^{
    });
    dispatch_activate(sources[i]);
  }
  return sources;
}

static void scale_drop_sources(dispatch_source_t *sources, int64_t n, dispatch_queue_t queue) {
  for (int64_t i = 0; i < n; i++) {
    dispatch_source_cancel(sources[i]);
    dispatch_release(sources[i]);
  }
  dispatch_sync(queue, ^{
  });
  free(sources);
}

/// `n` idle read sources on sockets and one active one: `extra[1]` round
/// trips of one byte (write, the handler reads it and signals). ns per
/// event. Memory: bytes per idle source.
EXPORT double bench_c_scale_idle_read(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  int64_t events = (int64_t)extra[1];
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.idle", NULL);
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  dispatch_source_t *sources = scale_idle_sources(n, queue);
  double result = 0;
  if (memory) {
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)n;
  } else {
    int active = scale_fds[2 * scale_fd_pairs], peer = scale_fds[2 * scale_fd_pairs + 1];
    dispatch_semaphore_t got = dispatch_semaphore_create(0);
    dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)active, 0, queue);
    dispatch_source_set_event_handler(source, ^{
      char byte;
      if (read(active, &byte, 1) == 1) dispatch_semaphore_signal(got);
    });
    dispatch_activate(source);
    char byte = 1;
    int64_t start = now_ns();
    for (int64_t i = 0; i < events; i++) {
      check(write(peer, &byte, 1) == 1, "scale idle write");
      dispatch_semaphore_wait(got, DISPATCH_TIME_FOREVER);
    }
    int64_t end = now_ns();
    dispatch_source_cancel(source);
    dispatch_release(source);
    dispatch_release(got);
    result = per_op(start, end, events);
  }
  scale_drop_sources(sources, n, queue);
  dispatch_release(queue);
  return result;
}

/// `n` idle read sources live; `extra[1]` create + resume + cancel + release
/// cycles of one more read source (on the spare descriptor). ns per cycle.
EXPORT double bench_c_scale_read_churn(int64_t n, double *extra) {
  int64_t cycles = (int64_t)extra[1];
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.churn", NULL);
  dispatch_source_t *sources = scale_idle_sources(n, queue);
  int spare = scale_fds[2 * scale_fd_pairs + 2];
  int64_t start = now_ns();
  for (int64_t i = 0; i < cycles; i++) {
    dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)spare, 0, queue);
    dispatch_source_set_event_handler(source, ^{
    });
    dispatch_activate(source);
    dispatch_source_cancel(source);
    dispatch_release(source);
  }
  dispatch_sync(queue, ^{
  });
  int64_t end = now_ns();
  scale_drop_sources(sources, n, queue);
  dispatch_release(queue);
  return per_op(start, end, cycles);
}

/// The connection cycle (`connection_cycle`) with `n` idle read sources live on the same queue.
EXPORT double bench_c_scale_connection_churn(int64_t n, double *extra) {
  int64_t cycles = (int64_t)extra[1];
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.connections", NULL);
  dispatch_source_t *sources = scale_idle_sources(n, queue);
  double result = connection_cycles(cycles, queue);
  scale_drop_sources(sources, n, queue);
  dispatch_release(queue);
  return result;
}

static void scale_notified(void *context) { __atomic_fetch_add((long *)context, 1, __ATOMIC_RELAXED); }

/// `n` dispatch_group_notify_f on one busy group (C cannot withdraw one;
/// the leave fires them all): ns per notify, registration to delivery.
/// Memory: bytes per pending notify.
EXPORT double bench_c_scale_group_waiters(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  dispatch_group_t group = dispatch_group_create();
  dispatch_queue_t queue = dispatch_get_global_queue(0, 0);
  long fired = 0;
  dispatch_group_enter(group);
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  int64_t start = now_ns();
  for (int64_t i = 0; i < n; i++) dispatch_group_notify_f(group, queue, &fired, scale_notified);
  double result = 0;
  if (memory) result = (double)(bench_c_heap_in_use() - heap) / (double)n;
  dispatch_group_leave(group);
  while (__atomic_load_n(&fired, __ATOMIC_RELAXED) < n) usleep(50);
  int64_t end = now_ns();
  if (!memory) result = per_op(start, end, n);
  dispatch_release(group);
  return result;
}

/// `extra[1]` dispatch_semaphore_create(n) + release. ns per semaphore.
EXPORT double bench_c_scale_semaphore_value(int64_t n, double *extra) {
  int64_t count = (int64_t)extra[1];
  int64_t start = now_ns();
  for (int64_t i = 0; i < count; i++) dispatch_release(dispatch_semaphore_create((intptr_t)n));
  int64_t end = now_ns();
  return per_op(start, end, count);
}

// MARK: - Scale: concurrency rows (events_sequences, actors_on_queues, work_item_graph)
//
// events_sequences and actors_on_queues have no C form (no async sequences,
// no actors); their rows compare with a tasks floor instead.

static void scale_graph_ran(long *ran) { __atomic_fetch_add(ran, 1, __ATOMIC_RELAXED); }

/// One pending graph of `n` items, then run: a root, a chain of (n - 2) / 2
/// after it (each link dispatch_block_notify of the one before, linked from
/// the end), a fan-out
/// of (n - 2) / 2 after it (dispatch_block_notify of the root) and one
/// fan-in block (dispatch_group_notify of a group the fan-out leaves). Timed:
/// build + run, ns per item. Memory: heap bytes per pending item, before the
/// root is submitted.
EXPORT double bench_c_scale_work_item_graph(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  int64_t branch = n - 2 < 2 ? 1 : (n - 2) / 2;
  int64_t items = 2 * branch + 2;
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.graph", NULL);
  dispatch_group_t group = dispatch_group_create();
  __block long ran = 0;
  long *counter = &ran;
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  int64_t start = now_ns();
  // The arrays are in the figures, as the Swift variants' arrays of items are.
  dispatch_block_t *chain = malloc(sizeof(dispatch_block_t) * (size_t)branch);
  dispatch_block_t *fan = malloc(sizeof(dispatch_block_t) * (size_t)branch);
  dispatch_block_t root = dispatch_block_create(0, ^{
    scale_graph_ran(counter);
  });
  for (int64_t i = 0; i < branch; i++) {
    chain[i] = dispatch_block_create(0, ^{
      scale_graph_ran(counter);
    });
  }
  // Linked from the chain's start, as the Swift variants are.
  for (int64_t i = 0; i < branch; i++) dispatch_block_notify(i == 0 ? root : chain[i - 1], queue, chain[i]);
  for (int64_t i = 0; i < branch; i++) {
    dispatch_group_enter(group);
    fan[i] = dispatch_block_create(0, ^{
      scale_graph_ran(counter);
      dispatch_group_leave(group);
    });
    dispatch_block_notify(root, queue, fan[i]);
  }
  dispatch_block_t sink = dispatch_block_create(0, ^{
    scale_graph_ran(counter);
  });
  dispatch_group_notify(group, queue, sink);
  double result = 0;
  if (memory) {
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)items;
  }
  dispatch_async(queue, root);
  dispatch_block_wait(chain[branch - 1], DISPATCH_TIME_FOREVER);
  dispatch_block_wait(sink, DISPATCH_TIME_FOREVER);
  int64_t end = now_ns();
  check(__atomic_load_n(&ran, __ATOMIC_RELAXED) == items, "scale work item graph ran");
  if (!memory) result = per_op(start, end, items);
  Block_release(root);
  Block_release(sink);
  for (int64_t i = 0; i < branch; i++) {
    Block_release(chain[i]);
    Block_release(fan[i]);
  }
  free(chain);
  free(fan);
  dispatch_release(group);
  dispatch_release(queue);
  return result;
}

// MARK: - Scale: kernel rows (fs_watches, proc_sources, io_channels)
//
// What a C user writes where libdispatch on Linux has no source type for
// the job: one inotify instance read by one dispatch read source for file
// watches, a pidfd read source per child for process exits; dispatch_io
// stream channels for the copies.

#include <errno.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/syscall.h>
#include <sys/wait.h>

extern char **environ;

/// The directory of the watched files (`0` … `N-1` idle, `active`), made by GCDBenchmarks.
static char *scale_watch_directory;
EXPORT void bench_c_scale_set_watch_directory(const char *directory) {
  free(scale_watch_directory);
  scale_watch_directory = strdup(directory);
}

/// What a C user keeps per watch to give each file its own handler: the
/// watch descriptor and the handler, found by the descriptor.
struct scale_watch {
  int descriptor;
  void (^handler)(uint32_t mask);
};

/// `n` idle watches and one active one on one inotify instance, one read
/// source on it whose handler reads the events and calls each one's watch
/// record's handler (a table indexed by watch descriptor, which inotify
/// numbers from 1); `extra[1]` round trips of a 1-byte pwrite to the active
/// file. ns per event. Memory: bytes per idle watch (its record, its table
/// slot, the one source spread over them).
EXPORT double bench_c_scale_fs_watches(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  int64_t events = (int64_t)extra[1];
  check(scale_watch_directory != NULL, "scale fs_watches: directory set");
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.fs", NULL);
  int inotify = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  check(inotify >= 0, "scale fs_watches: inotify_init1");
  char path[4096];
  dispatch_semaphore_t got = dispatch_semaphore_create(0);
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  int64_t slots = n + 2;
  struct scale_watch **watches = calloc((size_t)slots, sizeof(struct scale_watch *));
  for (int64_t i = 0; i <= n; i++) {
    if (i < n) {
      snprintf(path, sizeof path, "%s/%lld", scale_watch_directory, (long long)i);
    } else {
      snprintf(path, sizeof path, "%s/active", scale_watch_directory);
    }
    int descriptor = inotify_add_watch(inotify, path, IN_MODIFY | IN_DELETE_SELF);
    check(descriptor > 0 && descriptor < slots && watches[descriptor] == NULL, "scale fs_watches: inotify_add_watch");
    struct scale_watch *watch = malloc(sizeof *watch);
    watch->descriptor = descriptor;
    if (i < n) {
      watch->handler = Block_copy(^(uint32_t mask) {
        (void)mask;
      });
    } else {
      watch->handler = Block_copy(^(uint32_t mask) {
        if (mask & IN_MODIFY) dispatch_semaphore_signal(got);
      });
    }
    watches[descriptor] = watch;
  }
  dispatch_semaphore_t cancelled = dispatch_semaphore_create(0);
  dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)inotify, 0, queue);
  dispatch_source_set_event_handler(source, ^{
    char buffer[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t length;
    while ((length = read(inotify, buffer, sizeof buffer)) > 0) {
      for (char *at = buffer; at < buffer + length;) {
        struct inotify_event *event = (struct inotify_event *)at;
        if (event->wd > 0 && event->wd < slots && watches[event->wd]) watches[event->wd]->handler(event->mask);
        at += sizeof(struct inotify_event) + event->len;
      }
    }
  });
  dispatch_source_set_cancel_handler(source, ^{
    close(inotify);
    dispatch_semaphore_signal(cancelled);
  });
  dispatch_activate(source);
  double result = 0;
  if (memory) {
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)n;
  } else {
    int file = open(path, O_WRONLY | O_CLOEXEC);
    check(file >= 0, "scale fs_watches: open active");
    char byte = 1;
    int64_t start = now_ns();
    for (int64_t i = 0; i < events; i++) {
      check(pwrite(file, &byte, 1, 0) == 1, "scale fs_watches: pwrite");
      dispatch_semaphore_wait(got, DISPATCH_TIME_FOREVER);
    }
    int64_t end = now_ns();
    close(file);
    result = per_op(start, end, events);
  }
  // Closing the instance drops every watch.
  dispatch_source_cancel(source);
  dispatch_semaphore_wait(cancelled, DISPATCH_TIME_FOREVER);
  dispatch_release(source);
  dispatch_release(got);
  dispatch_release(cancelled);
  dispatch_release(queue);
  for (int64_t i = 0; i < slots; i++) {
    if (watches[i]) {
      Block_release(watches[i]->handler);
      free(watches[i]);
    }
  }
  free(watches);
  return result;
}

/// `n` children blocked in /bin/cat reading a pipe that stays empty
/// (`*feed` its write end), holding only the standard descriptors; they
/// exit on SIGKILL, or on their own when this process dies.
static pid_t *scale_spawn_children(int64_t n, int *feed) {
  pid_t *pids = malloc(sizeof(pid_t) * (size_t)(n > 0 ? n : 1));
  int ends[2];
  check(pipe2(ends, O_CLOEXEC) == 0, "scale proc_sources: pipe");
  *feed = ends[1];
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, ends[0], 0);
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  char *argv[] = {"/bin/cat", NULL};
  for (int64_t i = 0; i < n; i++) {
    check(posix_spawn(&pids[i], "/bin/cat", &actions, NULL, argv, environ) == 0, "scale proc_sources: posix_spawn");
  }
  posix_spawn_file_actions_destroy(&actions);
  close(ends[0]);
  return pids;
}

static void scale_kill_and_reap(pid_t *pids, int64_t n) {
  for (int64_t i = 0; i < n; i++) kill(pids[i], SIGKILL);
  for (int64_t i = 0; i < n; i++) {
    while (waitpid(pids[i], NULL, 0) < 0 && errno == EINTR) {
    }
  }
}

/// `n` children, each with a pidfd and a read source on it; all killed
/// (SIGKILL each) until every exit has been delivered: the handler cancels
/// the source, its cancel handler (once libdispatch has let go of the
/// pidfd, which hangs up when the child is reaped) closes the pidfd and
/// reaps. ns per exit. Memory: bytes per source, the children alive.
EXPORT double bench_c_scale_proc_sources(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  int feed;
  pid_t *pids = scale_spawn_children(n, &feed);
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.proc", NULL);
  struct scale_count *count = malloc(sizeof *count);
  *count = (struct scale_count){0, n, dispatch_semaphore_create(0)};
  if (memory) scale_settle();
  int64_t heap = bench_c_heap_in_use();
  dispatch_source_t *sources = malloc(sizeof(dispatch_source_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) {
    pid_t pid = pids[i];
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    check(pidfd >= 0, "scale proc_sources: pidfd_open");
    dispatch_source_t source = dispatch_source_create(DISPATCH_SOURCE_TYPE_READ, (uintptr_t)pidfd, 0, queue);
    sources[i] = source;
    dispatch_source_set_event_handler(source, ^{
      dispatch_source_cancel(source);
    });
    dispatch_source_set_cancel_handler(source, ^{
      close(pidfd);
      if (!memory) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        scale_count_event(count);
      }
    });
    dispatch_activate(source);
  }
  double result = 0;
  if (memory) {
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)n;
    for (int64_t i = 0; i < n; i++) dispatch_source_cancel(sources[i]);
    dispatch_sync(queue, ^{
    });
    scale_kill_and_reap(pids, n);
  } else {
    int64_t start = now_ns();
    for (int64_t i = 0; i < n; i++) kill(pids[i], SIGKILL);
    dispatch_semaphore_wait(count->done, DISPATCH_TIME_FOREVER);
    int64_t end = now_ns();
    check(count->value == n, "scale proc_sources: exits");
    result = per_op(start, end, n);
  }
  for (int64_t i = 0; i < n; i++) dispatch_release(sources[i]);
  dispatch_sync(queue, ^{
  });
  free(sources);
  free(pids);
  close(feed);
  dispatch_release(count->done);
  free(count);
  dispatch_release(queue);
  return result;
}

/// `n` pipes, each copied by a stream channel writing `extra[1]` bytes (one
/// data object shared by all) and one reading that many; all at once.
/// ns per KiB. Memory: bytes per channel with one read pending on an idle
/// pipe.
EXPORT double bench_c_scale_io_channels(int64_t n, double *extra) {
  int memory = extra[0] != 0;
  size_t bytes = (size_t)extra[1];
  dispatch_queue_t queue = dispatch_queue_create("bench.scale.io", NULL);
  int *fds = malloc(sizeof(int) * 2 * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) check(pipe2(fds + 2 * i, O_CLOEXEC) == 0, "scale io_channels: pipe");
  dispatch_io_t *channels = malloc(sizeof(dispatch_io_t) * 2 * (size_t)(n > 0 ? n : 1));
  dispatch_group_t cleaned = dispatch_group_create();
  __block int64_t received = 0;
  __block int64_t copied = 0;
  dispatch_semaphore_t done = dispatch_semaphore_create(0);
  double result = 0;
  if (memory) {
    scale_settle();
    int64_t heap = bench_c_heap_in_use();
    for (int64_t i = 0; i < n; i++) {
      int descriptor = fds[2 * i];
      dispatch_group_enter(cleaned);
      channels[i] = dispatch_io_create(DISPATCH_IO_STREAM, descriptor, queue, ^(int error) {
        (void)error;
        close(descriptor);
        dispatch_group_leave(cleaned);
      });
      dispatch_io_read(channels[i], 0, 1, queue, ^(bool finished, dispatch_data_t data, int error) {
        (void)finished;
        (void)data;
        (void)error;
      });
    }
    scale_settle();
    result = (double)(bench_c_heap_in_use() - heap) / (double)n;
    for (int64_t i = 0; i < n; i++) {
      dispatch_io_close(channels[i], DISPATCH_IO_STOP);
      dispatch_release(channels[i]);
    }
    // The write ends close once the read channels are gone (their cleanups ran), so that no read
    // end hangs up while libdispatch watches it (swift-corelibs-libdispatch#949).
    dispatch_group_wait(cleaned, DISPATCH_TIME_FOREVER);
    for (int64_t i = 0; i < n; i++) close(fds[2 * i + 1]);
  } else {
    void *memory_bytes = malloc(bytes);
    memset(memory_bytes, 0x78, bytes);
    dispatch_data_t chunk = dispatch_data_create(memory_bytes, bytes, NULL, DISPATCH_DATA_DESTRUCTOR_FREE);
    // The read ends' cleanups leave `readers` too: the write channels close once the read channels
    // are gone, so that no read end hangs up while libdispatch watches it
    // (swift-corelibs-libdispatch#949).
    dispatch_group_t readers = dispatch_group_create();
    for (int64_t i = 0; i < 2 * n; i++) {
      int descriptor = fds[i];
      bool reading = i % 2 == 0;
      dispatch_group_enter(cleaned);
      if (reading) dispatch_group_enter(readers);
      channels[i] = dispatch_io_create(DISPATCH_IO_STREAM, descriptor, queue, ^(int error) {
        (void)error;
        close(descriptor);
        if (reading) dispatch_group_leave(readers);
        dispatch_group_leave(cleaned);
      });
    }
    int64_t start = now_ns();
    for (int64_t i = 0; i < n; i++) {
      dispatch_io_read(channels[2 * i], 0, bytes, queue, ^(bool finished, dispatch_data_t data, int error) {
        if (data) received += (int64_t)dispatch_data_get_size(data);
        if (finished) {
          check(error == 0, "scale io_channels: read error");
          if (++copied == n) dispatch_semaphore_signal(done);
        }
      });
      dispatch_io_write(channels[2 * i + 1], 0, chunk, queue, ^(bool finished, dispatch_data_t rest, int error) {
        (void)finished;
        (void)rest;
        (void)error;
      });
    }
    dispatch_semaphore_wait(done, DISPATCH_TIME_FOREVER);
    int64_t end = now_ns();
    for (int64_t i = 0; i < n; i++) {
      dispatch_io_close(channels[2 * i], 0);
      dispatch_release(channels[2 * i]);
    }
    dispatch_group_wait(readers, DISPATCH_TIME_FOREVER);
    dispatch_release(readers);
    for (int64_t i = 0; i < n; i++) {
      dispatch_io_close(channels[2 * i + 1], 0);
      dispatch_release(channels[2 * i + 1]);
    }
    dispatch_release(chunk);
    result = (double)(end - start) / ((double)n * (double)bytes / 1024.0);
  }
  dispatch_group_wait(cleaned, DISPATCH_TIME_FOREVER);
  if (!memory) check(received == n * (int64_t)bytes, "scale io_channels: bytes received");
  dispatch_release(cleaned);
  dispatch_release(done);
  free(channels);
  free(fds);
  dispatch_release(queue);
  return result;
}
