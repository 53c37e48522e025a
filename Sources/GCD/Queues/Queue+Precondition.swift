// `Queue.precondition`: libdispatch's dispatch_assert_queue family, with a
// message that names the queue. It answers from the package's frames (work
// submitted by closure, `sync`, `apply`, executor jobs, source handlers)
// and from libdispatch's record of the running work item (work submitted
// to a created queue with an `_f` function).

extension Queue {
  /// What `Queue.precondition(_:)` checks.
  ///
  /// `Sendable`: it holds only `Queue`s, which are.
  public enum Predicate: Sendable {
    /// The current thread runs work of the queue (directly, through a
    /// queue that targets it, or inside a `sync` onto it).
    case onQueue(Queue)
    /// The current thread does not run work of the queue.
    case notOnQueue(Queue)
    /// The current thread runs work of the queue as a barrier (any work
    /// of a serial queue is one).
    case onQueueAsBarrier(Queue)
  }

  /// Stops the process with a message naming the queue unless `predicate`
  /// holds: the check for code that must (or must not) run on a queue,
  /// usable from any code, including actor methods on a `SerialQueue`.
  ///
  /// Work submitted with an `_f` function to a global queue is not seen
  /// (libdispatch keeps no per-queue record there); everything else is.
  ///
  /// - Parameter predicate: What must hold.
  ///
  /// The corresponding C functions are `dispatch_assert_queue`,
  /// `dispatch_assert_queue_not` and `dispatch_assert_queue_barrier`.
  public static func precondition(_ predicate: Predicate) {
    switch predicate {
    case .onQueue(let queue):
      if !queue.isRunningOnCurrentThread {
        fatalError(
          "GCD: Queue.precondition(.onQueue) failed: the current thread is not running work of queue '\(queue.label)'")
      }
    case .notOnQueue(let queue):
      if queue.isRunningOnCurrentThread {
        fatalError(
          "GCD: Queue.precondition(.notOnQueue) failed: the current thread is running work of queue '\(queue.label)'")
      }
    case .onQueueAsBarrier(let queue):
      if queue.kind == .serial {
        if !queue.isRunningOnCurrentThread {
          fatalError(
            "GCD: Queue.precondition(.onQueueAsBarrier) failed: the current thread is not running work of queue '\(queue.label)'"
          )
        }
      } else if !queue.isHeldExclusively {
        if queue.isCurrent {
          fatalError(
            "GCD: Queue.precondition(.onQueueAsBarrier) failed: the current thread runs work of queue '\(queue.label)', but not as a barrier"
          )
        } else if queue.isCurrentWorkItemQueue {
          // `_f` work, which has no frame: only libdispatch knows whether it is a barrier (it traps if not).
          Libdispatch.assert_queue_barrier(queue.raw)
        } else {
          fatalError(
            "GCD: Queue.precondition(.onQueueAsBarrier) failed: the current thread is not running work of queue '\(queue.label)'"
          )
        }
      }
    }
  }

  /// `isCurrent`, or libdispatch's record of the running work item says so.
  final var isRunningOnCurrentThread: Bool { isCurrent || isCurrentWorkItemQueue }

  /// Whether libdispatch's running work item was submitted to this queue or
  /// to a queue that targets it (through targets this package set). Only
  /// for created queues: outside any work item libdispatch answers with a
  /// global queue.
  final var isCurrentWorkItemQueue: Bool {
    if isGlobal { return false }
    guard let current = Libdispatch.get_current_queue() else { return false }
    var found = false
    forEachInChain(current, exclusive: false) { queue, _ in
      found = queue == raw
      return !found
    }
    return found
  }

  /// Whether a frame of the current thread holds this queue exclusively
  /// (a barrier, or work of a serial queue that targets it).
  final var isHeldExclusively: Bool {
    var found = false
    forEachRunningFrame { frameQueue, frameExclusive in
      forEachInChain(frameQueue, exclusive: frameExclusive) { held, heldExclusive in
        found = held == raw && heldExclusive
        return !found
      }
      return !found
    }
    return found
  }
}
