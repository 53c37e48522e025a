import Synchronization

/// A dispatch queue: a FIFO of work items run serially or concurrently on
/// libdispatch's threads.
///
/// A `Queue` owns one reference to its C queue and releases it in `deinit`.
/// Whatever state you leave it in, dropping it is safe: a queue that was
/// created inactive is activated and outstanding `suspend()`s are balanced
/// before the release, so queued work still runs and libdispatch never sees
/// the release of an inactive or suspended queue (which it punishes with a
/// trap).
///
/// `Sendable`: libdispatch queues are thread-safe, and the wrapper's state
/// is immutable or atomic.
///
/// Every queue is a `TaskExecutor` (`withTaskExecutorPreference(queue)`
/// runs child tasks on it); `SerialQueue`, the package's one subclass, is
/// also a `SerialExecutor` an actor can run on. The class is public but not
/// open, and its members are final: calls on a `Queue` dispatch statically.
///
/// The corresponding C type is `dispatch_queue_t`.
public class Queue: GCDObject, @unchecked Sendable {
  /// How a queue runs its work items.
  public enum Kind: Sendable, Hashable {
    /// One work item at a time, in FIFO order. `DISPATCH_QUEUE_SERIAL`.
    case serial
    /// Many work items at once, started in FIFO order. `DISPATCH_QUEUE_CONCURRENT`.
    case concurrent
  }

  /// `frameExclusive` for serial queues, plus `Queue.globalFlag` / `mainFlag`.
  @usableFromInline final let flags: UInt
  /// The life cycle (inactive, active, suspended(n)), balanced in
  /// `deinit`, and whether this package set a target (`sync` then walks
  /// the target chain in its re-entrancy check).
  ///
  /// The targets set with `setTarget` are kept, newest first, in a
  /// `TargetLink` list that the C queue holds as a queue-specific value
  /// (`Libdispatch.targetsKey`) and that `deinit` releases: they stay alive
  /// while the wrapper does, so a chain walk that read an older target
  /// stays valid, and a queue that never had a target pays nothing for them.
  @usableFromInline final let state: Atomic<Lifecycle>

  @usableFromInline static let globalFlag: UInt = 2
  @usableFromInline static let mainFlag: UInt = 4
  /// Created with `initiallyInactive`: libdispatch forbids re-targeting it once active.
  @usableFromInline static let createdInactiveFlag: UInt = 8
  /// A `SerialQueue`: its executor jobs run isolated to it.
  @usableFromInline static let serialExecutorFlag: UInt = 16

  /// Creates a serial or concurrent queue with a label, and optionally a quality of service and a target.
  ///
  /// - Parameters:
  ///   - label: A name shown in crash reports, messages and `label`.
  ///   - kind: `.serial` (the default) or `.concurrent`.
  ///   - qos: The quality-of-service class of the queue's work. A class
  ///     that is not one of `QoS`'s stops the process with a message
  ///     (libdispatch would drop the QoS without a word).
  ///   - target: The queue this queue's work is funneled through (by
  ///     default, the global queue of the queue's QoS). Set with
  ///     `dispatch_set_target_queue` after creation, so `setTarget(_:)` can
  ///     change it later (a queue made with `dispatch_queue_create_with_target`
  ///     could not be re-targeted).
  ///   - initiallyInactive: Create the queue inactive: work can be submitted
  ///     but none runs until `activate()`. libdispatch fixes the target of
  ///     such a queue when it is activated: set it before `activate()`.
  ///
  /// The corresponding C function is `dispatch_queue_create`.
  @inlinable
  public convenience init(
    label: String, kind: Kind = .serial, qos: QoS = .unspecified, target: Queue? = nil,
    initiallyInactive: Bool = false
  ) {
    var attr: OpaquePointer? = kind == .concurrent ? Libdispatch.queue_attr_concurrent : nil
    if qos != .unspecified {
      qos.checkKnown("Queue(label: \"\(label)\", ")  // libdispatch would drop it silently
      attr = Libdispatch.queue_attr_make_with_qos_class(attr, qos.rawClass, qos.relativePriority)
    }
    if initiallyInactive {
      attr = Libdispatch.queue_attr_make_initially_inactive(attr)
    }
    let created = label.withCString { Libdispatch.queue_create($0, attr) }
    // A queue made at the address of a freed one must not continue its statistics row. Here, before
    // the wrapper exists: a check after `super.init` kept the optimizer from treating the new
    // wrapper's `flags` as known (`sync` on a queue made in the same function: 2 instructions).
    if _slowPath(stallWatching) { stallForget(created) }
    self.init(
      created: created,
      flags: (kind == .serial ? frameExclusive : 0) | (initiallyInactive ? Queue.createdInactiveFlag : 0),
      state: initiallyInactive ? .inactive : .active)
    if let target {
      setTarget(target)
    }
  }

