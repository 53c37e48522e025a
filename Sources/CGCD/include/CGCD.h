// CGCD: the few pieces of libdispatch and Linux that Swift cannot import
// directly, used only by Sources/GCD/Internals (the package's C boundary).
// No logic lives here, except the frame-pushing trampolines that let a
// non-escaping Swift closure run through dispatch_sync_f / dispatch_apply_f
// (see Internals/NonEscapingClosure.swift).
//
// A C target cannot include <dispatch/dispatch.h> (it needs blocks and the
// toolchain's private include folder), so the libdispatch symbols below are
// declared under new names bound to the real symbols with asm labels: a call
// to `cgcd_release` is a direct call of `dispatch_release`, with no wrapper
// function in between.
#ifndef CGCD_H
#define CGCD_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>

#pragma clang assume_nonnull begin

// MARK: - Stall watching: the one word every submission and run checks (Stall.c)

/// Nonzero while a `StallMonitor` watches: the package's submissions and runs take their watched
/// path. Hidden: the package's Swift code reads it with one RIP-relative load.
extern int cgcd_stall_watching __attribute__((visibility("hidden")));

/// Whether a monitor watches (a relaxed load: the one cost of the feature when it is off).
static inline int cgcd_stall_is_watching(void) { return __atomic_load_n(&cgcd_stall_watching, __ATOMIC_RELAXED); }

// MARK: - Object lifetime (unavailable in Swift: "Can't be used with ARC")

/// The corresponding C function is `dispatch_retain`.
extern void cgcd_retain(void *object) __asm__("dispatch_retain");
/// The corresponding C function is `dispatch_release`.
extern void cgcd_release(void *object) __asm__("dispatch_release");

// MARK: - Sources

/// `dispatch_source_create`, declared so that its NULL result (bad handle,
/// bad mask) is visible to Swift as an optional instead of a null non-optional.
extern void *_Nullable cgcd_source_create(const void *type, uintptr_t handle,
                                          uintptr_t mask, void *_Nullable queue)
    __asm__("dispatch_source_create");

// DISPATCH_SOURCE_TYPE_* are addresses of exported structures of incomplete
// type; Swift cannot take their address, so these inline functions do.
#define CGCD_SOURCE_TYPE(name)                                                 \
  extern const char cgcd_source_type_##name##_sym                             \
      __asm__("_dispatch_source_type_" #name);                                 \
  static inline const void *cgcd_source_type_##name(void) {                   \
    return &cgcd_source_type_##name##_sym;                                     \
  }
CGCD_SOURCE_TYPE(data_add)
CGCD_SOURCE_TYPE(data_or)
CGCD_SOURCE_TYPE(data_replace)
CGCD_SOURCE_TYPE(read)
CGCD_SOURCE_TYPE(write)
CGCD_SOURCE_TYPE(signal)
CGCD_SOURCE_TYPE(timer)
#undef CGCD_SOURCE_TYPE

// MARK: - Queue attributes

/// DISPATCH_QUEUE_CONCURRENT (a macro over an incomplete global).
extern char cgcd_queue_attr_concurrent_sym __asm__("_dispatch_queue_attr_concurrent");
static inline void *cgcd_queue_attr_concurrent(void) {
  return &cgcd_queue_attr_concurrent_sym;
}

// MARK: - Execution frames (re-entrancy checks)

/// One entry of the per-thread chain of queues the current thread is running
/// on: pushed by the Swift trampolines around every closure they run, linked
/// to the caller's chain for `sync` and `apply`. `flags` bit 0 marks a frame
/// that holds its queue exclusively (a serial queue, or a barrier); bit 1
/// (`CGCD_FRAME_FORKED`) marks an iteration of `apply`, which runs beside the
/// other iterations on other threads: the frames after it are held by the
/// thread that called `apply` (the deadlock check sees them) but this thread
/// does not run their work (`isCurrent` stops there).
typedef struct cgcd_frame {
  void *_Nullable queue;
  uintptr_t flags;
  struct cgcd_frame *_Nullable prev;
} cgcd_frame_t;

// initial-exec: a direct %fs-relative access instead of a __tls_get_addr call
// on every sync (the package is linked into the program or loaded with it).
extern _Thread_local cgcd_frame_t *_Nullable cgcd_current_frame __attribute__((tls_model("initial-exec")));

