import GCD
import Testing

/// Expects `queue` to run two items at the same time: each item signals that it started, then waits
/// for the other one's signal.
func expectTwoItemsAtOnce(on queue: Queue, sourceLocation: SourceLocation = #_sourceLocation) {
  let first = Event()
  let second = Event()
  let results = Recorder<Bool>()
  let done = Latch(count: 2)
  queue.async {
    first.signal()
    results.append(second.wait())
    done.signal()
  }
  queue.async {
    second.signal()
    results.append(first.wait())
    done.signal()
  }
  #expect(done.wait(), sourceLocation: sourceLocation)
  #expect(results.values == [true, true], sourceLocation: sourceLocation)
}
