import CDispatch
import CGCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// What every dispatch source type shares: handlers, the resume / suspend /
/// cancel life cycle, and the event's data, mask and handle.
///
/// A source is created inactive. Set its handlers, then call `resume()`
/// once to start it. `suspend()` and `resume()` must balance; `cancel()` is
/// asynchronous and final: a handler that is running finishes, then the
/// cancel handler runs, exactly once, and no event handler runs after it.
///
/// Dropping the last reference to a source in any state is safe: `deinit`
/// cancels it, balances outstanding `suspend()`s and starts a never-resumed
/// source so that its cancel handler runs and libdispatch can release it
/// (libdispatch itself traps on the release of a suspended or inactive
/// source).
///
/// A handler that captures its own source keeps it alive until the source
/// is cancelled (libdispatch frees the handlers after cancellation). Capture
/// it `[weak source]`, or cancel it, to let it go.
///
/// Every source type is a final subclass of `SourceCore`, which holds the
/// C object and the life-cycle state: a source is one allocation beside
/// its C object (two once it has closure handlers).
///
/// The corresponding C type is `dispatch_source_t`.
public protocol Source: SourceCore {
  /// The pending data of the event being handled. For `TimerSource`, the
  /// number of fires merged into this event; for `ReadSource`, the bytes
  /// available; for `SignalSource`, the deliveries merged; for the data
  /// sources, the merged value.
  ///
  /// The corresponding C function is `dispatch_source_get_data`.
  var data: UInt { get }
  /// The mask the source was created with (the events it watches).
  ///
  /// The corresponding C function is `dispatch_source_get_mask`.
  var mask: UInt { get }
  /// The handle the source watches: a descriptor, a signal number, a pid.
  ///
  /// The corresponding C function is `dispatch_source_get_handle`.
  var handle: UInt { get }
}

extension Source {
  @inlinable
  public var data: UInt { dispatch_source_get_data(raw) }
  @inlinable
  public var mask: UInt { dispatch_source_get_mask(raw) }
  @inlinable
  public var handle: UInt { dispatch_source_get_handle(raw) }

  /// Sets the closure run on the target queue for each (merged) event.
  ///
  /// The corresponding C function is `dispatch_source_set_event_handler`.
  public func setEventHandler(_ handler: @escaping @Sendable () -> Void) {
    dispatch_source_set_event_handler(raw, handlers.block(handler))
  }

  /// Sets a C function as the event handler; it is called with `context`,
  /// which becomes the source's context (as in C, where the function gets
  /// the source's context).
  ///
  /// The corresponding C functions are `dispatch_set_context` and
  /// `dispatch_source_set_event_handler_f`.
  public func setEventHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    dispatch_set_context(raw.object, context)
    dispatch_source_set_event_handler_f(raw, function)
  }

  /// Sets the closure run once after `cancel()` takes effect: the place to
  /// close a descriptor or free the context.
  ///
  /// The corresponding C function is `dispatch_source_set_cancel_handler`.
  public func setCancelHandler(_ handler: @escaping @Sendable () -> Void) {
    setCancelHandler(.closure(handler))
  }

  /// Sets a C function as the cancel handler; it is called with the source's
  /// context at cancellation, and `context` becomes the source's context.
  ///
  /// The corresponding C functions are `dispatch_set_context` and
  /// `dispatch_source_set_cancel_handler_f`.
  public func setCancelHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    dispatch_set_context(raw.object, context)
    setCancelHandler(.function(function))
  }

  /// Sets the closure run once when the source is installed and starts
  /// watching (after the first `resume()`).
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler`.
  public func setRegistrationHandler(_ handler: @escaping @Sendable () -> Void) {
    dispatch_source_set_registration_handler(raw, handlers.block(handler))
  }

  /// Sets a C function as the registration handler, called with `context`
  /// (which becomes the source's context).
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler_f`.
  public func setRegistrationHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    dispatch_set_context(raw.object, context)
    dispatch_source_set_registration_handler_f(raw, function)
  }

  /// Starts a new source, or resumes one suspended with `suspend()`.
  ///
  /// The first `resume()` of a source that was never suspended starts it.
  /// A `resume()` with nothing to balance stops the process with a message
  /// naming the source (libdispatch traps with none).
  ///
  /// The corresponding C functions are `dispatch_activate` (first start) and `dispatch_resume`.
  @inlinable
  public func resume() {
    // Fast path: the first resume of a source with no start hook.
    if onActivate == nil
      && lifecycle.compareExchange(
        expected: 0, desired: SourceCore.startedBit, ordering: .acquiringAndReleasing
      ).exchanged
    {
      dispatch_activate(raw.object)
      return
    }
    resume(type: Self.self)
  }

  /// Suspends event delivery; events that arrive meanwhile are merged and
  /// delivered once after the matching `resume()`.
  ///
  /// The corresponding C function is `dispatch_suspend`.
  public func suspend() {
    lifecycle.add(SourceCore.suspensionUnit, ordering: .acquiringAndReleasing)
    dispatch_suspend(raw.object)
  }

  /// Stops the source: no event handler starts after this (one that is
  /// running finishes), then the cancel handler runs once. Calling it again
  /// does nothing.
  ///
  /// The corresponding C function is `dispatch_source_cancel`.
  @inlinable
  public func cancel() { dispatch_source_cancel(raw) }

  /// Whether the source is held back by a `suspend()` that has no `resume()` yet.
  public var isSuspended: Bool {
    let state = lifecycle.load(ordering: .relaxed)
    return state >= SourceCore.suspensionUnit && dispatch_source_testcancel(raw) == 0
  }

  /// Whether `cancel()` has been called.
  ///
  /// The corresponding C function is `dispatch_source_testcancel`.
  @inlinable
  public var isCancelled: Bool { dispatch_source_testcancel(raw) != 0 }

  /// Runs the handlers on `queue` from now on. A handler that is running
  /// finishes where it is; events not yet handled — even one waiting for
  /// the old queue — run on the new queue (libdispatch re-checks the
  /// target when it drains the source).
  ///
  /// The corresponding C function is `dispatch_set_target_queue`.
  public func setTarget(_ queue: Queue) {
    shared.withLock { shared in
      shared.target = queue
      shared.handlers?.target(queue)
    }
    dispatch_set_target_queue(raw.object, queue.raw)
  }

  /// The queue the handlers run on.
  public var queue: Queue { shared.withLock { $0.target } }
}

