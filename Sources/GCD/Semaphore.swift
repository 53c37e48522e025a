/// A counting semaphore that limits how many tasks use a resource at once, safe to drop with its units taken.
///
/// libdispatch traps when a semaphore is released while its count is below
/// the value it was created with. This wrapper creates the C semaphore at 0
/// and signals it up to the starting value, so the count it is compared with
/// is 0 and dropping a semaphore whose resources are still taken is safe.
/// (That costs one `dispatch_semaphore_signal` per unit of the starting
/// value, once, at creation.)
///
/// `Sendable`: libdispatch semaphores are thread-safe, and the wrapper's
/// only state is the immutable C pointer.
///
/// The corresponding C type is `dispatch_semaphore_t`.
public final class Semaphore: DispatchObject, @unchecked Sendable {
  @usableFromInline let raw: OpaquePointer

  /// The C semaphore, borrowed.
  public var unsafeObject: OpaquePointer { raw }

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
    raw = Libdispatch.semaphore_create(0)
    for _ in 0..<value {
      _ = Libdispatch.semaphore_signal(raw)
    }
  }

  deinit {
    Libdispatch.release(raw)
  }

  /// Takes one unit, waiting as long as it takes for one to be available.
  ///
  /// The corresponding C function is `dispatch_semaphore_wait` with `DISPATCH_TIME_FOREVER`.
  @available(*, noasync, message: "blocks the thread")
  @inlinable
  public func wait() {
    _ = Libdispatch.semaphore_wait(raw, Libdispatch.timeForever)
  }

  /// Takes one unit, waiting at most `timeout`.
  ///
  /// - Parameter timeout: How long to wait at most.
  /// - Returns: true if a unit was taken, false on timeout.
  ///
  /// The corresponding C function is `dispatch_semaphore_wait`.
  @available(*, noasync, message: "blocks the thread")
  @inlinable
  public func wait(timeout: Duration) -> Bool {
    Libdispatch.semaphore_wait(raw, deadline(after: timeout)) == 0
  }

  /// Takes one unit, waiting until the deadline at most.
  ///
  /// - Parameter deadline: When to give up.
  /// - Returns: true if a unit was taken, false on timeout.
  @available(*, noasync, message: "blocks the thread")
  @inlinable
  public func wait(deadline: Deadline) -> Bool {
    Libdispatch.semaphore_wait(raw, deadline.rawValue) == 0
  }

  /// Returns one unit, waking a waiting thread if there is one.
  ///
  /// - Returns: true if a waiting thread was woken.
  ///
  /// The corresponding C function is `dispatch_semaphore_signal`.
  @inlinable
  @discardableResult
  public func signal() -> Bool {
    Libdispatch.semaphore_signal(raw) != 0
  }
}
