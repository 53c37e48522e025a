import Synchronization

/// A dispatch source: the base class of every source type (it cannot be
/// subclassed outside this package). It holds the C source, its handlers
/// and its life cycle.
///
/// A source is created inactive. Set its handlers, then call `resume()`
/// once to start it. `suspend()` and `resume()` must balance. `cancel()` is
/// final: a handler that is running finishes, then the cancel handler runs,
/// exactly once, and no event handler runs after it. Cancelling a
/// suspended source does not wait for its `resume()`: the outstanding
/// suspensions are balanced at once, so the cancel handler runs promptly (a
/// later `resume()` that matches an earlier `suspend()` is still accepted).
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
/// `Sendable`: libdispatch sources are thread-safe, and the wrapper's own
/// state is atomic (the life cycle) or behind a mutex (target, handlers).
///
/// The corresponding C type is `dispatch_source_t`.
public class Source: GCDObject, @unchecked Sendable {
  /// The user's cancel handler, as a closure or a C function.
  enum CancelHandler: Sendable {
    case none
    case closure(@Sendable () -> Void)
    case function(Libdispatch.Function)
  }

  /// Started, suspended(n), cancelled: balanced in `deinit`. The hot word of the life cycle.
  @usableFromInline final let lifecycle: Atomic<Lifecycle>
  /// What the handler blocks share (`SourceState`), made on first use and held (+1) until
  /// `deinit`; before it is made, the queue the source was created with (+1), tagged
  /// (`Source.queueTag`); and in the low bits, `hasStartHook`, which never changes. One word,
  /// so that a source is 40 bytes (glibc's 48-byte chunk, not 64: every source is a scale row's
  /// object). An unmanaged word rather than `AtomicLazyReference`, whose generic `load()` is not
  /// specialized here and looked its metadata up on every call (callgrind: 300 instructions a
  /// timer).
  ///
  /// The queue's +1 goes when the state is made: the state (`LazySourceState`) holds the queue
  /// for its whole life beside its current target, so a reader that took the queue from the word
  /// before the state replaced it still has a live object (`queue`).
  @usableFromInline final let word: Atomic<UInt>
  @inlinable static var queueTag: UInt { 1 }
  @inlinable static var startHookBit: UInt { 2 }
  @inlinable static var flagBits: UInt { 3 }

  /// Whether the source has the package's start hook (a watcher's start, a watch's arming): its first
  /// start runs it, so it never takes `resume()`'s fast path.
  @inlinable final var hasStartHook: Bool { word.load(ordering: .relaxed) & Source.startHookBit != 0 }
  /// Whether the state has the package's cleanup (a descriptor watch's, a watcher's stop): its
  /// cancel block is installed by the cancel itself (`cancel()`, `deinit`), right before
  /// `dispatch_source_cancel`, not at creation, so that a live source carries no cancel block
  /// (a block and its continuation, 144 bytes of an idle read source's; docs/performance.md).
  /// libdispatch drains a handler change pushed on the source before its cancel callout
  /// (`_dispatch_source_invoke2`), so the block installed then is the one that runs. The sources
  /// with a start hook and those with a cleanup are the same (a watch's, a watcher's).
  @inlinable final var cleansUp: Bool { hasStartHook }

  /// The object `word`'s value names (the state, or the created queue), its flags masked off.
  static func object(in value: UInt) -> UnsafeRawPointer {
    UnsafeRawPointer(bitPattern: value & ~Source.flagBits).unsafelyUnwrapped
  }

  /// The state, if it is made.
  final var madeState: SourceState? {
    let value = word.load(ordering: .acquiring)
    guard value & Source.queueTag == 0 else { return nil }
    return Unmanaged<SourceState>.fromOpaque(Source.object(in: value))
      .takeUnretainedValue()
  }

