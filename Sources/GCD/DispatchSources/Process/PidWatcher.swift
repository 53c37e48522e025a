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
final class PidWatcher: KernelWatcher {
  /// The internal read source, held in `Sendable` state (libdispatch objects are thread-safe).
  struct Reader: @unchecked Sendable {
    let source: OpaquePointer
  }

  /// What a transition asks for, done outside the lock.
  private enum Action {
    case none
    case activate(Reader)
    /// Cancel the reader, then drop the reference taken for this call.
    case cancel(Reader)
    case close
  }

  let descriptor: Int32
  /// The epoll instance holding `descriptor` that the internal source watches (nil: the descriptor itself).
  let nest: EpollNest?
  /// The bits merged into the user source on exit (0 when `.exit` is not watched).
  let bits: UInt
  let target: MergeTarget
  private let phase = Mutex(WatcherPhase<Reader>.idle)

  /// Takes over `descriptor` (a pidfd), `nest` and a reference to `target`.
  init(descriptor: Int32, nest: EpollNest?, bits: UInt, target: OpaquePointer) {
    self.descriptor = descriptor
    self.nest = nest
    self.bits = bits
    self.target = MergeTarget(retaining: target)
  }

  func start() {
    let action = phase.withLock { phase -> Action in
      guard case .idle = phase,
        let reader = Libdispatch.source_create(.read, UInt(nest?.instance ?? descriptor), 0, Queue.global().raw)
      else { return .none }
      let running = Reader(source: reader)
      Libdispatch.source_set_event_handler(reader) { [target, bits] in
        // A pidfd stays readable once the process has exited: deliver once
        // and stop watching. No event handler runs after the cancel.
        target.merge(bits)
        Libdispatch.source_cancel(running.source)
      }
      Libdispatch.source_set_cancel_handler(reader) { [self] in
        system_close(descriptor)
        nest?.close()
        self.phase.withLock { $0 = .stopped }
        target.release()
        Libdispatch.release(running.source)
      }
      phase = .running(running)
      return .activate(running)
    }
    perform(action)
  }

  func stop() {
    let action = phase.withLock { phase -> Action in
      switch phase {
      case .idle:
        phase = .stopped
        return .close
      case .running(let reader):
        // Kept alive for the cancel below: its cancel handler releases it.
        Libdispatch.retain(reader.source)
        return .cancel(reader)
      case .stopped:
        return .none
      }
    }
    perform(action)
  }

  private func perform(_ action: Action) {
    switch action {
    case .none: break
    case .activate(let reader): Libdispatch.activate(reader.source)
    case .cancel(let reader):
      Libdispatch.source_cancel(reader.source)
      Libdispatch.release(reader.source)
    case .close:
      system_close(descriptor)
      nest?.close()
      target.release()
    }
  }
}