/// The C source and the state every source type shares: the base class of
/// every source (it cannot be subclassed outside this package).
///
/// A source is this one object beside its C object. What the handler blocks
/// must reach — the target queue for their frames, the cancel handler — is
/// in a second object, `SourceHandlers`, made when the first closure
/// handler is set: the blocks hold it, not the source, so a source whose
/// handlers are set is still released when its last reference goes.
public class SourceCore: DispatchObject, @unchecked Sendable {
  enum CancelHandler {
    case none
    case closure(@Sendable () -> Void)
    case function(@convention(c) (UnsafeMutableRawPointer?) -> Void)
  }

  struct Shared {
    var target: Queue
    var handlers: SourceHandlers?
  }

  @usableFromInline final let raw: OpaquePointer
  /// `startedBit` once the source was first resumed, plus the outstanding
  /// `suspend()` calls in units of `suspensionUnit` (balanced in `deinit`).
  @usableFromInline final let lifecycle: Atomic<UInt>
  final let shared: Mutex<Shared>
  /// Called once when the source is first started (before activation).
  @usableFromInline final let onActivate: (@Sendable () -> Void)?

  @usableFromInline static let startedBit: UInt = 1
  @usableFromInline static let suspensionUnit: UInt = 2

  /// The source itself (every source type is a `SourceCore`).
  public final var core: SourceCore { self }

  public final var unsafeObject: OpaquePointer { raw }

  /// Creates the C source, inactive; throws when libdispatch rejects the
  /// handle or the mask.
  static func create(type: UnsafeRawPointer, handle: UInt, mask: UInt, queue: Queue) throws(GCDError)
    -> OpaquePointer
  {
    guard let created = cgcd_source_create(type, handle, mask, queue.raw.raw) else {
      throw GCDError(
        operation: "dispatch_source_create(handle: \(handle), mask: \(mask))", errno: EINVAL,
        detail: "libdispatch rejected the handle or the mask")
    }
    return OpaquePointer(created)
  }

  /// Takes over `created` (from `create`), whose handlers run on `queue`.
  ///
  /// - Parameters:
  ///   - ownedCleanup: Work the source's owner must do when the source is
  ///     cancelled (closing a descriptor it opened), after the user's
  ///     cancel handler; runs once.
  ///   - onActivate: Called once when the source is first started.
  init(
    created: OpaquePointer, queue: Queue,
    ownedCleanup: (@Sendable () -> Void)? = nil, onActivate: (@Sendable () -> Void)? = nil
  ) {
    raw = created
    lifecycle = Atomic(0)
    self.onActivate = onActivate
    if let ownedCleanup {
      let handlers = SourceHandlers(raw: created, target: queue, ownedCleanup: ownedCleanup)
      shared = Mutex(Shared(target: queue, handlers: handlers))
      handlers.installCancelBlock()
    } else {
      shared = Mutex(Shared(target: queue, handlers: nil))
    }
  }

