#define _GNU_SOURCE
#include "CGCD.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local cgcd_frame_t *cgcd_current_frame = NULL;

// Runs `call` (a statement) as the package's work on `queue`: recorded for the stall monitor
// while one watches (Stall.c), with `site` the address of the code it runs; plain otherwise, at
// the cost of one relaxed load and a branch.
#define CGCD_RUN_WATCHED(queue, site, call)                              \
  do {                                                                   \
    if (__builtin_expect(cgcd_stall_is_watching(), 0)) {                 \
      uint32_t cgcd_depth = cgcd_stall_begin((queue), (uintptr_t)(site), 0); \
      call;                                                              \
      cgcd_stall_end(cgcd_depth);                                        \
    } else {                                                             \
      call;                                                              \
    }                                                                    \
  } while (0)

const char cgcd_key_storage[CGCD_KEY_COUNT] = {0};

// The main thread's id, cached per thread: gettid is a system call.
static _Thread_local int cgcd_thread_is_main = -1;

int cgcd_is_main_thread(void) {
  if (cgcd_thread_is_main < 0) {
    cgcd_thread_is_main = (pid_t)syscall(SYS_gettid) == getpid();
  }
  return cgcd_thread_is_main;
}

int cgcd_pidfd_open(int pid, unsigned int flags) { return (int)syscall(SYS_pidfd_open, pid, flags); }

int cgcd_o_path(void) { return O_PATH; }

int cgcd_o_direct(void) { return O_DIRECT; }

// The first word of a Swift closure as Swift passes it: its code (`stallSite`, Stall.swift).
__attribute__((swiftcall)) uintptr_t cgcd_stall_site(cgcd_swift_closure_fn function, void *context) {
  (void)context;
  return (uintptr_t)function;
}

// MARK: - sync and apply of Swift closures

extern void cgcd_dispatch_apply_f(size_t iterations, void *queue, void *context, void (*work)(void *, size_t))
    __asm__("dispatch_apply_f");
extern void cgcd_dispatch_async_f(void *queue, void *context, void (*work)(void *)) __asm__("dispatch_async_f");
extern void cgcd_dispatch_barrier_async_f(void *queue, void *context, void (*work)(void *))
    __asm__("dispatch_barrier_async_f");
extern void cgcd_dispatch_after_f(uint64_t when, void *queue, void *context, void (*work)(void *))
    __asm__("dispatch_after_f");
extern void cgcd_dispatch_group_notify_f(void *group, void *queue, void *context, void (*work)(void *))
    __asm__("dispatch_group_notify_f");

// dispatch_barrier_sync_f or dispatch_sync_f, as the caller asked.
static inline void cgcd_dispatch_sync_either(uintptr_t barrier, void *queue, void *context, void (*work)(void *)) {
  if (barrier) {
    cgcd_dispatch_barrier_sync_f(queue, context, work);
  } else {
    cgcd_dispatch_sync_f(queue, context, work);
  }
}

// dispatch_barrier_async_and_wait_f or dispatch_async_and_wait_f, as the caller asked.
static inline void cgcd_dispatch_async_and_wait_either(uintptr_t barrier, void *queue, void *context,
                                                       void (*work)(void *)) {
  if (barrier) {
    cgcd_barrier_async_and_wait_f(queue, context, work);
  } else {
    cgcd_async_and_wait_f(queue, context, work);
  }
}

// A non-escaping Swift closure on its way through dispatch_sync_f or
// dispatch_apply_f, with the frame it runs in: for `queue`, linked to the
// caller's chain (for apply, shared read-only by every iteration).
struct cgcd_call {
  cgcd_frame_t frame;
  union {
    cgcd_swift_closure_fn closure;
    cgcd_swift_index_fn indexed;
    void (*plain)(void *);
    void (*plain_indexed)(void *, size_t);
  } function;
  void *context;
};

static inline struct cgcd_call cgcd_call_make(void *queue, uintptr_t flags, void *context) {
  return (struct cgcd_call){.frame = {.queue = queue, .flags = flags, .prev = cgcd_current_frame}, .context = context};
}

// Runs `invocation` (a statement that calls `call->function.member`) inside the frame of `call`
// (a `struct cgcd_call *`), watched as CGCD_RUN_WATCHED runs it; the thread's frame is restored
// after: the body of every trampoline of a `cgcd_call`.
#define CGCD_RUN_IN_FRAME(call, member, invocation)                             \
  do {                                                                          \
    cgcd_frame_t *cgcd_saved = cgcd_current_frame;                              \
    cgcd_current_frame = &(call)->frame;                                        \
    CGCD_RUN_WATCHED((call)->frame.queue, (call)->function.member, invocation); \
    cgcd_current_frame = cgcd_saved;                                            \
  } while (0)

