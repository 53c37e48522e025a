import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Making `events` starts the source: what arrives before the first
/// `next()` is kept (merged in the suspended source), and a sequence that
/// is dropped unused cancels its source.
@Suite("SourceEvents start")
struct SourceEventsStartTests {
  @Test("a signal sent after making the sequence and before iterating it is seen, not the default action")
  func signalBeforeFirstNext() async {
    // SIGUSR1's default action ends the process: before the sequence
    // started its source when made, this child died of it.
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        let source = try SignalSource(signal: SIGUSR1, queue: Queue(label: "events.early"))
        let sequence = source.makeEvents()
        kill(getpid(), SIGUSR1)
        var deliveries: UInt = 0
        for try await count in sequence {
          deliveries = count
          break
        }
        childCheck(deliveries == 1, "expected 1 delivery, got \(deliveries)")
        childCheck(source.isCancelled, "leaving the loop did not cancel the source")
      })
  }

  @Test("what arrives before the first next() is merged in the suspended source: two elements, the exact sum")
  func mergedBeforeFirstNext() async throws {
    let source = DataAddSource(queue: Queue(label: "events.merged"))
    let sequence = source.makeEvents()
    source.merge(1)
    // The first event is taken and held; the source is suspended ...
    #expect(await eventually { source.isSuspended })
    // ... so everything merged meanwhile stays in the source, as one sum.
    for _ in 1..<10_000 { source.merge(1) }
    var elements: [UInt] = []
    var total: UInt = 0
    for try await value in sequence {
      elements.append(value)
      total += value
      if total >= 10_000 { break }
    }
    #expect(elements == [1, 9_999])
    #expect(source.isCancelled)
  }

  @Test("a sequence made and dropped without iterating cancels the source once")
  func droppedUnusedCancels() async throws {
    let source = DataOrSource(queue: .global())
    let cancels = Counter()
    source.setCancelHandler { cancels.increment() }
    do {
      let sequence = source.makeEvents()
      source.merge(1)
      withExtendedLifetime(sequence) {}
    }
    #expect(await eventually { cancels.current == 1 })
    #expect(source.isCancelled)
    #expect(await !eventually(timeout: briefTimeout) { cancels.current > 1 })
  }

  @Test("a stored sequence: leaving the loop cancels once; dropping the sequence later does nothing more")
  func storedSequenceLeftThenDropped() async throws {
    let source = DataAddSource(queue: Queue(label: "events.stored"))
    let cancels = Counter()
    source.setCancelHandler { cancels.increment() }
    var sequence: SourceEvents<UInt>? = source.makeEvents()
    source.merge(4)
    for try await value in sequence! {
      #expect(value == 4)
      break
    }
    #expect(await eventually { cancels.current == 1 })
    // A second iterator of the same sequence: EBUSY, the source left alone.
    var again = sequence!.makeAsyncIterator()
    let error = await #expect(throws: GCDError.self) { try await again.next() }
    #expect(error?.errno == EBUSY)
    sequence = nil
    #expect(await !eventually(timeout: briefTimeout) { cancels.current > 1 })
    #expect(cancels.current == 1)
  }

  @Test("events on a source resumed already: next() throws EBUSY, the source keeps running")
  func resumedSourceThrows() async throws {
    let source = DataAddSource(queue: .global())
    source.resume()
    let sequence = source.makeEvents()
    var iterator = sequence.makeAsyncIterator()
    let error = await #expect(throws: GCDError.self) { try await iterator.next() }
    #expect(error?.errno == EBUSY)
    #expect(try await iterator.next() == nil)
    #expect(!source.isCancelled)
    source.cancel()
  }

  @Test("read sources whose sequences are made and dropped unused leave no descriptor behind")
  func droppedReadSequencesCloseDescriptors() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        blocking { dropReadSequences(rounds: 100) }
      })
  }
}

/// In an exit test's child (alone, so other tests' descriptors do not
/// move the count): read sources on a pipe, each made into a sequence that
/// is dropped at once; every source is cancelled and its epoll instance
/// closed.
@available(*, noasync, message: "blocks the thread")
private func dropReadSequences(rounds: Int) {
  warmUpDispatch()
  var ends: [Int32] = [-1, -1]
  childCheck(pipe(&ends) == 0, "pipe failed")
  _ = write(ends[1], "x", 1)  // readable: every source has an event before it is dropped
  let baseline = openDescriptorTargets()
  let cancels = Counter()
  for round in 0..<rounds {
    guard let source = try? ReadSource(fileDescriptor: ends[0], queue: .global()) else {
      failChild("round \(round): ReadSource failed")
    }
    source.setCancelHandler { cancels.increment() }
    _ = source.makeEvents()
  }
  // childCheck, not requireInChild: the parent shows what the child found (a failed status hides it).
  childCheck(pollUntil { cancels.current == rounds }, "\(cancels.current) of \(rounds) sources cancelled")
  childCheck(
    pollUntil { sameDescriptors(baseline, openDescriptorTargets()) },
    "descriptors changed: \(descriptorChanges(from: baseline, to: openDescriptorTargets()))")
  close(ends[0])
  close(ends[1])
  exit(0)
}
