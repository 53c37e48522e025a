import Synchronization

/// The events of a source as an `AsyncSequence`: `for try await value in
/// source.makeEvents() { … }`, one element per (merged) event, typed per
/// source (`UInt` for the data, timer, signal, read and write sources,
/// `ProcEvents` and `FileSystemEvents`).
///
/// Making the sequence (`makeEvents()`) starts the source: it installs the
/// sequence as the source's event handler and starts the source (it must
/// not have been started: the sequence is how it is started). No event
/// after that point is lost, also before the first `next()`: `let seq =
/// source.makeEvents()` in one place and `for try await value in seq` in a
/// child task later sees a signal sent between the two.
///
/// Making it never waits for the source's queue, which may be suspended,
/// inactive, busy, or the one the caller runs on (the events then wait in
/// the source until the queue runs). A `SignalSource`'s sequence returns
/// once the kernel watches the signal (microseconds): a signal sent before
/// would be lost, and libdispatch runs the registration on the source's
/// queue, so the source registers on a queue of the package's own and stays
/// there (a new target of an active source is deprecated use in libdispatch,
/// which `LIBDISPATCH_STRICT=1` stops): its elements and its end come from
/// there, also while its queue is suspended, and its handlers of yours are
/// sent on to its queue. Every other source returns at once: what
/// happens before it registers waits for it (a descriptor stays ready, a
/// timer's deadline is absolute, a data source merges, the package's
/// watchers have started). The source's registration and cancel handlers,
/// if you set them, run on the source's queue, as always; the registration
/// handler may run after `makeEvents()` returns.
///
/// Back-pressure is the source's own merging: while no one takes an
/// element (before the first `next()`, or while the consumer is busy) the
/// source is held back (`isSuspended` says so) holding at most one element,
/// and what arrives
/// meanwhile merges in it (data sources add, OR or replace; timers and
/// signals count; file-system and process events OR), so memory stays
/// flat however fast the producer is, and the element the consumer gets
/// next sums everything since the last. The hold is the sequence's own, not
/// a `suspend()`: your `suspend()` and `resume()` still balance each other
/// during it, and a `resume()` with no `suspend()` of yours to balance stops
/// the process with a message naming the source, as on any running source.
///
/// Leaving the loop (breaking out, returning, throwing), cancelling the
/// task, or dropping a sequence that was never iterated cancels the
/// source, once; its cancel handler runs once. The sequence finishes
/// (`next()` returns nil) when the source is cancelled, by the loop or by
/// anyone else, after delivering an element already taken from the source.
///
/// A source has one event sequence with one iterator: making a sequence of
/// a source that was started already (by `resume()` or another sequence),
/// or a second iterator of one sequence, gives an iterator whose `next()`
/// throws `EBUSY` (and leaves the source alone); for a cancelled source it
/// just finishes.
///
/// `Sendable`: it holds the source, whose state is behind a mutex.
public struct SourceEvents<Element: Sendable>: AsyncSequence, Sendable {
  /// The error `next()` throws: the source was started (or iterated) already.
  public typealias Failure = GCDError

  /// The sequence that started the source; nil for one that did not (`refusal`).
  let owner: EventsOwner?
  /// Why this sequence did not start the source: `EBUSY` (it was started already), thrown by its
  /// first `next()`; nil for a cancelled source (the sequence just finishes) or the one that started it.
  let refusal: GCDError?
  /// The element of an event's data (a thin function: `{ $0 }`, an option set's `init(rawValue:)`).
  let element: @Sendable (UInt) -> Element

  /// Starts the source (see the type's documentation).
  @usableFromInline
  init(source: Source, element: @escaping @Sendable (UInt) -> Element) {
    self.element = element
    if source.startSequence() {
      owner = EventsOwner(source: source)
      refusal = nil
    } else {
      owner = nil
      refusal =
        source.lifecycle.load(ordering: .acquiring).isCancelled
        ? nil
        : GCDError(
          operation: "\(type(of: source)).makeEvents()", errno: Errno.busy,
          detail:
            "the source was already started (by resume() or another sequence); the sequence starts it: make it before resume()"
        )
    }
  }

