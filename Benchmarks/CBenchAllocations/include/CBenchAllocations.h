#ifndef CBENCHALLOCATIONS_H
#define CBENCHALLOCATIONS_H

/// The heap allocations the benchmark process has made so far, every thread included: each call
/// of malloc, calloc, realloc, aligned_alloc, posix_memalign, memalign and valloc, as valgrind's
/// memcheck counts them ("total heap usage: N allocs"). The benchmark executable defines those
/// functions (CBenchAllocations.c), so every allocation of the process — Swift's, libdispatch's,
/// bench_c.c's — goes through them to glibc's own (__libc_malloc and the rest); nothing else of
/// the package links this target.
unsigned long gcd_bench_allocations(void);

/// 1 when allocations are counted; 0 in a sanitizer's build, whose runtime defines malloc itself.
int gcd_bench_counts_allocations(void);

#endif
