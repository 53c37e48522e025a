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
/// The corresponding C type is `dispatch_source_t`.
public protocol Source: DispatchObject {
  /// The machinery shared by every source type. Opaque: it has no public members.
  var core: SourceCore { get }
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
  public var unsafeObject: OpaquePointer { core.raw }

  @inlinable
  public var data: UInt { dispatch_source_get_data(core.raw) }
  @inlinable
  public var mask: UInt { dispatch_source_get_mask(core.raw) }
  @inlinable
  public var handle: UInt { dispatch_source_get_handle(core.raw) }

  /// Sets the closure run on the target queue for each (merged) event.
  ///
  /// The corresponding C function is `dispatch_source_set_event_handler`.
  public func setEventHandler(_ handler: @escaping @Sendable () -> Void) {
    dispatch_source_set_event_handler(core.raw, core.block(handler))
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
    dispatch_set_context(core.raw.object, context)
    dispatch_source_set_event_handler_f(core.raw, function)
  }

  /// Sets the closure run once after `cancel()` takes effect: the place to
  /// close a descriptor or free the context.
  ///
  /// The corresponding C function is `dispatch_source_set_cancel_handler`.
  public func setCancelHandler(_ handler: @escaping @Sendable () -> Void) {
    core.setCancelHandler(.closure(handler))
  }

  /// Sets a C function as the cancel handler; it is called with the source's
  /// context at cancellation, and `context` becomes the source's context.
  ///
  /// The corresponding C functions are `dispatch_set_context` and
  /// `dispatch_source_set_cancel_handler_f`.
  public func setCancelHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    dispatch_set_context(core.raw.object, context)
    core.setCancelHandler(.function(function))
  }

  /// Sets the closure run once when the source is installed and starts
  /// watching (after the first `resume()`).
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler`.
  public func setRegistrationHandler(_ handler: @escaping @Sendable () -> Void) {
    dispatch_source_set_registration_handler(core.raw, core.block(handler))
  }

  /// Sets a C function as the registration handler, called with `context`
  /// (which becomes the source's context).
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler_f`.
  public func setRegistrationHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    dispatch_set_context(core.raw.object, context)
    dispatch_source_set_registration_handler_f(core.raw, function)
  }

  /// Starts a new source, or resumes one suspended with `suspend()`.
  ///
  /// The first `resume()` of a source that was never suspended starts it.
  /// A `resume()` with nothing to balance stops the process with a message
  /// naming the source (libdispatch traps with none).
  ///
  /// The corresponding C functions are `dispatch_activate` (first start) and `dispatch_resume`.
  public func resume() { core.resume(type: Self.self) }

  /// Suspends event delivery; events that arrive meanwhile are merged and
  /// delivered once after the matching `resume()`.
  ///
  /// The corresponding C function is `dispatch_suspend`.
  public func suspend() { core.suspend() }

  /// Stops the source: no event handler starts after this (one that is
  /// running finishes), then the cancel handler runs once. Calling it again
  /// does nothing.
  ///
  /// The corresponding C function is `dispatch_source_cancel`.
  public func cancel() { dispatch_source_cancel(core.raw) }

  /// Whether `cancel()` has been called.
  ///
  /// The corresponding C function is `dispatch_source_testcancel`.
  public var isCancelled: Bool { dispatch_source_testcancel(core.raw) != 0 }

  /// Runs the handlers on `queue` from now on. A handler that is running
  /// finishes where it is; events not yet handled — even one waiting for
  /// the old queue — run on the new queue (libdispatch re-checks the
  /// target when it drains the source).
  ///
  /// The corresponding C function is `dispatch_set_target_queue`.
  public func setTarget(_ queue: Queue) { core.setTarget(queue) }

  /// The queue the handlers run on.
  public var queue: Queue { core.queue }
}

/// The state and handlers shared by every source type.
public final class SourceCore: @unchecked Sendable {
  enum CancelHandler {
    case none
    case closure(@Sendable () -> Void)
    case function(@convention(c) (UnsafeMutableRawPointer?) -> Void)
  }

  struct State {
    var activated = false
    var suspensions = 0
    var cancelHandler = CancelHandler.none
    var cancelBlockInstalled = false
    var target: Queue
  }