#define CGCD_FRAME_FORKED ((uintptr_t)2)

static inline cgcd_frame_t *_Nullable cgcd_frame_get(void) { return cgcd_current_frame; }
static inline void cgcd_frame_set(cgcd_frame_t *_Nullable frame) { cgcd_current_frame = frame; }

// MARK: - sync without allocation

/// A Swift closure `() -> Void` as C sees it: its invocation function, which
/// takes the closure's context in the Swift context register.
typedef void (*cgcd_swift_closure_fn)(void *_Nullable __attribute__((swift_context)) context)
    __attribute__((swiftcall));

/// A Swift closure `(Int) -> Void`, likewise.
typedef void (*cgcd_swift_index_fn)(intptr_t index, void *_Nullable __attribute__((swift_context)) context)
    __attribute__((swiftcall));

/// `dispatch_sync_f` / `dispatch_barrier_sync_f` of a non-escaping Swift
/// closure, given as its two words (function, context), inside a frame for
/// `queue` linked to the caller's chain. Called from Swift through
/// `@_silgen_name` (see Queue.swift), so Swift passes the closure exactly
/// as it passes any closure argument; nothing is allocated.
__attribute__((swiftcall)) void cgcd_sync(void *queue, uintptr_t flags, uintptr_t barrier,
                                          cgcd_swift_closure_fn function, void *_Nullable context);

/// The code address of a Swift closure given as its two words (the stall monitor's site).
__attribute__((swiftcall)) uintptr_t cgcd_stall_site(cgcd_swift_closure_fn function, void *_Nullable context);

/// `cgcd_sync` for a thread with no frame, onto a queue whose work
/// dispatch_sync runs on the calling thread (not the main queue or a queue
/// that may target it): the frame (with no predecessor) is set around the
/// wait instead of inside the work, and the thread's chain is empty again
/// on return.
__attribute__((swiftcall)) void cgcd_sync_here(void *queue, uintptr_t flags, uintptr_t barrier,
                                               cgcd_swift_closure_fn function, void *_Nullable context);

/// `dispatch_async_and_wait_f` / `dispatch_barrier_async_and_wait_f` of a
/// non-escaping Swift closure, inside a frame for `queue` linked to the
/// caller's chain (as `cgcd_sync`).
__attribute__((swiftcall)) void cgcd_async_and_wait(void *queue, uintptr_t flags, uintptr_t barrier,
                                                    cgcd_swift_closure_fn function, void *_Nullable context);

/// `dispatch_apply_f` of a non-escaping Swift `(Int) -> Void` closure, each
/// iteration inside a frame for `queue` linked to the caller's chain.
__attribute__((swiftcall)) void cgcd_apply(size_t iterations, void *queue, uintptr_t flags,
                                           cgcd_swift_index_fn function, void *_Nullable context);

// MARK: - The function forms (`context:function:`) inside a frame

/// `dispatch_sync_f` / `dispatch_barrier_sync_f` of a C function, inside a
/// frame for `queue` linked to the caller's chain (as `cgcd_sync`).
void cgcd_sync_function(void *queue, uintptr_t flags, uintptr_t barrier, void *_Nullable context,
                        void (*function)(void *_Nullable));

/// `dispatch_async_and_wait_f` / `dispatch_barrier_async_and_wait_f` of a C function, inside a
/// frame for `queue` linked to the caller's chain (as `cgcd_sync_function`); the record lives on
/// the caller's stack, which waits.
void cgcd_async_and_wait_function(void *queue, uintptr_t flags, uintptr_t barrier, void *_Nullable context,
                                  void (*function)(void *_Nullable));

extern void cgcd_dispatch_sync_f(void *queue, void *_Nullable context, void (*work)(void *_Nullable))
    __asm__("dispatch_sync_f");
extern void cgcd_dispatch_barrier_sync_f(void *queue, void *_Nullable context, void (*work)(void *_Nullable))
    __asm__("dispatch_barrier_sync_f");

