import Synchronization

/// An internal libdispatch read source on a descriptor the package owns, held in `Sendable`
/// state (libdispatch objects are thread-safe).
///
/// What `PressureTrigger` (a PSI trigger's epoll descriptor) uses: the reader is made and
/// activated by `startReading`, cancelled by
/// `stopReading`, and the owner's descriptors are closed exactly once — by `stopReading()` while
/// idle, otherwise in the reader's cancel handler, after libdispatch has stopped watching.
struct InternalReader: @unchecked Sendable {
  let source: OpaquePointer
}

/// The owner of an `InternalReader`: its phase under the owner's lock, and what it closes and
/// gives back when the reader stops.
protocol InternalReaderOwner: AnyObject, Sendable {
  /// Runs `body` under the owner's lock on its reader's phase.
  func withReaderPhase<Result: Sendable>(_ body: (inout WatcherPhase<InternalReader>) -> Result) -> Result
  /// Closes the owner's descriptors. Runs once: in `stopReading()` while idle, otherwise in the
  /// reader's cancel handler (before the phase becomes `stopped`).
  func closeDescriptors()
  /// Runs once, after `closeDescriptors()` (in the cancel handler, once the phase is `stopped`):
  /// what else the owner gives back.
  func didClose()
}

/// What a transition asks for, done outside the lock.
private enum InternalReaderAction {
  case none
  case activate(InternalReader)
  /// Cancel the reader, then drop the reference taken for this call.
  case cancel(InternalReader)
  case close
}

extension InternalReaderOwner {
  func didClose() {}

  /// Starts watching `descriptor` with a read source on `queue` whose event handler is
  /// `makeHandler(reader)`; does nothing unless idle (or when libdispatch refuses the source).
  func startReading(
    _ descriptor: Int32, queue: OpaquePointer, handler makeHandler: (InternalReader) -> @Sendable () -> Void
  ) {
    let action = withReaderPhase { phase -> InternalReaderAction in
      guard case .idle = phase, let reader = Libdispatch.source_create(.read, UInt(descriptor), 0, queue)
      else { return .none }
      let running = InternalReader(source: reader)
      Libdispatch.source_set_event_handler(reader, makeHandler(running))
      Libdispatch.source_set_cancel_handler(reader) { [self] in
        closeDescriptors()
        withReaderPhase { $0 = .stopped }
        didClose()
        Libdispatch.release(running.source)
      }
      phase = .running(running)
      return .activate(running)
    }
    performReaderAction(action)
  }

  /// Stops watching and closes the descriptors (now while idle, else in the reader's cancel
  /// handler). Later calls do nothing.
  func stopReading() {
    let action = withReaderPhase { phase -> InternalReaderAction in
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
    performReaderAction(action)
  }

  private func performReaderAction(_ action: InternalReaderAction) {
    switch action {
    case .none: break
    case .activate(let reader): Libdispatch.activate(reader.source)
    case .cancel(let reader):
      Libdispatch.source_cancel(reader.source)
      Libdispatch.release(reader.source)
    case .close:
      closeDescriptors()
      didClose()
    }
  }
}
