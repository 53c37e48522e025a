import Synchronization

/// A unit of work that runs at most once and can be waited on, observed,
/// cancelled, given a QoS and made to wait for other items: libdispatch's
/// dispatch block, with the operation features built on it.
///
/// ```swift
/// let item = WorkItem(qos: .utility) { compile() }
/// item.notify(on: .main) { print("done") }
/// queue.async(item)
/// ```
///
/// An item runs its closure at most once, however often it is submitted
/// (`Queue.async(_:)`, `start(on:after:)`, `Queue.after(deadline:_:)`) or
/// performed: the first execution runs it, later ones return at once.
/// Cancelling an item that has not started completes it at once: its
/// closure never runs, its `notify` work runs, `wait()` returns, and items
/// started after it are released. Cancelling a running item only sets
/// `isCancelled`, which the closure may poll.
///
/// Dropping the last reference to an item is safe in any state. An item
/// that is submitted or waited on is kept alive by that; one that nobody
/// holds and that has not run is cancelled (its `notify` work runs, as
/// libdispatch does for a released block).
///
/// Flags and QoS reach libdispatch: each submission of an item with flags
/// or a QoS is a fresh block made by `dispatch_block_create_with_qos_class`
/// (so a `.barrier` item runs alone on a concurrent queue); an item with
/// neither goes through `dispatch_async_f` with no block at all.
///
/// `Sendable`: its state is under a mutex, the rest is immutable.
///
/// The corresponding C type is `dispatch_block_t` (made by `dispatch_block_create`).
public final class WorkItem: Sendable {
  /// How libdispatch runs the item's blocks.
  ///
  /// The corresponding C type is `dispatch_block_flags_t`.
  public struct Flags: OptionSet, Sendable, Hashable, CustomStringConvertible {
    /// The `DISPATCH_BLOCK_*` bits.
    public let rawValue: UInt

    /// Flags from their `DISPATCH_BLOCK_*` bits.
    ///
    /// - Parameter rawValue: The bits.
    public init(rawValue: UInt) { self.rawValue = rawValue }

    /// Submitted to a concurrent queue, the item waits for the work before
    /// it and runs alone (`DISPATCH_BLOCK_BARRIER`).
    public static let barrier = Flags(rawValue: 0x1)
    /// Runs with none of the submitter's context: no QoS, no activity
    /// (`DISPATCH_BLOCK_DETACHED`).
    public static let detached = Flags(rawValue: 0x2)
    /// Takes the context of the thread that creates the item, not the one
    /// that submits it (`DISPATCH_BLOCK_ASSIGN_CURRENT`).
    public static let assignCurrentContext = Flags(rawValue: 0x4)
    /// Runs with no QoS class of its own (`DISPATCH_BLOCK_NO_QOS_CLASS`).
    public static let noQoS = Flags(rawValue: 0x8)
    /// Prefers the queue's QoS to the item's when submitted
    /// (`DISPATCH_BLOCK_INHERIT_QOS_CLASS`).
    public static let inheritQoS = Flags(rawValue: 0x10)
    /// Prefers the item's QoS to the queue's as long as that does not lower
    /// it (`DISPATCH_BLOCK_ENFORCE_QOS_CLASS`).
    public static let enforceQoS = Flags(rawValue: 0x20)

    static let all: Flags = [.barrier, .detached, .assignCurrentContext, .noQoS, .inheritQoS, .enforceQoS]

    /// The set flags by name, e.g. `[barrier, enforceQoS]`.
    public var description: String {
      describeFlags(
        self,
        names: [
          (.barrier, "barrier"), (.detached, "detached"), (.assignCurrentContext, "assignCurrentContext"),
          (.noQoS, "noQoS"), (.inheritQoS, "inheritQoS"), (.enforceQoS, "enforceQoS"),
        ])
    }
  }

