// Allocation counts for `make bench` (docs/performance.md, "Reproduce"): preloaded into the
// benchmark (LD_PRELOAD), this library defines the allocation functions, and the dynamic linker
// binds every library's calls to them (a preloaded object comes before every library in the
// global lookup scope), so each allocation of the process — Swift's, libdispatch's, bench_c.c's —
// is counted here and then made by glibc's own allocator (__libc_malloc and the rest), unchanged.
// The benchmark finds gcd_bench_allocations with dlsym and shows no count without it
// (Benchmarks/callgrind.sh, `make test`'s --quick run).
//
// One counter per thread, each on its own cache line and written only by its thread (a relaxed
// load and store, no read-modify-write, no sharing), in static memory so that a thread's count
// outlives it; the 1,024 first threads get one, the rest share an atomic counter. A thread finds
// its counter through a thread-local index in static TLS (initial-exec: a preloaded library gets
// its TLS with the program's, so no thread's first access allocates from inside malloc, as a
// dynamic TLS block would).

#include <errno.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t count, size_t size);
extern void *__libc_realloc(void *pointer, size_t size);
extern void *__libc_memalign(size_t alignment, size_t size);
extern void *__libc_valloc(size_t size);

enum { slotCount = 1024 };

struct slot {
  alignas(64) _Atomic unsigned long count;
};

static struct slot slots[slotCount];
static _Atomic int slotsUsed;
static _Atomic unsigned long shared;
static _Thread_local int mySlot __attribute__((tls_model("initial-exec"))) = -1;

static void counted(void) {
  int slot = mySlot;
  if (slot < 0) {
    slot = atomic_fetch_add_explicit(&slotsUsed, 1, memory_order_relaxed);
    if (slot >= slotCount) slot = slotCount;
    mySlot = slot;
  }
  if (slot < slotCount) {
    _Atomic unsigned long *count = &slots[slot].count;
    atomic_store_explicit(count, atomic_load_explicit(count, memory_order_relaxed) + 1, memory_order_relaxed);
  } else {
    atomic_fetch_add_explicit(&shared, 1, memory_order_relaxed);
  }
}

/// The heap allocations the process has made so far, every thread included: each call of malloc,
/// calloc, realloc, aligned_alloc, posix_memalign, memalign and valloc, as valgrind's memcheck counts
/// them ("total heap usage: N allocs").
unsigned long gcd_bench_allocations(void);

unsigned long gcd_bench_allocations(void) {
  int used = atomic_load_explicit(&slotsUsed, memory_order_relaxed);
  if (used > slotCount) used = slotCount;
  unsigned long total = atomic_load_explicit(&shared, memory_order_relaxed);
  for (int index = 0; index < used; index++) total += atomic_load_explicit(&slots[index].count, memory_order_relaxed);
  return total;
}

void *malloc(size_t size) {
  counted();
  return __libc_malloc(size);
}

void *calloc(size_t count, size_t size) {
  counted();
  return __libc_calloc(count, size);
}

void *realloc(void *pointer, size_t size) {
  counted();
  return __libc_realloc(pointer, size);
}

void *memalign(size_t alignment, size_t size) {
  counted();
  return __libc_memalign(alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
  counted();
  return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
  counted();
  return __libc_valloc(size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
  if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) return EINVAL;
  counted();
  void *pointer = __libc_memalign(alignment, size);
  if (pointer == NULL) return ENOMEM;
  *out = pointer;
  return 0;
}
