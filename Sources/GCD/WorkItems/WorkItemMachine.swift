// The state of a WorkItem: one small machine under the item's mutex. Every
// event (run, finish, cancel, drop, a new waiter) is a mutating method that
// decides under the lock and returns what to do; the caller does it after
// the lock is released: run the body, call observers, resume continuations,
// leave the group, release the body (whose captures may have a `deinit`
// that calls back into the item).

import Synchronization

/// The machine itself. Not copyable: it lives in the item's mutex, and is
/// never copied in or out (a copy costs the hot path).
struct WorkItemMachine: ~Copyable {
  var phase: WorkItem.State = .pending
  /// `cancel()` was called (in any phase): what `isCancelled` reports.
  var cancelRequested = false
  /// The closure, until it runs or the item is cancelled: `begin` moves it
  /// out, so it can run only once.
  var body: (@Sendable () -> Void)?
  /// The first `notify` work, kept here and submitted at completion: an
  /// item with one completion block needs no group.
  var notification: Notification?
  /// Made on the first `wait` (or second `notify`) of an item that has not
  /// completed, and entered once; left once, when the item completes.
  var group: OpaquePointer?

  /// A completion block and its queue.
  struct Notification {
    let queue: Queue
    let work: @Sendable () -> Void
  }
  /// Everything that listens to the item, made on first use: an item that
  /// is only submitted (the common case) carries none of it.
  var listeners: Listeners?
  /// The gate of the first item started after this one (`start(on:after:)`), told once at
  /// completion; the others are in `listeners.moreGates`. Here rather than in the listeners: a
  /// chain's link or a fan-out's leaf has one dependent and nothing else that listens, so it needs
  /// no listeners box. With `moreGates`, the edges the cycle check walks (`dependents`): an item's
  /// pending dependents, held strongly through their gates, present exactly until it completes.
  /// Added under `WorkItem.linking`.
  var firstGate: DependencyGate?

  /// Who listens to an item: a class, so that an item with none carries
  /// one nil pointer and hands it on by moving it. Touched only under the
  /// item's lock, or by the thread that took it out at completion.
  final class Listeners {
    /// `onStateChange` handlers: called with `.running` and with the final state.
    var observers: [@Sendable (WorkItem.State) -> Void] = []
    /// The gates of the items started after this one but the first (`WorkItemMachine.firstGate`).
    var moreGates: [DependencyGate] = []
    /// Tasks suspended in `finished`, by id.
    var waiters: [(id: Int, continuation: FinishedContinuation)] = []
    var nextWaiter = 0
  }

  init(body: @escaping @Sendable () -> Void) {
    self.body = body
  }

  var isComplete: Bool { phase == .finished || phase == .cancelled }

  /// The listeners, made now if there were none.
  private mutating func withListeners<R>(_ body: (Listeners) -> R) -> R {
    if let listeners { return body(listeners) }
    let created = Listeners()
    listeners = created
    return body(created)
  }

  /// What the thread that completed the item does once the lock is released.
  struct Completion {
    let state: WorkItem.State
    let listeners: Listeners?
    let firstGate: DependencyGate?
    let notification: Notification?
    let group: OpaquePointer?
    /// The closure of a cancelled item, released only here, outside the lock.
    let body: (@Sendable () -> Void)?

    /// Observers first, then dependents and waiting tasks, then the group
    /// (its `notify` work and `wait`ers), so whoever is told of the
    /// completion sees the final state. The body goes with the value,
    /// after this returns.
    func perform() {
      if let listeners { for observer in listeners.observers { observer(state) } }
      firstGate?.arrive()
      if let listeners {
        for gate in listeners.moreGates { gate.arrive() }
        for waiter in listeners.waiters { waiter.continuation.resume(returning: state) }
      }
      if let notification { notification.queue.async(notification.work) }
      if let group { Libdispatch.group_leave(group) }
    }
  }

  /// Moves to `state`, handing out everything that waits for the end.
  private mutating func complete(_ state: WorkItem.State, body: (@Sendable () -> Void)?) -> Completion {
    phase = state
    return Completion(
      state: state, listeners: listeners.take(), firstGate: firstGate.take(), notification: notification.take(),
      group: group, body: body)
  }

  // MARK: Events

  /// An execution starts: the body if this is the first one of an item not
  /// cancelled (the phase becomes `.running`), nil otherwise; and the
  /// observers to tell.
  mutating func begin() -> (body: @Sendable () -> Void, observers: [@Sendable (WorkItem.State) -> Void]?)? {
    guard phase == .pending, let body = body.take() else { return nil }
    phase = .running
    return (body, listeners?.observers)
  }

  /// The execution `begin` allowed has returned.
  mutating func end() -> Completion {
    complete(.finished, body: nil)
  }