  /// Creates a C source, inactive, whose handlers run on `queue`.
  ///
  /// - Throws: `EINVAL` when libdispatch rejects the handle or the mask.
  static func create(_ type: Libdispatch.SourceType, handle: UInt = 0, mask: UInt = 0, queue: Queue)
    throws(GCDError) -> OpaquePointer
  {
    guard let created = Libdispatch.source_create(type, handle, mask, queue.raw) else {
      throw GCDError(
        operation: "dispatch_source_create(handle: \(handle), mask: \(mask))", errno: Errno.invalidArgument,
        detail: "libdispatch rejected the handle or the mask")
    }
    return created
  }

  /// Creates the C source of a read or write source on `descriptor`, which must be open and not
  /// a directory (epoll cannot watch one: libdispatch would accept it and the source would never
  /// fire). The initializer the descriptor sources share.
  ///
  /// A descriptor epoll can watch (a pipe, a socket, a terminal) goes into the package's descriptor
  /// fence (`DescriptorFence`), and the C source is a DATA_OR source the fence merges into, so that
  /// libdispatch never sees the descriptor hang up (swift-corelibs-libdispatch#949). A regular
  /// file or a device, which epoll cannot watch (`EPERM`), gets an always-ready watch
  /// (`DescriptorWatch.Arming.alwaysReady`); past the kernel's limit of epoll paths to one file (`EINVAL`)
  /// the descriptor is given to libdispatch directly (`watch` is nil). The registration answers
  /// for the descriptor: `EBADF` when it is not open; only a refused one is looked at (`fstat`),
  /// to refuse a directory.
  static func create(
    descriptor: Int32, _ type: Libdispatch.SourceType, queue: Queue, operation: @autoclosure () -> String
  ) throws(GCDError) -> (created: OpaquePointer, watch: DescriptorWatch?) {
    guard descriptor >= 0 else {
      throw GCDError(operation: operation(), errno: Errno.badFileDescriptor, detail: "not an open file descriptor")
    }
    let fence = try DescriptorFence.shared(operation())
    let merged = try create(.dataOr, queue: queue)
    let watch = DescriptorWatch(
      raw: merged, queue: queue, fence: fence, descriptor: descriptor, writable: type == .write)
    let registration: DescriptorFence.Registration
    do {
      registration = try fence.register(watch, operation: operation())
    } catch {
      discard(merged)
      throw error
    }
    if registration == .watched { return (merged, watch) }
    guard let status = system_fstat(descriptor) else {
      discard(merged)
      throw GCDError(operation: operation(), errno: Errno.badFileDescriptor, detail: "not an open file descriptor")
    }
    if status.isDirectory {
      discard(merged)
      throw GCDError(
        operation: operation(), errno: Errno.isDirectory,
        detail: "a directory never becomes readable or writable (epoll cannot watch it); use FileSystemSource")
    }
    if registration == .notPollable {
      // A regular file or a device with no poll operation (`/dev/null`): `poll` calls such a file
      // always ready. libdispatch would stand an `eventfd` in for a regular file (a descriptor per
      // source) and refuse a device's registration (the source would never fire).
      watch.arming = .alwaysReady
      return (merged, watch)
    }
    discard(merged)
    return (try create(type, handle: UInt(descriptor), queue: queue), nil)
  }

  /// Creates the C source of a process source on `descriptor` (a pidfd): a DATA_OR source the
  /// descriptor fence merges `bits` into once, when the process exits (a pidfd becomes readable
  /// then, for good, and hangs up once the process is reaped: the fence keeps libdispatch from
  /// seeing that, as for a socket). The watch leaves the fence with its one event, and closes the
  /// descriptor then if it `owns` it (or in the cancel path, if it comes first). On a failure an
  /// owned descriptor is closed before the error is thrown.
  static func create(
    pidfd descriptor: Int32, bits: UInt, owns: Bool, queue: Queue, operation: @autoclosure () -> String
  ) throws(GCDError) -> (created: OpaquePointer, watch: DescriptorWatch) {
    let merged: OpaquePointer
    let fence: DescriptorFence
    do {
      fence = try DescriptorFence.shared(operation())
      merged = try create(.dataOr, queue: queue)
    } catch {
      if owns { system_close(descriptor) }
      throw error
    }
    let watch = DescriptorWatch(
      raw: merged, queue: queue, fence: fence, descriptor: descriptor, writable: false, mergeValue: bits,
      deliversOnce: true, closesDescriptor: owns)
    let registration: DescriptorFence.Registration
    do {
      registration = try fence.register(watch, operation: operation())
    } catch {
      if owns { system_close(descriptor) }
      discard(merged)
      throw error
    }
    guard registration == .watched else {
      if owns { system_close(descriptor) }
      discard(merged)
      throw GCDError(
        operation: operation(), errno: Errno.invalidArgument,
        detail: registration == .overLimit
          ? "the kernel's limit of epoll paths to one file is reached (too many descriptors of this pidfd)"
          : "epoll cannot watch this descriptor")
    }
    return (merged, watch)
  }