  /// The iterator; a second one (of this sequence) throws `EBUSY`.
  public func makeAsyncIterator() -> Iterator {
    guard let owner else { return Iterator(token: nil, failure: refusal, failsOnce: true, element: element) }
    if owner.source.state.claimIterator() {
      return Iterator(token: EventsToken(source: owner.source), failure: nil, failsOnce: false, element: element)
    }
    return Iterator(
      token: nil,
      failure: GCDError(
        operation: "\(type(of: owner.source)).makeEvents()", errno: Errno.busy,
        detail: "the sequence is iterated already; a source's events have one iterator"),
      failsOnce: false, element: element)
  }

  /// The iterator. Dropping it (leaving the loop) cancels the source.
  ///
  /// `Sendable`: it holds the source, whose state is behind a mutex.
  public struct Iterator: AsyncIteratorProtocol, Sendable {
    let token: EventsToken?
    var failure: GCDError?
    /// The refusal of a sequence that did not start its source is thrown once, then the iterator
    /// ends; a second iterator's, every time.
    let failsOnce: Bool
    let element: @Sendable (UInt) -> Element

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Throws: `GCDError` with `EBUSY` when the source was started
    ///   before the sequence was made (by `resume()` or another sequence),
    ///   or this is the sequence's second iterator.
    public mutating func next() async throws(GCDError) -> Element? {
      guard let token else { return try refused() }
      return await token.source.state.nextEvent().map(element)
    }

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Parameter actor: The caller's isolation (the element is `Sendable`).
    /// - Throws: `GCDError` with `EBUSY` as `next()`.
    public mutating func next(isolation actor: isolated (any Actor)?) async throws(GCDError) -> Element? {
      guard let token else { return try refused() }
      return await token.source.state.nextEvent().map(element)
    }

    /// An iterator of a sequence that did not start its source: throws the refusal once (a second
    /// iterator's, every time), then ends.
    mutating func refused() throws(GCDError) -> Element? {
      guard let failure else { return nil }
      if failsOnce { self.failure = nil }
      throw failure
    }
  }
}

/// Held by the sequence that started its source (never by the source's handlers): dropping a
/// sequence that made no iterator ends it.
final class EventsOwner: Sendable {
  let source: Source
  init(source: Source) { self.source = source }
  deinit { source.state.sequenceDropped() }
}

/// Held by the iterator only (never by the source's handlers): its end is the end of the loop.
final class EventsToken: Sendable {
  let source: Source
  init(source: Source) { self.source = source }
  deinit { source.state.endSequence() }
}

extension Source {
  /// Claims the start of the source for its event sequence, makes the sequence's part of the
  /// state and starts the source, waiting for its registration (which never waits for the source's
  /// queue: `Source.startRegistered`) only where an event sent before it would be lost: a
  /// signal's. False, touching nothing, when the source was started, suspended or cancelled
  /// already. The claim and the check are one atomic step, so of two sequences, or a sequence and
  /// a `resume()`, exactly one starts the source, and the other never touches its handlers.
  final func startSequence() -> Bool {
    guard claimStart() else { return false }
    // Set before the C source is activated: libdispatch installs a handler set on an active source
    // asynchronously. Meanwhile the word says active, so a `resume()` stops as on any running
    // source, and a `cancel()` leaves the start to this call.
    // A source that registers on `Registration.queue` stays there: said before its event block is
    // set, so that a user's event handler set beside the start is sent on to the user's queue.
    if losesEventsBeforeRegistration { state.startRegistering() }
    state.beginSequence(self)
    if losesEventsBeforeRegistration {
      Source.startRegistered([self])
    } else {
      // What arrives before the source registers waits for it (see `losesEventsBeforeRegistration`):
      // no wait, and the source registers on its own queue, as any source does.
      runStartHook()
      Libdispatch.activate(raw)
    }
    return true
  }

  /// The sequence holds the source back (under the state's lock, so that a consumer that takes the
  /// element releases a suspension C has seen).
  final func holdForSequence() {
    Libdispatch.suspend(raw)
    lifecycle.update { $0.hold() }.perform(on: raw)
  }

