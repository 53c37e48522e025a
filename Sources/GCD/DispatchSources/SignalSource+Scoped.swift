import Synchronization

extension SignalSource {
  /// Observes `signals` for the duration of `body`: creates one
  /// `SignalSource` per signal, starts them and waits until every one is
  /// registered (on a queue of the package's own: never on `queue`, which
  /// may be suspended or inactive), then calls `body` with the deliveries
  /// as an `AsyncSequence` of signal numbers (one element per delivery). When
  /// `body` returns or throws, the sources are cancelled, and libdispatch has
  /// run their cancellation (the kernel no longer watches them) before this
  /// returns; nothing outlives the scope.
  ///
  /// Nothing of it waits for `queue`: the sources stay on the package's
  /// queue, where their deliveries reach the sequence and their cancellation
  /// ends, so the scope ends also while `queue` is suspended or inactive.
  ///
  /// The sequence may be iterated by several tasks at once: each delivery
  /// goes to one of the waiting iterators, the one waiting longest (first
  /// in, first out), or is kept until an iterator asks. A `next()` whose
  /// task is cancelled returns nil at once (the others go on waiting); at
  /// the end of the scope every waiting `next()` returns nil, and every later
  /// one too.
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
  ///   - queue: The sources' queue (`SignalSource.queue`); the sequence
  ///     never waits for it.
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
      // The package's hook, run by the cancel block on the package's queue: never on `queue`.
      source.state.setCancelHook { cancelled.leave() }
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

  /// Ends the deliveries (cancelling the sources) and waits for the sources' cancel blocks (from
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

    /// An iterator; every iterator shares the one stream of deliveries: each delivery goes to one
    /// waiting iterator, the one waiting longest.
    public func makeAsyncIterator() -> Iterator { Iterator(storage: storage) }

    /// The iterator.
    ///
    /// `Sendable`: its state is in a class behind a mutex.
    public struct Iterator: AsyncIteratorProtocol, Sendable {
      let storage: SignalDeliveries

      /// The next delivered signal (each goes to one iterator: of several waiting, the one waiting
      /// longest), or nil once the scope ended or the task is cancelled.
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
  /// The sources register, and stay, on a queue of the package's own, never
  /// on `queue`: the call returns once the kernel watches (microseconds),
  /// also when `queue` is suspended, inactive, or the one the caller runs on
  /// (inside `queue.sync { }`, or `.main` before `Queue.dispatchMain()`),
  /// and the deliveries reach the sequence without waiting for `queue`. No
  /// source is given a new target queue once active (libdispatch's
  /// deprecated use, which `LIBDISPATCH_STRICT=1` stops).
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
  ///   - queue: The sources' queue (`SignalSource.queue`); the sequence
  ///     never waits for it.
  /// - Returns: The deliveries; iterating them cannot fail.
  /// - Throws: `GCDError` with `EINVAL` for a signal that cannot be
  ///   observed (no source is created then).
  public static func sequence(of signals: [Int32], queue: Queue = .global()) throws(GCDError) -> SignalSequence {
    let deliveries = try SignalDeliveries.start(
      signals, counting: .eachEvent, queue: queue, operation: "SignalSource.sequence(of: \(signals))")
    return SignalSequence(owner: SignalSequenceOwner(storage: deliveries))
  }

