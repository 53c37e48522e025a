// Candidate designs for a "descriptor fence": one process-wide epoll instance watched by ONE
// reader thread, which hands each ready connection to one of 2 WORKER threads (a mutex-protected
// queue plus a futex wake of an idle worker, standing in for libdispatch's queue hop); the worker
// runs the handler (ONE recv into a 4096-byte buffer, short read = queue empty; one send of the
// response) and then re-arms the connection.
//
// Workload: HTTP/1.1-like keep-alive on loopback. 64 TCP connections driven by one client thread
// (its own epoll); each sends an 80-byte request ending in "\r\n\r\n" and waits for the 80-byte
// response before sending the next. A request unanswered after 1 s is counted as lost (and its
// connection abandoned).
//
//   oneshot   EPOLLIN|EPOLLRDHUP|EPOLLONESHOT; the worker re-arms with EPOLL_CTL_MOD after every
//             handler (today's design). Reader epoll_wait takes 1 record, one handoff per event.
//   et        EPOLLIN|EPOLLRDHUP|EPOLLET registered once. Per connection, under its own lock:
//             armed, missed, epoch. Reader: armed -> disarm, epoch++, hand off; else missed = true.
//             Handler: short recv or EAGAIN -> drained = epoch it loaded before the recv. Re-arm:
//             !missed && drained == epoch -> armed = true, no system call; else missed = false,
//             armed = true, EPOLL_CTL_MOD with the same ET mask (re-polls, queues an event if data
//             is there). Reader epoll_wait takes 1 record.
//   et-batch  et, but the reader takes 64 records per epoll_wait and queues all ready connections
//             of one wait under one queue lock, waking at most one idle worker per queued
//             connection (so at most 2 futex wakes per batch, instead of one handoff per wait).
//   level     plain level-triggered registration, armed flag only; counts the reader's returns
//             that found the connection still with a worker ("disarmed").
//   uring     et's rule on io_uring (raw system calls): one multishot IORING_OP_POLL_ADD per
//             connection, submitted by the reader; a re-arm that must ask submits a one-shot poll.
//             The reader takes every completion in user space and waits in io_uring_enter only
//             when the completion queue is empty.
//   uring-reap  uring, but a worker takes the completions posted while its handler ran, after its
//             re-arm, and the reader parks on a futex (1 ms at most) while connections are with
//             workers; the last worker out that took nothing wakes it.
//   uring-batch  uring, but the reader's wait asks for 16 completions and returns with what there
//             is 50 us after the wait began (Linux 6.13's min_wait_usec): batches under load, no
//             delay for the first completion after an idle spell.
//   `partial` makes the handler recv only 16 bytes per call (a request needs 5+ calls): nothing
//             may be lost, the candidate must keep calling the handler until the request is read.
//
// All system calls on the hot path are the program's own and are counted (recv/send are
// recvfrom/sendto to the kernel; the queue and connection locks are a counted futex mutex, so the
// futex column is complete). Per-request figures are over a 3 s window after 0.5 s warm-up;
// `totals` lines count the whole run, for comparison with `strace -c -f`.
//
// Build: gcc -O2 -Wall -Wextra -pthread Benchmarks/probes/fence_candidates.c -o /tmp/fence_candidates
// Run:   /tmp/fence_candidates                    (2 interleaved rounds of the 4, then 3 partial runs)
//        /tmp/fence_candidates et [partial] [seconds]
//        strace -c -f /tmp/fence_candidates et 2  (then compare with the printed totals line)
//
// Measured here 2026-12-05 (Firecracker VM, 2 cores AMD EPYC, Linux 6.18, glibc 2.36, gcc 12.2).
// CAUTION: a Swift build/test run shared the 2 cores during nearly every run, so req/s moved by
// +-30% between runs (7 default runs); the per-request system-call counts are stable to ~0.01.
// cpu_us = CPU time of the whole process (server + client) per request. Default run at 14:58,
// full mode, server-side calls per request (client adds ~2.03: recv + send + epoll_wait share):
//   cand     rnd  req/s  cpu_us recv send epoll_ctl epoll_wait futex disarmed p50/p99 us lost
//   oneshot  1    71501  22.1   1    1    1.000     1.000      0.67  0        898/2012   0
//   et       1    58816  17.9   1    1    0.000     1.000      0.32  0.000    1020/2442  0
//   et-batch 1    58564  16.7   1    1    0.000     0.157      0.33  0.000    1008/2526  0
//   level    1    22602  43.0   1    1    0         19.45      1.16  18.45    1926/8005  0
//   oneshot  2    53645  18.1   1    1    1.000     1.000      0.31  0        1069/2628  0
//   et       2    60154  17.8   1    1    0.000     1.000      0.37  0.000    994/2310   0
//   et-batch 2    61440  15.8   1    1    0.000     0.144      0.32  0.000    988/2040   0
//   level    2    54960  28.7   1    1    0         6.95       0.85  5.95     907/5487   0
//   partial (16-byte reads, 5 handler calls per request): oneshot 30859 req/s, et 27248,
//   et-batch 29807; each 5.0 recv, 5.0 epoll_ctl per request, lost 0.
// Over all 7 runs: et's re-arm needed EPOLL_CTL_MOD for 0.00-0.8% of events (always `missed`:
// the next request arrived before the re-arm; never `undrained`); its handler never met an empty
// recv (level did, ~0.001/req: a stale report acted on after the re-arm); no request was lost in
// any candidate or mode. With `partial` every et re-arm is a MOD (a 16-byte read is never short):
// et degrades to oneshot's cost and still loses nothing. The run-to-run regime matters more than
// the design for req/s: with a quiet core the workers sleep often (futex ~0.8/req, ~1.7 events
// per batched wait, level ~4 spurious returns/req; 63-85k req/s for all four, level not slower);
// with the build running they rarely sleep (futex ~0.3, ~6.5 events per batched wait, level
// 14-19 spurious returns/req and 22-25k req/s). CPU per request (last two runs): oneshot
// 18-26 us, et 18-27, et-batch 16-28, level 27-43. p50 ~ 64 / throughput (closed loop).
// strace -c -f agreed with the totals lines exactly for recvfrom, sendto, epoll_wait and
// epoll_ctl, and to +2 for futex (thread joins).
//
// uring and uring-reap, 2026-12-05 (quiet machine, 3 interleaved rounds with et-batch, 3 s each),
// server calls per request: et-batch epoll_wait 0.61-0.65; uring io_uring_enter 0.39-0.42 (1.9-2.0
// completions per wait); uring-reap io_uring_enter 0.06-0.07 plus 0.09-0.10 parks (9-11 completions
// per reader wake). Process system time per request 22.1-22.7 us, 20.4-23.9, 19.8-23.0: no
// difference. strace -c -f shows why: a poll completion is task work for the thread that submitted
// the poll, so each one interrupts the parked reader (restart_syscall 0.91 per request, which the
// program's own counters cannot see). uring-batch (3 rounds against et-batch): io_uring_enter
// 0.15-0.16 per request (et-batch epoll_wait 0.64-0.67), futex 0.51-0.55 (0.85-0.92), system time
// 21.1-22.5 us (20.4-23.3), p99 1.73-1.86 ms (1.42-1.65). Lost 0 in every run, full and partial.
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/io_uring.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NCONN 64
#define NWORKERS 2
#define MSG_LEN 80
#define HIST_US 200000 // latency histogram: 1 us buckets up to 200 ms, then one overflow bucket
#define ET_MASK (EPOLLIN | EPOLLRDHUP | EPOLLET)
#define OS_MASK (EPOLLIN | EPOLLRDHUP | EPOLLONESHOT)
#define LT_MASK (EPOLLIN | EPOLLRDHUP)