  /// Where an item is in its life: `pending`, then `running` and
  /// `finished`, or `cancelled` (the closure never ran and never will).
  public enum State: Sendable, Hashable {
    /// Created, submitted or waiting for its dependencies; not started.
    case pending
    /// Its closure is running.
    case running
    /// Its closure ran and returned (even if `cancel()` came while it ran).
    case finished
    /// Cancelled (or dropped) before it started: its closure never ran.
    case cancelled

    /// Whether the item is done: `finished` or `cancelled`.
    public var isComplete: Bool { self == .finished || self == .cancelled }
  }

  /// The flags given at creation.
  public let flags: Flags
  /// The QoS given at creation.
  public let qos: Queue.QoS
  let machine: Mutex<WorkItemMachine>
  /// The queue of the first plain submission, with the frame's exclusive
  /// bit: that submission passes the item itself as the `_f` context.
  let firstQueue = Atomic<UInt>(0)

  /// Creates an item that runs `body` when submitted or performed.
  ///
  /// - Parameters:
  ///   - flags: How libdispatch runs it (`.barrier`, `.enforceQoS`, …).
  ///   - qos: Its quality-of-service class and relative priority; the
  ///     operation priorities map to these classes.
  ///   - body: The work; it runs at most once.
  ///
  /// Flags outside `Flags`' six, a class that is not one of `Queue.QoS`'s,
  /// or a relative priority outside -15...0 stop the process with a message
  /// (libdispatch would return no block).
  ///
  /// The corresponding C function is `dispatch_block_create_with_qos_class`.
  public init(flags: Flags = [], qos: Queue.QoS = .unspecified, _ body: @escaping @Sendable () -> Void) {
    if !flags.isEmpty || qos != .unspecified {
      WorkItem.validate(flags: flags, qos: qos)
    }
    self.flags = flags
    self.qos = qos
    self.machine = Mutex(WorkItemMachine(body: body))
  }

  private static func validate(flags: Flags, qos: Queue.QoS) {
    requireKnownBits(flags, of: Flags.all, "WorkItem(flags: \(flags))", "libdispatch knows no such block flag")
    qos.checkKnown("WorkItem(")
  }

  deinit {
    // The last reference: nothing is submitted or waiting (each holds the
    // item). An item that never ran is cancelled, so notify work runs and
    // dependents go on, and the group is left before it is released.
    let (completion, group) = machine.withLock { ($0.cancel(), $0.group) }
    completion?.perform()
    if let group { Libdispatch.release(group) }
  }

  /// Whether submissions need a dispatch block (for flags beside `.barrier`, or a QoS).
  var needsBlock: Bool { !flags.subtracting(.barrier).isEmpty || qos != .unspecified }

  /// A new dispatch block that carries the item's flags and QoS and runs `body`.
  func makeBlock(_ body: @escaping @Sendable () -> Void) -> Libdispatch.Block {
    guard
      let block = Libdispatch.block_create_with_qos_class(
        flags.rawValue, qos.rawClass, qos.relativePriority, body)
    else {
      fatalError("GCD: WorkItem: libdispatch made no block for flags \(flags), QoS \(qos)")
    }
    return block
  }

  /// An execution: runs the body if this is the first one of an item not
  /// cancelled, inside a frame for `queue` (none for `perform()`).
  func run(queue: OpaquePointer?, flags frameFlags: UInt) {
    guard let (body, observers) = machine.withLock({ $0.begin() }) else { return }
    if let observers {
      for observer in observers { observer(.running) }
    }
    if let queue {
      withFrame(queue: queue, flags: frameFlags) { body() }
    } else {
      body()
    }
    let completion = machine.withLock { $0.end() }
    completion.perform()
  }

  /// The trampoline of the first plain submission: the context is the item.
  static func runFirst(_ context: UnsafeMutableRawPointer?) {
    let item = Unmanaged<WorkItem>.fromOpaque(context.unsafelyUnwrapped).takeRetainedValue()
    let tagged = item.firstQueue.load(ordering: .relaxed)
    item.run(queue: OpaquePointer(bitPattern: tagged & ~frameExclusive), flags: tagged & frameExclusive)
  }

