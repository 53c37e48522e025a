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
/// queue, so the source registers on a queue of the package's own and is
/// then pointed at its queue. Every other source returns at once: what
/// happens before it registers waits for it (a descriptor stays ready, a
/// timer's deadline is absolute, a data source merges, the package's
/// watchers have started). The source's registration and cancel handlers,
/// if you set them, run on the source's queue, as always; the registration
/// handler may run after `makeEvents()` returns.
///
/// Back-pressure is the source's own merging: while no one takes an
/// element (before the first `next()`, or while the consumer is busy) the
/// source is suspended holding at most one element, and what arrives
/// meanwhile merges in it (data sources add, OR or replace; timers and
/// signals count; file-system and process events OR), so memory stays
/// flat however fast the producer is, and the element the consumer gets
/// next sums everything since the last.
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
/// `Sendable`: it holds a class whose state is behind a mutex.
public struct SourceEvents<Element: Sendable>: AsyncSequence, Sendable {
  /// The error `next()` throws: the source was started (or iterated) already.
  public typealias Failure = GCDError

  let owner: EventsOwner<Element>

  /// Starts the source (see the type's documentation).
  init(source: Source, element: @escaping @Sendable (UInt) -> Element) {
    owner = EventsOwner(storage: EventsStorage(source: source, element: element))
    owner.storage.start()
  }

  /// The iterator; a second one (of this sequence) throws `EBUSY`.
  public func makeAsyncIterator() -> Iterator {
    let storage = owner.storage
    if storage.claimIterator() { return Iterator(token: EventsToken(storage: storage), failure: nil) }
    return Iterator(
      token: nil,
      failure: GCDError(
        operation: "\(type(of: storage.source)).makeEvents()", errno: Errno.busy,
        detail: "the sequence is iterated already; a source's events have one iterator"))
  }

  /// The iterator. Dropping it (leaving the loop) cancels the source.
  ///
  /// `Sendable`: its state is in a class behind a mutex.
  public struct Iterator: AsyncIteratorProtocol, Sendable {
    let token: EventsToken<Element>?
    let failure: GCDError?

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Throws: `GCDError` with `EBUSY` when the source was started
    ///   before the sequence was made (by `resume()` or another sequence),
    ///   or this is the sequence's second iterator.
    public mutating func next() async throws(GCDError) -> Element? {
      guard let token else { throw failure.unsafelyUnwrapped }
      return try await token.storage.next()
    }

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Parameter actor: The caller's isolation (the element is `Sendable`).
    /// - Throws: `GCDError` with `EBUSY` as `next()`.
    public mutating func next(isolation actor: isolated (any Actor)?) async throws(GCDError) -> Element? {
      guard let token else { throw failure.unsafelyUnwrapped }
      return try await token.storage.next()
    }
  }
}

/// Held by the sequence (never by the source's handlers): dropping a
/// sequence that made no iterator ends it.
final class EventsOwner<Element: Sendable>: Sendable {
  let storage: EventsStorage<Element>

  init(storage: EventsStorage<Element>) { self.storage = storage }

  deinit { storage.sequenceDropped() }
}

/// Held by the iterator only (never by the source's handlers): its end is
/// the end of the loop.
final class EventsToken<Element: Sendable>: Sendable {
  let storage: EventsStorage<Element>

  init(storage: EventsStorage<Element>) { self.storage = storage }

  deinit { storage.terminate() }
}

/// The state machine between the source's handlers (on its queue) and the
/// consumer: a lock, an action returned under it, continuations resumed
/// outside it, "finished" delivered once.
final class EventsStorage<Element: Sendable>: Sendable {
  typealias Consumer = UnsafeContinuation<Result<Element?, GCDError>, Never>

  struct State: OneIteratorState {
    /// Cancelled, the loop ended, or the start failed.
    var finished = false
    /// This sequence started the source (so its end cancels it).
    var started = false
    /// An iterator was made (the sequence's drop no longer ends it).
    var iterated = false
    /// Why the start failed (`EBUSY`), thrown by the first `next()`.
    var failure: GCDError?
    /// An event taken from the source that the consumer has not asked for
    /// yet; the source is suspended while it is here.
    var buffered: Element?
    /// This sequence suspended the source (back-pressure).
    var suspended = false
    var consumer: Consumer?
  }

  enum Action {
    case none
    case deliver(Consumer, Result<Element?, GCDError>, resumeSource: Bool)
  }

  let source: Source
  let element: @Sendable (UInt) -> Element
  let state = Mutex(State())

