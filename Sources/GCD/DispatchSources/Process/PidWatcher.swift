import Synchronization

/// The Linux half of a `ProcSource`: a pidfd, and an internal read source
/// that turns its readability (the process exited) into one `.exit` merged
/// into the user source.
///
/// libdispatch watches the pidfd through an epoll instance of the package's
/// own (`EpollNest`): once the process is reaped the pidfd reports a
/// hang-up, which libdispatch's epoll layer must not see
/// (swift-corelibs-libdispatch#949).
///
/// The descriptor and the nest are closed exactly once: by `stop()` while
/// idle, otherwise in the internal source's cancel handler, after libdispatch
/// has stopped watching the nest. The internal source cancels itself after its one event (a
/// pidfd stays readable once the process has exited), or `stop()` cancels it.
final class PidWatcher: KernelWatcher, InternalReaderOwner {
  let descriptor: Int32
  /// The epoll instance holding `descriptor` that the internal source watches (nil: the descriptor itself).
  let nest: EpollNest?
  /// The bits merged into the user source on exit (0 when `.exit` is not watched).
  let bits: UInt
  let target: MergeTarget
  private let phase = Mutex(WatcherPhase<InternalReader>.idle)

  /// Takes over `descriptor` (a pidfd), `nest` and a reference to `target`.
  init(descriptor: Int32, nest: EpollNest?, bits: UInt, target: OpaquePointer) {
    self.descriptor = descriptor
    self.nest = nest
    self.bits = bits
    self.target = MergeTarget(retaining: target)
  }

  func start() {
    startReading(nest?.instance ?? descriptor, queue: Queue.global().raw) { running in
      { [target, bits] in
        // A pidfd stays readable once the process has exited: deliver once
        // and stop watching. No event handler runs after the cancel.
        target.merge(bits)
        Libdispatch.source_cancel(running.source)
      }
    }
  }

  func stop() { stopReading() }

  func withReaderPhase<Result: Sendable>(_ body: (inout WatcherPhase<InternalReader>) -> Result) -> Result {
    phase.withLock { body(&$0) }
  }

  func closeDescriptors() {
    system_close(descriptor)
    nest?.close()
  }

  func didClose() { target.release() }
}