  @usableFromInline let raw: OpaquePointer
  let state: Mutex<State>
  /// The target queue and its frame flags, read by every handler call.
  let targetRaw: Atomic<UInt>
  let targetFlags: Atomic<UInt>
  /// Work the source's owner must do when the source is cancelled (closing
  /// a descriptor it opened), after the user's cancel handler; runs once.
  let ownedCleanup: (@Sendable () -> Void)?
  /// Called once when the source is first started (before activation).
  let onActivate: (@Sendable () -> Void)?

  init(
    type: UnsafeRawPointer, handle: UInt, mask: UInt, queue: Queue,
    ownedCleanup: (@Sendable () -> Void)? = nil, onActivate: (@Sendable () -> Void)? = nil
  ) throws(GCDError) {
    guard let created = cgcd_source_create(type, handle, mask, queue.raw.raw) else {
      throw GCDError(
        operation: "dispatch_source_create(handle: \(handle), mask: \(mask))", errno: EINVAL,
        detail: "libdispatch rejected the handle or the mask")
    }
    raw = OpaquePointer(created)
    state = Mutex(State(target: queue))
    targetRaw = Atomic(UInt(bitPattern: queue.raw.raw))
    targetFlags = Atomic(queue.flags & frameExclusive)
    self.ownedCleanup = ownedCleanup
    self.onActivate = onActivate
    if ownedCleanup != nil {
      installCancelBlock()
    }
  }

  /// A closure as a handler block that runs inside a frame of the target queue.
  func block(_ handler: @escaping @Sendable () -> Void) -> @convention(block) () -> Void {
    return { [self] in
      let queue = OpaquePointer(bitPattern: targetRaw.load(ordering: .relaxed)).unsafelyUnwrapped
      withFrame(queue: queue, flags: targetFlags.load(ordering: .relaxed), prev: cgcd_frame_get(), handler)
    }
  }

  func setCancelHandler(_ handler: CancelHandler) {
    let install = state.withLock { state in
      state.cancelHandler = handler
      defer { state.cancelBlockInstalled = true }
      return !state.cancelBlockInstalled
    }
    if install { installCancelBlock() }
  }

  /// The one cancel handler libdispatch sees: the user's, then the owner's cleanup.
  private func installCancelBlock() {
    state.withLock { $0.cancelBlockInstalled = true }
    let run: @Sendable () -> Void = { [self] in
      let handler = state.withLock { state in
        defer { state.cancelHandler = .none }
        return state.cancelHandler
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

  /// `type` names the source in the message of an unbalanced resume; it is
  /// formatted only then.
  func resume(type: Any.Type) {
    enum Action { case resume, activate }
    let action: Action? = state.withLock { state in
      if state.suspensions > 0 {
        state.suspensions -= 1
        return .resume
      }
      if !state.activated {
        state.activated = true
        return .activate
      }
      return nil
    }
    switch action {
    case .resume: dispatch_resume(raw.object)
    case .activate:
      onActivate?()
      dispatch_activate(raw.object)
    case nil: fatalError("GCD: \(type).resume() without a matching suspend() (the source is already running)")
    }
  }

  func suspend() {
    state.withLock { $0.suspensions += 1 }
    dispatch_suspend(raw.object)
  }

  func setTarget(_ queue: Queue) {
    state.withLock { $0.target = queue }
    targetRaw.store(UInt(bitPattern: queue.raw.raw), ordering: .relaxed)
    targetFlags.store(queue.flags & frameExclusive, ordering: .relaxed)
    dispatch_set_target_queue(raw.object, queue.raw)
  }

  var queue: Queue { state.withLock { $0.target } }

  /// Called from the owning wrapper's `deinit`: leaves the C source in a
  /// state libdispatch can release, then releases this wrapper's reference.
  func dispose() {
    dispatch_source_cancel(raw)
    let (suspensions, activated) = state.withLock { state in
      defer {
        state.suspensions = 0
        state.activated = true
      }
      return (state.suspensions, state.activated)
    }
    for _ in 0..<suspensions { dispatch_resume(raw.object) }
    if !activated {
      dispatch_activate(raw.object)
    }
    cgcd_release(raw.raw)
  }
}