enum cand { ONESHOT, ET, ET_BATCH, LEVEL, URING, URING_REAP, URING_BATCH, NCAND };
static const char *cand_name[NCAND] = {"oneshot", "et", "et-batch", "level", "uring", "uring-reap", "uring-batch"};
#define IS_URING(c) ((c) == URING || (c) == URING_REAP || (c) == URING_BATCH)

// Per-thread counters; written only by their thread (relaxed stores), read by main (relaxed loads).
enum ctr {
  C_RECV, C_SEND, C_EPCTL, C_EPWAIT, C_FUTEX_WAIT, C_FUTEX_WAKE, // server-side system calls
  C_URSUBMIT, C_URWAIT,                                         // io_uring_enter: submit, wait
  C_CRECV, C_CSEND, C_CEPWAIT, C_CEPCTL,                       // client-side system calls
  C_REAPED, C_PARKS,
  C_WAKEUPS, C_EVENTS, C_DISARMED, C_EMPTY, C_FAST, C_SLOW_MISSED, C_SLOW_UNDRAINED,
  C_SERVED, C_DONE, C_LOST, NCTR
};
typedef struct { uint64_t v[NCTR]; } counters;
static counters thread_ctrs[8];
static atomic_int next_ctr;
static __thread counters *tc;
#define INC(k, n) __atomic_store_n(&tc->v[k], tc->v[k] + (n), __ATOMIC_RELAXED)