/// `cgcd_sync_function` for a thread with no frame (as `cgcd_sync_here`):
/// the frame is set around the wait and the function goes to libdispatch
/// as it is. Inline, so the Swift caller makes the C call itself.
static inline void cgcd_sync_function_here(void *queue, uintptr_t flags, uintptr_t barrier, void *_Nullable context,
                                           void (*function)(void *_Nullable)) {
  if (__builtin_expect(cgcd_stall_is_watching(), 0)) {
    cgcd_sync_function(queue, flags, barrier, context, function);  // watched in its trampoline
    return;
  }
  cgcd_frame_t frame = {.queue = queue, .flags = flags, .prev = NULL};
  cgcd_current_frame = &frame;
  if (barrier) {
    cgcd_dispatch_barrier_sync_f(queue, context, function);
  } else {
    cgcd_dispatch_sync_f(queue, context, function);
  }
  cgcd_current_frame = NULL;
}

/// `dispatch_async_f` / `dispatch_barrier_async_f` of a C function, run
/// inside a frame for `queue`: the function, its context and the frame's
/// queue travel in one malloc'd record (three words and the flags), freed
/// before the function runs.
void cgcd_async_function(void *queue, uintptr_t flags, uintptr_t barrier, void *_Nullable context,
                         void (*function)(void *_Nullable));

/// `dispatch_after_f` of a C function, run inside a frame for `queue`.
void cgcd_after_function(uint64_t when, void *queue, uintptr_t flags, void *_Nullable context,
                         void (*function)(void *_Nullable));

/// `dispatch_group_notify_f` of a C function, run inside a frame for `queue`.
void cgcd_group_notify_function(void *group, void *queue, uintptr_t flags, void *_Nullable context,
                                void (*function)(void *_Nullable));

/// `dispatch_apply_f` of a C function, each iteration inside a forked frame
/// for `queue` linked to the caller's chain (as `cgcd_apply`).
void cgcd_apply_function(size_t iterations, void *queue, uintptr_t flags, void *_Nullable context,
                         void (*function)(void *_Nullable, size_t));

/// The keys under which the library records values on queues
/// (`dispatch_queue_set_specific`, read back with `dispatch_get_specific`),
/// each the address of its own byte of `cgcd_key_storage`, so unique.
enum {
  /// On queues it re-targets: the target queue (its address, with bit 0 set
  /// when the target is serial).
  CGCD_KEY_TARGET,
  /// On queues it re-targets: the list of every target it set (a retained
  /// Swift object, released by the queue's wrapper when it is dropped).
  CGCD_KEY_TARGETS,
  /// Marks the main queue (value: the queue).
  CGCD_KEY_MAIN_QUEUE,
  /// Marks the queue sources register on when a sequence starts them
  /// (value: the key itself), read back with dispatch_get_specific by the
  /// handler blocks that must not run there.
  CGCD_KEY_REGISTRATION,
  CGCD_KEY_COUNT
};

/// The key `key` (a `CGCD_KEY_*`).
static inline const void *cgcd_key(size_t key) {
  extern const char cgcd_key_storage[CGCD_KEY_COUNT];
  return &cgcd_key_storage[key];
}

/// `dispatch_get_current_queue` (deprecated in the header, so declared
/// again under another name): the queue the calling thread's work item was
/// submitted to, or the global queue running it.
extern void *_Nullable cgcd_get_current_queue(void) __asm__("dispatch_get_current_queue");

/// True on the process's main thread (the thread whose id is the pid).
int cgcd_is_main_thread(void);

// MARK: - Linux calls with no Swift face

/// `pidfd_open(2)`: a descriptor that refers to process `pid` and becomes
/// readable when it exits (close-on-exec by definition). Returns -1 and sets
/// `errno` on failure. A direct `syscall(SYS_pidfd_open, pid, flags)`.
int cgcd_pidfd_open(int pid, unsigned int flags);

/// `O_PATH` (defined by <fcntl.h> only under _GNU_SOURCE, so Swift's Glibc
/// module does not see it).
int cgcd_o_path(void);

/// `O_DIRECT` (also _GNU_SOURCE only): on a pipe, packet mode, where a read returns one write's
/// packet and so can be short with more queued behind it.
int cgcd_o_direct(void);

/// `pipe2(2)` (declared under _GNU_SOURCE only): a pipe with `O_CLOEXEC`, `O_NONBLOCK` or
/// `O_DIRECT` set at once.
extern int cgcd_pipe2(int fds[_Nonnull 2], int flags) __asm__("pipe2");

