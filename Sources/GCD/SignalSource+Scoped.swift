import Synchronization

extension SignalSource {
  /// Observes `signals` for the duration of `body`: creates one
  /// `SignalSource` per signal, starts them and waits until every one is
  /// registered, then calls `body` with the deliveries as an
  /// `AsyncSequence` of signal numbers (one element per delivery). When
  /// `body` returns or throws, the sources are cancelled and their cancel
  /// handlers have run before this returns; nothing outlives the scope.
  ///
  /// ```swift
  /// try await SignalSource.withSignals([SIGTERM, SIGINT]) { signals in
  ///   for await signal in signals { if signal == SIGTERM { break } }
  /// }
  /// ```
  ///
  /// On Linux send signals to the process with `kill(getpid(), …)`:
  /// libdispatch reads them from a `signalfd` on its own thread, and a
  /// thread-directed signal (`raise`, `pthread_kill`) stays pending on the
  /// raising thread and never reaches a source. See `SignalSource` for the
  /// signal dispositions libdispatch changes.
  ///
  /// - Parameters:
  ///   - signals: The signals to observe (each observable, see `SignalSource`).
  ///   - queue: The queue the sources' handlers run on.
  ///   - isolation: The caller's isolation, inherited.
  ///   - body: The scope; its sequence ends when the scope does.
  /// - Returns: What `body` returns.
  /// - Throws: `GCDError` for a signal that cannot be observed; what `body` throws.
  public static func withSignals<R>(
    _ signals: [Int32], queue: Queue = .global(), isolation: isolated (any Actor)? = #isolation,
    _ body: (Signals) async throws -> R
  ) async throws -> R {
    let storage = SignalsStorage()
    let sources = try signals.map { signal throws(GCDError) in try SignalSource(signal: signal, queue: queue) }
    let registered = Group()
    let cancelled = Group()
    for source in sources {
      registered.enter()
      cancelled.enter()
      let signal = source.signal
      source.setEventHandler { [unowned source] in storage.delivered(signal, count: source.count) }
      source.setRegistrationHandler { registered.leave() }
      source.setCancelHandler { cancelled.leave() }
      source.resume()
    }
    defer { withExtendedLifetime(sources) {} }
    do {
      // Every source is watching before the body runs (even if the task is cancelled meanwhile).
      await Task { try? await registered.wait() }.value
      let result = try await body(Signals(storage: storage))
      await end(sources, storage, cancelled)
      return result
    } catch {
      await end(sources, storage, cancelled)
      throw error
    }
  }

  /// Cancels the sources and waits for their cancel handlers (from an
  /// unstructured task, which a cancellation of this one does not reach).
  private static func end(_ sources: [SignalSource], _ storage: SignalsStorage, _ cancelled: Group) async {
    for source in sources { source.cancel() }
    await Task { try? await cancelled.wait() }.value
    storage.finish()
  }

  /// The deliveries of the signals of `withSignals`, one element (the
  /// signal number) per delivery; it ends when the scope does.
  ///
  /// `Sendable`: its state is in a class behind a mutex.
  public struct Signals: AsyncSequence, Sendable {
    /// It never throws.
    public typealias Failure = Never
    let storage: SignalsStorage

    /// An iterator; every iterator shares the one stream of deliveries.
    public func makeAsyncIterator() -> Iterator { Iterator(storage: storage) }

    /// The iterator.
    ///
    /// `Sendable`: its state is in a class behind a mutex.
    public struct Iterator: AsyncIteratorProtocol, Sendable {
      let storage: SignalsStorage

      /// The next delivered signal, or nil once the scope ended or the task is cancelled.
      public mutating func next() async -> Int32? { await storage.next() }

      /// The next delivered signal, or nil once the scope ended or the task is cancelled.
      ///
      /// - Parameter actor: The caller's isolation.
      public mutating func next(isolation actor: isolated (any Actor)?) async -> Int32? { await storage.next() }
    }
  }
}

/// Pending deliveries per signal (bounded: one counter per signal) and the
/// waiting consumer, under a lock; continuations resumed outside it.
final class SignalsStorage: Sendable {
  struct State {
    var pending: [(signal: Int32, count: UInt)] = []
    var consumer: UnsafeContinuation<Int32?, Never>?
    var finished = false
  }

  let state = Mutex(State())

  func delivered(_ signal: Int32, count: UInt) {
    let consumer: UnsafeContinuation<Int32?, Never>? = state.withLock { state in
      if state.finished { return nil }
      var count = count
      if let consumer = state.consumer {
        state.consumer = nil
        count -= 1
        if count > 0 { state.add(signal, count) }
        return consumer
      }
      state.add(signal, count)
      return nil
    }
    consumer?.resume(returning: signal)
  }

  func next() async -> Int32? {
    await withTaskCancellationHandler {
      await withUnsafeContinuation { (consumer: UnsafeContinuation<Int32?, Never>) in
        let ready: Int32?? = state.withLock { state in
          if let signal = state.take() { return .some(signal) }
          if state.finished || Task.isCancelled { return .some(nil) }
          state.consumer = consumer
          return nil
        }
        if let ready { consumer.resume(returning: ready) }
      }
    } onCancel: {
      let consumer = state.withLock { state in
        defer { state.consumer = nil }
        return state.consumer
      }
      consumer?.resume(returning: nil)
    }
  }

  func finish() {
    let consumer = state.withLock { state in
      state.finished = true
      state.pending = []
      defer { state.consumer = nil }
      return state.consumer
    }
    consumer?.resume(returning: nil)
  }
}

extension SignalsStorage.State {
  mutating func add(_ signal: Int32, _ count: UInt) {
    if let index = pending.firstIndex(where: { $0.signal == signal }) {
      pending[index].count += count
    } else {
      pending.append((signal, count))
    }
  }

  mutating func take() -> Int32? {
    guard !pending.isEmpty else { return nil }
    let signal = pending[0].signal
    pending[0].count -= 1
    if pending[0].count == 0 { pending.removeFirst() }
    return signal
  }
}
