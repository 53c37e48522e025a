import Synchronization

// Re-entrancy: `sync` (and `apply`) onto a queue this thread already holds
// would deadlock (libdispatch then kills the process with a bare SIGILL).
// Every closure this package runs on a queue runs inside a frame
// (Internals/Frames.swift), so the current thread's chain of frames lists
// every queue it is running on. The check costs one thread-local load when
// the chain is empty and the queue has no custom target: the common case of
// `sync` from outside any queue.

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
    hasNoFrame && flags & Queue.mainFlag == 0 && !state.load(ordering: .relaxed).isRetargeted
  }

  @usableFromInline
  func checkReentrancySlow(barrier: Bool, operation: StaticString) {
    if let conflict = deadlockingQueue(barrier: barrier) {
      let culprit = String(cString: Libdispatch.queue_get_label(conflict))
      let how =
        if conflict == Queue.main.raw && Libdispatch.isMainThread {
          conflict == raw
            ? "only the main thread drains the main queue, and this is the main thread"
            : "it runs through the main queue, which only the main thread drains, and this is the main thread"
        } else if conflict == raw {
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
  func deadlockingQueue(barrier: Bool) -> OpaquePointer? {
    let mainQueue = Queue.main.raw
    var found: OpaquePointer?
    forEachInChain(raw, exclusive: barrier || flags & frameExclusive != 0) { needed, neededExclusive in
      if needed == mainQueue && (Libdispatch.isMainThread || Queue.isOnMainQueue) {
        // The main queue is drained only by the main thread (or, after
        // dispatch_main, by one worker at a time); a thread that waits for it
        // while being that drainer, or while on the main thread outside
        // dispatchMain, waits forever.
        found = needed
        return false
      }
      forEachFrame { frameQueue, frameExclusive in
        forEachInChain(frameQueue, exclusive: frameExclusive) { held, heldExclusive in
          if held == needed && (neededExclusive || heldExclusive) {
            found = needed
            return false
          }
          return true
        }
        return found == nil
      }
      return found == nil
    }
    return found
  }

  /// Whether the current thread is running work of this queue: directly,
  /// inside a nested `sync`, or through a queue that targets this one. Only
  /// work submitted through this package is seen.
  ///
  /// For a serial queue it is true on one thread at a time. Inside an
  /// iteration of `apply` it is true for the queue `apply` runs on (and its
  /// targets), not for the queues of the code that called `apply`: that
  /// thread holds them while iterations run on several threads at once, so
  /// none of those threads runs their work exclusively. (`sync` onto such a
  /// queue from an iteration still stops with the deadlock message.)
  ///
  /// This is the question libdispatch's `dispatch_assert_queue` asks,
  /// answered without trapping.
  public var isCurrent: Bool {
    if flags & Queue.mainFlag != 0 && Queue.isOnMainQueue { return true }
    var found = false
    forEachRunningFrame { frameQueue, _ in
      forEachInChain(frameQueue, exclusive: false) { held, _ in
        found = held == raw
        return !found
      }
      return !found
    }
    return found
  }
}

extension Queue {
  /// Whether the current work item runs on the main queue or on a queue
  /// that targets it, however it was submitted (libdispatch's own record).
  static var isOnMainQueue: Bool { Libdispatch.get_specific(Libdispatch.mainQueueKey) != nil }

  /// Whether the calling thread is the process's main thread (the thread
  /// whose id is the process id), the only thread that drains `Queue.main`
  /// in `dispatchMain()`.
  public static var isMainThread: Bool { Libdispatch.isMainThread }
}

/// Calls `body` with `queue` and each queue of its target chain (as far as
/// this package set the targets), with whether each is held exclusively,
/// until `body` returns false.
func forEachInChain(_ queue: OpaquePointer, exclusive: Bool, _ body: (OpaquePointer, Bool) -> Bool) {
  var link: OpaquePointer? = queue
  var linkExclusive = exclusive
  var depth = 0
  while let current = link, depth < 64 {
    if !body(current, linkExclusive) { return }
    (link, linkExclusive) = targetLink(of: current)
    depth += 1
  }
}

extension Queue {
  /// Runs the work submitted to `Queue.main` on the main thread, forever:
  /// call it from the main thread once the program has set up its work, and
  /// end the program from a work item (with `exit`).
  ///
  /// On Linux, libdispatch's own `dispatch_main` ends the main thread and lets
  /// worker threads drain the main queue; this function instead drains it on
  /// the main thread, as a run loop does, so main-queue work really runs on
  /// the main thread (still one item at a time, in FIFO order).
  ///
  /// A static member of `Queue`, so that a file that imports Foundation (which
  /// re-exports Dispatch and its free `dispatchMain()`) names it without ambiguity.
  ///
  /// The corresponding C function is `dispatch_main`.
  public static func dispatchMain() -> Never {
    if !Libdispatch.isMainThread {
      fatalError("GCD: Queue.dispatchMain() must be called on the main thread")
    }
    Libdispatch.drainMainQueueForever()
  }

  /// Runs `body` as a main-actor task and drains `Queue.main` on the main
  /// thread until it ends, then exits the process (status 0, or 1 with the
  /// error on standard error if `body` throws). Call it from the main thread,
  /// from synchronous top-level code.
  ///
  /// An `async` main on Linux ends in libdispatch's `dispatch_main`, which
  /// parks the main thread and runs main-queue work, `@MainActor` jobs
  /// included, on worker threads: main-actor code after an `await` is not on
  /// the main thread. Here the main queue is drained on the main thread (as
  /// `Queue.dispatchMain()` does), so every main-actor job of `body` and of the
  /// tasks it starts runs there (`Queue.isMainThread` holds after each `await`).
  ///
  /// - Parameter body: The program, isolated to the main actor.
  ///
  /// The corresponding C function is `dispatch_main`.
  public static func dispatchMain(_ body: @escaping @MainActor @Sendable () async throws -> Void) -> Never {
    if !Libdispatch.isMainThread {
      fatalError("GCD: Queue.dispatchMain(_:) must be called on the main thread")
    }
    Task { @MainActor in
      do {
        try await body()
      } catch {
        system_writeStandardError("GCD: Queue.dispatchMain: the main task threw \(error)\n")
        system_exit(1)
      }
      system_exit(0)
    }
    Libdispatch.drainMainQueueForever()
  }
}

/// `Queue.dispatchMain()`, by its name before 1.0. With Foundation imported it is ambiguous with
/// Dispatch's `dispatchMain()`; use `Queue.dispatchMain()`.
@available(*, deprecated, renamed: "Queue.dispatchMain()")
public func dispatchMain() -> Never { Queue.dispatchMain() }

/// `Queue.dispatchMain(_:)`, by its name before 1.0. With Foundation imported it is ambiguous
/// with Dispatch's `dispatchMain()`; use `Queue.dispatchMain(_:)`.
@available(*, deprecated, renamed: "Queue.dispatchMain(_:)")
public func dispatchMain(_ body: @escaping @MainActor @Sendable () async throws -> Void) -> Never {
  Queue.dispatchMain(body)
}