// MARK: - The main queue's run-loop interface

/// libdispatch's run-loop interface, exported for CoreFoundation but not
/// declared in its headers: the main queue's wake-up descriptor (an eventfd
/// on Linux) and the function that drains the main queue on the calling
/// thread. `Queue.dispatchMain()` uses them to drain the main queue on the main
/// thread, where libdispatch's own `dispatch_main` would end that thread.
extern int cgcd_main_queue_handle(void) __asm__("_dispatch_get_main_queue_handle_4CF");
extern void cgcd_main_queue_callback(void *_Nullable message) __asm__("_dispatch_main_queue_callback_4CF");

// MARK: - Dispatch blocks and async-and-wait

#if __has_extension(blocks)
/// `dispatch_block_t`, for the two calls that need a real block: a block
/// made by `dispatch_block_create_with_qos_class` carries its flags and QoS
/// only while it keeps its identity, which Swift's import of the dispatch
/// headers loses (it re-wraps every block argument and result as a closure).
typedef void (^cgcd_block_t)(void);

/// `dispatch_block_create_with_qos_class`: a new block (+1, released by
/// Swift) that runs `block` with `flags` and the QoS class; NULL for an
/// invalid class or relative priority.
extern cgcd_block_t _Nullable cgcd_block_create_with_qos_class(uintptr_t flags, unsigned int qos_class,
                                                               int relative_priority, cgcd_block_t block)
    __asm__("dispatch_block_create_with_qos_class") __attribute__((ns_returns_retained));

/// `dispatch_async` of a block, which keeps its identity (and so its flags).
extern void cgcd_async_block(void *queue, cgcd_block_t block) __asm__("dispatch_async");

/// `dispatch_barrier_async` of a block, likewise.
extern void cgcd_barrier_async_block(void *queue, cgcd_block_t block) __asm__("dispatch_barrier_async");

/// `dispatch_after` of a block, likewise.
extern void cgcd_after_block(uint64_t when, void *queue, cgcd_block_t block) __asm__("dispatch_after");

/// `dispatch_source_set_event_handler`, `_cancel_handler` and `_registration_handler`, taking the
/// block as a pointer (a block is one): a block-typed parameter, from the dispatch headers or
/// declared here, makes Swift wrap the block in a closure and that closure in a new block at the
/// call (two more allocations, 72 bytes, for every handler a source is given; measured with gdb on
/// `malloc`, issue 26). `Libdispatch` passes the block it holds; libdispatch copies (retains) it.
extern void cgcd_source_set_event_handler(void *source, void *block)
    __asm__("dispatch_source_set_event_handler");
extern void cgcd_source_set_cancel_handler(void *source, void *block)
    __asm__("dispatch_source_set_cancel_handler");
extern void cgcd_source_set_registration_handler(void *source, void *block)
    __asm__("dispatch_source_set_registration_handler");
#endif

/// Sets `source`'s event handler to a block that holds one pointer, `context`, and calls
/// `invoke` with the block: `invoke` reads the pointer back with `cgcd_block_context`. The block is
/// built by hand to the blocks ABI (a stack block with no copy or dispose helper, which
/// `dispatch_source_set_event_handler` copies: 40 bytes, where a block made from a Swift closure
/// that captures one object is 48, and glibc gives 48 bytes a 64-byte chunk). It does not retain
/// `context`: the caller keeps it alive for as long as libdispatch may run the block.
extern void cgcd_source_set_context_handler(void *source, void (*invoke)(void *block), void *context);

/// The pointer a block made by `cgcd_source_set_context_handler` holds.
extern void *cgcd_block_context(const void *block);

/// `dispatch_async_and_wait_f`: exported by libdispatch, not declared in the
/// headers Swift imports.
extern void cgcd_async_and_wait_f(void *queue, void *_Nullable context, void (*work)(void *_Nullable))
    __asm__("dispatch_async_and_wait_f");

/// `dispatch_barrier_async_and_wait_f`, likewise.
extern void cgcd_barrier_async_and_wait_f(void *queue, void *_Nullable context, void (*work)(void *_Nullable))
    __asm__("dispatch_barrier_async_and_wait_f");

