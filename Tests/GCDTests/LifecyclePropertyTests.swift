import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The life cycle under concurrency: random interleavings of `suspend`,
/// `resume`, `cancel`, merges, a new event handler, a new target and the final drop, from several
/// threads at once, on real sources (half of them making the source's state in that race; a third
/// started by an event sequence whose consumer takes elements meanwhile, so that its hold and its
/// end race the rest), checked against the model of `LifecycleTests`
/// (each thread balances only its own suspensions, as a correct program
/// does). Failures print the seed; `GCD_PROPERTY_SEED` replays one.
extension LifecycleTests {
  @Test("claimStart starts only a never-started, never-suspended, live source", arguments: 0..<10)
  func claimStartEveryState(row: Int) {
    let (name, start) = LifecycleTests.states[row]
    var state = start
    let action = state.claimStart()
    if name == "inactive" {
      #expect(action == .activate && state == .active)
    } else {
      #expect(action == .none && state == start, "\(name)")
    }
  }

  @Test("random concurrent suspend / resume / cancel / merge / drop on sources keep the model's invariants")
  func concurrentInterleavings() async {
    // The child draws the seed (or takes GCD_PROPERTY_SEED) and names it in any failure.
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      blocking { runInterleavings(seed: SeededRandom.runSeed, rounds: runningUnderSanitizer ? 60 : 300) }
    }
    expectChildPassed(result)
  }
}

/// One source's run: what its handlers saw.
private final class Observed: Sendable {
  let cancels = Counter()
  let eventsAfterCancel = Counter()
  let events = Counter()
  let released = Event()
  /// A sequence's consumer: the sum of the elements it took, and its end.
  let taken = Atomic<UInt>(0)
  let consumed = Event()
  let merges = Atomic<UInt>(0)
}

private func recordRelease(_ context: UnsafeMutableRawPointer?) {
  Unmanaged<Observed>.fromOpaque(context!).takeRetainedValue().released.signal()
}

private func runInterleavings(seed: UInt64, rounds: Int) {
  var random = SeededRandom(seed: seed)
  for round in 0..<rounds {
    let observed = Observed()
    // A third of the rounds start the source with an event sequence, consumed by a task.
    let sequenced = random.next() % 3 == 0
    let startFirst = !sequenced && Bool.random(using: &random)
    let takes = Int(random.next() % 6)
    let threadSeeds = (0..<3).map { _ in random.next() }
    let outstanding = Atomic(0)
    let cancelled = Atomic(false)
    // Half the rounds make the source's state (`Source.state`) before the threads run; the rest
    // leave its first use to them (setEventHandler and setTarget racing to make it).
    let lazyState = Bool.random(using: &random)
    let handlerSet = Atomic(!lazyState)
    let queues = [Queue(label: "interleave.\(round).a"), Queue(label: "interleave.\(round).b")]
    do {
      let source = DataAddSource(queue: queues[0])
      source.context = Unmanaged.passRetained(observed).toOpaque()
      source.setFinalizer(recordRelease)
      let handler: @Sendable () -> Void = { [observed] in
        observed.events.increment()
        if observed.cancels.current > 0 { observed.eventsAfterCancel.increment() }
      }
      if !lazyState || sequenced {
        if !sequenced { source.setEventHandler(handler) }
        source.setCancelHandler { [observed] in observed.cancels.increment() }
      }
      if startFirst { source.resume() }
      if sequenced {
        let events = source.makeEvents()
        Task.detached { [observed] in
          var iterator = events.makeAsyncIterator()
          for _ in 0..<takes {
            guard let value = try? await iterator.next() else { break }
            observed.taken.add(value, ordering: .relaxed)
            if Bool.random() { await Task.yield() }
          }
          observed.consumed.signal()
        }
      }
      let threads = Group()
      for threadSeed in threadSeeds {
        threads.async(on: .global()) {
          var random = SeededRandom(seed: threadSeed)
          var mine = 0
          for _ in 0..<40 {
            switch random.next() % 10 {
            case 0...2:
              source.suspend()
              mine += 1
            case 3...5 where mine > 0:
              source.resume()
              mine -= 1
            case 6:
              if random.next() % 4 == 0 {
                cancelled.store(true, ordering: .relaxed)
                source.cancel()
              }
            case 7 where !sequenced:
              // A new handler, the same count: the state's handler block replaced while it runs.
              source.setEventHandler(handler)
              handlerSet.store(true, ordering: .relaxed)
            case 8:
              source.setTarget(queues[Int(random.next() % 2)])
            default:
              source.merge(1)
              observed.merges.add(1, ordering: .relaxed)
            }
          }
          // Leave some suspensions for the drop to balance.
          if random.next() % 2 == 0 {
            while mine > 0 {
              source.resume()
              mine -= 1
            }
          }
          outstanding.add(mine, ordering: .relaxed)
        }
      }
      childCheck(threads.wait(timeout: .seconds(60)), "seed \(seed) round \(round): the threads did not finish")
      if sequenced {
        // A consumer still waiting (no merge came, or a suspension was left): the cancel ends it.
        if !observed.consumed.wait(timeout: .milliseconds(50)) {
          cancelled.store(true, ordering: .relaxed)
          source.cancel()
        }
        childCheck(
          observed.consumed.wait(timeout: .seconds(30)), "seed \(seed) round \(round): the consumer never ended")
        childCheck(
          observed.taken.load(ordering: .relaxed) <= observed.merges.load(ordering: .relaxed),
          "seed \(seed) round \(round): the sequence gave \(observed.taken.load(ordering: .relaxed)) for \(observed.merges.load(ordering: .relaxed)) merges"
        )
        // The loop's end (or the cancel) ended the source.
        childCheck(
          pollUntil { source.isCancelled }, "seed \(seed) round \(round): the sequence's end did not cancel the source")
        cancelled.store(true, ordering: .relaxed)
      }
      let isCancelled = cancelled.load(ordering: .relaxed)
      let suspensions = outstanding.load(ordering: .relaxed)
      childCheck(source.isCancelled == isCancelled, "seed \(seed) round \(round): isCancelled disagrees with the model")
      childCheck(
        source.isSuspended == (!isCancelled && suspensions > 0),
        "seed \(seed) round \(round): isSuspended \(source.isSuspended), model: cancelled \(isCancelled), \(suspensions) suspensions"
      )
      childCheck(
        queues.contains { $0 === source.queue },
        "seed \(seed) round \(round): the source's queue is not one it was given")
      if !isCancelled && suspensions == 0 && startFirst && handlerSet.load(ordering: .relaxed) {
        // Balanced and started: it must deliver.
        let before = observed.events.current
        source.merge(1)
        childCheck(
          pollUntil { observed.events.current > before },
          "seed \(seed) round \(round): a balanced source delivers nothing")
      }
    }
    // The drop: the cancel handler runs once, no event after it, the C object is freed.
    childCheck(
      observed.released.wait(timeout: .seconds(30)), "seed \(seed) round \(round): the C source was never freed")
    childCheck(
      observed.cancels.current == (lazyState && !sequenced ? 0 : 1),
      "seed \(seed) round \(round): \(observed.cancels.current) cancel handler runs")
    childCheck(
      observed.eventsAfterCancel.current == 0,
      "seed \(seed) round \(round): an event handler ran after the cancel handler")
  }
  exit(0)
}