  /// Takes over a queue just created (its one reference).
  @inlinable
  init(created raw: OpaquePointer, flags: UInt, state: Lifecycle) {
    self.flags = flags
    self.state = Atomic(state)
    super.init(raw: raw)
  }

  /// Wraps a global or the main queue (never released).
  init(unownedGlobal raw: OpaquePointer, flags: UInt) {
    self.flags = flags
    self.state = Atomic(.active)
    super.init(raw: raw)
  }

  deinit {
    if flags & Queue.globalFlag != 0 { return }
    if _slowPath(stallWatching) { stallForget(raw) }
    // The last reference: nothing else can change the state now.
    var state = state.load(ordering: .acquiring)
    let retargeted = state.isRetargeted
    state.drop().perform(on: raw)
    if retargeted, let targets = Libdispatch.queue_get_specific(raw, Libdispatch.targetsKey) {
      Unmanaged<TargetLink>.fromOpaque(targets).release()
    }
    Libdispatch.release(raw)
  }

  /// The serial queue bound to the main thread, drained by `Queue.dispatchMain()`.
  ///
  /// The corresponding C function is `dispatch_get_main_queue`.
  public static let main: Queue = {
    let main = Queue(unownedGlobal: Libdispatch.get_main_queue(), flags: globalFlag | mainFlag | frameExclusive)
    // Marks the main queue so that work running on it (or on a queue that
    // targets it) is recognised even when it was not submitted through this
    // package: Swift's main actor, for one, runs main-queue work on worker
    // threads after an async main parks the main thread in dispatch_main.
    Libdispatch.queue_set_specific(main.raw, Libdispatch.mainQueueKey, UnsafeMutableRawPointer(main.raw), nil)
    return main
  }()

  /// The label given at creation ("" for none).
  ///
  /// The corresponding C function is `dispatch_queue_get_label`.
  public final var label: String { String(cString: Libdispatch.queue_get_label(raw)) }

  /// Whether the queue runs one work item at a time.
  public final var kind: Kind { flags & frameExclusive != 0 ? .serial : .concurrent }

  /// Whether this is `Queue.main` or one of the global queues.
  public final var isGlobal: Bool { flags & Queue.globalFlag != 0 }
}

// MARK: - Submitting work

extension Queue {
  /// Submits a closure to run on the queue and returns at once.
  ///
  /// The corresponding C function is `dispatch_async` (this calls
  /// `dispatch_async_f` with the closure as context).
  @inlinable
  public func async(_ work: @escaping @Sendable () -> Void) {
    if _slowPath(stallWatching) { return asyncWatched(work, barrier: false) }
    Libdispatch.async_f(raw, Work.context(work, queue: raw, flags: flags)) { Work.run($0) }
  }

  /// `async` and `asyncBarrier` while a `StallMonitor` watches.
  @usableFromInline
  @inline(never)
  func asyncWatched(_ work: @escaping @Sendable () -> Void, barrier: Bool) {
    if barrier {
      Libdispatch.barrier_async_f(raw, Work.watchedContext(work, queue: raw, flags: frameExclusive)) {
        Work.runWatched($0)
      }
    } else {
      Libdispatch.async_f(raw, Work.watchedContext(work, queue: raw, flags: flags)) { Work.runWatched($0) }
    }
  }