static void cgcd_sync_trampoline(void *argument) {
  struct cgcd_call *call = argument;
  CGCD_RUN_IN_FRAME(call, closure, call->function.closure(call->context));
}

__attribute__((swiftcall)) void cgcd_sync(void *queue, uintptr_t flags, uintptr_t barrier,
                                          cgcd_swift_closure_fn function, void *context) {
  struct cgcd_call call = cgcd_call_make(queue, flags, context);
  call.function.closure = function;
  cgcd_dispatch_sync_either(barrier, queue, &call, cgcd_sync_trampoline);
}

__attribute__((swiftcall)) void cgcd_async_and_wait(void *queue, uintptr_t flags, uintptr_t barrier,
                                                    cgcd_swift_closure_fn function, void *context) {
  struct cgcd_call call = cgcd_call_make(queue, flags, context);
  call.function.closure = function;
  cgcd_dispatch_async_and_wait_either(barrier, queue, &call, cgcd_sync_trampoline);
}

// The fast path of `sync` from outside any queue (no frame on this thread)
// onto a queue that cannot hand the work to another thread (not the main
// queue, no target set by the package): dispatch_sync runs the work on the
// calling thread, so the frame is pushed here, around the wait, and the
// trampoline only calls the closure.
struct cgcd_closure {
  cgcd_swift_closure_fn function;
  void *context;
};

static void cgcd_closure_trampoline(void *argument) {
  struct cgcd_closure *closure = argument;
  closure->function(closure->context);
}

__attribute__((swiftcall)) void cgcd_sync_here(void *queue, uintptr_t flags, uintptr_t barrier,
                                               cgcd_swift_closure_fn function, void *context) {
  // Watched, the work goes the general way, where its trampoline records it (not the wait).
  if (__builtin_expect(cgcd_stall_is_watching(), 0)) {
    cgcd_sync(queue, flags, barrier, function, context);
    return;
  }
  struct cgcd_closure closure = {.function = function, .context = context};
  cgcd_frame_t frame = {.queue = queue, .flags = flags, .prev = NULL};
  cgcd_current_frame = &frame;
  cgcd_dispatch_sync_either(barrier, queue, &closure, cgcd_closure_trampoline);
  cgcd_current_frame = NULL;
}

static void cgcd_apply_trampoline(void *argument, size_t index) {
  struct cgcd_call *call = argument;
  CGCD_RUN_IN_FRAME(call, indexed, call->function.indexed((intptr_t)index, call->context));
}

__attribute__((swiftcall)) void cgcd_apply(size_t iterations, void *queue, uintptr_t flags,
                                           cgcd_swift_index_fn function, void *context) {
  struct cgcd_call call = cgcd_call_make(queue, flags | CGCD_FRAME_FORKED, context);
  call.function.indexed = function;
  cgcd_dispatch_apply_f(iterations, queue, &call, cgcd_apply_trampoline);
}

// MARK: - The function forms inside a frame

static void cgcd_sync_function_trampoline(void *argument) {
  struct cgcd_call *call = argument;
  CGCD_RUN_IN_FRAME(call, plain, call->function.plain(call->context));
}

void cgcd_sync_function(void *queue, uintptr_t flags, uintptr_t barrier, void *context, void (*function)(void *)) {
  struct cgcd_call call = cgcd_call_make(queue, flags, context);
  call.function.plain = function;
  cgcd_dispatch_sync_either(barrier, queue, &call, cgcd_sync_function_trampoline);
}

void cgcd_async_and_wait_function(void *queue, uintptr_t flags, uintptr_t barrier, void *context,
                                  void (*function)(void *)) {
  struct cgcd_call call = cgcd_call_make(queue, flags, context);
  call.function.plain = function;
  cgcd_dispatch_async_and_wait_either(barrier, queue, &call, cgcd_sync_function_trampoline);
}

// An asynchronous function call on its way to its queue: what its frame needs
// (the queue and the flags) beside the caller's function and context.
struct cgcd_async_call {
  void *queue;
  uintptr_t flags;
  void *context;
  void (*function)(void *);
};

static struct cgcd_async_call *cgcd_async_call_make(void *queue, uintptr_t flags, void *context,
                                                    void (*function)(void *)) {
  struct cgcd_async_call *call = malloc(sizeof *call);
  if (call == NULL) abort();
  *call = (struct cgcd_async_call){.queue = queue, .flags = flags, .context = context, .function = function};
  return call;
}

static void cgcd_async_function_trampoline(void *argument) {
  struct cgcd_async_call call = *(struct cgcd_async_call *)argument;
  free(argument);
  cgcd_frame_t frame = {.queue = call.queue, .flags = call.flags, .prev = cgcd_current_frame};
  cgcd_current_frame = &frame;
  CGCD_RUN_WATCHED(call.queue, call.function, call.function(call.context));
  cgcd_current_frame = frame.prev;
}

