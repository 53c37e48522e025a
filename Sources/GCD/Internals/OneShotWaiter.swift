import Synchronization

/// One awaiting task and the one outcome it waits for (true: done; false:
/// cancelled), whichever of the two sides comes first: the state machine
/// under a lock decides, and the continuation is resumed outside it,
/// exactly once. Used by `Group.wait()` (the group's notify finishes it,
/// the task's cancellation finishes it false).
final class OneShotWaiter: Sendable {
  enum State {
    case idle
    case waiting(UnsafeContinuation<Bool, Never>)
    case finished(Bool)
  }

  let state = Mutex(State.idle)

  /// Suspends until `finish` (at once if it came first).
  func wait() async -> Bool {
    await withUnsafeContinuation { continuation in
      let outcome: Bool? = state.withLock { state in
        switch state {
        case .idle:
          state = .waiting(continuation)
          return nil
        case .finished(let outcome): return outcome
        case .waiting: fatalError("GCD: OneShotWaiter awaited twice")
        }
      }
      if let outcome { continuation.resume(returning: outcome) }
    }
  }

  /// Delivers `outcome` unless one was delivered already.
  func finish(_ outcome: Bool) {
    let continuation: UnsafeContinuation<Bool, Never>? = state.withLock { state in
      switch state {
      case .idle:
        state = .finished(outcome)
        return nil
      case .waiting(let continuation):
        state = .finished(outcome)
        return continuation
      case .finished: return nil
      }
    }
    continuation?.resume(returning: outcome)
  }
}

/// The async waiters of a `Semaphore` (tasks in `try await wait()`), in
/// arrival order, and the state of each, all under one lock that
/// `signal()` also takes when waiters exist (so a unit signalled between a
/// waiter's failed try and its joining the list is not lost).
struct SemaphoreWaiters: ~Copyable {
  /// One waiting task.
  final class Waiter: @unchecked Sendable {  // mutated only under the semaphore's waiters lock
    enum Phase {
      case new
      case waiting(UnsafeContinuation<Bool, Never>)
      case done
    }
    var phase = Phase.new
  }

  var list: [Waiter] = []
}