  /// Releases a created C source no wrapper took over: cancelled and started first (libdispatch
  /// traps on the release of an inactive source).
  private static func discard(_ created: OpaquePointer) {
    Libdispatch.source_cancel(created)
    Libdispatch.activate(created)
    Libdispatch.release(created)
  }

  /// Takes over `created` (from `create`), whose handlers run on `queue`.
  ///
  /// - Parameters:
  ///   - watcher: The kernel watcher of the package's own kinds (inotify, a pressure trigger),
  ///     started at the first start and stopped once at cancellation, after the user's cancel
  ///     handler (`OwnedSourceState`).
  ///   - watch: For a read or write source in the descriptor fence, its watch (from
  ///     `create(descriptor:)`), which is the source's state: taken out of the fence before the
  ///     user's cancel handler, re-armed after each event handler, and the source of `data`.
  init(
    created: OpaquePointer, queue: Queue,
    watcher: (any KernelWatcher)? = nil, watch: DescriptorWatch? = nil
  ) {
    lifecycle = Atomic(.inactive)
    let made: SourceState?
    if let watch {
      made = watch
    } else if let watcher {
      // The package's own kinds: their state at once; their cleanup runs however the source
      // ends (the cancel block, installed by the cancel: `cleansUp`).
      made = OwnedSourceState(raw: created, queue: queue, watcher: watcher)
    } else {
      made = nil
    }
    if let made {
      word = Atomic(
        UInt(bitPattern: Unmanaged.passRetained(made).toOpaque()) | Source.startHookBit)
    } else {
      word = Atomic(UInt(bitPattern: Unmanaged.passRetained(queue).toOpaque()) | Source.queueTag)
    }
    super.init(raw: created)
  }

  /// Leaves the C source in a state libdispatch can release (cancelled,
  /// suspensions balanced, started), then releases this wrapper's reference.
  deinit {
    // The last reference: nothing else can change the state now.
    var state = lifecycle.load(ordering: .acquiring)
    if cleansUp { installCleanup() }
    if !state.isCancelled { Libdispatch.source_cancel(raw) }
    state.drop().perform(on: raw)
    Libdispatch.release(raw)
    let value = word.load(ordering: .acquiring)
    let object = Source.object(in: value)
    if value & Source.queueTag != 0 {
      Unmanaged<Queue>.fromOpaque(object).release()
    } else {
      Unmanaged<SourceState>.fromOpaque(object).release()
    }
  }

  // MARK: The event

  /// The pending data of the event being handled. For `TimerSource`, the
  /// number of fires merged into this event; for `ReadSource`, the bytes
  /// available; for `SignalSource`, the deliveries merged; for the data
  /// sources, the merged value; for `ProcSource` and `FileSystemSource`,
  /// the raw value of `firedEvents`.
  ///
  /// The corresponding C function is `dispatch_source_get_data`.
  ///
  /// `ReadSource` and `WriteSource` compute it from their descriptor when it is read (their C
  /// source is the descriptor fence's DATA_OR source, whose data says nothing).
  @inlinable
  public var data: UInt { Libdispatch.source_get_data(raw) }

  /// The mask the source was created with (the events it watches).
  ///
  /// The corresponding C function is `dispatch_source_get_mask`.
  @inlinable
  public var mask: UInt { Libdispatch.source_get_mask(raw) }