static void snapshot(uint64_t *out) {
  memset(out, 0, NCTR * sizeof *out);
  for (int t = 0; t < 8; t++)
    for (int k = 0; k < NCTR; k++) out[k] += __atomic_load_n(&thread_ctrs[t].v[k], __ATOMIC_RELAXED);
}

static void bind_counters(void) { tc = &thread_ctrs[atomic_fetch_add(&next_ctr, 1)]; }

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static double sys_s(void) { // system time of the whole process
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_stime.tv_sec + (double)u.ru_stime.tv_usec * 1e-6;
}

static double cpu_s(void) { // user + system time of the whole process
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         (double)(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

static void die(const char *what) { perror(what); exit(1); }

// ---- counted futex mutex (Drepper, "Futexes Are Tricky", mutex 3) and futex wait/wake ----
static void futex_wait(atomic_uint *w, unsigned v) {
  INC(C_FUTEX_WAIT, 1);
  syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}
static void futex_wake(atomic_uint *w) {
  INC(C_FUTEX_WAKE, 1);
  syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
typedef struct { atomic_uint s; } lock_t; // 0 free, 1 locked, 2 locked with waiters
static void lock(lock_t *l) {
  unsigned c = 0;
  if (atomic_compare_exchange_strong(&l->s, &c, 1)) return;
  if (c != 2) c = atomic_exchange(&l->s, 2);
  while (c != 0) {
    futex_wait(&l->s, 2);
    c = atomic_exchange(&l->s, 2);
  }
}
static void unlock(lock_t *l) {
  if (atomic_fetch_sub(&l->s, 1) != 1) {
    atomic_store(&l->s, 0);
    futex_wake(&l->s);
  }
}

// ---- connections ----
typedef struct {
  int fd, match;                 // match: how much of "\r\n\r\n" the stream has matched so far
  lock_t mu;                     // guards armed, missed, epoch
  int armed, missed;
  unsigned epoch, drained;       // drained: written by the worker holding the connection
} conn;

// ---- handoff: queue under a lock, an idle worker is woken through its own futex word ----
typedef struct { atomic_uint go; } worker;
static struct {
  lock_t mu;
  conn *ring[256];
  unsigned head, tail;
  worker *idle[NWORKERS];
  int nidle;
} q;

static void push(conn **cs, int n) {
  worker *wake[NWORKERS];
  int nw = 0;
  lock(&q.mu);
  for (int i = 0; i < n; i++) q.ring[q.tail++ % 256] = cs[i];
  while (q.nidle > 0 && nw < n) {
    wake[nw] = q.idle[--q.nidle];
    atomic_store(&wake[nw]->go, 1);
    nw++;
  }
  unlock(&q.mu);
  for (int i = 0; i < nw; i++) futex_wake(&wake[i]->go);
}

static conn *pop(worker *self) {
  for (;;) {
    lock(&q.mu);
    if (q.head != q.tail) {
      conn *c = q.ring[q.head++ % 256];
      unlock(&q.mu);
      return c;
    }
    atomic_store(&self->go, 0);
    q.idle[q.nidle++] = self;
    unlock(&q.mu);
    while (atomic_load(&self->go) == 0) futex_wait(&self->go, 0);
  }
}

// ---- one run ----
static enum cand cur;
static int partial;
static int epfd;
static atomic_int stop_flag, measuring;
static conn conns[NCONN];
static int client_fd[NCONN];
static uint32_t hist[HIST_US + 1];
static const char request[] = "GET /plaintext HTTP/1.1\r\nHost: localhost\r\nUser-Agent: fence/1.0\r\n"
                              "Accept: */*\r\n\r\n";
static const char response1[] = "HTTP/1.1 200 OK\r\nContent-Length: 26\r\nServer: fence\r\n\r\n"
                                "Hello, World! fence probe.";
_Static_assert(sizeof request - 1 == MSG_LEN && sizeof response1 - 1 == MSG_LEN, "80-byte messages");
static char response[16 * MSG_LEN];

// The et rule for an event: an armed connection is disarmed and handed off (1); else it is a miss.
static int take(conn *c) {
  lock(&c->mu);
  int armed = c->armed;
  if (armed) {
    c->armed = 0;
    c->epoch++;
  } else {
    c->missed = 1;
    INC(C_DISARMED, 1);
  }
  unlock(&c->mu);
  return armed;
}

// ---- io_uring (uring, uring-reap, uring-batch): raw system calls, no liburing ----
// Each connection has one multishot IORING_OP_POLL_ADD (EPOLLIN | EPOLLRDHUP), submitted by the
// reader, so its completions are posted by task work on the reader's thread. The et rule decides
// the re-arm; a re-arm that must ask submits a one-shot poll of the connection (tagged bit 0).
static struct {
  int fd;
  unsigned *sq_tail, sq_mask, *sq_array, *cq_head, *cq_tail, cq_mask;
  struct io_uring_sqe *sqes;
  struct io_uring_cqe *cqes;
  void *sq_map, *cq_map;
  size_t sq_len, cq_len, sqes_len;
  lock_t sq_mu, cq_mu;
} ring;
static atomic_int inflight; // connections handed to workers and not yet re-armed
static atomic_uint parked;  // uring-reap: the reader sleeps on this word while workers reap

static void ring_setup(void) {
  struct io_uring_params p;
  memset(&p, 0, sizeof p);
  ring.fd = (int)syscall(__NR_io_uring_setup, 256, &p);
  if (ring.fd < 0) die("io_uring_setup");
  if (!(p.features & IORING_FEAT_SINGLE_MMAP)) { fprintf(stderr, "no single mmap\n"); exit(1); }
  if (cur == URING_BATCH && !(p.features & (1U << 15))) { // IORING_FEAT_MIN_TIMEOUT (Linux 6.13)
    fprintf(stderr, "no IORING_FEAT_MIN_TIMEOUT\n");
    exit(1);
  }
  ring.sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  ring.cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  if (ring.cq_len > ring.sq_len) ring.sq_len = ring.cq_len;
  ring.sq_map = mmap(NULL, ring.sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring.fd,
                     IORING_OFF_SQ_RING);
  if (ring.sq_map == MAP_FAILED) die("mmap sq");
  ring.cq_map = ring.sq_map;
  ring.sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
  ring.sqes = mmap(NULL, ring.sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring.fd,
                   IORING_OFF_SQES);
  if (ring.sqes == MAP_FAILED) die("mmap sqes");
  char *sq = ring.sq_map, *cq = ring.cq_map;
  ring.sq_tail = (unsigned *)(sq + p.sq_off.tail);
  ring.sq_mask = *(unsigned *)(sq + p.sq_off.ring_mask);
  ring.sq_array = (unsigned *)(sq + p.sq_off.array);
  ring.cq_head = (unsigned *)(cq + p.cq_off.head);
  ring.cq_tail = (unsigned *)(cq + p.cq_off.tail);
  ring.cq_mask = *(unsigned *)(cq + p.cq_off.ring_mask);
  ring.cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
}

static void ring_teardown(void) {
  munmap(ring.sqes, ring.sqes_len);
  munmap(ring.sq_map, ring.sq_len);
  close(ring.fd);
}

// Queues one poll of c (multishot, or one-shot for a re-arm that must ask) and submits it.
static void ring_poll(conn *c, int multishot) {
  lock(&ring.sq_mu);
  unsigned tail = *ring.sq_tail, idx = tail & ring.sq_mask;
  struct io_uring_sqe *e = &ring.sqes[idx];
  memset(e, 0, sizeof *e);
  e->opcode = IORING_OP_POLL_ADD;
  e->fd = c->fd;
  e->poll32_events = EPOLLIN | EPOLLRDHUP;
  e->len = multishot ? IORING_POLL_ADD_MULTI : 0;
  e->user_data = (uint64_t)(uintptr_t)c | (multishot ? 0 : 1);
  ring.sq_array[idx] = idx;
  __atomic_store_n(ring.sq_tail, tail + 1, __ATOMIC_RELEASE);
  INC(C_URSUBMIT, 1);
  if (syscall(__NR_io_uring_enter, ring.fd, 1, 0, 0, NULL, 0) != 1) die("io_uring_enter submit");
  unlock(&ring.sq_mu);
}

// Takes every completion posted so far, with no system call; returns the connections to hand off.
static int ring_reap(conn **ready) {
  conn *again[64];
  int nr = 0, na = 0;
  lock(&ring.cq_mu);
  unsigned head = *ring.cq_head, tail = __atomic_load_n(ring.cq_tail, __ATOMIC_ACQUIRE);
  for (; head != tail; head++) {
    struct io_uring_cqe *e = &ring.cqes[head & ring.cq_mask];
    conn *c = (conn *)(uintptr_t)(e->user_data & ~(uint64_t)1);
    int multishot = !(e->user_data & 1);
    if (multishot && !(e->flags & IORING_CQE_F_MORE) && na < 64) again[na++] = c;
    if (e->res < 0) continue;
    INC(C_EVENTS, 1);
    if (take(c)) ready[nr++] = c;
  }
  __atomic_store_n(ring.cq_head, head, __ATOMIC_RELEASE);
  unlock(&ring.cq_mu);
  for (int i = 0; i < na; i++)
    if (!atomic_load(&stop_flag)) ring_poll(again[i], 1);
  return nr;
}

static void hand_off(conn **ready, int nr) {
  atomic_fetch_add(&inflight, nr);
  push(ready, nr);
}

// uring-batch: wait for 16 completions, but return with what there is once 50 us have passed since
// the wait began (the `pad` of Linux 6.1's header is 6.13's min_wait_usec): an idle reader returns
// at the first completion, a busy one takes a batch.
static void ring_wait(void) {
  struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 50 * 1000 * 1000};
  struct io_uring_getevents_arg arg = {.sigmask = 0, .sigmask_sz = 8, .ts = (uint64_t)(uintptr_t)&ts};
  unsigned want = 1;
  if (cur == URING_BATCH) {
    arg.pad = 50;
    want = 16;
  }
  INC(C_URWAIT, 1);
  syscall(__NR_io_uring_enter, ring.fd, 0, want, IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
          &arg, sizeof arg);
}

static void futex_wait_1ms(atomic_uint *w, unsigned v) {
  struct timespec ts = {.tv_sec = 0, .tv_nsec = 1000 * 1000};
  INC(C_FUTEX_WAIT, 1);
  syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, &ts, NULL, 0);
}

// The handler: ONE recv, then one send answering every request completed by it.
static void handle(conn *c) {
  char buf[4096];
  size_t want = partial ? 16 : sizeof buf;
  unsigned e = c->epoch;
  ssize_t n = recv(c->fd, buf, want, 0);
  INC(C_RECV, 1);
  if (n < 0) {
    if (errno == EAGAIN) { c->drained = e; INC(C_EMPTY, 1); }
    return;
  }
  if (n == 0) return;
  if ((size_t)n < want) c->drained = e;
  int done = 0;
  for (ssize_t i = 0; i < n; i++) {
    char ch = buf[i];
    int expect = (c->match & 1) ? '\n' : '\r';
    if (ch == expect) c->match++;
    else c->match = (ch == '\r');
    if (c->match == 4) { done++; c->match = 0; }
  }
  if (done > 0) {
    if (done > 16) done = 16;
    if (send(c->fd, response, (size_t)done * MSG_LEN, MSG_NOSIGNAL) < 0) perror("server send");
    INC(C_SEND, 1);
    INC(C_SERVED, done);
  }
}

static void *worker_main(void *arg) {
  worker *self = arg;
  bind_counters();
  conn *c;
  while ((c = pop(self)) != NULL) {
    handle(c);
    if (cur == ONESHOT) {
      struct epoll_event ev = {.events = OS_MASK, .data.ptr = c};
      INC(C_EPCTL, 1);
      if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl MOD");
    } else if (cur == LEVEL) {
      lock(&c->mu);
      c->armed = 1;
      unlock(&c->mu);
    } else {
      lock(&c->mu);
      int fast = !c->missed && c->drained == c->epoch;
      if (fast) INC(C_FAST, 1);
      else INC(c->missed ? C_SLOW_MISSED : C_SLOW_UNDRAINED, 1);
      c->missed = 0;
      c->armed = 1;
      unlock(&c->mu);
      if (!fast && IS_URING(cur)) {
        ring_poll(c, 0);
      } else if (!fast) {
        struct epoll_event ev = {.events = ET_MASK, .data.ptr = c};
        INC(C_EPCTL, 1);
        if (epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev) < 0) die("epoll_ctl MOD");
      }
    }
    if (!IS_URING(cur)) continue;
    // The connection is re-armed; it leaves the in-flight count. uring-reap: every worker takes
    // what completed while its handler ran; the last one out with nothing taken hands the wait
    // back to the reader (the decrement comes first, so the last reap follows every other one).
    int left = atomic_fetch_sub(&inflight, 1) - 1;
    if (cur != URING_REAP) continue;
    conn *ready[256];
    int nr = ring_reap(ready);
    INC(C_REAPED, nr);
    if (nr > 0) hand_off(ready, nr);
    else if (left == 0 && atomic_exchange(&parked, 0) == 1) futex_wake(&parked);
  }
  return NULL;
}