  /// Submits a barrier closure: on a concurrent queue it waits for the
  /// closures before it and runs alone; on a serial queue it is like `async`.
  ///
  /// The corresponding C function is `dispatch_barrier_async`.
  @inlinable
  public func asyncBarrier(_ work: @escaping @Sendable () -> Void) {
    if _slowPath(stallWatching) { return asyncWatched(work, barrier: true) }
    Libdispatch.barrier_async_f(raw, Work.context(work, queue: raw, flags: frameExclusive)) {
      Work.run($0)
    }
  }

  /// Submits a C function and its context to run on the queue.
  ///
  /// The function runs inside the package's frame for the queue, as a
  /// closure does (`isCurrent` sees it, and a `sync` onto the queue from it
  /// stops with the deadlock message): one small record travels with it,
  /// malloc'd here and freed before the function runs.
  ///
  /// The corresponding C function is `dispatch_async_f`.
  @inlinable
  public func async(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.asyncInFrame(raw, flags, barrier: false, context, function)
  }

  /// Submits a C function and its context as a barrier (inside a frame, as
  /// `async(context:function:)`).
  ///
  /// The corresponding C function is `dispatch_barrier_async_f`.
  @inlinable
  public func asyncBarrier(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.asyncInFrame(raw, frameExclusive, barrier: true, context, function)
  }