  /// Observes those of `signals` that a source can observe, from now on,
  /// as `sequence(of:queue:)` does; it never throws: the signals
  /// `canObserve(_:)` rejects are left out, as
  /// `signals.filter(SignalSource.canObserve)` would leave them. For a list
  /// that is filtered already, or made of signals known to be observable,
  /// so that no `do`/`catch` is needed.
  ///
  /// ```swift
  /// let signals = SignalSource.sequence(ofObservable: [SIGTERM, SIGINT, SIGHUP])
  /// ```
  ///
  /// - Parameters:
  ///   - signals: The signals; a repeated one counts once, and a list with
  ///     none observable gives a sequence that ends at once.
  ///   - queue: The sources' queue (`SignalSource.queue`); the sequence
  ///     never waits for it.
  /// - Returns: The deliveries; iterating them cannot fail.
  public static func sequence(ofObservable signals: [Int32], queue: Queue = .global()) -> SignalSequence {
    do {
      return try sequence(of: signals.filter(canObserve), queue: queue)
    } catch {
      // `sequence(of:)` throws only `EINVAL` for a signal `canObserve(_:)` rejects.
      fatalError("GCD: SignalSource.sequence(ofObservable:) could not observe \(signals): \(error)")
    }
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

/// The deliveries of a set of signal sources to their consumers, as swift-async-algorithms bridges
/// callbacks: a small state machine under a lock whose transitions return what to do, the
/// continuations resumed outside it, each consumer's task cancellation entering it as an event
/// (`withTaskCancellationHandler`), and the end delivered exactly once (`terminate`, which
/// cancels the sources).
///
/// `withSignals` counts every delivery (`.eachDelivery`: one element per delivery, a counter per
/// signal) and serves several iterators: each element goes to one consumer, the one waiting
/// longest (first in, first out); a consumer's task cancellation ends only its own `next()` (nil);
/// the end resumes every waiting consumer with nil. `sequence(of:)` keeps one pending flag per
/// signal (`.eachEvent`: one element per event of a source, as the kernel merges a standard signal
/// while it is pending) and has one iterator, whose task's cancellation ends the sequence.
final class SignalDeliveries: Sendable {
  enum Counting {
    /// `withSignals`: one element per delivery; a task's cancellation ends only its `next()`.
    case eachDelivery
    /// `sequence(of:)`: one element per source event; a task's cancellation ends the sequence.
    case eachEvent
  }

  typealias Consumer = UnsafeContinuation<Int32?, Never>

  struct State: OneIteratorState {
    /// The signals pending, in the order they arrived, each once.
    var pending: [Int32] = []
    /// The elements each pending signal still owes (`.eachEvent`: always 1).
    var counts: [UInt] = []
    /// The consumers waiting in `next()`, the longest-waiting first, each with its id.
    var consumers: [(id: UInt64, continuation: Consumer)] = []
    /// The id of the next `next()` call.
    var nextID: UInt64 = 0
    var finished = false
    var iterated = false

    /// The consumer `next()` registers (`id`): an element at once, the end, or nil to wait.
    mutating func consume(id: UInt64, _ consumer: Consumer, cancelled: Bool) -> Int32?? {
      if let signal = pending.first {
        counts[0] -= 1
        if counts[0] == 0 {
          pending.removeFirst()
          counts.removeFirst()
        }
        return .some(signal)
      }
      if finished || cancelled { return .some(nil) }
      consumers.append((id, consumer))
      return nil
    }

    /// `owed` elements of `signal`: to the waiting consumers, longest-waiting first, the rest
    /// pending (merged per signal). Returns the consumers to resume with `signal`.
    mutating func deliver(_ signal: Int32, owed: UInt, merging: Bool) -> [Consumer] {
      if finished || owed == 0 { return [] }
      let served = Int(min(owed, UInt(consumers.count)))
      let resumed = consumers.prefix(served).map(\.continuation)
      consumers.removeFirst(served)
      let rest = owed - UInt(served)
      if rest > 0 {
        if let index = pending.firstIndex(of: signal) {
          if merging { counts[index] += rest }
        } else {
          pending.append(signal)
          counts.append(rest)
        }
      }
      return resumed
    }

    /// The consumer `id` was cancelled: taken out if it waits (its continuation returned, to be
    /// resumed with nil); nil if it has not registered yet (it sees its task cancelled when it
    /// does) or was served already.
    mutating func cancel(id: UInt64) -> Consumer? {
      guard let index = consumers.firstIndex(where: { $0.id == id }) else { return nil }
      return consumers.remove(at: index).continuation
    }

    /// The end, once: every waiting consumer, to resume with nil; nil when it had ended already.
    mutating func finish() -> [Consumer]? {
      if finished { return nil }
      finished = true
      pending = []
      counts = []
      defer { consumers = [] }
      return consumers.map(\.continuation)
    }
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
      // The handlers hold the storage, never a source (the storage does). Set before the start:
      // the package's own handler, it runs where the source does (`Registration.queue`), never
      // waiting for `queue`.
      source.setEventHandler { (count: UInt) in deliveries.delivered(signal, count: count) }
      prepare(source)
      _ = source.claimStart()
    }
    Source.startRegistered(sources)
    if sources.isEmpty { deliveries.terminate() }
    return deliveries
  }

  /// An event of `signal`'s source, merging `count` deliveries.
  func delivered(_ signal: Int32, count: UInt) {
    let owed = counting == .eachDelivery ? count : 1
    let consumers = state.withLock { $0.deliver(signal, owed: owed, merging: counting == .eachDelivery) }
    for consumer in consumers { consumer.resume(returning: signal) }
  }

  func next() async -> Int32? {
    let id = state.withLock { state in
      defer { state.nextID += 1 }
      return state.nextID
    }
    return await withTaskCancellationHandler {
      await withUnsafeContinuation { (consumer: Consumer) in
        // A cancellation before this point finds no consumer `id`; the task is cancelled then,
        // which this sees under the same lock (`.eachDelivery`; `.eachEvent`'s ends the sequence).
        let ready = state.withLock { state in
          state.consume(id: id, consumer, cancelled: counting == .eachDelivery && Task.isCancelled)
        }
        if let ready { consumer.resume(returning: ready) }
      }
    } onCancel: {
      switch counting {
      case .eachEvent: terminate()
      case .eachDelivery: state.withLock { $0.cancel(id: id) }?.resume(returning: nil)
      }
    }
  }

  /// How many consumers wait in `next()` (tests).
  var waitingConsumers: Int { state.withLock { $0.consumers.count } }

  /// Makes the one iterator of `sequence(of:)`; false for a second one.
  func claimIterator() -> Bool { state.claimIterator() }

  /// The sequence was dropped: ends it if it made no iterator.
  func sequenceDropped() {
    if !state.isIterated { terminate() }
  }

  /// Ends the deliveries and cancels the sources, once.
  func terminate() {
    guard let consumers = state.withLock({ $0.finish() }) else { return }
    for source in sources { source.cancel() }
    for consumer in consumers { consumer.resume(returning: nil) }
  }
}