  /// The handle the source watches: a descriptor, a signal number, a pid.
  ///
  /// The corresponding C function is `dispatch_source_get_handle`.
  @inlinable
  public var handle: UInt { Libdispatch.source_get_handle(raw) }

  // MARK: Handlers

  /// Sets the closure run on the target queue for each (merged) event.
  ///
  /// - Parameter handler: The closure; it runs on the source's queue.
  ///
  /// The corresponding C function is `dispatch_source_set_event_handler`.
  public final func setEventHandler(_ handler: @escaping @Sendable () -> Void) {
    let state = state
    if sendsHandlersOn(state) {
      Libdispatch.source_set_event_handler(raw, state.block { state.sendToTarget(handler) })
    } else {
      state.setEventHandler(handler)
    }
  }

  /// Whether an event handler set now is sent on to the source's queue: a signal source a sequence
  /// started stays on the package's registration queue (`SourceState.startRegistering`). Only a
  /// signal source asks the state's lock.
  final func sendsHandlersOn(_ state: SourceState) -> Bool {
    losesEventsBeforeRegistration && state.staysOnRegistrationQueue
  }

  /// Sets `handler` as the event handler, called with the event's data as
  /// `data` reads it (`SourceState.eventData`), so the handler never holds the source.
  /// What each type's `setEventHandler { value in }` calls.
  ///
  /// On a source a signal sequence started (it stays on the package's registration queue), the
  /// user's handler is sent on to the source's queue, with the value read where the event is.
  @usableFromInline
  final func setValueHandler(_ handler: @escaping @Sendable (UInt) -> Void) {
    let state = state
    if sendsHandlersOn(state) {
      Libdispatch.source_set_event_handler(raw, state.valueBlock { value in state.sendToTarget { handler(value) } })
    } else {
      state.setValueHandler(handler)
    }
  }

