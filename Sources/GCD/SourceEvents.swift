import Synchronization

/// The events of a source as an `AsyncSequence`: `for try await value in
/// source.events { … }`, one element per (merged) event, typed per source
/// (`UInt` for the data, timer, signal, read and write sources,
/// `ProcEvents` and `FileSystemEvents`).
///
/// The first `next()` installs the sequence as the source's event handler,
/// starts the source (it must not have been started: iterating is how it
/// is started) and waits for its registration, so no event after that
/// point is lost. The source's registration handler, if you set one, runs
/// first: code that must know the source is watching waits for it.
///
/// Back-pressure is the source's own merging: while the consumer is busy
/// the source is suspended, and what arrives meanwhile merges in it (data
/// sources add, OR or replace; timers and signals count; file-system and
/// process events OR), so memory stays flat however fast the producer is,
/// and the element the consumer gets next sums everything since the last.
///
/// Leaving the loop (breaking out, returning, throwing) or cancelling the
/// task cancels the source, once; its cancel handler runs once. The
/// sequence finishes (`next()` returns nil) when the source is cancelled,
/// by the loop or by anyone else, after delivering an element already
/// taken from the source.
///
/// A source has one event sequence: the source is started by the first
/// iteration, and a second one throws.
///
/// `Sendable`: it holds the source (which is) and a `@Sendable` conversion.
public struct SourceEvents<Element: Sendable>: AsyncSequence, Sendable {
  /// The error `next()` throws: the source was started (or iterated) already.
  public typealias Failure = GCDError

  let source: Source
  let element: @Sendable (UInt) -> Element

  init(source: Source, element: @escaping @Sendable (UInt) -> Element) {
    self.source = source
    self.element = element
  }

  /// A new iterator; the first call of its `next()` starts the source.
  public func makeAsyncIterator() -> Iterator {
    Iterator(storage: EventsStorage(source: source, element: element))
  }

  /// The iterator. Dropping it (leaving the loop) cancels the source.
  ///
  /// `Sendable`: its state is in a class behind a mutex.
  public struct Iterator: AsyncIteratorProtocol, Sendable {
    let token: EventsToken<Element>

    init(storage: EventsStorage<Element>) {
      token = EventsToken(storage: storage)
    }

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Throws: `GCDError` with `EBUSY` when the source was started
    ///   before the first `next()` (by `resume()` or another sequence).
    public mutating func next() async throws(GCDError) -> Element? {
      try await token.storage.next()
    }

    /// The next event, or nil once the source is cancelled.
    ///
    /// - Parameter actor: The caller's isolation (the element is `Sendable`).
    /// - Throws: `GCDError` with `EBUSY` when the source was started before.
    public mutating func next(isolation actor: isolated (any Actor)?) async throws(GCDError) -> Element? {
      try await token.storage.next()
    }
  }
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

  enum Phase {
    /// Not iterated yet.
    case initial
    /// Started; waiting for the registration handler.
    case registering
    /// Registered: events flow.
    case running
    /// Cancelled, or the loop ended.
    case finished
  }

  struct State {
    var phase = Phase.initial
    /// An event taken from the source that the consumer has not asked for
    /// yet; the source is suspended while it is here.
    var buffered: Element?
    /// This sequence suspended the source (back-pressure).
    var suspended = false
    var consumer: Consumer?
  }

  enum Action {
    case none
    case start
    case deliver(Consumer, Element?, resumeSource: Bool)
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
            return .deliver(consumer, value, resumeSource: state.suspended)
          }
          switch state.phase {
          case .initial:
            state.phase = .registering
            state.consumer = consumer
            return .start
          case .registering, .running:
            state.consumer = consumer
            return .none
          case .finished:
            return .deliver(consumer, nil, resumeSource: false)
          }
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
    case .start: start()
    case .deliver(let consumer, let value, let resumeSource):
      if resumeSource { source.resume() }
      consumer.resume(returning: .success(value))
    }
  }

  /// Claims the start of the source, installs the handlers and starts it;
  /// unless it was started (or suspended) already: then `EBUSY`, or the end
  /// for a cancelled source. The claim and the check are one atomic step,
  /// so of two sequences, or a sequence and a `resume()`, exactly one starts
  /// the source, and the other never touches its handlers.
  func start() {
    let claim = source.lifecycle.update { $0.claimStart() }
    if claim != .activate {
      if source.lifecycle.load(ordering: .acquiring).isCancelled {
        finish()
        return
      }
      let taken = state.withLock { state in
        state.phase = .finished
        defer { state.consumer = nil }
        return state.consumer
      }
      taken?.resume(
        returning: .failure(
          GCDError(
            operation: "\(type(of: source)).events", errno: Errno.busy,
            detail:
              "the source was already started (by resume() or another iteration); the sequence starts it: iterate before resume()"
          )))
      return
    }
    // Set before the C source is activated: libdispatch installs a handler
    // set on an active source asynchronously. Meanwhile the word says
    // active, so a `resume()` stops as on any running source, and a
    // `cancel()` leaves the start to this call.
    source.setEventHandler { [self] in received(source.data) }
    source.handlers.setCancelHook { [self] in finish() }
    source.handlers.setRegistration(hook: { [self] in registered() })
    source.onActivate?()
    claim.perform(on: source.raw)
  }

  /// The registration handler ran: events flow from now on.
  func registered() {
    state.withLock { state in
      if state.phase == .registering { state.phase = .running }
    }
  }

  /// An event (on the source's queue).
  func received(_ data: UInt) {
    let value = element(data)
    let consumer: Consumer? = state.withLock { state in
      if state.phase == .finished { return nil }
      state.phase = .running  // the registration handler runs first; this only makes it certain
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
      state.phase = .finished
      if state.buffered != nil { return nil }  // the consumer takes it, then nil
      defer { state.consumer = nil }
      return state.consumer
    }
    consumer?.resume(returning: .success(nil))
  }

  /// The loop ended or the task was cancelled: ends the sequence and
  /// cancels the source (once) if the sequence started it.
  func terminate() {
    let (consumer, started): (Consumer?, Bool) = state.withLock { state in
      if state.phase == .finished { return (nil, false) }
      let started = state.phase != .initial
      state.phase = .finished
      state.buffered = nil
      defer { state.consumer = nil }
      return (state.consumer, started)
    }
    if started { source.cancel() }
    consumer?.resume(returning: .success(nil))
  }
}