  /// Leaves the C source in a state libdispatch can release (cancelled,
  /// suspensions balanced, started), then releases this wrapper's reference.
  deinit {
    if dispatch_source_testcancel(raw) == 0 {
      dispatch_source_cancel(raw)
    }
    // The last reference: nothing else can change the state now.
    let state = lifecycle.load(ordering: .acquiring)
    var outstanding = state / SourceCore.suspensionUnit
    while outstanding > 0 {
      dispatch_resume(raw.object)
      outstanding -= 1
    }
    if state & SourceCore.startedBit == 0 {
      dispatch_activate(raw.object)
    }
    cgcd_release(raw.raw)
  }

  /// The handlers box, made on first use.
  final var handlers: SourceHandlers {
    shared.withLock { shared in
      if let handlers = shared.handlers { return handlers }
      let handlers = SourceHandlers(raw: raw, target: shared.target, ownedCleanup: nil)
      shared.handlers = handlers
      return handlers
    }
  }

  final func setCancelHandler(_ handler: CancelHandler) {
    if handlers.setCancelHandler(handler) {
      handlers.installCancelBlock()
    }
  }

  /// `type` names the source in the message of an unbalanced resume; it is
  /// formatted only then.
  @usableFromInline
  final func resume(type: Any.Type) {
    var current = lifecycle.load(ordering: .relaxed)
    while true {
      if current >= SourceCore.suspensionUnit {
        let (exchanged, original) = lifecycle.compareExchange(
          expected: current, desired: current - SourceCore.suspensionUnit, ordering: .acquiringAndReleasing)
        if exchanged {
          dispatch_resume(raw.object)
          return
        }
        current = original
      } else if current & SourceCore.startedBit == 0 {
        let (exchanged, original) = lifecycle.compareExchange(
          expected: current, desired: current | SourceCore.startedBit, ordering: .acquiringAndReleasing)
        if exchanged {
          onActivate?()
          dispatch_activate(raw.object)
          return
        }
        current = original
      } else {
        let why =
          dispatch_source_testcancel(raw) != 0
          ? "the source is cancelled; a cancelled source cannot be started again"
          : "the source is already running"
        fatalError("GCD: \(type).resume() without a matching suspend() (\(why))")
      }
    }
  }
}

/// What a source's handler blocks share: the target queue (read by every
/// handler call, for its frame) and the cancel handler. Held by the blocks
/// and by the source; never by the source's C object alone, so no cycle.
final class SourceHandlers: @unchecked Sendable {
  /// The C source, not retained: the blocks that use it run while
  /// libdispatch holds the source.
  let raw: OpaquePointer
  /// The target queue and its frame flags.
  let targetRaw: Atomic<UInt>
  let targetFlags: Atomic<UInt>
  let cancel: Mutex<(handler: SourceCore.CancelHandler, installed: Bool)>
  /// Run once at cancellation, after the user's cancel handler.
  let ownedCleanup: (@Sendable () -> Void)?

  init(raw: OpaquePointer, target: Queue, ownedCleanup: (@Sendable () -> Void)?) {
    self.raw = raw
    targetRaw = Atomic(UInt(bitPattern: target.raw.raw))
    targetFlags = Atomic(target.flags & frameExclusive)
    cancel = Mutex((handler: .none, installed: ownedCleanup != nil))
    self.ownedCleanup = ownedCleanup
  }

  func target(_ queue: Queue) {
    targetRaw.store(UInt(bitPattern: queue.raw.raw), ordering: .relaxed)
    targetFlags.store(queue.flags & frameExclusive, ordering: .relaxed)
  }

  /// A closure as a handler block that runs inside a frame of the target queue.
  func block(_ handler: @escaping @Sendable () -> Void) -> @convention(block) () -> Void {
    return { [self] in
      let queue = OpaquePointer(bitPattern: targetRaw.load(ordering: .relaxed)).unsafelyUnwrapped
      withFrame(queue: queue, flags: targetFlags.load(ordering: .relaxed), prev: cgcd_frame_get(), handler)
    }
  }

  /// Records the user's cancel handler; true when the cancel block is not
  /// installed yet (the caller installs it).
  func setCancelHandler(_ handler: SourceCore.CancelHandler) -> Bool {
    cancel.withLock { cancel in
      cancel.handler = handler
      defer { cancel.installed = true }
      return !cancel.installed
    }
  }

  /// The one cancel handler libdispatch sees: the user's, then the owner's cleanup.
  func installCancelBlock() {
    let run: @Sendable () -> Void = { [self] in
      let handler = cancel.withLock { cancel in
        defer { cancel.handler = .none }
        return cancel.handler
      }
      switch handler {
      case .none: break
      case .closure(let closure): closure()
      case .function(let function): function(dispatch_get_context(raw.object))
      }
      ownedCleanup?()
    }
    dispatch_source_set_cancel_handler(raw, block(run))
  }
}