  /// Sets a C function as the event handler; it is called with `context`,
  /// which becomes the source's context (as in C, where the function gets
  /// the source's context).
  ///
  /// - Parameters:
  ///   - context: The pointer passed to `function`; stored as the source's context.
  ///   - function: The C function to call for each event.
  ///
  /// The function runs inside the package's frame for the source's queue,
  /// as a closure handler does.
  ///
  /// The corresponding C functions are `dispatch_set_context` and
  /// `dispatch_source_set_event_handler_f`.
  public final func setEventHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.set_context(raw, context)
    // A block that calls the function inside the target queue's frame (as
    // every handler of the package runs), with the context read at each call
    // as `dispatch_source_set_event_handler_f` does.
    let state = state
    if sendsHandlersOn(state) {
      Libdispatch.source_set_event_handler(
        raw, state.block { state.sendToTarget { function(Libdispatch.get_context(state.raw)) } })
    } else {
      state.setEventHandler { function(Libdispatch.get_context(state.raw)) }
    }
  }

  /// Sets the closure run once after `cancel()` takes effect: the place to
  /// close a descriptor or free the context.
  ///
  /// - Parameter handler: The closure; it runs on the source's queue.
  ///
  /// The corresponding C function is `dispatch_source_set_cancel_handler`.
  public final func setCancelHandler(_ handler: @escaping @Sendable () -> Void) {
    setCancelHandler(.closure(handler))
  }

  /// Sets a C function as the cancel handler; it is called with the source's
  /// context at cancellation, and `context` becomes the source's context.
  ///
  /// - Parameters:
  ///   - context: The pointer passed to `function`; stored as the source's context.
  ///   - function: The C function to call once at cancellation.
  ///
  /// The corresponding C functions are `dispatch_set_context` and
  /// `dispatch_source_set_cancel_handler_f`.
  public final func setCancelHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.set_context(raw, context)
    setCancelHandler(.function(function))
  }

  /// Sets the closure run once when the source is installed and starts
  /// watching (after the first `resume()`).
  ///
  /// - Parameter handler: The closure; it runs on the source's queue.
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler`.
  public final func setRegistrationHandler(_ handler: @escaping @Sendable () -> Void) {
    state.setRegistration(handler: .closure(handler))
  }

  /// Sets a C function as the registration handler, called with `context`
  /// (which becomes the source's context).
  ///
  /// - Parameters:
  ///   - context: The pointer passed to `function`; stored as the source's context.
  ///   - function: The C function to call once at registration.
  ///
  /// The corresponding C function is `dispatch_source_set_registration_handler_f`
  /// (here one registration block, shared with `events`, calls the function).
  public final func setRegistrationHandler(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.set_context(raw, context)
    state.setRegistration(handler: .function(function))
  }

  /// Whether an event that happens between the start and the registration is lost: true for a
  /// signal (delivered before libdispatch's handler and signalfd exist, it takes its disposition).
  /// For every other source it waits: a descriptor stays ready (epoll reports it when added), a
  /// timer's deadline is absolute, a data source merges before it is installed, and the package's
  /// own watchers (inotify, pidfd, pressure) start in the start hook, before the C source.
  var losesEventsBeforeRegistration: Bool { false }

  /// The state the handler blocks share, made on first use (two threads asking at once get the
  /// same one: the loser's is dropped before anything used it).
  ///
  /// The word holds the state's +1 from here to `deinit`; a reader takes it unretained and so
  /// holds it strongly while it uses it, and no reader exists once `deinit` runs (the last
  /// reference is gone).
  final var state: SourceState { madeState ?? makeState() }

  /// `state`'s first use: one compare-and-swap installs it, and gives back the word's +1 on the
  /// created queue (the state holds the queue itself).
  final func makeState() -> SourceState {
    var value = word.load(ordering: .acquiring)
    while value & Source.queueTag != 0 {
      let queue = Unmanaged<Queue>.fromOpaque(Source.object(in: value))
      let made = Unmanaged<SourceState>.passRetained(LazySourceState(raw: raw, queue: queue.takeUnretainedValue()))
      let desired = UInt(bitPattern: made.toOpaque()) | (value & (Source.flagBits & ~Source.queueTag))
      let (exchanged, current) = word.compareExchange(
        expected: value, desired: desired, ordering: .acquiringAndReleasing)
      if exchanged {
        queue.release()
        return made.takeUnretainedValue()
      }
      made.release()
      value = current
    }
    return Unmanaged<SourceState>.fromOpaque(Source.object(in: value))
      .takeUnretainedValue()
  }

  /// The package's start hook (a watcher's start), before the first activation; nothing for a
  /// source without one.
  final func runStartHook() {
    if hasStartHook { state.startHook() }
  }

  final func setCancelHandler(_ handler: CancelHandler) {
    state.setCancelHandler(handler)
  }

  // MARK: Life cycle

  /// Starts a new source, or resumes one suspended with `suspend()`.
  ///
  /// The first `resume()` of a source that was never suspended starts it.
  /// A `resume()` with nothing to balance stops the process with a message
  /// naming the source (libdispatch traps with none).
  ///
  /// The corresponding C functions are `dispatch_activate` (first start) and `dispatch_resume`.
  @inlinable
  public final func resume() {
    // The common first start (inactive -> active, `.activate`), as one
    // compare-and-swap; every other case goes through the machine.
    if !hasStartHook
      && lifecycle.compareExchange(expected: .inactive, desired: .active, ordering: .acquiringAndReleasing).exchanged
    {
      Libdispatch.activate(raw)
      return
    }
    resumeThroughLifecycle()
  }

  /// `resume()` through the life-cycle machine: balances a suspension,
  /// starts (running the start hook first), or stops with a message.
  @usableFromInline
  final func resumeThroughLifecycle() {
    let action = lifecycle.update { $0.resume(starts: true) }
    if action == .activate { runStartHook() }
    if let misuse = action.perform(on: raw) { unbalancedResume(misuse) }
  }

  /// Suspends event delivery; events that arrive meanwhile are merged and
  /// delivered once after the matching `resume()`.
  ///
  /// The corresponding C function is `dispatch_suspend`.
  public final func suspend() {
    Libdispatch.suspend(raw)
    lifecycle.update { $0.suspend() }.perform(on: raw)
  }

  /// Stops the source: no event handler starts after this (one that is
  /// running finishes), then the cancel handler runs once. Outstanding
  /// suspensions are balanced at once and a never-started source is
  /// started, so the cancel handler does not wait. Calling it again does
  /// nothing.
  ///
  /// The corresponding C function is `dispatch_source_cancel`.
  @inlinable
  public final func cancel() {
    if cleansUp { installCleanup() }
    Libdispatch.source_cancel(raw)
    lifecycle.update { $0.cancel() }.perform(on: raw)
  }

  /// A read or write source's watch in the descriptor fence: its state (a source that has one has
  /// the start hook, and no other kind of state); nil past the kernel's limit of epoll paths to one
  /// file, where libdispatch watches the descriptor. Kept in `stateWord` alone, so that a read
  /// source carries no field of its own (an idle one is a scale row's target).
  final var descriptorWatch: DescriptorWatch? {
    guard hasStartHook else { return nil }
    return unsafeDowncast(madeState.unsafelyUnwrapped, to: DescriptorWatch.self)
  }

  /// A read or write source's descriptor: its watch's, or the C source's handle (a source that
  /// libdispatch watches itself).
  final var fenceDescriptor: Int32 {
    descriptorWatch?.descriptor ?? Int32(truncatingIfNeeded: Int(bitPattern: Libdispatch.source_get_handle(raw)))
  }

  /// Installs the cancel block that runs the package's cleanup, once (`cleansUp`): a `cancel()`
  /// racing another, or `deinit`, finds it installed.
  @usableFromInline
  final func installCleanup() {
    madeState.unsafelyUnwrapped.installCancelBlockOnce()
  }

  /// Whether `cancel()` has been called.
  ///
  /// The corresponding C function is `dispatch_source_testcancel`.
  @inlinable
  public final var isCancelled: Bool { Libdispatch.source_testcancel(raw) }

  /// Whether the source is held back by a `suspend()` that has no
  /// `resume()` yet (a cancelled source never is).
  public final var isSuspended: Bool { lifecycle.load(ordering: .relaxed).isSuspended }

  /// Stops with a message naming the source type; formatted only then.
  @usableFromInline
  final func unbalancedResume(_ misuse: Lifecycle.Misuse) -> Never {
    let why =
      switch misuse {
      case .cancelled: "the source is cancelled; a cancelled source cannot be started again"
      case .notSuspended: "the source is already running"
      case .held:
        "the source is already running: its event sequence holds it until the next element is taken, "
          + "and resume() balances only your own suspend()"
      }
    fatalError("GCD: \(type(of: self)).resume() without a matching suspend() (\(why))")
  }

  // MARK: Target queue

  /// Runs the handlers on `queue` from now on. A handler that is running
  /// finishes where it is; events not yet handled — even one waiting for
  /// the old queue — run on the new queue (libdispatch re-checks the
  /// target when it drains the source).
  ///
  /// A `SignalSource` whose sequence was made (`makeEvents()`) stays on the
  /// package's registration queue, where the sequence is served: there this
  /// records `queue`, and your handlers are sent on to it (libdispatch
  /// counts a new target of an active source as deprecated use).
  ///
  /// - Parameter queue: The queue to run the handlers on.
  ///
  /// The corresponding C function is `dispatch_set_target_queue`.
  public final func setTarget(_ queue: Queue) {
    if state.setTarget(queue) { Libdispatch.set_target_queue(raw, queue.raw) }
  }

  /// The queue the handlers run on.
  public final var queue: Queue {
    let value = word.load(ordering: .acquiring)
    let object = Source.object(in: value)
    if value & Source.queueTag != 0 { return Unmanaged<Queue>.fromOpaque(object).takeUnretainedValue() }
    return Unmanaged<SourceState>.fromOpaque(object).takeUnretainedValue().queue
  }
}