// uring: the reader waits in io_uring_enter whenever the completion queue is empty.
// uring-reap: while connections are in flight the reader parks (at most 1 ms at a time, so a
// handler that blocks delays the others' events by that much), and the workers reap.
static void *ring_reader_main(void *arg) {
  (void)arg;
  bind_counters();
  for (int i = 0; i < NCONN; i++) ring_poll(&conns[i], 1); // the reader submits: task work is its
  conn *ready[256];
  while (!atomic_load(&stop_flag)) {
    int nr = ring_reap(ready);
    if (nr > 0) {
      INC(C_WAKEUPS, 1);
      hand_off(ready, nr);
    }
    if (cur == URING_REAP && atomic_load(&inflight) > 0) {
      atomic_store(&parked, 1);
      if (atomic_load(&inflight) > 0) {
        INC(C_PARKS, 1);
        futex_wait_1ms(&parked, 1);
      }
      atomic_store(&parked, 0);
      continue;
    }
    if (nr == 0) ring_wait();
  }
  return NULL;
}

static void *reader_main(void *arg) {
  (void)arg;
  bind_counters();
  int max = cur == ET_BATCH ? 64 : 1;
  struct epoll_event evs[64];
  conn *ready[64];
  while (!atomic_load(&stop_flag)) {
    INC(C_EPWAIT, 1);
    int n = epoll_wait(epfd, evs, max, 50);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    if (n <= 0) continue;
    INC(C_WAKEUPS, 1);
    INC(C_EVENTS, n);
    int nr = 0;
    for (int i = 0; i < n; i++) {
      conn *c = evs[i].data.ptr;
      if (cur == ONESHOT) { ready[nr++] = c; continue; }
      if (take(c)) ready[nr++] = c;
    }
    if (nr > 0) push(ready, nr);
  }
  return NULL;
}