  init(source: Source, element: @escaping @Sendable (UInt) -> Element) {
    self.source = source
    self.element = element
  }

  func next() async throws(GCDError) -> Element? {
    let result = await withTaskCancellationHandler {
      await withUnsafeContinuation { (consumer: Consumer) in
        let action: Action = state.withLock { state in
          if let value = state.buffered {
            state.buffered = nil
            defer { state.suspended = false }
            return .deliver(consumer, .success(value), resumeSource: state.suspended)
          }
          if let failure = state.failure {
            state.failure = nil
            return .deliver(consumer, .failure(failure), resumeSource: false)
          }
          if state.finished { return .deliver(consumer, .success(nil), resumeSource: false) }
          state.consumer = consumer
          return .none
        }
        perform(action)
      }
    } onCancel: {
      terminate()
    }
    return try result.get()
  }

  func perform(_ action: Action) {
    switch action {
    case .none: break
    case .deliver(let consumer, let result, let resumeSource):
      if resumeSource { source.resume() }
      consumer.resume(returning: result)
    }
  }

  /// Claims the start of the source, installs the handlers and starts it,
  /// waiting for its registration (which never waits for the source's
  /// queue: `Source.startRegistered`) only where an event sent before it
  /// would be lost: a signal's; unless it was started (or suspended)
  /// already: then `EBUSY` for the first `next()`, or the end for a
  /// cancelled source. The claim and the check are one atomic step, so of
  /// two sequences, or a sequence and a `resume()`, exactly one starts the
  /// source, and the other never touches its handlers.
  func start() {
    guard source.claimStart() else {
      let cancelled = source.lifecycle.load(ordering: .acquiring).isCancelled
      state.withLock { state in
        state.finished = true
        if !cancelled {
          state.failure = GCDError(
            operation: "\(type(of: source)).makeEvents()", errno: Errno.busy,
            detail:
              "the source was already started (by resume() or another sequence); the sequence starts it: make it before resume()"
          )
        }
      }
      return
    }
    state.withLock { $0.started = true }
    // Set before the C source is activated: libdispatch installs a handler
    // set on an active source asynchronously. Meanwhile the word says
    // active, so a `resume()` stops as on any running source, and a
    // `cancel()` leaves the start to this call.
    source.setEventHandler { [self] in received(source.data) }
    source.state.setCancelHook { [self] in finish() }
    if source.losesEventsBeforeRegistration {
      Source.startRegistered([source])
    } else {
      // What arrives before the source registers waits for it (see `losesEventsBeforeRegistration`):
      // no wait, and the source registers on its own queue, as any source does.
      source.runStartHook()
      Libdispatch.activate(source.raw)
    }
  }

  /// Makes the one iterator; false for a second one.
  func claimIterator() -> Bool { state.claimIterator() }

  /// The sequence was dropped: ends it if it made no iterator.
  func sequenceDropped() {
    if !state.isIterated { terminate() }
  }

  /// An event (on the source's queue).
  func received(_ data: UInt) {
    let value = element(data)
    let consumer: Consumer? = state.withLock { state in
      if state.finished { return nil }
      if let consumer = state.consumer {
        state.consumer = nil
        return consumer
      }
      // No one asks yet: keep the value and let the source merge the rest.
      state.buffered = value
      if !state.suspended {
        state.suspended = true
        // Under the lock, so a consumer that takes the value resumes a suspension C has seen.
        source.suspend()
      }
      return nil
    }
    consumer?.resume(returning: .success(value))
  }

  /// The source was cancelled (its cancel handler ran): the sequence ends
  /// once the buffered element, if any, is delivered.
  func finish() {
    let consumer: Consumer? = state.withLock { state in
      state.finished = true
      state.started = false  // cancelled already
      if state.buffered != nil { return nil }  // the consumer takes it, then nil
      defer { state.consumer = nil }
      return state.consumer
    }
    consumer?.resume(returning: .success(nil))
  }

  /// The loop ended, the task was cancelled or the sequence was dropped
  /// unused: ends the sequence and cancels the source (once) if the
  /// sequence started it.
  func terminate() {
    let (consumer, cancels): (Consumer?, Bool) = state.withLock { state in
      if state.finished && !state.started { return (nil, false) }
      let cancels = state.started
      state.finished = true
      state.started = false
      state.buffered = nil
      state.failure = nil
      defer { state.consumer = nil }
      return (state.consumer, cancels)
    }
    if cancels { source.cancel() }
    consumer?.resume(returning: .success(nil))
  }
}