  /// The consumer took the held element: the hold ends (nothing once the source is cancelled).
  final func releaseForSequence() {
    lifecycle.update { $0.release() }.perform(on: raw)
  }
}

// MARK: The sequence's part of the state

/// The event sequence as a view of the source's state (`SourceState.Rare`): the source's handlers
/// (on its queue) and the consumer meet under the state's one lock; what to do is decided under
/// it, continuations are resumed and the source's life cycle moved outside it (but the hold: see
/// `holdForSequence`), "finished" is delivered once.
extension SourceState {
  /// Makes the sequence's part and installs its event block (which captures this state alone) and
  /// the cancel block (which ends the sequence after the user's cancel handler).
  func beginSequence(_ source: Source) {
    let install = locked.withLock { locked in
      locked.madeRare().sequenceSource = source
      return locked.claimCancelBlock()
    }
    setSequenceHandler()
    if install { installCancelBlock() }
  }

  /// An event (on the source's queue): to the waiting consumer, or held, holding the source back.
  func sequenceEvent() {
    let data = eventData()
    let consumer: Consumer? = locked.withLock { locked in
      guard let rare = locked.rare, let source = rare.sequenceSource, !rare.finished else { return nil }
      if let consumer = rare.consumer {
        rare.consumer = nil
        return consumer
      }
      // No one asks yet: keep the data and let the source merge the rest.
      if rare.held == nil { source.holdForSequence() }
      rare.held = data
      return nil
    }
    consumer?.resume(returning: data)
  }

  /// The consumer's `next()`: the held element (ending the hold), the end, or a wait for either.
  /// The task's cancellation ends the sequence.
  func nextEvent() async -> UInt? {
    await withTaskCancellationHandler {
      await withUnsafeContinuation { (consumer: Consumer) in
        enum Action {
          case none
          case deliver(UInt?, release: Source?)
        }
        let action: Action = locked.withLock { locked in
          let rare = locked.madeRare()
          if let data = rare.held {
            rare.held = nil
            return .deliver(data, release: rare.sequenceSource)
          }
          if rare.finished { return .deliver(nil, release: nil) }
          rare.consumer = consumer
          return .none
        }
        guard case .deliver(let data, let source) = action else { return }
        source?.releaseForSequence()
        consumer.resume(returning: data)
      }
    } onCancel: {
      endSequence()
    }
  }

  /// Makes the sequence's one iterator; false for a second one.
  func claimIterator() -> Bool {
    locked.withLock { locked in
      let rare = locked.madeRare()
      defer { rare.iterated = true }
      return !rare.iterated
    }
  }

  /// The sequence was dropped: ends it if it made no iterator.
  func sequenceDropped() {
    if !locked.withLock({ $0.rare?.iterated ?? false }) { endSequence() }
  }

  /// The source was cancelled (its cancel handler ran): the sequence ends once the held element, if
  /// any, is delivered. Lets the source go (outside the lock: it may be the last reference).
  func sequenceCancelled() {
    let (consumer, source): (Consumer?, Source?) = locked.withLock { locked in
      guard let rare = locked.rare, !rare.finished else { return (nil, nil) }
      rare.finished = true
      defer { rare.sequenceSource = nil }
      if rare.held != nil { return (nil, rare.sequenceSource) }  // the consumer takes it, then nil
      defer { rare.consumer = nil }
      return (rare.consumer, rare.sequenceSource)
    }
    withExtendedLifetime(source) {}
    consumer?.resume(returning: nil)
  }

  /// The loop ended, the task was cancelled or the sequence was dropped unused: ends the sequence
  /// and cancels the source (once), which balances the hold.
  func endSequence() {
    let (consumer, source): (Consumer?, Source?) = locked.withLock { locked in
      guard let rare = locked.rare else { return (nil, nil) }
      rare.finished = true
      rare.held = nil
      defer { (rare.consumer, rare.sequenceSource) = (nil, nil) }
      return (rare.consumer, rare.sequenceSource)
    }
    source?.cancel()
    consumer?.resume(returning: nil)
  }
}
