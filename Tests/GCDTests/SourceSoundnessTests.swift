import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

extension SourceLifecycleTests {
  @Test("a handler starting during setTarget never pairs one queue with the other's exclusive bit")
  func setTargetNeverTears() async {
    await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      blocking { flipTargetsWhileHandling() }
    }
  }
}

extension SourceEventsTests {
  @Test("two iterations racing to start one source: exactly one gets the events, the other throws EBUSY")
  func racingIterations() async {
    await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      for round in 0..<(runningUnderSanitizer ? 100 : 400) {
        let source = DataAddSource(queue: .global())
        source.setRegistrationHandler { [weak source] in source?.merge(1) }
        let outcomes = await withTaskGroup(of: String.self) { group in
          for _ in 0..<2 {
            group.addTask {
              do throws(GCDError) {
                var iterator = source.events.makeAsyncIterator()
                return try await iterator.next() == nil ? "ended" : "element"
              } catch {
                return error.errno == EBUSY ? "busy" : "error \(error)"
              }
            }
          }
          var outcomes: [String] = []
          for await outcome in group { outcomes.append(outcome) }
          return outcomes.sorted()
        }
        childCheck(outcomes == ["busy", "element"], "round \(round): \(outcomes)")
      }
    }
  }
}

/// Flips a source's target between a serial and a concurrent queue while
/// its handler runs: a frame that paired the concurrent queue with the
/// serial queue's exclusive bit would stop the handler's legal
/// `concurrent.sync {}` as a deadlock.
private func flipTargetsWhileHandling() {
  let serial = Queue(label: "torn.serial")
  let concurrent = Queue(label: "torn.concurrent", kind: .concurrent)
  let source = DataAddSource(queue: concurrent)
  let handled = Counter()
  source.setEventHandler {
    if concurrent.isCurrent { concurrent.sync {} }
    handled.increment()
  }
  source.resume()
  let deadline = ContinuousClock.now + .seconds(runningUnderSanitizer ? 4 : 2)
  let merger = Group()
  merger.async(on: .global()) {
    while ContinuousClock.now < deadline { source.merge(1) }
  }
  var flips = 0
  while ContinuousClock.now < deadline {
    source.setTarget(flips.isMultiple(of: 2) ? serial : concurrent)
    flips += 1
  }
  childCheck(merger.wait(timeout: .seconds(30)), "the merger did not finish")
  source.cancel()
  childCheck(handled.current > 0, "no event was handled")
  exit(0)
}