static void *client_main(void *arg) {
  (void)arg;
  bind_counters();
  int cep = epoll_create1(0);
  double sent_at[NCONN];
  int got[NCONN], dead[NCONN];
  for (int i = 0; i < NCONN; i++) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
    INC(C_CEPCTL, 1);
    if (epoll_ctl(cep, EPOLL_CTL_ADD, client_fd[i], &ev) < 0) die("client epoll_ctl");
    got[i] = dead[i] = 0;
    sent_at[i] = now_s();
    INC(C_CSEND, 1);
    if (send(client_fd[i], request, MSG_LEN, MSG_NOSIGNAL) != MSG_LEN) die("client send");
  }
  double last_check = now_s();
  struct epoll_event evs[64];
  char buf[4096];
  while (!atomic_load(&stop_flag)) {
    INC(C_CEPWAIT, 1);
    int n = epoll_wait(cep, evs, 64, 100);
    double now = now_s();
    for (int k = 0; k < n; k++) {
      int i = (int)evs[k].data.u32;
      if (dead[i]) continue;
      INC(C_CRECV, 1);
      ssize_t r = recv(client_fd[i], buf, sizeof buf, 0);
      if (r <= 0) continue;
      got[i] += (int)r;
      if (got[i] < MSG_LEN) continue;
      got[i] -= MSG_LEN; // one request is outstanding at a time, so exactly one response is due
      if (atomic_load_explicit(&measuring, memory_order_relaxed)) {
        long us = (long)((now - sent_at[i]) * 1e6);
        hist[us < HIST_US ? us : HIST_US]++;
      }
      INC(C_DONE, 1);
      sent_at[i] = now;
      INC(C_CSEND, 1);
      if (send(client_fd[i], request, MSG_LEN, MSG_NOSIGNAL) != MSG_LEN) die("client send");
    }
    if (now - last_check > 0.1) {
      last_check = now;
      for (int i = 0; i < NCONN; i++)
        if (!dead[i] && now - sent_at[i] > 1.0) { dead[i] = 1; INC(C_LOST, 1); }
    }
  }
  close(cep);
  return NULL;
}