  /// Submits an execution to `queue`, now or (with `deadline`) later.
  func submit(to queue: Queue, deadline: UInt64?) {
    let barrier = flags.contains(.barrier)
    let frameFlags = queue.flags | (barrier ? frameExclusive : 0)
    let raw = queue.raw
    if let deadline, barrier {
      // dispatch_after has no barrier form: at the deadline, submit it as one.
      let resubmit = Work.context({ self.submit(to: queue, deadline: nil) }, queue: raw, flags: queue.flags)
      Libdispatch.after_f(deadline, raw, resubmit) { Work.run($0) }
      return
    }
    if needsBlock {
      let block = makeBlock { self.run(queue: queue.raw, flags: frameFlags) }
      if let deadline {
        Libdispatch.after_block(deadline, raw, block)
      } else if barrier {
        // The block's own barrier flag, given to dispatch_async, did not
        // always hold under load (tests); dispatch_barrier_async always does.
        Libdispatch.barrier_async_block(raw, block)
      } else {
        Libdispatch.async_block(raw, block)
      }
      return
    }
    let context: UnsafeMutableRawPointer
    let function: Libdispatch.Function
    let tagged = UInt(bitPattern: UnsafeMutableRawPointer(raw)) | (frameFlags & frameExclusive)
    if firstQueue.compareExchange(expected: 0, desired: tagged, ordering: .relaxed).exchanged {
      context = Unmanaged.passRetained(self).toOpaque()
      function = { WorkItem.runFirst($0) }
    } else {
      context = WorkItemSubmission.context(self, queue: raw, flags: frameFlags)
      function = { WorkItemSubmission.run($0) }
    }
    if let deadline {
      Libdispatch.after_f(deadline, raw, context, function)
    } else if barrier {
      Libdispatch.barrier_async_f(raw, context, function)
    } else {
      Libdispatch.async_f(raw, context, function)
    }
  }

  // MARK: Running

  /// Runs the item on the calling thread now, if it has not run and is not
  /// cancelled; otherwise returns at once.
  ///
  /// An item with flags or a QoS runs inside a block made with them, so
  /// libdispatch applies its QoS to the calling thread while it runs.
  ///
  /// The corresponding C function is `dispatch_block_perform` (here the
  /// created block is invoked).
  public func perform() {
    if needsBlock {
      makeBlock { self.run(queue: nil, flags: 0) }()
    } else {
      run(queue: nil, flags: 0)
    }
  }

  /// Submits the item to `queue` once every item of `dependencies` has
  /// completed, finished or cancelled (at once if there are none).
  ///
  /// A cancelled dependency counts as done: the item still runs, and its
  /// closure can tell by the dependency's `state` (`.cancelled` instead of
  /// `.finished`). A dependency dropped before it ran counts as cancelled.
  /// An item's dependencies are fixed by this call; a call that would make
  /// an item wait for itself, directly or through other items, stops the
  /// process with a message naming both (it could never run). Calling it
  /// again adds another set: the item runs when the first set is done.
  ///
  /// - Parameters:
  ///   - queue: The queue to run the item on.
  ///   - dependencies: The items to wait for.
  ///
  /// Built on the completion of each dependency, the way
  /// `dispatch_block_notify` would submit it; no thread waits.
  public func start(on queue: Queue, after dependencies: [WorkItem] = []) {
    if dependencies.isEmpty {
      submit(to: queue, deadline: nil)
      return
    }
    let gate = DependencyGate(item: self, queue: queue, count: dependencies.count + 1)
    WorkItem.linking.withLock { _ in
      // A cycle goes from this item through the items that wait for it to one of `dependencies`:
      // an item nothing waits for yet (a chain's new end, the common case) skips the walk.
      let mayCloseCycle = dependencies.contains { $0 === self } || machine.withLock { $0.isWaitedOn }
      if mayCloseCycle, let path = pathToAny(of: dependencies) {
        fatalError(
          "GCD: WorkItem.start(after:) would make a cycle: \(ObjectIdentifier(self)) waits for itself through "
            + "\(path.reversed().map { "\(ObjectIdentifier($0))" }.joined(separator: " -> "))")
      }
      // Under the lock, so that the next start's walk sees these links. The count's one extra
      // arrival (this call's, below) keeps a completed dependency's arrival from submitting yet.
      for dependency in dependencies where !dependency.machine.withLock({ $0.addGate(gate) }) { gate.arrive() }
    }
    gate.arrive()
  }

