import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

extension SourceLifecycleTests {
  @Test("a handler starting during setTarget never pairs one queue with the other's exclusive bit")
  func setTargetNeverTears() {
    let serial = Queue(label: "torn.serial")
    let concurrent = Queue(label: "torn.concurrent", kind: .concurrent)
    let source = DataAddSource(queue: concurrent)
    let state = source.state
    let torn = Counter()
    let checked = Counter()
    // The handler block as libdispatch calls it, run in a loop on one thread
    // while another flips the target: each call reads the target and opens
    // its frame; the frame must name the queue with that queue's own bit.
    nonisolated(unsafe) let block = state.block {
      forEachFrame { queue, exclusive in
        if (queue == serial.raw) != exclusive { torn.increment() }
        return false
      }
      checked.increment()
    }
    let rounds = runningUnderSanitizer ? 200_000 : 2_000_000
    let started = Atomic(0)
    let done = Group()
    // Two created serial queues: libdispatch gives each a thread of its own (they are overcommit),
    // so the two loops never wait for each other in the global pool (a spinning worker there
    // would hold up every other test's global work).
    done.async(on: Queue(label: "torn.flipper")) {
      started.add(1, ordering: .relaxed)
      while started.load(ordering: .relaxed) < 2 {}
      for round in 0..<rounds { _ = state.setTarget(round.isMultiple(of: 2) ? serial : concurrent) }
    }
    done.async(on: Queue(label: "torn.handler")) {
      started.add(1, ordering: .relaxed)
      while started.load(ordering: .relaxed) < 2 {}
      for _ in 0..<rounds { block() }
    }
    #expect(blocking { done.wait(timeout: .seconds(120)) })
    #expect(checked.current == rounds)
    #expect(torn.current == 0, "\(torn.current) of \(rounds) handler calls saw a torn target")
    source.cancel()
  }
}

extension SourceLifecycleTests {
  @Test("the state's first use on two threads at once makes one state, which both get")
  func stateMadeOnce() {
    let rounds = runningUnderSanitizer ? 200 : 2_000
    let queues = [Queue(label: "state.first.0"), Queue(label: "state.first.1")]
    var split = 0
    for _ in 0..<rounds {
      let source = DataAddSource(queue: .global())
      let seen = Mutex<[ObjectIdentifier]>([])
      let ready = Atomic(0)
      let done = Group()
      for queue in queues {
        // A created serial queue each: a thread of its own, so neither spins waiting for the other.
        done.async(on: queue) {
          ready.add(1, ordering: .relaxed)
          while ready.load(ordering: .relaxed) < 2 {}
          let state = source.state
          seen.withLock { $0.append(ObjectIdentifier(state)) }
        }
      }
      #expect(blocking { done.wait(timeout: .seconds(30)) })
      let identities = seen.withLock { $0 }
      if Set(identities).count != 1 { split += 1 }
      #expect(ObjectIdentifier(source.state) == identities.first)
    }
    #expect(split == 0, "\(split) of \(rounds) rounds made two states")
  }
}

extension SourceEventsTests {
  @Test("two sequences starting one source at the same moment: exactly one starts it, the other fails with EBUSY")
  func racingStarts() async {
    await #expect(processExitsWith: .success) {
      blocking { raceSequenceStarts(rounds: runningUnderSanitizer ? 200 : 2_000) }
    }
  }
}

/// Two sequences of one source are made (which starts it) on two threads
/// released together, round after round; before the fix the loser's
/// `resume()` stopped the process as an unbalanced resume.
private func raceSequenceStarts(rounds: Int) {
  for round in 0..<rounds {
    let source = DataAddSource(queue: .global())
    // The sequences stay alive for the round: dropping one ends it.
    let made = Mutex<[SourceEvents<UInt>]>([])
    let ready = Atomic(0)
    let done = Group()
    for index in 0..<2 {
      // A created serial queue each: a thread of its own (overcommit), so neither spins waiting for
      // a global worker the other holds.
      done.async(on: Queue(label: "race.\(index)")) {
        ready.add(1, ordering: .relaxed)
        while ready.load(ordering: .relaxed) < 2 {}
        let sequence = source.makeEvents()
        made.withLock { $0.append(sequence) }
      }
    }
    requireInChild(done.wait(timeout: .seconds(30)), "round \(round): the starts did not return")
    let sequences = made.withLock { $0 }
    let failed = sequences.filter { $0.refusal != nil }
    requireInChild(failed.count == 1, "round \(round): \(failed.count) of 2 sequences failed to start")
    requireInChild(!source.isSuspended && !source.isCancelled, "round \(round): the source is not running")
    // The winner's start waited for the registration (which ends the source's registering window).
    requireInChild(
      !source.state.isRegistering, "round \(round): the winner's source never registered")
    source.cancel()
    withExtendedLifetime(sequences) {}
  }
  exit(0)
}

extension SourceLifecycleTests {
  /// LeakSanitizer found it (issue 17's merged ASan run): the registration block of a source
  /// cancelled before it ran never runs, and the closures it would have called stayed in the
  /// handlers box; an event sequence's hook holds the source, so source, handlers and sequence
  /// were never freed. The queue is suspended between the start and the cancel, so the
  /// registration cannot run before the cancel (the order is made, not hoped for).
  @Test(
    "a source cancelled before its registration ran releases the registration handler's captures, and is freed")
  func cancelledBeforeRegistrationReleasesClosures() {
    let queue = Queue(label: "soundness.registration")
    let released = Event()
    let cancelled = Event()
    weak var weakSource: DataAddSource?
    do {
      let source = DataAddSource(queue: queue)
      weakSource = source
      let probe = DeinitProbe(released: released)
      // The closure holds the source, as an event sequence's registration hook does.
      source.setRegistrationHandler { [probe, source] in _ = (probe, source) }
      source.setCancelHandler { cancelled.signal() }
      queue.suspend()
      source.resume()
      source.cancel()
      queue.resume()
    }
    #expect(cancelled.wait(), "the cancel handler ran")
    #expect(released.wait(), "the registration handler's captures were released")
    #expect(waitUntil { weakSource == nil }, "the source was freed")
  }
}
