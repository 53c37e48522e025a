import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `SignalSource.sequence(of:)`: registered at the call, one element per
/// source event, ends (cancelling every source) when left or dropped. The
/// signals are sent in exit-test children: their default actions end the
/// process, so a signal the sequence missed fails the test.
@Suite("SignalSource.sequence(of:)")
struct SignalSequenceTests {
  @Test("several signals sent right after the call, before iterating: every one is seen")
  func sentBeforeIterating() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        let signals = try SignalSource.sequence(of: [SIGUSR1, SIGUSR2, SIGHUP])
        for signal in [SIGUSR1, SIGUSR2, SIGHUP] { kill(getpid(), signal) }
        var seen: Set<Int32> = []
        for await signal in signals {
          seen.insert(signal)
          if seen.count == 3 { break }
        }
        childCheck(seen == [SIGUSR1, SIGUSR2, SIGHUP], "seen \(seen)")
      })
  }

  @Test("consumed in a child task later: deliveries while no one iterates merge, one pending per signal")
  func childTaskAndMerging() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        let signals = try SignalSource.sequence(of: [SIGUSR1, SIGUSR2])
        let storage = signals.owner.storage
        kill(getpid(), SIGUSR2)
        childCheck(
          await eventually { storage.state.withLock { $0.pending == [SIGUSR2] } }, "SIGUSR2 never pending")
        for _ in 0..<5 { kill(getpid(), SIGUSR2) }
        kill(getpid(), SIGUSR1)
        childCheck(
          await eventually { storage.state.withLock { $0.pending == [SIGUSR2, SIGUSR1] } },
          "pending: \(storage.state.withLock { $0.pending })")
        let first = await withTaskGroup(of: [Int32].self) { group in
          group.addTask {
            var got: [Int32] = []
            for await signal in signals {
              got.append(signal)
              if got.count == 2 { break }
            }
            return got
          }
          return await group.next() ?? []
        }
        childCheck(first == [SIGUSR2, SIGUSR1], "got \(first)")
        childCheck(storage.sources.allSatisfy { $0.isCancelled }, "leaving the loop left a source running")
      })
  }

  @Test("a sequence dropped without iterating cancels every source; a signal listed twice counts once")
  func droppedCancelsAll() throws {
    // SIGWINCH and SIGURG are ignored by default (and owned by SourceEventsTests: not sent here).
    var signals: SignalSource.SignalSequence? = try SignalSource.sequence(of: [SIGWINCH, SIGURG, SIGWINCH])
    let sources = signals!.owner.storage.sources
    #expect(sources.map(\.signal) == [SIGWINCH, SIGURG])
    #expect(sources.allSatisfy { !$0.isCancelled })
    signals = nil
    #expect(sources.allSatisfy { $0.isCancelled })
  }

  @Test("a second iterator is misuse: it stops the process with a message naming the call")
  func secondIteratorStops() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let signals = try SignalSource.sequence(of: [SIGURG])
      let first = signals.makeAsyncIterator()
      _ = signals.makeAsyncIterator()
      withExtendedLifetime(first) {}
    }
    #expect(standardError(of: result).contains("SignalSequence.makeAsyncIterator()"), "\(standardError(of: result))")
  }

  @Test("an empty list is a sequence that ends at once")
  func emptyListEndsAtOnce() async throws {
    let signals = try SignalSource.sequence(of: [])
    var count = 0
    for await _ in signals { count += 1 }
    #expect(count == 0)
    #expect(signals.owner.storage.sources.isEmpty)
  }

  @Test("cancel() ends the sequence: the waiting iterator returns nil, every source is cancelled")
  func cancelEnds() async throws {
    // Real-time signals no test sends (SIGURG and SIGWINCH are sent in this process by
    // SourceEventsTests): the consumer waits from its first next() on.
    let unsent = [__libc_current_sigrtmin() + 7, __libc_current_sigrtmin() + 8]
    let signals = try SignalSource.sequence(of: unsent)
    let storage = signals.owner.storage
    let consumer = Task {
      var count = 0
      for await _ in signals { count += 1 }
      return count
    }
    #expect(await eventually { storage.waitingConsumers == 1 })
    signals.cancel()
    #expect(await consumer.value == 0)
    #expect(storage.sources.allSatisfy { $0.isCancelled })
    signals.cancel()  // once is enough; again does nothing
  }

  @Test("cancelling the consuming task ends the loop and cancels the sources")
  func taskCancellation() async throws {
    let signals = try SignalSource.sequence(of: [SIGURG])
    let sources = signals.owner.storage.sources
    let consumer = Task {
      var count = 0
      for await _ in signals { count += 1 }
      return count
    }
    consumer.cancel()
    _ = await consumer.value
    #expect(sources.allSatisfy { $0.isCancelled })
  }

  @Test("bad signals throw EINVAL at the call, for sequence(of:) and withSignals alike")
  func badSignals() async {
    let bad: [[Int32]] = [[SIGKILL], [SIGTERM, SIGSEGV], [0], [65], [32], [SIGUSR1, 33]]
    for signals in bad {
      let error = #expect(throws: GCDError.self) { try SignalSource.sequence(of: signals) }
      #expect(error?.errno == EINVAL, "\(signals)")
      let scoped = await #expect(throws: GCDError.self) {
        try await SignalSource.withSignals(signals) { _ in Issue.record("the body ran for \(signals)") }
      }
      #expect(scoped?.errno == EINVAL, "\(signals)")
    }
  }

  @Test("withSignals: a signal listed twice counts once per delivery")
  func scopedRepeatsCountOnce() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        alarm(30)
        let queue = Queue(label: "signals.repeated")
        let got = try await SignalSource.withSignals([SIGUSR1, SIGUSR1, SIGUSR2], queue: queue) { signals in
          var got: [Int32] = []
          kill(getpid(), SIGUSR1)
          for await signal in signals {
            got.append(signal)
            // Sent after the first element: a second source of SIGUSR1 (merged by the same manager pass)
            // has queued its element on the serial queue before this one is even read.
            if got.count == 1 { kill(getpid(), SIGUSR2) }
            if signal == SIGUSR2 { break }
          }
          return got
        }
        childCheck(got == [SIGUSR1, SIGUSR2], "got \(got)")
        endChild("ok")
      })
  }
}