  /// Serializes `start(on:after:)`'s cycle check and the new links (rare),
  /// so two items can never be linked into a cycle at the same time.
  private static let linking = Mutex(())

  /// The chain of items from this one through the items that wait for it (pending dependents, each
  /// held by its gate) to one of `targets`, if there is one. Each item is visited once, and the
  /// chain is rebuilt from the visit's links only when a target is found, so the walk is linear in
  /// the items it reaches.
  private func pathToAny(of targets: [WorkItem]) -> [WorkItem]? {
    let wanted = Set(targets.map(ObjectIdentifier.init))
    var reachedFrom: [ObjectIdentifier: WorkItem] = [:]
    var seen: Set<ObjectIdentifier> = [ObjectIdentifier(self)]
    var stack: [WorkItem] = [self]
    while let item = stack.popLast() {
      if wanted.contains(ObjectIdentifier(item)) {
        var path = [item]
        while let previous = reachedFrom[ObjectIdentifier(path[path.count - 1])] { path.append(previous) }
        return path.reversed()
      }
      for next in item.machine.withLock({ $0.dependents }) where seen.insert(ObjectIdentifier(next)).inserted {
        reachedFrom[ObjectIdentifier(next)] = item
        stack.append(next)
      }
    }
    return nil
  }

  // MARK: Cancellation

  /// Cancels the item: if it has not started, it never will and completes
  /// now as `.cancelled` (its `notify` work runs, `wait()` returns, items
  /// started after it go on); if it is running, it finishes normally and
  /// `isCancelled` is true. Calling it again, or after the end, does nothing.
  ///
  /// The corresponding C function is `dispatch_block_cancel`.
  public func cancel() {
    let completion = machine.withLock { $0.cancel() }
    completion?.perform()
  }

  /// Whether `cancel()` has been called (or the item was dropped unrun).
  ///
  /// The corresponding C function is `dispatch_block_testcancel`.
  public var isCancelled: Bool { machine.withLock { $0.cancelRequested } }

  /// Where the item is: `pending`, `running`, `finished` or `cancelled`.
  public var state: State { machine.withLock { $0.phase } }

  // MARK: Completion

  /// Submits `work` to `queue` when the item completes, finished or
  /// cancelled (at once if it has): the completion block.
  ///
  /// - Parameters:
  ///   - queue: The queue to run `work` on.
  ///   - work: The completion block.
  ///
  /// The corresponding C function is `dispatch_block_notify` (here the
  /// first completion block is kept in the item and submitted with
  /// `dispatch_async_f` when it completes; later ones wait on a group the
  /// item leaves then, with `dispatch_group_notify_f`).
  public func notify(on queue: Queue, _ work: @escaping @Sendable () -> Void) {
    switch machine.withLock({ $0.addNotification(.init(queue: queue, work: work)) }) {
    case .complete:
      queue.async(work)
    case .stored:
      break
    case .wait(let group):
      Libdispatch.group_notify_f(group, queue.raw, Work.context(work, queue: queue.raw, flags: queue.flags)) {
        Work.run($0)
      }
    }
  }

  /// Waits until the item has completed, finished or cancelled.
  ///
  /// Any number of threads may wait, any number of times.
  ///
  /// The corresponding C function is `dispatch_block_wait` with `DISPATCH_TIME_FOREVER`.
  @available(*, noasync, message: "blocks the thread; use `await item.finished`")
  public func wait() {
    _ = wait(rawDeadline: Libdispatch.timeForever)
  }

