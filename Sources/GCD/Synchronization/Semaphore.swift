import Synchronization

/// A counting semaphore that limits how many tasks use a resource at once, safe to drop with its units taken.
///
/// libdispatch traps when a semaphore is released while its count is below
/// the value it was created with. This wrapper creates the C semaphore at 0,
/// so the count it is compared with is 0 and dropping a semaphore whose
/// resources are still taken is safe. The starting value waits in a reserve
/// that a wait which finds the C semaphore empty moves over, 64 units at a
/// time, before it blocks: creation costs the same for any value, and each
/// unit is signalled once, when it is first needed.
///
/// Tasks wait with `try await wait()`, which suspends the task instead of
/// blocking its thread: it takes a unit at once when one is free, and
/// otherwise joins a list that `signal()` serves (a cancelled waiter leaves
/// the list and takes no unit).
///
/// `Sendable`: libdispatch semaphores are thread-safe; the wrapper holds
/// the immutable C pointer and its async waiters behind a mutex.
///
/// The corresponding C type is `dispatch_semaphore_t`.
public final class Semaphore: GCDObject, @unchecked Sendable {
  /// How many tasks wait in `waiters`: `signal()` takes the lock only when some are.
  @usableFromInline let asyncWaiterCount = Atomic<Int>(0)
  let waiters = Mutex(SemaphoreWaiters())
  /// Units of the starting value not yet signalled to the C semaphore. It
  /// only ever decreases, so once a waiter has seen it at 0 it stays 0 and
  /// no thread or task blocks while units are held back here.
  let reserve: Atomic<Int>

  /// Creates a semaphore with `value` units available.
  ///
  /// - Throws: `GCDError` with `EINVAL` when `value` is negative.
  ///
  /// The corresponding C function is `dispatch_semaphore_create`.
  /// - Parameter value: The units available at the start, zero or more.
  public init(value: Int) throws(GCDError) {
    guard value >= 0 else {
      throw GCDError(
        operation: "Semaphore(value: \(value))", errno: Errno.invalidArgument,
        detail: "the starting value must be zero or more")
    }
    reserve = Atomic(value)
    super.init(raw: Libdispatch.semaphore_create(0))
  }

  /// Units a wait moves from `reserve` to the C semaphore at a time.
  static let refillUnits = 64

  /// Moves up to `refillUnits` units from `reserve` to the C semaphore.
  /// - Returns: false when the reserve is empty (for good).
  @usableFromInline
  func refill() -> Bool {
    var available = reserve.load(ordering: .relaxed)
    while available > 0 {
      let taken = min(available, Semaphore.refillUnits)
      let (exchanged, original) = reserve.compareExchange(
        expected: available, desired: available - taken, ordering: .relaxed)
      if exchanged {
        for _ in 0..<taken { _ = Libdispatch.semaphore_signal(raw) }
        return true
      }
      available = original
    }
    return false
  }

  /// A wait whose try found the C semaphore empty: moves the reserve over
  /// while there is one and tries again, then waits until `timeout`.
  @usableFromInline
  func waitAfterFailedTry(_ timeout: () -> UInt64) -> Bool {
    while refill() {
      if Libdispatch.semaphore_wait(raw, 0) == 0 { return true }
    }
    return Libdispatch.semaphore_wait(raw, timeout()) == 0
  }

  deinit {
    Libdispatch.release(raw)
  }