/// `withSignals`' sequence serves several iterators: each delivery goes to one waiting consumer,
/// the one waiting longest; the end of the scope resumes every waiting consumer with nil, and a
/// cancelled consumer's `next()` returns nil at once while the others wait on.
extension SignalSequenceTests {
  /// A real-time signal no test sends: the consumers wait from their first `next()` on.
  static let unsentSignal = __libc_current_sigrtmin() + 9

  // In exit-test children bounded by `alarm(30)`: a consumer that is never resumed would hang the
  // whole test process (a time limit records an issue but cannot end a task that never resumes).
  // The alarm bounds the child; the parent's limit also counts the wait for the child to start,
  // which under AddressSanitizer, beside the suite's other exit tests, passed 60 s (a fresh-clone
  // CI run: both tests' children were still queued at 60 s, every exit test ended at 107 s).
  @Test("withSignals: two iterating tasks; the scope ends; both return nil", .timeLimit(.minutes(5)))
  func scopedTwoIterators() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        alarm(30)
        let (first, second) = try await SignalSource.withSignals([Self.unsentSignal]) { signals in
          await twoWaitingConsumers(of: signals)
        }
        childCheck(await first.value == nil, "the first got a signal")
        childCheck(await second.value == nil, "the second got a signal")
        endChild("ok")
      })
  }

  @Test(
    "withSignals: of two waiting tasks, a cancelled one returns nil; the other waits for the end",
    .timeLimit(.minutes(5)))
  func scopedCancelledIterator() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        alarm(30)
        let other = try await SignalSource.withSignals([Self.unsentSignal]) { signals in
          let storage = signals.storage
          let (cancelled, other) = await twoWaitingConsumers(of: signals)
          cancelled.cancel()
          childCheck(await cancelled.value == nil, "the cancelled one got a signal")
          childCheck(storage.waitingConsumers == 1, "\(storage.waitingConsumers) wait after the cancellation")
          return other
        }
        childCheck(await other.value == nil, "the other got a signal")
        endChild("ok")
      })
  }

  @Test("withSignals: each delivery goes to one waiting consumer, the one waiting longest")
  func scopedDeliveriesFIFO() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        alarm(30)
        let got = try await SignalSource.withSignals([SIGUSR1, SIGUSR2]) { signals in
          let storage = signals.storage
          let (first, second) = await twoWaitingConsumers(of: signals)
          kill(getpid(), SIGUSR1)
          let one = await first.value
          childCheck(storage.waitingConsumers == 1, "the delivery woke \(2 - storage.waitingConsumers)")
          kill(getpid(), SIGUSR2)
          return [one, await second.value]
        }
        childCheck(got == [SIGUSR1, SIGUSR2], "got \(got)")
        endChild("ok")
      })
  }
}