  /// Runs a closure on the queue and waits for it; returns its result or
  /// rethrows its error.
  ///
  /// Calling `sync` onto a queue the current thread is already running on
  /// (directly, from inside a nested `sync`, or through a target queue)
  /// would deadlock; this stops the process with a message naming the
  /// queue instead. See `isCurrent`.
  ///
  /// `sync` blocks the calling thread for as long as the work waits and
  /// runs; from async code, `await run { }` suspends the task instead.
  ///
  /// The corresponding C function is `dispatch_sync` (this calls
  /// `dispatch_sync_f`, with no allocation).
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func sync<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
    try runAndWait(barrier: false, work)
  }

  /// Runs a closure that returns nothing on the queue and waits for it: the
  /// same as the generic `sync`, without the result slot.
  ///
  /// The corresponding C function is `dispatch_sync`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func sync(_ work: () -> Void) {
    runAndWait(barrier: false, operation: "sync", work)
  }

  /// Runs a closure that returns nothing as a barrier and waits for it.
  ///
  /// The corresponding C function is `dispatch_barrier_sync`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func syncBarrier(_ work: () -> Void) {
    runAndWait(barrier: true, operation: "syncBarrier", work)
  }

  /// Runs a closure as a barrier on the queue and waits for it.
  ///
  /// The corresponding C function is `dispatch_barrier_sync`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func syncBarrier<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
    try runAndWait(barrier: true, work)
  }

  /// Runs a C function with its context on the queue and waits for it,
  /// inside the package's frame for the queue (as `sync { }`).
  ///
  /// The corresponding C function is `dispatch_sync_f`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func sync(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    runAndWait(barrier: false, operation: "sync", context: context, function: function)
  }

  /// Runs a C function with its context as a barrier and waits for it,
  /// inside the package's frame for the queue.
  ///
  /// The corresponding C function is `dispatch_barrier_sync_f`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func syncBarrier(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    runAndWait(barrier: true, operation: "syncBarrier", context: context, function: function)
  }

  /// Submits a closure to the queue and waits for it: like `sync`, but the
  /// closure runs the way async work does (on one of the queue's threads,
  /// after the work before it, and with what the queue is set up for),
  /// while the caller waits. Returns its result or rethrows its error.
  ///
  /// Calling it onto a queue the current thread is already running on
  /// would deadlock; this stops the process with a message naming the
  /// queue instead (as `sync` does).
  ///
  /// - Parameter work: The closure.
  ///
  /// The corresponding C function is `dispatch_async_and_wait` (this calls
  /// `dispatch_async_and_wait_f`, with no allocation).
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func asyncAndWait<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
    try runAsyncAndWait(barrier: false, work)
  }

  /// `asyncAndWait` as a barrier: on a concurrent queue the closure waits
  /// for the work before it and runs alone.
  ///
  /// - Parameter work: The closure.
  ///
  /// The corresponding C function is `dispatch_barrier_async_and_wait`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func asyncAndWaitBarrier<T, E: Error>(_ work: () throws(E) -> T) throws(E) -> T {
    try runAsyncAndWait(barrier: true, work)
  }

  /// `asyncAndWait` of a C function and its context: the function runs on
  /// the queue (on the calling thread when the queue is idle, as
  /// `dispatch_async_and_wait_f` does), inside the package's frame for the
  /// queue, and the call returns once it has run. Nothing is allocated: the
  /// frame's record is on the waiting caller's stack.
  ///
  /// Calling it onto a queue the current thread is already running on stops
  /// the process with a message naming the queue (as `sync` does).
  ///
  /// The corresponding C function is `dispatch_async_and_wait_f`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func asyncAndWait(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    checkReentrancy(barrier: false, operation: "asyncAndWait")
    Libdispatch.asyncAndWaitInFrame(raw, flags, barrier: false, context, function)
  }

  /// `asyncAndWait(context:function:)` as a barrier: on a concurrent queue the
  /// function waits for the work before it and runs alone.
  ///
  /// The corresponding C function is `dispatch_barrier_async_and_wait_f`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func asyncAndWaitBarrier(
    context: UnsafeMutableRawPointer?, function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    checkReentrancy(barrier: true, operation: "asyncAndWaitBarrier")
    Libdispatch.asyncAndWaitInFrame(raw, frameExclusive, barrier: true, context, function)
  }

  @inlinable
  func runAsyncAndWait<T, E: Error>(barrier: Bool, _ work: () throws(E) -> T) throws(E) -> T {
    checkReentrancy(barrier: barrier, operation: barrier ? "asyncAndWaitBarrier" : "asyncAndWait")
    var result: Result<T, E>?
    withUnsafeMutablePointer(to: &result) { result in
      cgcdAsyncAndWait(UnsafeMutableRawPointer(raw), barrier ? frameExclusive : flags, barrier ? 1 : 0) {
        result.pointee = Result(catching: work)
      }
    }
    return try result.unsafelyUnwrapped.get()
  }

  @inlinable
  func runAndWait<T, E: Error>(barrier: Bool, _ work: () throws(E) -> T) throws(E) -> T {
    var result: Result<T, E>?
    withUnsafeMutablePointer(to: &result) { result in
      runAndWait(barrier: barrier, operation: barrier ? "syncBarrier" : "sync") {
        result.pointee = Result(catching: work)
      }
    }
    return try result.unsafelyUnwrapped.get()
  }

  /// `dispatch_sync_f` / `dispatch_barrier_sync_f` of `work`, after the
  /// re-entrancy check. From outside every queue (the common case) the
  /// frame is set around the wait (`cgcd_sync_here`); otherwise the
  /// trampoline sets it on the thread that runs the work (`cgcd_sync`).
  @inlinable
  func runAndWait(barrier: Bool, operation: StaticString, _ work: () -> Void) {
    let frameFlags = barrier ? frameExclusive : flags
    if isOutsideEveryChain {
      cgcdSyncHere(UnsafeMutableRawPointer(raw), frameFlags, barrier ? 1 : 0, work)
    } else {
      checkReentrancySlow(barrier: barrier, operation: operation)
      cgcdSync(UnsafeMutableRawPointer(raw), frameFlags, barrier ? 1 : 0, work)
    }
  }

  /// `runAndWait` of a C function and its context.
  @inlinable
  func runAndWait(
    barrier: Bool, operation: StaticString, context: UnsafeMutableRawPointer?, function: Libdispatch.Function
  ) {
    let frameFlags = barrier ? frameExclusive : flags
    if isOutsideEveryChain {
      Libdispatch.syncInFrameHere(raw, frameFlags, barrier: barrier, context, function)
    } else {
      checkReentrancySlow(barrier: barrier, operation: operation)
      Libdispatch.syncInFrame(raw, frameFlags, barrier: barrier, context, function)
    }
  }

  /// Submits a closure to run on the queue after a delay.
  ///
  /// - Parameters:
  ///   - delay: How long from now.
  ///   - work: The closure.
  /// - Returns: The closure as a `WorkItem`: `cancel()` it to keep it from
  ///   running, `notify` or `wait` on it. Ignore it if you need none of that.
  ///
  /// The corresponding C function is `dispatch_after`.
  @inlinable
  @discardableResult
  public func after(_ delay: Duration, _ work: @escaping @Sendable () -> Void) -> WorkItem {
    after(deadline: .now + delay, work)
  }

  /// Submits a closure to run on the queue at a deadline (monotonic or wall clock).
  /// With `Deadline.forever` the closure never runs: it is released with
  /// the returned item (at once if the result is ignored).
  ///
  /// - Parameters:
  ///   - deadline: When to run it.
  ///   - work: The closure.
  /// - Returns: The closure as a `WorkItem`: `cancel()` it to keep it from
  ///   running (it never runs, and its captures are released at once).
  ///
  /// The corresponding C function is `dispatch_after`.
  @discardableResult
  public func after(deadline: Deadline, _ work: @escaping @Sendable () -> Void) -> WorkItem {
    let item = WorkItem(work)
    after(deadline: deadline, item)
    return item
  }

  /// Submits a C function and its context to run on the queue at a
  /// deadline, inside the package's frame for the queue.
  ///
  /// The corresponding C function is `dispatch_after_f`.
  @inlinable
  public func after(
    deadline: Deadline, context: UnsafeMutableRawPointer?,
    function: @convention(c) (UnsafeMutableRawPointer?) -> Void
  ) {
    Libdispatch.afterInFrame(deadline.rawValue, raw, flags, context, function)
  }

  /// Runs `body` for every index in `0..<iterations`, concurrently on this
  /// queue (serially if it is a serial queue), and returns when all are done.
  ///
  /// Indexes run in no particular order, on several threads at once: the
  /// closure is `@Sendable`. Each iteration should do enough
  /// work (microseconds, not nanoseconds) to pay for the threads it wakes;
  /// a trivial loop is faster as a plain `for`. Calling `apply` onto a
  /// serial queue the current thread is running on would deadlock and
  /// stops with a message instead.
  ///
  /// The corresponding C function is `dispatch_apply` (through `dispatch_apply_f`).
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func apply(_ iterations: Int, _ body: @Sendable (Int) -> Void) {
    Swift.precondition(iterations >= 0, "Queue.apply: negative iteration count \(iterations)")
    checkReentrancy(barrier: false, operation: "apply")
    cgcdApply(iterations, UnsafeMutableRawPointer(raw), flags, body)
  }

  /// Calls a C function `iterations` times with the context and the index,
  /// each call inside the package's frame for the queue (as `apply { }`).
  ///
  /// The corresponding C function is `dispatch_apply_f`.
  @available(*, noasync, message: "blocks the thread; use `try await run { }` from async code")
  @inlinable
  public func apply(
    _ iterations: Int, context: UnsafeMutableRawPointer?,
    function: @convention(c) (UnsafeMutableRawPointer?, Int) -> Void
  ) {
    Swift.precondition(iterations >= 0, "Queue.apply: negative iteration count \(iterations)")
    checkReentrancy(barrier: false, operation: "apply")
    Libdispatch.applyInFrame(iterations, raw, flags, context, function)
  }
}
