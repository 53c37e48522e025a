import CGCD

// Re-entrancy: `sync` (and `apply`) onto a queue this thread already holds
// deadlocks, and libdispatch then kills the process with a bare SIGILL. Every
// closure this package runs on a queue does so inside a frame, a
// `cgcd_frame_t` on the running thread's stack, linked to the frames of the
// code waiting for it (through `sync` and `apply`), so the current thread's
// chain lists every queue it is running on. The head of the chain is a C
// thread-local (initial-exec: one %fs-relative load).

/// Frame flag: the frame holds its queue exclusively (a serial queue, or a barrier).
@usableFromInline let frameExclusive: UInt = 1

/// Frame flag: an iteration of `apply`, run beside the others on other
/// threads (`CGCD_FRAME_FORKED`). The frames after it are held by the thread
/// that called `apply`, not run by this one.
@usableFromInline let frameForked: UInt = 2

/// Whether the current thread runs no work of this package (no frame).
@inlinable
var hasNoFrame: Bool { cgcd_frame_get() == nil }

/// Runs `body` with a frame for `queue` pushed on this thread's chain, and
/// restores the chain afterwards.
///
/// Not generic and not `rethrows`: a closure passed as `() throws -> R`
/// would be wrapped in a reabstraction thunk, and the stored closure copied
/// (retained and released) on every call.
///
/// While a `StallMonitor` watches, the work is recorded for it (`withWatchedFrame`): the one cost
/// of the feature when it is off is the check of one word here.
@inlinable
func withFrame(queue: OpaquePointer, flags: UInt, _ body: () -> Void) {
  if _slowPath(stallWatching) {
    withWatchedFrame(queue: queue, flags: flags, site: stallSite(body), submitted: 0, body)
    return
  }
  withUnwatchedFrame(queue: queue, flags: flags, body)
}

/// `withFrame` without the stall check: for work whose submission made the check (`Work`).
@inlinable
func withUnwatchedFrame(queue: OpaquePointer, flags: UInt, _ body: () -> Void) {
  let saved = cgcd_frame_get()
  var frame = cgcd_frame_t(queue: UnsafeMutableRawPointer(queue), flags: flags, prev: saved)
  withUnsafeMutablePointer(to: &frame) { frame in
    cgcd_frame_set(frame)
    body()
    cgcd_frame_set(saved)
  }
}

/// Calls `body` with the queue of each frame of the current thread's chain,
/// innermost first, and whether the frame holds it exclusively, until
/// `body` returns false: every queue the thread holds, the ones an `apply`
/// caller holds while its iterations run included (what the deadlock check
/// needs).
func forEachFrame(_ body: (OpaquePointer, Bool) -> Bool) {
  forEachFrame(throughForks: true, body)
}

/// `forEachFrame` that stops after the first `apply` iteration's frame: the
/// queues whose work this thread runs, and no other thread of the same chain
/// does at the same time (what `isCurrent` and the isolation checks need).
func forEachRunningFrame(_ body: (OpaquePointer, Bool) -> Bool) {
  forEachFrame(throughForks: false, body)
}

private func forEachFrame(throughForks: Bool, _ body: (OpaquePointer, Bool) -> Bool) {
  var frame = cgcd_frame_get()
  while let current = frame {
    let flags = current.pointee.flags
    if !body(OpaquePointer(current.pointee.queue.unsafelyUnwrapped), flags & frameExclusive != 0) {
      return
    }
    if !throughForks && flags & frameForked != 0 { return }
    frame = current.pointee.prev
  }
}