  /// Takes one unit, waiting as long as it takes for one to be available.
  ///
  /// The corresponding C function is `dispatch_semaphore_wait` with `DISPATCH_TIME_FOREVER`.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait() {
    // A try first (the same uncontended cost as a wait forever): only a
    // failed one looks at the reserve.
    if Libdispatch.semaphore_wait(raw, 0) != 0 {
      _ = waitAfterFailedTry { Libdispatch.timeForever }
    }
  }

  /// Takes one unit, waiting at most `timeout`.
  ///
  /// - Parameter timeout: How long to wait at most.
  /// - Returns: true if a unit was taken, false on timeout.
  ///
  /// The corresponding C function is `dispatch_semaphore_wait`.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait(timeout: Duration) -> Bool {
    let until = deadline(after: timeout)
    return Libdispatch.semaphore_wait(raw, 0) == 0 || waitAfterFailedTry { until }
  }

  /// Takes one unit, waiting until the deadline at most.
  ///
  /// - Parameter deadline: When to give up.
  /// - Returns: true if a unit was taken, false on timeout.
  @available(*, noasync, message: "blocks the thread; use `try await wait()` from async code")
  @inlinable
  public func wait(deadline: Deadline) -> Bool {
    Libdispatch.semaphore_wait(raw, 0) == 0 || waitAfterFailedTry { deadline.rawValue }
  }

  /// Returns one unit, waking a waiting thread or task if there is one.
  ///
  /// - Returns: true if a waiting thread or task was woken.
  ///
  /// The corresponding C function is `dispatch_semaphore_signal`.
  @inlinable
  @discardableResult
  public func signal() -> Bool {
    let woke = Libdispatch.semaphore_signal(raw) != 0
    // Pairs with the fence in `wait()`: either this sees the waiter, or the
    // waiter's try sees this unit. On x86-64 the signal's `lock xadd` is
    // already a full barrier (and the C call one for the compiler).
    #if !arch(x86_64)
      atomicMemoryFence(ordering: .sequentiallyConsistent)
    #endif
    if asyncWaiterCount.load(ordering: .relaxed) == 0 { return woke }
    return handOverUnits() || woke
  }

  /// Takes the free units and gives them to the async waiters, in order.
  @usableFromInline
  func handOverUnits() -> Bool {
    var woken: [UnsafeContinuation<Bool, Never>] = []
    waiters.withLock { waiters in
      while !waiters.isEmpty && Libdispatch.semaphore_wait(raw, 0) == 0 {
        let waiter = waiters.removeFirst()
        asyncWaiterCount.subtract(1, ordering: .relaxed)
        if case .waiting(let continuation, _) = waiter.phase { woken.append(continuation) }
        waiter.phase = .done
      }
    }
    for continuation in woken { continuation.resume(returning: true) }
    return !woken.isEmpty
  }

  /// Takes one unit, suspending the task until one is available: no thread
  /// waits. Waiting, being served and being cancelled each cost the same
  /// however many tasks wait.
  ///
  /// - Throws: `CancellationError` when the task is cancelled before it got
  ///   a unit; it returns promptly then and has taken none.
  ///
  /// The corresponding C function is `dispatch_semaphore_wait` with
  /// `DISPATCH_TIME_NOW` (a try; a timed-out try gives its decrement back).
  public func wait() async throws(CancellationError) {
    if Libdispatch.semaphore_wait(raw, 0) == 0 { return }
    while refill() {
      if Libdispatch.semaphore_wait(raw, 0) == 0 { return }
    }
    let waiter = SemaphoreWaiters.Waiter()
    let acquired = await withTaskCancellationHandler {
      await withUnsafeContinuation { (continuation: UnsafeContinuation<Bool, Never>) in
        let outcome: Bool? = waiters.withLock { waiters in
          if case .done = waiter.phase { return false }  // cancelled before it got here
          asyncWaiterCount.add(1, ordering: .relaxed)
          atomicMemoryFence(ordering: .sequentiallyConsistent)
          if Libdispatch.semaphore_wait(raw, 0) == 0 {
            asyncWaiterCount.subtract(1, ordering: .relaxed)
            waiter.phase = .done
            return true
          }
          waiter.phase = .waiting(continuation, confirmed: true)
          waiters.append(waiter)
          return nil
        }
        if let outcome { continuation.resume(returning: outcome) }
      }
    } onCancel: {
      let continuation = waiters.withLock { waiters in
        waiter.cancel {
          waiters.removeCancelled()
          asyncWaiterCount.subtract(1, ordering: .relaxed)
        }
      }
      continuation?.resume(returning: false)
    }
    if !acquired { throw CancellationError() }
  }
}

extension Semaphore {
  /// The entries the async waiter list holds (waiting tasks and cancelled
  /// ones not yet compacted away): at most twice the waiting tasks, plus 64.
  var asyncWaiterRecords: Int { waiters.withLock { $0.records } }
}
