import CDispatch
import CGCD
import Synchronization

// Re-entrancy: `sync` (and `apply`) onto a queue this thread already holds
// deadlocks, and libdispatch then kills the process with a bare SIGILL. Every
// closure this package runs on a queue does so inside a frame (see
// `withFrame`), linked to the frames of the code waiting for it, so the
// current thread's chain lists every queue it is running on. The check costs
// one thread-local load when the chain is empty and the queue has no custom
// target: the common case of `sync` from outside any queue.

extension Queue {
  /// Stops the process with a message when waiting on this queue from the
  /// current thread can never finish.
  @inlinable
  func checkReentrancy(barrier: Bool, operation: StaticString) {
    if isOutsideEveryChain { return }
    checkReentrancySlow(barrier: barrier, operation: operation)
  }

  /// True when the current thread runs no work of this package (no frame)
  /// and this queue cannot lead to the main queue (it is not the main queue
  /// and has no target set by this package): waiting on the queue cannot
  /// deadlock, and `dispatch_sync` runs its work on this thread.
  @inlinable
  var isOutsideEveryChain: Bool {
    cgcd_frame_get() == nil && flags & Queue.mainFlag == 0
      && state.load(ordering: .relaxed) & Queue.customTargetBit == 0
  }

  @usableFromInline
  func checkReentrancySlow(barrier: Bool, operation: StaticString) {
    if let conflict = deadlockingQueue(barrier: barrier) {
      let culprit = String(cString: dispatch_queue_get_label(OpaquePointer(conflict)))
      let how =
        if conflict == Queue.main.raw.raw && cgcd_is_main_thread() != 0 {
          conflict == raw.raw
            ? "only the main thread drains the main queue, and this is the main thread"
            : "it runs through the main queue, which only the main thread drains, and this is the main thread"
        } else if conflict == raw.raw {
          "the current thread is already running on it"
        } else {
          "it runs through queue '\(culprit)', which the current thread is already running on"
        }
      fatalError(
        "GCD: Queue '\(label)'.\(operation) would deadlock: \(how). Use async, or check isCurrent first.")
    }
  }

  /// The queue of this queue's chain that the current thread holds in a way
  /// that makes waiting on this queue impossible, if any.
  func deadlockingQueue(barrier: Bool) -> UnsafeMutableRawPointer? {
    let mainQueue = Queue.main.raw.raw
    var found: UnsafeMutableRawPointer?
    forEachInChain(raw.raw, exclusive: barrier || flags & frameExclusive != 0) { needed, neededExclusive in
      if needed == mainQueue && (cgcd_is_main_thread() != 0 || Queue.isOnMainQueue) {
        // The main queue is drained only by the main thread (or, after
        // dispatch_main, by one worker at a time); a thread that waits for it
        // while being that drainer, or while on the main thread outside
        // dispatchMain, waits forever.
        found = needed
        return false
      }
      var frame = cgcd_frame_get()
      while let current = frame {
        forEachInChain(current.pointee.queue!, exclusive: current.pointee.flags & frameExclusive != 0) {
          held, heldExclusive in
          if held == needed && (neededExclusive || heldExclusive) {
            found = needed
            return false
          }
          return true
        }
        if found != nil { return false }
        frame = current.pointee.prev
      }
      return true
    }
    return found
  }

  /// Whether the current thread is running work of this queue: directly,
  /// inside a nested `sync` or `apply`, or through a queue that targets
  /// this one. Only work submitted through this package is seen.
  ///
  /// This is the question libdispatch's `dispatch_assert_queue` asks,
  /// answered without trapping.
  public var isCurrent: Bool {
    if flags & Queue.mainFlag != 0 && Queue.isOnMainQueue { return true }
    var frame = cgcd_frame_get()
    while let current = frame {
      var found = false
      forEachInChain(current.pointee.queue!, exclusive: false) { held, _ in
        found = held == raw.raw
        return !found
      }
      if found { return true }
      frame = current.pointee.prev
    }
    return false
  }
}

extension Queue {
  /// Whether the current work item runs on the main queue or on a queue
  /// that targets it, however it was submitted (libdispatch's own record).
  static var isOnMainQueue: Bool { dispatch_get_specific(cgcd_main_queue_key()) != nil }

  /// Whether the calling thread is the process's main thread (the thread
  /// whose id is the process id), the only thread that drains `Queue.main`
  /// in `dispatchMain()`.
  public static var isMainThread: Bool { cgcd_is_main_thread() != 0 }
}

/// Calls `body` with `queue` and each queue of its target chain (as far as
/// this package set the targets), with whether each is held exclusively,
/// until `body` returns false.
func forEachInChain(
  _ queue: UnsafeMutableRawPointer, exclusive: Bool,
  _ body: (UnsafeMutableRawPointer, Bool) -> Bool
) {
  var link: UnsafeMutableRawPointer? = queue
  var linkExclusive = exclusive
  var depth = 0
  while let current = link, depth < 64 {
    if !body(current, linkExclusive) { return }
    (link, linkExclusive) = targetLink(of: current)
    depth += 1
  }
}

/// Runs the work submitted to `Queue.main` on the main thread, forever:
/// call it from the main thread once the program has set up its work, and
/// end the program from a work item (with `exit`).
///
/// On Linux, libdispatch's own `dispatch_main` ends the main thread and lets
/// worker threads drain the main queue; this function instead drains it on
/// the main thread, as a run loop does, so main-queue work really runs on
/// the main thread (still one item at a time, in FIFO order).
///
/// The corresponding C function is `dispatch_main`.
public func dispatchMain() -> Never {
  if cgcd_is_main_thread() == 0 {
    fatalError("GCD: dispatchMain() must be called on the main thread")
  }
  cgcd_drain_main_queue_forever()
}