// MARK: - Dispatch data and I/O channels


/// `dispatch_data_empty` (a macro over an exported structure of incomplete type).
extern char cgcd_data_empty_sym __asm__("_dispatch_data_empty");
static inline void *cgcd_data_empty(void) { return &cgcd_data_empty_sym; }

/// `DISPATCH_DATA_DESTRUCTOR_FREE` and `_MUNMAP`: exported block pointers that
/// libdispatch recognizes by identity (Swift would re-wrap an imported block,
/// so they are declared as plain pointers).
extern const void *const cgcd_data_destructor_free __asm__("_dispatch_data_destructor_free");
extern const void *const cgcd_data_destructor_munmap __asm__("_dispatch_data_destructor_munmap");

/// `dispatch_data_create` with the destructor as an untyped block pointer, so
/// that the recognized destructors above keep their identity.
extern void *cgcd_data_create(const void *_Nullable buffer, size_t size, void *_Nullable queue,
                              const void *_Nullable destructor) __asm__("dispatch_data_create");

/// `dispatch_data_applier_function_t` (libdispatch's private data_private.h).
typedef bool (*cgcd_data_applier_t)(void *_Nullable context, void *region, size_t offset,
                                    const void *buffer, size_t size);
/// `dispatch_data_apply_f` (exported, declared only in a private header).
extern bool cgcd_data_apply_f(void *data, void *_Nullable context, cgcd_data_applier_t applier)
    __asm__("dispatch_data_apply_f");

/// Copies bytes `[start, end)` of the dispatch data object `data` (of `total`
/// bytes) into `target`, region by region (`dispatch_data_apply_f` with a C
/// applier that `memcpy`s each region's part of the range and stops after the
/// last one; for the whole object, one that copies each region as it is).
/// `DispatchBuffer.copyBytes` calls it: the applier runs once per region, so it
/// is C, as the loop of a C caller would be.
void cgcd_data_copy_out(void *data, void *target, size_t start, size_t end, size_t total);

/// `dispatch_io_handler_function_t` (libdispatch's private io_private.h).
typedef void (*cgcd_io_handler_t)(void *_Nullable context, bool done, void *_Nullable data, int error);
/// The cleanup function of the `_f` channel constructors.
typedef void (*cgcd_io_cleanup_t)(void *_Nullable context, int error);
/// `dispatch_function_t`.
typedef void (*cgcd_function_t)(void *_Nullable context);

// The `_f` forms of the I/O calls: exported, declared only in libdispatch's
// private io_private.h. Each is the block form with a context and a function.
extern void *_Nullable cgcd_io_create_f(unsigned long type, int fd, void *queue, void *_Nullable context,
                                        cgcd_io_cleanup_t cleanup) __asm__("dispatch_io_create_f");
extern void *_Nullable cgcd_io_create_with_io_f(unsigned long type, void *channel, void *queue,
                                                void *_Nullable context, cgcd_io_cleanup_t cleanup)
    __asm__("dispatch_io_create_with_io_f");
extern void cgcd_io_read_f(void *channel, long offset, size_t length, void *queue, void *_Nullable context,
                           cgcd_io_handler_t handler) __asm__("dispatch_io_read_f");
extern void cgcd_io_write_f(void *channel, long offset, void *data, void *queue, void *_Nullable context,
                            cgcd_io_handler_t handler) __asm__("dispatch_io_write_f");
extern void cgcd_io_barrier_f(void *channel, void *_Nullable context, cgcd_function_t barrier)
    __asm__("dispatch_io_barrier_f");


// MARK: - Nested epoll for descriptor sources (issue 18)

/// `ioctl(descriptor, output ? SIOCOUTQ : SIOCINQ, &bytes)`: the bytes queued to be read (`SIOCINQ`,
/// the same request as `FIONREAD`) or still unsent (`SIOCOUTQ`, the same request as `TIOCOUTQ`) —
/// what libdispatch reports as a read or write source's data. Returns 0, or -1 and sets `errno`.
/// `ioctl` is variadic, which Swift cannot call.
int cgcd_queued_bytes(int descriptor, int output, int *bytes);

