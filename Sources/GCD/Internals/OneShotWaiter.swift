import Synchronization

/// The tasks in `try await wait()` on one `Group`, and the one
/// `dispatch_group_notify_f` that serves them: however many tasks wait or
/// were cancelled, the group holds at most one notify record of ours, and
/// a cancelled task leaves nothing behind (libdispatch cannot withdraw a
/// notify, so one per task would stay until the group empties).
///
/// The notify wakes the task that registered it (its check that the group
/// was busy came first). A task that joined later may have checked after
/// the notify had already fired (the group emptied, refilled, and the
/// notify has not run yet): it wakes only if the group is empty when the
/// notify runs, and otherwise waits for the next notify, registered then,
/// after its check. So no task returns while work entered before its check
/// is pending.
///
/// State under `state`: the waiting tasks and whether a notify is pending;
/// the notify is registered under the lock (libdispatch never runs it
/// inline), continuations are resumed outside it, a cancellation is an
/// event, and each task finishes exactly once (its phase becomes `.done`).
final class GroupWaiters: @unchecked Sendable {  // the C group pointer is immutable; the rest is under `state`
  struct State: ~Copyable {
    var waiting: [ObjectIdentifier: AsyncWaiter] = [:]
    var notifyPending = false
  }

  /// The C group, retained: the notify may run after the `Group` is gone.
  let group: OpaquePointer
  let state = Mutex(State())

  init(group: OpaquePointer) {
    Libdispatch.retain(group)
    self.group = group
  }

  deinit {
    Libdispatch.release(group)
  }

  /// Suspends until the group is empty (true) or `cancel(waiter)` (false).
  func wait(_ waiter: AsyncWaiter) async -> Bool {
    await withUnsafeContinuation { (continuation: UnsafeContinuation<Bool, Never>) in
      let outcome: Bool? = state.withLock { state in
        if case .done = waiter.phase { return false }  // cancelled before it got here
        if Libdispatch.group_wait(group, 0) == 0 {
          waiter.phase = .done
          return true
        }
        waiter.phase = .waiting(continuation, confirmed: !state.notifyPending)
        state.waiting[ObjectIdentifier(waiter)] = waiter
        if !state.notifyPending { registerNotify(&state) }
        return nil
      }
      if let outcome { continuation.resume(returning: outcome) }
    }
  }

  /// The task of `waiter` was cancelled.
  func cancel(_ waiter: AsyncWaiter) {
    let continuation = state.withLock { state in
      waiter.cancel { state.waiting[ObjectIdentifier(waiter)] = nil }
    }
    continuation?.resume(returning: false)
  }

  /// Under the lock: one notify, which holds this object until it runs.
  private func registerNotify(_ state: inout State) {
    state.notifyPending = true
    Libdispatch.group_notify_f(group, Queue.global().raw, Unmanaged.passRetained(self).toOpaque()) {
      Unmanaged<GroupWaiters>.fromOpaque($0.unsafelyUnwrapped).takeRetainedValue().notified()
    }
  }

  /// The notify ran: the group emptied after the confirmed waiters' checks.
  private func notified() {
    let woken: [UnsafeContinuation<Bool, Never>] = state.withLock { state in
      state.notifyPending = false
      let empty = Libdispatch.group_wait(group, 0) == 0
      var woken: [UnsafeContinuation<Bool, Never>] = []
      for (key, waiter) in state.waiting {
        guard case .waiting(let continuation, let confirmed) = waiter.phase else { continue }
        if empty || confirmed {
          woken.append(continuation)
          waiter.phase = .done
          state.waiting[key] = nil
        } else {
          waiter.phase = .waiting(continuation, confirmed: true)  // the next notify comes after its check
        }
      }
      if !state.waiting.isEmpty { registerNotify(&state) }
      return woken
    }
    for continuation in woken { continuation.resume(returning: true) }
  }

  /// The waiting tasks and the pending notifies (0 or 1): a test's bound.
  var records: (waiting: Int, notifies: Int) {
    state.withLock { ($0.waiting.count, $0.notifyPending ? 1 : 0) }
  }
}

/// One task in an async wait (of a `Group` or a `Semaphore`), its phase
/// mutated only under its owner's lock.
final class AsyncWaiter: @unchecked Sendable {
  enum Phase {
    case new
    /// `confirmed`: used by `GroupWaiters` (the pending notify was
    /// registered after this task's check).
    case waiting(UnsafeContinuation<Bool, Never>, confirmed: Bool)
    case done
  }
  var phase = Phase.new

  /// The task was cancelled (under its owner's lock): the waiter is done from now on. A waiting
  /// one is taken off its owner's list by `unlist` (called once the phase reads `.done`) and its
  /// continuation returned, to be resumed with false outside the lock; nil when it was not waiting
  /// (not yet, or served already).
  @inline(__always)
  func cancel(unlist: () -> Void) -> UnsafeContinuation<Bool, Never>? {
    guard case .waiting(let continuation, _) = phase else {
      phase = .done
      return nil
    }
    phase = .done
    unlist()
    return continuation
  }
}

/// The async waiters of a `Semaphore` (tasks in `try await wait()`), in
/// arrival order, and the state of each, all under one lock that
/// `signal()` also takes when waiters exist (so a unit signalled between a
/// waiter's failed try and its joining the list is not lost).
struct SemaphoreWaiters: ~Copyable {
  /// One waiting task.
  typealias Waiter = AsyncWaiter

  /// The waiters in arrival order from `head` on; entries before `head`
  /// are served, and `cancelled` of those after it are cancelled ones
  /// (phase `.done`) left in place: a cancellation marks its waiter instead
  /// of searching the list, and the list is compacted once the dead entries
  /// outnumber the live ones, so every operation is O(1) amortized.
  private var list: [Waiter] = []
  private var head = 0
  private var cancelled = 0

  /// No task waits.
  var isEmpty: Bool { list.count - head == cancelled }

  /// The entries held, live and dead (a test's bound).
  var records: Int { list.count - head }

  mutating func append(_ waiter: Waiter) { list.append(waiter) }

  /// The first waiting task; call only when `!isEmpty`.
  mutating func removeFirst() -> Waiter {
    while true {
      let waiter = list[head]
      head += 1
      if case .done = waiter.phase {
        cancelled -= 1
        continue
      }
      if head > 64 && head * 2 > list.count {
        list.removeFirst(head)
        head = 0
      }
      return waiter
    }
  }

  /// Notes that one waiter in the list was cancelled (its phase is `.done`).
  mutating func removeCancelled() {
    cancelled += 1
    let entries = list.count - head
    if cancelled > 32 && cancelled * 2 > entries {
      list = list[head...].filter { if case .done = $0.phase { false } else { true } }
      head = 0
      cancelled = 0
    }
  }
}