static double pct(uint64_t total, double p) {
  uint64_t want = (uint64_t)(p * (double)total), acc = 0;
  for (int us = 0; us <= HIST_US; us++)
    if ((acc += hist[us]) > want) return us;
  return HIST_US;
}

static void run(enum cand c, int part, double seconds, int round) {
  cur = c;
  partial = part;
  atomic_store(&stop_flag, 0);
  atomic_store(&measuring, 0);
  atomic_store(&next_ctr, 0);
  memset(thread_ctrs, 0, sizeof thread_ctrs);
  memset(hist, 0, sizeof hist);
  memset(&q, 0, sizeof q);
  bind_counters(); // main thread: setup epoll_ctl(ADD)s

  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t alen = sizeof a;
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, NCONN) < 0 ||
      getsockname(ls, (struct sockaddr *)&a, &alen) < 0) die("listen");
  epfd = epoll_create1(0);
  if (IS_URING(c)) ring_setup();
  atomic_store(&inflight, 0);
  atomic_store(&parked, 0);
  memset(&ring.sq_mu, 0, sizeof ring.sq_mu);
  memset(&ring.cq_mu, 0, sizeof ring.cq_mu);
  unsigned mask = c == ONESHOT ? OS_MASK : c == LEVEL ? LT_MASK : ET_MASK;
  for (int i = 0; i < NCONN; i++) {
    client_fd[i] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(client_fd[i], (struct sockaddr *)&a, sizeof a) < 0) die("connect");
    int s = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
    if (s < 0) die("accept");
    setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(client_fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conns[i] = (conn){.fd = s, .armed = 1};
    struct epoll_event ev = {.events = mask, .data.ptr = &conns[i]};
    if (IS_URING(c)) continue;
    INC(C_EPCTL, 1);
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, s, &ev) < 0) die("epoll_ctl ADD");
  }
  close(ls);

  pthread_t rt, ct, wt[NWORKERS];
  static worker ws[NWORKERS];
  for (int i = 0; i < NWORKERS; i++) pthread_create(&wt[i], NULL, worker_main, &ws[i]);
  pthread_create(&rt, NULL, IS_URING(c) ? ring_reader_main : reader_main, NULL);
  pthread_create(&ct, NULL, client_main, NULL);

  uint64_t s0[NCTR], s1[NCTR], total[NCTR];
  usleep(500000);
  snapshot(s0);
  double t0 = now_s(), cpu0 = cpu_s(), sys0 = sys_s();
  atomic_store(&measuring, 1);
  usleep((useconds_t)(seconds * 1e6));
  atomic_store(&measuring, 0);
  double t1 = now_s(), cpu1 = cpu_s(), sys1 = sys_s();
  snapshot(s1);

  atomic_store(&stop_flag, 1);
  pthread_join(ct, NULL);
  pthread_join(rt, NULL);
  conn *poison[NWORKERS] = {NULL};
  push(poison, NWORKERS);
  for (int i = 0; i < NWORKERS; i++) pthread_join(wt[i], NULL);
  snapshot(total);
  for (int i = 0; i < NCONN; i++) { close(conns[i].fd); close(client_fd[i]); }
  close(epfd);
  if (IS_URING(c)) ring_teardown();

  double d[NCTR];
  for (int k = 0; k < NCTR; k++) d[k] = (double)(s1[k] - s0[k]);
  double req = d[C_DONE] > 0 ? d[C_DONE] : 1;
  uint64_t nlat = 0;
  for (int us = 0; us <= HIST_US; us++) nlat += hist[us];
  double rearms = d[C_FAST] + d[C_SLOW_MISSED] + d[C_SLOW_UNDRAINED];
  printf("cand=%-10s mode=%-7s round=%d req_s=%.0f cpu_us=%.2f sys_us=%.2f recv=%.3f send=%.3f "
         "uring_submit=%.3f uring_wait=%.3f parks=%.3f reaped=%.3f epoll_ctl=%.3f "
         "epoll_wait=%.3f futex=%.3f futex_wait=%.3f futex_wake=%.3f wakeups=%.3f ev_per_wait=%.2f "
         "disarmed=%.3f empty_recv=%.3f rearm_syscall_pct=%.2f rearm_missed=%.0f rearm_undrained=%.0f "
         "client=%.3f p50_us=%.0f p99_us=%.0f lost=%llu\n",
         cand_name[c], part ? "partial" : "full", round, d[C_DONE] / (t1 - t0),
         (cpu1 - cpu0) * 1e6 / req, (sys1 - sys0) * 1e6 / req, d[C_RECV] / req, d[C_SEND] / req,
         d[C_URSUBMIT] / req, d[C_URWAIT] / req, d[C_PARKS] / req, d[C_REAPED] / req,
         d[C_EPCTL] / req, d[C_EPWAIT] / req,
         (d[C_FUTEX_WAIT] + d[C_FUTEX_WAKE]) / req, d[C_FUTEX_WAIT] / req, d[C_FUTEX_WAKE] / req,
         d[C_WAKEUPS] / req, d[C_WAKEUPS] > 0 ? d[C_EVENTS] / d[C_WAKEUPS] : 0, d[C_DISARMED] / req,
         d[C_EMPTY] / req,
         c == ET || c == ET_BATCH || IS_URING(c) ? 100.0 * (rearms - d[C_FAST]) / (rearms ? rearms : 1) : 0,
         d[C_SLOW_MISSED], d[C_SLOW_UNDRAINED], (d[C_CRECV] + d[C_CSEND] + d[C_CEPWAIT]) / req,
         pct(nlat, 0.50), pct(nlat, 0.99), (unsigned long long)total[C_LOST]);
  // Whole-run counts (setup ADDs included) for strace -c -f; the served/done gap is requests still
  // in flight at stop, not losses.
  printf("totals cand=%s recvfrom=%llu sendto=%llu epoll_ctl=%llu epoll_wait=%llu futex=%llu "
         "served=%llu done=%llu\n",
         cand_name[c], (unsigned long long)(total[C_RECV] + total[C_CRECV]),
         (unsigned long long)(total[C_SEND] + total[C_CSEND]),
         (unsigned long long)(total[C_EPCTL] + total[C_CEPCTL]),
         (unsigned long long)(total[C_EPWAIT] + total[C_CEPWAIT]),
         (unsigned long long)(total[C_FUTEX_WAIT] + total[C_FUTEX_WAKE]),
         (unsigned long long)total[C_SERVED], (unsigned long long)total[C_DONE]);
  fflush(stdout);
}

int main(int argc, char **argv) {
  int only = -1, part = 0;
  double seconds = 3;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "partial")) { part = 1; continue; }
    int found = 0;
    for (int k = 0; k < NCAND; k++)
      if (!strcmp(argv[i], cand_name[k])) { only = k; found = 1; }
    if (!found && atof(argv[i]) > 0) seconds = atof(argv[i]);
    else if (!found) {
      fprintf(stderr, "usage: %s [oneshot|et|et-batch|level|uring|uring-reap|uring-batch] [partial] [seconds]\n", argv[0]);
      return 2;
    }
  }
  for (int i = 0; i < (int)sizeof response; i += MSG_LEN)
    memcpy(response + i, response1, MSG_LEN);
  if (only >= 0) { run((enum cand)only, part, seconds, 1); return 0; }
  for (int round = 1; round <= 2; round++)
    for (int k = 0; k < NCAND; k++) run((enum cand)k, part, seconds, round);
  if (!part)
    for (int k = 0; k < NCAND; k++)
      if (k != LEVEL) run((enum cand)k, 1, seconds, 1);
  return 0;
}
