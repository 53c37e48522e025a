// `await queue.run { }`: the closure goes through dispatch_async_f in one
// allocation (the box below, which holds the closure and the continuation)
// and the awaiting task is resumed from the queue; no thread blocks.

extension Queue {
  /// Runs `work` on the queue and returns its result (or throws its error)
  /// to the awaiting task, which is suspended meanwhile: no thread waits.
  ///
  /// The work runs inside the package's frame for the queue (`isCurrent`
  /// holds in it), after the work submitted before it. On a private serial
  /// queue each call hands the work to another thread and back (tens of
  /// microseconds); short awaited work is cheapest on a serial queue that
  /// targets a global queue, or on a global queue.
  ///
  /// - Parameter work: The closure to run on the queue.
  /// - Returns: What `work` returns.
  ///
  /// The corresponding C function is `dispatch_async_f`.
  public final func run<T: Sendable, E: Error>(_ work: @escaping @Sendable () throws(E) -> T) async throws(E) -> T {
    let result = await withUnsafeContinuation { (continuation: UnsafeContinuation<Result<T, E>, Never>) in
      let box = AwaitedWorkOf(queue: raw, flags: flags, work: work, continuation: continuation)
      Libdispatch.async_f(raw, Unmanaged<AwaitedWork>.passRetained(box).toOpaque()) { AwaitedWork.run($0) }
    }
    return try result.get()
  }
}

/// Awaited work on its way through `dispatch_async_f`: the queue (for the
/// frame) and, in the generic subclass, the closure and the continuation.
class AwaitedWork: @unchecked Sendable {  // immutable after init; the subclass's continuation is resumed once
  final let queue: OpaquePointer
  final let flags: UInt

  init(queue: OpaquePointer, flags: UInt) {
    self.queue = queue
    self.flags = flags
  }

  func perform() {}

  /// The trampoline: takes back the box and runs it inside a frame for its queue.
  static func run(_ context: UnsafeMutableRawPointer?) {
    let work = Unmanaged<AwaitedWork>.fromOpaque(context.unsafelyUnwrapped).takeRetainedValue()
    withFrame(queue: work.queue, flags: work.flags) { work.perform() }
  }
}

final class AwaitedWorkOf<T: Sendable, E: Error>: AwaitedWork, @unchecked Sendable {  // as AwaitedWork
  let work: @Sendable () throws(E) -> T
  let continuation: UnsafeContinuation<Result<T, E>, Never>

  init(
    queue: OpaquePointer, flags: UInt, work: @escaping @Sendable () throws(E) -> T,
    continuation: UnsafeContinuation<Result<T, E>, Never>
  ) {
    self.work = work
    self.continuation = continuation
    super.init(queue: queue, flags: flags)
  }

  override func perform() {
    continuation.resume(returning: Result(catching: work))
  }
}
