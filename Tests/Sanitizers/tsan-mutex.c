// ThreadSanitizer support for `make sanitize`: teaches TSan the happens-before
// edges of Synchronization.Mutex's contended path. Preloaded (LD_PRELOAD)
// into the sanitized test run; never linked into the package.
//
// Why: Mutex's fast path (an atomic compare-exchange inlined into the caller)
// is instrumented, but its slow path -- `_MutexHandle._lockSlow`,
// `_tryLockSlow` and `_unlockSlow` in libswiftSynchronization.so, which spin
// with their own compare-exchange and fall back to FUTEX_LOCK_PI /
// FUTEX_UNLOCK_PI -- is not. A lock handed over through that path carries no
// synchronisation TSan can see, so every contended `withLock` is reported as
// a "Swift access race" on the protected value (toolchain 6.3.1; reproduced
// with two threads incrementing a Mutex<Int>, docs/reliability.md).
//
// These three functions replace the exported slow paths, call the real ones,
// and tell TSan what they did: `__tsan_release` on the lock word before an
// unlock, `__tsan_acquire` after a lock -- the same sync object the inlined
// fast-path atomics use. Nothing is suppressed: a real race (an access
// outside the lock) is still reported. In a process without TSan (children
// such as /bin/sleep inherit LD_PRELOAD) the weak hooks are null and the
// functions only forward.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>

__attribute__((weak)) void __tsan_acquire(void *address);
__attribute__((weak)) void __tsan_release(void *address);

#define LOCK_SLOW "$s15Synchronization12_MutexHandleV9_lockSlowyys6UInt32VF"
#define TRY_LOCK_SLOW "$s15Synchronization12_MutexHandleV12_tryLockSlowSbyF"
#define UNLOCK_SLOW "$s15Synchronization12_MutexHandleV11_unlockSlowyyF"

// The methods take the handle (self) in the Swift self register, which
// clang spells `swift_context` under `swiftcall`.
typedef __attribute__((swiftcall)) void (*lock_slow_t)(uint32_t, void *__attribute__((swift_context)));
typedef __attribute__((swiftcall)) bool (*try_lock_slow_t)(void *__attribute__((swift_context)));
typedef __attribute__((swiftcall)) void (*unlock_slow_t)(void *__attribute__((swift_context)));

static lock_slow_t real_lock_slow;
static try_lock_slow_t real_try_lock_slow;
static unlock_slow_t real_unlock_slow;

// Resolved once, before any thread can lock: the definitions the preload hides.
__attribute__((constructor)) static void resolve_real_definitions(void) {
  real_lock_slow = (lock_slow_t)dlsym(RTLD_NEXT, LOCK_SLOW);
  real_try_lock_slow = (try_lock_slow_t)dlsym(RTLD_NEXT, TRY_LOCK_SLOW);
  real_unlock_slow = (unlock_slow_t)dlsym(RTLD_NEXT, UNLOCK_SLOW);
}

__attribute__((swiftcall)) void tsan_mutex_lock_slow(uint32_t thread, void *__attribute__((swift_context)) handle)
    __asm__(LOCK_SLOW);
__attribute__((swiftcall)) void tsan_mutex_lock_slow(uint32_t thread, void *__attribute__((swift_context)) handle) {
  real_lock_slow(thread, handle);
  if (__tsan_acquire) __tsan_acquire(handle);
}

__attribute__((swiftcall)) bool tsan_mutex_try_lock_slow(void *__attribute__((swift_context)) handle)
    __asm__(TRY_LOCK_SLOW);
__attribute__((swiftcall)) bool tsan_mutex_try_lock_slow(void *__attribute__((swift_context)) handle) {
  bool locked = real_try_lock_slow(handle);
  if (locked && __tsan_acquire) __tsan_acquire(handle);
  return locked;
}

__attribute__((swiftcall)) void tsan_mutex_unlock_slow(void *__attribute__((swift_context)) handle)
    __asm__(UNLOCK_SLOW);
__attribute__((swiftcall)) void tsan_mutex_unlock_slow(void *__attribute__((swift_context)) handle) {
  if (__tsan_release) __tsan_release(handle);
  real_unlock_slow(handle);
}
