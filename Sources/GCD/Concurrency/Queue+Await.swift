import Synchronization

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
  /// `work` and its result are `sending`: they may be non-`Sendable`
  /// (a class instance made for the work, or handed to it and not used
  /// meanwhile), since the caller is suspended while the work runs and the
  /// result is handed to it alone. A `@Sendable` closure and a `Sendable`
  /// result are accepted as before.
  ///
  /// - Parameter work: The closure to run on the queue.
  /// - Returns: What `work` returns.
  ///
  /// The corresponding C function is `dispatch_async_f`.
  public final func run<T, E: Error>(_ work: sending @escaping () throws(E) -> T) async throws(E) -> sending T {
    let box = AwaitedWorkOf(queue: raw, flags: flags, work: work)
    let outcome = await withUnsafeContinuation { (continuation: UnsafeContinuation<Handoff<Result<T, E>>, Never>) in
      box.continuation = continuation
      Libdispatch.async_f(raw, Unmanaged<AwaitedWork>.passRetained(box).toOpaque()) { AwaitedWork.run($0) }
    }
    box.acquireHandoff()
    return try outcome.value.get()
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

/// A value that crosses between the awaiting task and the queue's thread:
/// `run`'s closure on the way there, its result on the way back. Both are
/// `sending`, so nothing else holds them, and the task is suspended
/// meanwhile: one side at a time touches the value.
struct Handoff<Value>: @unchecked Sendable {
  let value: Value
}

/// `@unchecked Sendable`: the closure is `sending` (no one else holds it)
/// and is touched only by `perform`, once, on the queue's thread, while the
/// awaiting task is suspended; it is released there before the task resumes.
/// `continuation` is set by the task before the box is submitted
/// (`dispatch_async_f` orders it before `perform`).
final class AwaitedWorkOf<T, E: Error>: AwaitedWork, @unchecked Sendable {
  private var work: (() throws(E) -> T)?
  var continuation: UnsafeContinuation<Handoff<Result<T, E>>, Never>?
  /// Stored (releasing) by `perform` before it resumes the task, loaded
  /// (acquiring) by the task after it resumes. The continuation orders the
  /// two already; ThreadSanitizer does not see that order on Linux (it
  /// reported the task's first use of a non-`Sendable` result made on the
  /// queue as a race), and it sees this one. Two instructions per call.
  private let handedOver = Atomic<Bool>(false)

  init(queue: OpaquePointer, flags: UInt, work: @escaping () throws(E) -> T) {
    self.work = work
    super.init(queue: queue, flags: flags)
  }

  override func perform() {
    let result = Result(catching: work.unsafelyUnwrapped)
    // The closure's captures go before the task resumes, so none is released
    // on this thread while the task uses what the work returned.
    work = nil
    handedOver.store(true, ordering: .releasing)
    continuation.unsafelyUnwrapped.resume(returning: Handoff(value: result))
  }

  /// The task's side of `handedOver`, after it resumed.
  func acquireHandoff() { _ = handedOver.load(ordering: .acquiring) }
}
