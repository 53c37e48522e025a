import Synchronization

extension SignalSource {
  /// Observes `signals` for the duration of `body`: creates one
  /// `SignalSource` per signal, starts them and waits until every one is
  /// registered (on a queue of the package's own: never on `queue`, which
  /// may be suspended or inactive), then calls `body` with the deliveries
  /// as an `AsyncSequence` of signal numbers (one element per delivery). When
  /// `body` returns or throws, the sources are cancelled and their cancel
  /// handlers have run before this returns; nothing outlives the scope.
  ///
  /// ```swift
  /// try await SignalSource.withSignals([SIGTERM, SIGINT]) { signals in
  ///   for await signal in signals { if signal == SIGTERM { break } }
  /// }
  /// ```
  ///
  /// A signal listed twice counts once (one source per signal); an empty
  /// list gives a sequence that ends at once.
  ///
  /// On Linux send signals to the process with `kill(getpid(), …)`:
  /// libdispatch reads them from a `signalfd` on its own thread, and a
  /// thread-directed signal (`raise`, `pthread_kill`) stays pending on the
  /// raising thread and never reaches a source. See `SignalSource` for the
  /// signal dispositions libdispatch changes.
  ///
  /// - Parameters:
  ///   - signals: The signals to observe, each observable (`canObserve(_:)`).
  ///   - queue: The queue the sources' handlers run on.
  ///   - isolation: The caller's isolation, inherited.
  ///   - body: The scope; its sequence ends when the scope does.
  /// - Returns: What `body` returns.
  /// - Throws: `GCDError` with `EINVAL` for a signal that cannot be
  ///   observed (before `body` runs; no source is created then); what
  ///   `body` throws.
  public static func withSignals<R>(
    _ signals: [Int32], queue: Queue = .global(), isolation: isolated (any Actor)? = #isolation,
    _ body: (Signals) async throws -> R
  ) async throws -> R {
    let cancelled = Group()
    // Every source is watching before the body runs (microseconds: the registration runs on the
    // package's queue and libdispatch's manager thread, never on a cooperative thread).
    let deliveries = try SignalDeliveries.start(
      signals, counting: .eachDelivery, queue: queue, operation: "SignalSource.withSignals(\(signals))"
    ) { source in
      cancelled.enter()
      source.setCancelHandler { cancelled.leave() }
    }
    do {
      let result = try await body(Signals(storage: deliveries))
      await end(deliveries, cancelled)
      return result
    } catch {
      await end(deliveries, cancelled)
      throw error
    }
  }

  /// Ends the deliveries (cancelling the sources) and waits for the sources' cancel handlers (from
  /// an unstructured task, which a cancellation of this one does not reach).
  private static func end(_ deliveries: SignalDeliveries, _ cancelled: Group) async {
    deliveries.terminate()
    await Task { try? await cancelled.wait() }.value
  }

  /// The deliveries of the signals of `withSignals`, one element (the
  /// signal number) per delivery; it ends when the scope does.
  ///
  /// `Sendable`: its state is in a class behind a mutex.
  public struct Signals: AsyncSequence, Sendable {
    /// It never throws.
    public typealias Failure = Never
    let storage: SignalDeliveries

    /// An iterator; every iterator shares the one stream of deliveries.
    public func makeAsyncIterator() -> Iterator { Iterator(storage: storage) }

    /// The iterator.
    ///
    /// `Sendable`: its state is in a class behind a mutex.
    public struct Iterator: AsyncIteratorProtocol, Sendable {
      let storage: SignalDeliveries

      /// The next delivered signal, or nil once the scope ended or the task is cancelled.
      public mutating func next() async -> Int32? { await storage.next() }

      /// The next delivered signal, or nil once the scope ended or the task is cancelled.
      ///
      /// - Parameter actor: The caller's isolation.
      public mutating func next(isolation actor: isolated (any Actor)?) async -> Int32? { await storage.next() }
    }
  }
}

// MARK: A signal sequence outside a scope

