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
    await #expect(processExitsWith: .success) {
      let signals = try SignalSource.sequence(of: [SIGUSR1, SIGUSR2, SIGHUP])
      for signal in [SIGUSR1, SIGUSR2, SIGHUP] { kill(getpid(), signal) }
      var seen: Set<Int32> = []
      for try await signal in signals {
        seen.insert(signal)
        if seen.count == 3 { break }
      }
      childCheck(seen == [SIGUSR1, SIGUSR2, SIGHUP], "seen \(seen)")
    }
  }

  @Test("consumed in a child task later: deliveries while no one iterates merge, one pending per signal")
  func childTaskAndMerging() async {
    await #expect(processExitsWith: .success) {
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
      let first = try await withThrowingTaskGroup(of: [Int32].self) { group in
        group.addTask {
          var got: [Int32] = []
          for try await signal in signals {
            got.append(signal)
            if got.count == 2 { break }
          }
          return got
        }
        return try await group.next() ?? []
      }
      childCheck(first == [SIGUSR2, SIGUSR1], "got \(first)")
      childCheck(storage.sources.allSatisfy { $0.isCancelled }, "leaving the loop left a source running")
    }
  }

  @Test("a sequence dropped without iterating cancels every source; a second iterator throws EBUSY")
  func droppedCancelsAll() async throws {
    // SIGWINCH and SIGURG are ignored by default (and owned by SourceEventsTests: not sent here).
    var signals: SignalSource.SignalSequence? = try SignalSource.sequence(of: [SIGWINCH, SIGURG, SIGWINCH])
    let sources = signals!.owner.storage.sources
    #expect(sources.map(\.signal) == [SIGWINCH, SIGURG])
    #expect(sources.allSatisfy { !$0.isCancelled })
    signals = nil
    #expect(sources.allSatisfy { $0.isCancelled })

    let iterated = try SignalSource.sequence(of: [SIGURG])
    let first = iterated.makeAsyncIterator()
    var second = iterated.makeAsyncIterator()
    let error = await #expect(throws: GCDError.self) { try await second.next() }
    #expect(error?.errno == EBUSY)
    #expect(!iterated.owner.storage.sources[0].isCancelled)
    withExtendedLifetime(first) {}
  }

  @Test("cancelling the consuming task ends the loop and cancels the sources")
  func taskCancellation() async throws {
    let signals = try SignalSource.sequence(of: [SIGURG])
    let sources = signals.owner.storage.sources
    let consumer = Task {
      var count = 0
      for try await _ in signals { count += 1 }
      return count
    }
    consumer.cancel()
    _ = try await consumer.value
    #expect(sources.allSatisfy { $0.isCancelled })
  }

  @Test("bad signals throw EINVAL at the call")
  func badSignals() {
    for bad in [[SIGKILL], [SIGTERM, SIGSEGV], [0], [65], []] as [[Int32]] {
      let error = #expect(throws: GCDError.self) { try SignalSource.sequence(of: bad) }
      #expect(error?.errno == EINVAL, "\(bad)")
    }
  }
}