/// `pthread_setname_np` (a GNU extension the Glibc module leaves out), a thread's handle as glibc's
/// `pthread_t` (an unsigned long): names the descriptor fence's reader thread in debuggers and
/// backtraces.
extern int cgcd_pthread_setname_np(unsigned long thread, const char *name) __asm__("pthread_setname_np");


// MARK: - Stall watching (Stall.c)

void cgcd_stall_set_watching(int on);

/// CLOCK_MONOTONIC, in nanoseconds.
uint64_t cgcd_stall_now(void);

#define CGCD_STALL_DEPTH 8
#define CGCD_STALL_BUCKETS 20
#define CGCD_STALL_PROBES 8

/// Watched work starts on this thread: records its queue (label copied), site and start, and
/// counts the start (and the wait since `submitted`, 0 when unknown) on the queue's row. Returns
/// the depth to give `cgcd_stall_end`.
uint32_t cgcd_stall_begin(void *queue, uintptr_t site, uint64_t submitted);

/// The work `cgcd_stall_begin` returned `depth` for has ended.
void cgcd_stall_end(uint32_t depth);

/// Counts a submission on the queue's row.
void cgcd_stall_submitted(void *queue);

/// Clears the queue's row (its queue is being freed, or was made where a freed one was).
void cgcd_stall_forget(void *queue);

/// Clears every row (the last monitor is gone: rows of queues freed meanwhile would go stale).
void cgcd_stall_clear(void);

/// A piece of work running on some thread, as the monitor reads it.
typedef struct {
  const void *record;
  uint32_t depth;
  int tid;
  uint64_t start;
  uintptr_t site;
  char label[48];
} cgcd_stall_running_t;

/// The innermost watched work of every thread that has run at least `at_least` nanoseconds at `now`.
size_t cgcd_stall_running(cgcd_stall_running_t *out, size_t capacity, uint64_t now, uint64_t at_least);

/// Whether the work read as (`record`, `depth`, `start`) still runs; if not, `*ended_at` is when
/// it ended (0 if another piece of work has ended at that depth since).
int cgcd_stall_still_running(const void *record, uint32_t depth, uint64_t start, uint64_t *ended_at);

/// One queue's counts, read by `StallMonitor.statistics()`.
typedef struct {
  uintptr_t queue;
  char label[48];
  uint64_t submitted, started, completed;
  uint64_t wait_max, run_max;  // nanoseconds (kept in microseconds)
  uint32_t wait[CGCD_STALL_BUCKETS], run[CGCD_STALL_BUCKETS];
} cgcd_stall_queue_row_t;

/// Copies up to `capacity` queue rows into `out`; returns how many.
size_t cgcd_stall_queue_rows(cgcd_stall_queue_row_t *out, size_t capacity);

/// Submits a probe to `queue` (a global queue) that records when it starts in `slot`.
void cgcd_stall_probe(void *queue, uintptr_t slot);

/// When the probe of `slot` started (0: not yet).
uint64_t cgcd_stall_probe_start(uintptr_t slot);

/// The bytes one watched queue's statistics row takes (`statistics()`): at most 256.
size_t cgcd_stall_bytes_per_queue(void);

/// Copies `length` bytes of this process's memory at `address` into `out` without faulting
/// (`process_vm_readv`): how many were copied (0 where nothing is mapped).
size_t cgcd_stall_read_memory(uintptr_t address, void *out, size_t length);

/// `dladdr(address)`: the symbol (may be NULL), the binary's path and its load address; 0 if none.
int cgcd_stall_symbol(uintptr_t address, const char *_Nullable *_Nonnull symbol,
                      const char *_Nullable *_Nonnull file, uintptr_t *base);

/// The function symbol of the ELF file at `path` whose code holds `offset` (from its load
/// address), from its `.symtab`, into `out`; 0 when none.
int cgcd_stall_file_symbol(const char *path, uint64_t offset, char *out, size_t capacity);

#pragma clang assume_nonnull end

// MARK: - epoll (pressure triggers)

// The toolchain's Glibc module leaves out <sys/epoll.h>: the pressure
// sources hold each PSI trigger in an epoll descriptor of their own, and the
// descriptor sources their descriptor (Syscalls.swift calls epoll directly).
#include <sys/epoll.h>

#endif