extension SignalSource {
  /// Observes `signals` from now on, in any scope: creates one
  /// `SignalSource` per signal, starts them and waits until every one is
  /// registered, then returns their deliveries as one `AsyncSequence` of
  /// signal numbers. Make it in one place (a service's start) and iterate
  /// it later, in a child task: a signal sent in between is kept.
  ///
  /// ```swift
  /// let signals = try SignalSource.sequence(of: [SIGTERM, SIGINT])
  /// for await signal in signals { if signal == SIGTERM { break } }
  /// ```
  ///
  /// The sources register on a queue of the package's own, never on
  /// `queue`: the call returns once the kernel watches (microseconds), also
  /// when `queue` is suspended, inactive, or the one the caller runs on
  /// (inside `queue.sync { }`, or `.main` before `Queue.dispatchMain()`);
  /// the deliveries then wait in the sources until `queue` runs.
  ///
  /// One element per event of a signal's source: deliveries of one signal
  /// that arrive before the consumer takes the last merge into one element
  /// (as the kernel merges a standard signal while it is pending, and the
  /// source merges its events), so memory stays bounded, one pending flag
  /// per signal; signals pending together come in the order they arrived.
  /// `cancel()`, leaving the loop, cancelling the task, or dropping a
  /// sequence that was never iterated cancels every source; nothing else
  /// does. Like `withSignals`, it leaves the dispositions libdispatch
  /// installed (see `SignalSource`), and signals are best sent with
  /// `kill(getpid(), …)`.
  ///
  /// - Parameters:
  ///   - signals: The signals to observe, each observable
  ///     (`canObserve(_:)`); a repeated signal counts once, and an empty
  ///     list gives a sequence that ends at once.
  ///   - queue: The queue the sources' handlers run on.
  /// - Returns: The deliveries; iterating them cannot fail.
  /// - Throws: `GCDError` with `EINVAL` for a signal that cannot be
  ///   observed (no source is created then).
  public static func sequence(of signals: [Int32], queue: Queue = .global()) throws(GCDError) -> SignalSequence {
    let deliveries = try SignalDeliveries.start(
      signals, counting: .eachEvent, queue: queue, operation: "SignalSource.sequence(of: \(signals))")
    return SignalSequence(owner: SignalSequenceOwner(storage: deliveries))
  }

  /// The deliveries of `sequence(of:)`: one signal number per event of a
  /// signal's source. It ends (and cancels the sources) at `cancel()`, when
  /// its iterator is dropped or its task cancelled, or when it is dropped
  /// unused.
  ///
  /// It has one iterator: a second `makeAsyncIterator()` is misuse and
  /// stops the process with a message.
  ///
  /// `Sendable`: it holds a class whose state is behind a mutex.
  public struct SignalSequence: AsyncSequence, Sendable {
    /// It never throws.
    public typealias Failure = Never

    let owner: SignalSequenceOwner

    /// The iterator. A second one stops the process with a message naming
    /// the call (the sequence has one consumer).
    public func makeAsyncIterator() -> Iterator {
      let storage = owner.storage
      guard storage.claimIterator() else {
        fatalError(
          "GCD: SignalSource.SignalSequence.makeAsyncIterator() called a second time: a signal sequence has one iterator (iterate it in one loop)"
        )
      }
      return Iterator(token: SignalSequenceToken(storage: storage))
    }

    /// Ends the sequence: its sources are cancelled, and the iterator's
    /// `next()` returns nil (at once if it waits). Again does nothing.
    public func cancel() { owner.storage.terminate() }

    /// The iterator. Dropping it (leaving the loop) cancels the sources.
    ///
    /// `Sendable`: its state is in a class behind a mutex.
    public struct Iterator: AsyncIteratorProtocol, Sendable {
      let token: SignalSequenceToken

      /// The next delivered signal, or nil once the sequence ended (`cancel()`, the task cancelled).
      public mutating func next() async -> Int32? { await token.storage.next() }

      /// The next delivered signal, or nil once the sequence ended.
      ///
      /// - Parameter actor: The caller's isolation.
      public mutating func next(isolation actor: isolated (any Actor)?) async -> Int32? {
        await token.storage.next()
      }
    }
  }
}

/// Held by the sequence: dropping one that made no iterator ends it.
final class SignalSequenceOwner: Sendable {
  let storage: SignalDeliveries
  init(storage: SignalDeliveries) { self.storage = storage }
  deinit { storage.sequenceDropped() }
}

/// Held by the iterator only: its end is the end of the loop.
final class SignalSequenceToken: Sendable {
  let storage: SignalDeliveries
  init(storage: SignalDeliveries) { self.storage = storage }
  deinit { storage.terminate() }
}

// MARK: The deliveries, for both

/// The deliveries of a set of signal sources to their consumer: the signals pending, in arrival
/// order, each once with a count, and the waiting consumer, under a lock; continuations resumed
/// outside it; the end (cancelling the sources) happens once. `withSignals` counts every delivery
/// (`.eachDelivery`: one element per delivery, a counter per signal) and its iterators share the
/// stream; `sequence(of:)` keeps one pending flag per signal (`.eachEvent`: one element per event
/// of a source, as the kernel merges a standard signal while it is pending) and has one iterator,
/// whose task's cancellation ends the sequence.
final class SignalDeliveries: Sendable {
  enum Counting {
    /// `withSignals`: one element per delivery; a task's cancellation ends only its `next()`.
    case eachDelivery
    /// `sequence(of:)`: one element per source event; a task's cancellation ends the sequence.
    case eachEvent
  }