  /// Waits until the item has completed or `timeout` has passed.
  ///
  /// - Parameter timeout: How long to wait at most.
  /// - Returns: true if the item completed, false on timeout.
  ///
  /// The corresponding C function is `dispatch_block_wait`.
  @available(*, noasync, message: "blocks the thread; use `await item.finished`")
  public func wait(timeout: Duration) -> Bool {
    wait(rawDeadline: deadline(after: timeout))
  }

  /// Waits until the item has completed or `deadline` has come.
  ///
  /// - Parameter deadline: When to stop waiting.
  /// - Returns: true if the item completed, false on timeout.
  ///
  /// The corresponding C function is `dispatch_block_wait`.
  @available(*, noasync, message: "blocks the thread; use `await item.finished`")
  public func wait(deadline: Deadline) -> Bool {
    wait(rawDeadline: deadline.rawValue)
  }

  private func wait(rawDeadline: UInt64) -> Bool {
    switch machine.withLock({ $0.groupToWaitOn() }) {
    case .complete: true
    case .wait(let group): Libdispatch.group_wait(group, rawDeadline) == 0
    }
  }

  /// The item's final state, `.finished` or `.cancelled`, once it has
  /// completed: the waiting task is suspended, no thread is blocked.
  ///
  /// - Throws: `CancellationError` when the waiting task is cancelled
  ///   first (the item itself is not affected); nothing else.
  public var finished: State {
    get async throws(CancellationError) {
      let id = machine.withLock { $0.makeWaiterID() }
      let state = await withTaskCancellationHandler {
        await withCheckedContinuation { (continuation: WorkItemMachine.FinishedContinuation) in
          let action = machine.withLock {
            $0.addWaiter(id, continuation, taskCancelled: Task.isCancelled)
          }
          switch action {
          case .registered: break
          case .resume(let state): continuation.resume(returning: state)
          case .cancelled: continuation.resume(returning: nil)
          }
        }
      } onCancel: {
        machine.withLock { $0.removeWaiter(id) }?.resume(returning: nil)
      }
      guard let state else { throw CancellationError() }
      return state
    }
  }

  // MARK: Observing

  /// Calls `handler` with every state the item enters from now on:
  /// `.running` then `.finished`, or `.cancelled`. It is called on the
  /// thread that makes the change (a queue's thread, or the one that
  /// cancels), after the change, in order; an item already complete never
  /// calls it.
  ///
  /// - Parameter handler: Called with each new state; keep it short.
  public func onStateChange(_ handler: @escaping @Sendable (State) -> Void) {
    machine.withLock { $0.addObserver(handler) }
  }

  /// The item's state now, then each state it enters, ending after
  /// `.finished` or `.cancelled`.
  ///
  /// ```swift
  /// for await state in item.stateChanges { print(state) }
  /// ```
  public var stateChanges: AsyncStream<State> {
    let (stream, continuation) = AsyncStream.makeStream(of: State.self)
    let complete = machine.withLock {
      // Yielded under the lock so that no change can come before it: the
      // stream is new, nobody awaits it, so this only buffers.
      continuation.yield($0.phase)
      if $0.isComplete { return true }
      $0.addObserver { state in
        continuation.yield(state)
        if state.isComplete { continuation.finish() }
      }
      return false
    }
    if complete { continuation.finish() }
    return stream
  }
}

extension WorkItem: CustomStringConvertible, CustomReflectable {
  /// The state, flags and QoS, e.g. `WorkItem(pending, flags: [barrier], qos: 0x19/0)`.
  public var description: String {
    "WorkItem(\(state), flags: \(flags), qos: 0x\(String(qos.rawClass, radix: 16))/\(qos.relativePriority))"
  }

  /// State, cancellation, flags and QoS: what `dump` and debuggers show
  /// (the closure and the lock are not reflected).
  public var customMirror: Mirror {
    Mirror(
      self, children: ["state": state, "isCancelled": isCancelled, "flags": flags, "qos": qos],
      displayStyle: .class)
  }
}