void cgcd_async_function(void *queue, uintptr_t flags, uintptr_t barrier, void *context, void (*function)(void *)) {
  struct cgcd_async_call *call = cgcd_async_call_make(queue, flags, context, function);
  if (barrier) {
    cgcd_dispatch_barrier_async_f(queue, call, cgcd_async_function_trampoline);
  } else {
    cgcd_dispatch_async_f(queue, call, cgcd_async_function_trampoline);
  }
}

void cgcd_after_function(uint64_t when, void *queue, uintptr_t flags, void *context, void (*function)(void *)) {
  // DISPATCH_TIME_FOREVER: dispatch_after_f drops the call without running
  // it (and would leak the record).
  if (when == UINT64_MAX) return;
  cgcd_dispatch_after_f(when, queue, cgcd_async_call_make(queue, flags, context, function),
                        cgcd_async_function_trampoline);
}

void cgcd_group_notify_function(void *group, void *queue, uintptr_t flags, void *context, void (*function)(void *)) {
  cgcd_dispatch_group_notify_f(group, queue, cgcd_async_call_make(queue, flags, context, function),
                               cgcd_async_function_trampoline);
}

static void cgcd_apply_function_trampoline(void *argument, size_t index) {
  struct cgcd_call *call = argument;
  CGCD_RUN_IN_FRAME(call, plain_indexed, call->function.plain_indexed(call->context, index));
}

void cgcd_apply_function(size_t iterations, void *queue, uintptr_t flags, void *context,
                         void (*function)(void *, size_t)) {
  struct cgcd_call call = cgcd_call_make(queue, flags | CGCD_FRAME_FORKED, context);
  call.function.plain_indexed = function;
  cgcd_dispatch_apply_f(iterations, queue, &call, cgcd_apply_function_trampoline);
}

// MARK: - Copying dispatch data out

struct cgcd_copy {
  char *target;
  size_t start;
  size_t end;
};

static bool cgcd_copy_region(void *context, void *region, size_t offset, const void *buffer, size_t size) {
  (void)region;
  const struct cgcd_copy *copy = context;
  size_t from = offset > copy->start ? offset : copy->start;
  size_t to = offset + size < copy->end ? offset + size : copy->end;
  if (to > from) memcpy(copy->target + (from - copy->start), (const char *)buffer + (from - offset), to - from);
  return offset + size < copy->end;
}

// The whole object: no region needs clamping (the loop a C caller writes).
static bool cgcd_copy_whole_region(void *context, void *region, size_t offset, const void *buffer, size_t size) {
  (void)region;
  memcpy((char *)context + offset, buffer, size);
  return true;
}

void cgcd_data_copy_out(void *data, void *target, size_t start, size_t end, size_t total) {
  if (start == 0 && end == total) {
    cgcd_data_apply_f(data, target, cgcd_copy_whole_region);
    return;
  }
  struct cgcd_copy copy = {target, start, end};
  cgcd_data_apply_f(data, &copy, cgcd_copy_region);
}

// MARK: - The queued bytes of a descriptor source's descriptor (issue 18)

#include <linux/sockios.h>
#include <sys/ioctl.h>

int cgcd_queued_bytes(int descriptor, int output, int *bytes) {
  return ioctl(descriptor, output ? SIOCOUTQ : SIOCINQ, bytes);
}


// MARK: - A source handler block that holds one pointer (cgcd_source_set_context_handler)

// The blocks ABI (clang's Block-ABI-Apple.txt, BlocksRuntime): a block is its isa, flags, a
// reserved word, its invoke function and its descriptor, then what it captured. A stack block
// without BLOCK_HAS_COPY_DISPOSE is copied to the heap byte for byte by _Block_copy, which gives
// the copy BLOCK_NEEDS_FREE and a reference count, and frees it at the last release.
extern void *_NSConcreteStackBlock[32];
extern void cgcd_source_set_event_handler_raw(void *source, void *block) __asm__("dispatch_source_set_event_handler");

struct cgcd_context_block_descriptor {
  unsigned long reserved;
  unsigned long size;
};

struct cgcd_context_block {
  void *isa;
  int flags;
  int reserved;
  void (*invoke)(void *block);
  const struct cgcd_context_block_descriptor *descriptor;
  void *context;
};

static const struct cgcd_context_block_descriptor cgcd_context_block_descriptor = {
  0, sizeof(struct cgcd_context_block)};

void cgcd_source_set_context_handler(void *source, void (*invoke)(void *block), void *context) {
  struct cgcd_context_block block = {
    _NSConcreteStackBlock, 0, 0, invoke, &cgcd_context_block_descriptor, context};
  cgcd_source_set_event_handler_raw(source, &block);
}

void *cgcd_block_context(const void *block) { return ((const struct cgcd_context_block *)block)->context; }