  struct State: OneIteratorState {
    /// The signals pending, in the order they arrived, each once.
    var pending: [Int32] = []
    /// The elements each pending signal still owes (`.eachEvent`: always 1).
    var counts: [UInt] = []
    var consumer: UnsafeContinuation<Int32?, Never>?
    var finished = false
    var iterated = false
  }

  /// Cancelled at the end; a cancelled source's handlers are freed, which releases their hold on
  /// this storage.
  let sources: [SignalSource]
  let counting: Counting
  let state = Mutex(State())

  init(sources: [SignalSource], counting: Counting) {
    self.sources = sources
    self.counting = counting
  }

  /// One source per signal of `signals` (validated: `EINVAL` naming `operation`; repeats count
  /// once) on `queue`, each prepared by `prepare` and started, registered when this returns (an
  /// empty list: ended at once).
  static func start(
    _ signals: [Int32], counting: Counting, queue: Queue, operation: @autoclosure () -> String,
    prepare: (SignalSource) -> Void = { _ in }
  ) throws(GCDError) -> SignalDeliveries {
    let unique = try SignalSource.validated(signals, operation: operation())
    let sources = try unique.map { signal throws(GCDError) in try SignalSource(signal: signal, queue: queue) }
    let deliveries = SignalDeliveries(sources: sources, counting: counting)
    for source in sources {
      let signal = source.signal
      // The handlers hold the storage, never a source (the storage does).
      source.setEventHandler { (count: UInt) in deliveries.delivered(signal, count: count) }
      prepare(source)
      _ = source.claimStart()
    }
    Source.startRegistered(sources)
    if sources.isEmpty { deliveries.terminate() }
    return deliveries
  }

  /// An event of `signal`'s source (on its queue), merging `count` deliveries.
  func delivered(_ signal: Int32, count: UInt) {
    let owed = counting == .eachDelivery ? count : 1
    let consumer: UnsafeContinuation<Int32?, Never>? = state.withLock { state in
      if state.finished || owed == 0 { return nil }
      var rest = owed
      let consumer = state.consumer
      if consumer != nil {
        state.consumer = nil
        rest -= 1
      }
      if rest > 0 {
        if let index = state.pending.firstIndex(of: signal) {
          if counting == .eachDelivery { state.counts[index] += rest }
        } else {
          state.pending.append(signal)
          state.counts.append(rest)
        }
      }
      return consumer
    }
    consumer?.resume(returning: signal)
  }

  func next() async -> Int32? {
    await withTaskCancellationHandler {
      await withUnsafeContinuation { (consumer: UnsafeContinuation<Int32?, Never>) in
        let ready: Int32?? = state.withLock { state in
          if let signal = state.pending.first {
            state.counts[0] -= 1
            if state.counts[0] == 0 {
              state.pending.removeFirst()
              state.counts.removeFirst()
            }
            return .some(signal)
          }
          if state.finished || (counting == .eachDelivery && Task.isCancelled) { return .some(nil) }
          state.consumer = consumer
          return nil
        }
        if let ready { consumer.resume(returning: ready) }
      }
    } onCancel: {
      switch counting {
      case .eachEvent: terminate()
      case .eachDelivery:
        let consumer = state.withLock { state in
          defer { state.consumer = nil }
          return state.consumer
        }
        consumer?.resume(returning: nil)
      }
    }
  }

  /// How many consumers wait in `next()` (tests).
  var waitingConsumers: Int { state.withLock { $0.consumer == nil ? 0 : 1 } }

  /// Makes the one iterator of `sequence(of:)`; false for a second one.
  func claimIterator() -> Bool { state.claimIterator() }

  /// The sequence was dropped: ends it if it made no iterator.
  func sequenceDropped() {
    if !state.isIterated { terminate() }
  }

  /// Ends the deliveries and cancels the sources, once.
  func terminate() {
    let (consumer, ends): (UnsafeContinuation<Int32?, Never>?, Bool) = state.withLock { state in
      if state.finished { return (nil, false) }
      state.finished = true
      state.pending = []
      state.counts = []
      defer { state.consumer = nil }
      return (state.consumer, true)
    }
    guard ends else { return }
    for source in sources { source.cancel() }
    consumer?.resume(returning: nil)
  }
}