extension SignalSequenceTests {
  @Test("sequence(ofObservable:) never throws: what canObserve rejects is left out, a repeat counts once")
  func observableNeverThrows() {
    // SIGWINCH and SIGURG are ignored by default (and owned by SourceEventsTests: not sent here).
    let signals = SignalSource.sequence(ofObservable: [SIGKILL, SIGWINCH, 0, SIGSEGV, SIGURG, SIGWINCH, 32])
    let sources = signals.owner.storage.sources
    #expect(sources.map(\.signal) == [SIGWINCH, SIGURG])
    signals.cancel()
    #expect(sources.allSatisfy { $0.isCancelled })
  }

  @Test("sequence(ofObservable:) of nothing observable ends at once")
  func observableNoneEnds() async {
    var count = 0
    for await _ in SignalSource.sequence(ofObservable: [SIGKILL, SIGSTOP]) { count += 1 }
    #expect(count == 0)
  }
}

/// How many C sources of `cancelledSourcesFreed` libdispatch has freed (their finalizers ran).
private let freedSources = Atomic(0)

extension SignalSequenceTests {
  /// A sequence's sources hold their C sources until their cancellation ran (for the blocks they
  /// send on to the user's queue): the cancel block must run, and release, also for a source with
  /// no cancel handler. Before it did, every C source of `sequence(of:)` leaked.
  @Test("a cancelled sequence's C sources are freed: their finalizers run", .timeLimit(.minutes(1)))
  func cancelledSourcesFreed() async throws {
    // Real-time signals no test sends.
    let unsent = [__libc_current_sigrtmin() + 10, __libc_current_sigrtmin() + 11]
    var signals: SignalSource.SignalSequence? = try SignalSource.sequence(of: unsent)
    for source in signals!.owner.storage.sources {
      // libdispatch calls a finalizer only with a context.
      source.context = UnsafeMutableRawPointer(bitPattern: 1)
      source.setFinalizer { _ in freedSources.add(1, ordering: .relaxed) }
    }
    signals!.cancel()
    signals = nil
    #expect(await eventually { freedSources.load(ordering: .relaxed) == 2 })
  }
}

/// Two tasks each waiting in `next()` of its own iterator of `signals`, the first waiting before the
/// second starts (in an exit-test child: a consumer that never waits ends it).
private func twoWaitingConsumers(
  of signals: SignalSource.Signals
) async -> (Task<Int32?, Never>, Task<Int32?, Never>) {
  func consumer() -> Task<Int32?, Never> {
    Task {
      var iterator = signals.makeAsyncIterator()
      return await iterator.next()
    }
  }
  let first = consumer()
  childCheck(await eventually { signals.storage.waitingConsumers == 1 }, "the first never waited")
  let second = consumer()
  childCheck(await eventually { signals.storage.waitingConsumers == 2 }, "the second never waited")
  return (first, second)
}
