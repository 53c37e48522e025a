#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// How long a test waits for something that must happen. Generous on
/// purpose: a slow machine makes a test slower, never wrong. 30 s, not 10:
/// while the churn suites' children run (observed exit tests, 3 s each under
/// the scribbling allocator), the testing library's blocking reads of their
/// pipes hold both of the parent's cooperative threads (2 cores), and every
/// async test of the parallel suite stands still for 15–17 s (trivial tests
/// "passed after 17 s"); a test whose 10 s wait spanned such a stall failed
/// with the event it waited for still to come (`taskCancellationEndsLoop`,
/// 2 of 11 clean-clone runs).
let generousTimeout: Duration = .seconds(30)

/// How long a test waits to see that something does NOT happen. A short
/// wait can only make such a check pass when it should have failed, never
/// the other way round.
let briefTimeout: Duration = .milliseconds(200)

/// A countdown latch on a pthread mutex and condition variable (independent
/// of the library under test): `signal()` counts down, `wait` returns once
/// the count has reached zero.
///
/// The condition variable uses `CLOCK_MONOTONIC`, so timeouts do not follow
/// changes of the wall clock.
final class Latch: @unchecked Sendable {
  private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
  private let condition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
  private var remaining: Int

  init(count: Int) {
    precondition(count >= 0)
    remaining = count
    pthread_mutex_init(mutex, nil)
    var attributes = pthread_condattr_t()
    pthread_condattr_init(&attributes)
    pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
    pthread_cond_init(condition, &attributes)
    pthread_condattr_destroy(&attributes)
  }

  deinit {
    pthread_cond_destroy(condition)
    pthread_mutex_destroy(mutex)
    condition.deallocate()
    mutex.deallocate()
  }

  /// Counts down by one (never below zero) and wakes the waiters at zero.
  func signal() {
    pthread_mutex_lock(mutex)
    if remaining > 0 { remaining -= 1 }
    if remaining == 0 { pthread_cond_broadcast(condition) }
    pthread_mutex_unlock(mutex)
  }

  /// Whether the count has reached zero, without waiting.
  var isOpen: Bool {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return remaining == 0
  }

  /// How many `signal()`s are still missing.
  var count: Int {
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    return remaining
  }

  /// Waits until the count reaches zero or `timeout` passes.
  ///
  /// - Returns: true if the count reached zero.
  @available(*, noasync, message: "blocks the thread")
  @discardableResult
  func wait(timeout: Duration = generousTimeout) -> Bool {
    var deadline = timespec()
    clock_gettime(CLOCK_MONOTONIC, &deadline)
    let (seconds, attoseconds) = timeout.components
    let nanoseconds = Int(deadline.tv_nsec) + Int(attoseconds / 1_000_000_000)
    deadline.tv_sec += Int(seconds) + nanoseconds / 1_000_000_000
    deadline.tv_nsec = nanoseconds % 1_000_000_000
    pthread_mutex_lock(mutex)
    defer { pthread_mutex_unlock(mutex) }
    while remaining > 0 {
      if pthread_cond_timedwait(condition, mutex, &deadline) == ETIMEDOUT {
        return remaining == 0
      }
    }
    return true
  }
}

/// A one-shot event: `signal()` once, `wait` returns from then on.
final class Event: @unchecked Sendable {
  private let latch = Latch(count: 1)

  init() {}

  func signal() { latch.signal() }

  /// Whether the event has been signalled, without waiting.
  var isSignaled: Bool { latch.isOpen }

  /// Waits until the event is signalled or `timeout` passes.
  ///
  /// - Returns: true if the event was signalled.
  @available(*, noasync, message: "blocks the thread")
  @discardableResult
  func wait(timeout: Duration = generousTimeout) -> Bool { latch.wait(timeout: timeout) }
}
