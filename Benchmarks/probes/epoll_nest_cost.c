// The system-call cost of the two ways to keep a descriptor source's descriptor away from
// libdispatch's epoll layer (docs/sources-linux.md, "One instance per source, not one shared"):
//
//   per-source   each source makes an epoll instance holding its descriptor: at creation
//                epoll_create1 + epoll_ctl(ADD), at the end close; per event nothing (libdispatch's
//                own epoll_wait and re-arm reach the nested descriptor through the kernel)
//   shared       one instance for the process: at creation epoll_ctl(ADD), at the end
//                epoll_ctl(DEL); per event the package's demultiplexer makes an epoll_wait and,
//                one-shot so that a level-triggered descriptor does not fire again before its
//                handler has read, an epoll_ctl(MOD) re-arm
//
// It times each sequence on a pipe, single-threaded, median of 7 runs of N.
// Build and run: cc -O2 Benchmarks/probes/epoll_nest_cost.c -o /tmp/epoll_nest_cost && /tmp/epoll_nest_cost
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int compare(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

#define RUNS 7

static double median(double *samples) {
  qsort(samples, RUNS, sizeof(double), compare);
  return samples[RUNS / 2];
}

int main(int argc, char **argv) {
  int n = argc > 1 ? atoi(argv[1]) : 100000;
  int ends[2];
  if (pipe(ends) != 0) return 1;
  if (write(ends[1], "x", 1) != 1) return 1;  // the read end stays readable
  double samples[RUNS];
  struct epoll_event event = {.events = EPOLLIN, .data = {.fd = ends[0]}};

  for (int run = 0; run < RUNS; run++) {
    double start = now_ns();
    for (int i = 0; i < n; i++) {
      int instance = epoll_create1(EPOLL_CLOEXEC);
      epoll_ctl(instance, EPOLL_CTL_ADD, ends[0], &event);
      close(instance);
    }
    samples[run] = (now_ns() - start) / n;
  }
  printf("per-source create+cancel: epoll_create1 + ADD + close   %.0f ns\n", median(samples));

  int shared = epoll_create1(EPOLL_CLOEXEC);
  for (int run = 0; run < RUNS; run++) {
    double start = now_ns();
    for (int i = 0; i < n; i++) {
      epoll_ctl(shared, EPOLL_CTL_ADD, ends[0], &event);
      epoll_ctl(shared, EPOLL_CTL_DEL, ends[0], NULL);
    }
    samples[run] = (now_ns() - start) / n;
  }
  printf("shared create+cancel:     ADD + DEL                      %.0f ns\n", median(samples));

  struct epoll_event oneshot = {.events = EPOLLIN | EPOLLONESHOT, .data = {.fd = ends[0]}};
  epoll_ctl(shared, EPOLL_CTL_ADD, ends[0], &oneshot);
  for (int run = 0; run < RUNS; run++) {
    double start = now_ns();
    for (int i = 0; i < n; i++) {
      struct epoll_event ready[16];
      epoll_wait(shared, ready, 16, 0);
      epoll_ctl(shared, EPOLL_CTL_MOD, ends[0], &oneshot);
    }
    samples[run] = (now_ns() - start) / n;
  }
  printf("shared, extra per event:  epoll_wait + MOD re-arm        %.0f ns\n", median(samples));
  printf("per-source, extra per event: none (0 system calls)\n");
  printf("descriptors: per-source 1 per source; shared 1 per process\n");
  return 0;
}