  /// `cancel()`, or the last reference dropped: a pending item completes
  /// as `.cancelled` at once; a running one only records it.
  mutating func cancel() -> Completion? {
    cancelRequested = true
    guard phase == .pending else { return nil }
    return complete(.cancelled, body: body.take())
  }

  enum WaitAction {
    case complete
    case wait(OpaquePointer)
  }

  /// A `notify` or `wait`: done already, or the group to wait on (made
  /// and entered now if this is the first).
  mutating func groupToWaitOn() -> WaitAction {
    if isComplete { return .complete }
    if let group { return .wait(group) }
    let created = Libdispatch.group_create()
    Libdispatch.group_enter(created)
    group = created
    return .wait(created)
  }

  enum NotifyAction {
    case complete
    case stored
    case wait(OpaquePointer)
  }

  /// A `notify`: done already (submit it now), kept in the item's one
  /// slot, or to be registered on the group.
  mutating func addNotification(_ notification: Notification) -> NotifyAction {
    if isComplete { return .complete }
    if self.notification == nil && group == nil {
      self.notification = notification
      return .stored
    }
    guard case .wait(let group) = groupToWaitOn() else { return .complete }
    return .wait(group)
  }

  /// The gate of an item started after this one: registered, or false when this item is complete
  /// already (the caller arrives at once).
  mutating func addGate(_ gate: DependencyGate) -> Bool {
    if isComplete { return false }
    if firstGate == nil { firstGate = gate } else { withListeners { $0.moreGates.append(gate) } }
    return true
  }

  /// The items started after this one that wait for it (its gates' items): none once it is complete.
  var dependents: [WorkItem] {
    guard let first = firstGate else { return [] }
    return [first.item] + (listeners?.moreGates.map(\.item) ?? [])
  }

  /// Whether an item started after this one waits for it (only such an item can close a cycle).
  var isWaitedOn: Bool { firstGate != nil }

  /// An `onStateChange` handler (none once the item is complete).
  mutating func addObserver(_ observer: @escaping @Sendable (WorkItem.State) -> Void) {
    if isComplete { return }
    withListeners { $0.observers.append(observer) }
  }

  mutating func makeWaiterID() -> Int {
    withListeners {
      $0.nextWaiter += 1
      return $0.nextWaiter
    }
  }

  /// A task in `finished`: resumed with the final state, or with nil when it was cancelled.
  typealias FinishedContinuation = CheckedContinuation<WorkItem.State?, Never>

  enum WaiterAction {
    case registered
    case resume(WorkItem.State)
    case cancelled
  }

  /// A task starts waiting in `finished`. `taskCancelled` is read under
  /// the lock, so a cancellation either came first (seen here) or comes
  /// later and finds the waiter (`removeWaiter`).
  mutating func addWaiter(
    _ id: Int, _ continuation: FinishedContinuation, taskCancelled: Bool
  ) -> WaiterAction {
    if isComplete { return .resume(phase) }
    if taskCancelled { return .cancelled }
    withListeners { $0.waiters.append((id, continuation)) }
    return .registered
  }

  /// The waiting task was cancelled: its continuation, if still waiting.
  mutating func removeWaiter(_ id: Int) -> FinishedContinuation? {
    guard let listeners, let index = listeners.waiters.firstIndex(where: { $0.id == id }) else { return nil }
    return listeners.waiters.remove(at: index).continuation
  }
}

/// A weak reference to an item, for the dependency lists.
/// The gate of an item started after others: the last dependency to
/// complete (plus the starter itself, counted as one) submits the item.
final class DependencyGate: Sendable {
  let item: WorkItem
  let queue: Queue
  let remaining: Atomic<Int>

  init(item: WorkItem, queue: Queue, count: Int) {
    self.item = item
    self.queue = queue
    self.remaining = Atomic(count)
  }

  func arrive() {
    if remaining.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 {
      queue.async(item)
    }
  }
}

/// The record of a second (or later) submission of an item: the queue to
/// run it on, for its frame. The first submission needs none (the item
/// keeps its queue, `WorkItem.firstQueue`).
struct WorkItemSubmission {
  let item: WorkItem
  let queue: OpaquePointer
  let flags: UInt

  /// A new record in malloc'd memory, as the context of a `_f` call.
  static func context(_ item: WorkItem, queue: OpaquePointer, flags: UInt) -> UnsafeMutableRawPointer {
    let memory = system_malloc(MemoryLayout<WorkItemSubmission>.stride)
    memory.assumingMemoryBound(to: WorkItemSubmission.self).initialize(
      to: WorkItemSubmission(item: item, queue: queue, flags: flags))
    return memory
  }

  /// The trampoline's body: takes back the record and runs the item.
  static func run(_ context: UnsafeMutableRawPointer?) {
    let memory = context.unsafelyUnwrapped
    let submission = memory.assumingMemoryBound(to: WorkItemSubmission.self).move()
    system_free(memory)
    submission.item.run(queue: submission.queue, flags: submission.flags)
  }
}
