import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The three custom sources, seen through what they share.
protocol MergeableSource: Source {
  init(queue: Queue)
  func merge(_ value: UInt)
}

extension DataAddSource: MergeableSource {}
extension DataOrSource: MergeableSource {}
extension DataReplaceSource: MergeableSource {}

enum DataKind: String, CaseIterable, Sendable, CustomTestStringConvertible {
  case add, or, replace

  func make(queue: Queue) -> any MergeableSource {
    switch self {
    case .add: DataAddSource(queue: queue)
    case .or: DataOrSource(queue: queue)
    case .replace: DataReplaceSource(queue: queue)
    }
  }

  var testDescription: String { "DATA_\(rawValue.uppercased())" }
}

@Suite("DataAddSource, DataOrSource, DataReplaceSource")
struct DataSourceTests {
  static let threads = 4
  static let mergesPerThread = 100_000

  // MARK: - Exact merging under contention

  @Test("DATA_ADD: the values the handler sees add up exactly to what 4 threads × 100,000 merges added")
  func addSumIsExact() {
    let queue = Queue(label: "data.add")
    let source = DataAddSource(queue: queue)
    let expected = UInt(Self.mergesPerThread * (1...Self.threads).reduce(0, +))
    let total = Atomic<UInt>(0)
    let calls = Counter()
    let reached = Event()
    source.setEventHandler { [unowned source] in
      calls.increment()
      if total.add(source.data, ordering: .relaxed).newValue == expected { reached.signal() }
    }
    source.resume()
    let group = Group()
    for thread in 1...Self.threads {
      group.async(on: .global()) {
        for _ in 0..<Self.mergesPerThread { source.merge(UInt(thread)) }
      }
    }
    #expect(group.wait(timeout: generousTimeout))
    #expect(reached.wait(), "sum seen \(total.load(ordering: .relaxed)) of \(expected)")
    queue.sync {}
    #expect(total.load(ordering: .relaxed) == expected)
    #expect(calls.current >= 1 && calls.current <= Self.threads * Self.mergesPerThread)
    source.cancel()
  }

  @Test("DATA_OR: the bits the handler sees are exactly the bits 4 threads × 100,000 merges set")
  func orBitsAreExact() {
    let queue = Queue(label: "data.or")
    let source = DataOrSource(queue: queue)
    // Thread t sets bits 16t ... 16t + 14; bits 15, 31, 47 and 63 are never merged.
    let expected: UInt = (0..<Self.threads).reduce(0) { $0 | (0x7FFF << (16 * $1)) }
    let union = Atomic<UInt>(0)
    let stray = Atomic<UInt>(0)
    let reached = Event()
    source.setEventHandler { [unowned source] in
      let data = source.data
      stray.bitwiseOr(data & ~expected, ordering: .relaxed)
      if union.bitwiseOr(data, ordering: .relaxed).newValue == expected { reached.signal() }
    }
    source.resume()
    let group = Group()
    for thread in 0..<Self.threads {
      group.async(on: .global()) {
        for index in 0..<Self.mergesPerThread { source.merge(1 << UInt(index % 15 + 16 * thread)) }
      }
    }
    #expect(group.wait(timeout: generousTimeout))
    #expect(reached.wait(), "bits seen \(union.load(ordering: .relaxed)) of \(expected)")
    queue.sync {}
    #expect(union.load(ordering: .relaxed) == expected)
    #expect(stray.load(ordering: .relaxed) == 0, "the handler saw bits nobody merged")
    source.cancel()
  }

  @Test("DATA_REPLACE: each value seen was merged, per thread in order, and the last seen is the last merged")
  func replaceLastValueSeenIsLastMerged() {
    let queue = Queue(label: "data.replace")
    let source = DataReplaceSource(queue: queue)
    let last: UInt = 0xFFFF_FFFF_FFFF
    let seen = Recorder<UInt>()
    let reachedLast = Event()
    source.setEventHandler { [unowned source] in
      let data = source.data
      seen.append(data)
      if data == last { reachedLast.signal() }
    }
    source.resume()
    let group = Group()
    for thread in 0..<Self.threads {
      group.async(on: .global()) {
        for index in 1...Self.mergesPerThread { source.merge(UInt(thread) << 32 | UInt(index)) }
      }
    }
    #expect(group.wait(timeout: generousTimeout))
    source.merge(last)
    #expect(reachedLast.wait())
    queue.sync {}
    let values = seen.values
    #expect(values.last == last)
    var latest = [UInt](repeating: 0, count: Self.threads)
    for value in values.dropLast() {
      let thread = Int(value >> 32)
      let index = value & 0xFFFF_FFFF
      #expect(thread < Self.threads && index >= 1 && index <= UInt(Self.mergesPerThread), "never merged: \(value)")
      guard thread < Self.threads else { continue }
      #expect(index > latest[thread], "thread \(thread): \(index) seen after \(latest[thread])")
      latest[thread] = index
    }
    source.cancel()
  }

  // MARK: - merge(0)

  @Test("merge(0) alone does not call the handler; a later merge is seen whole", arguments: DataKind.allCases)
  func mergeZeroAloneDoesNothing(kind: DataKind) {
    let queue = Queue(label: "data.zero")
    let (source, seen, called) = recordingDataSource(kind, queue: queue)
    source.merge(0)
    // A handler call due to the merge would be queued before this sync's work item.
    queue.sync {}
    queue.sync {}
    #expect(seen.values == [])
    source.merge(3)
    #expect(called.wait())
    queue.sync {}
    #expect(seen.values == [3])
    source.cancel()
  }

  @Test(
    "merge(0) after a pending merge does nothing: the pending value is still delivered", arguments: DataKind.allCases)
  func mergeZeroKeepsPendingValue(kind: DataKind) {
    let queue = Queue(label: "data.zero.pending")
    let (source, seen, called) = recordingDataSource(kind, queue: queue)
    source.suspend()
    source.merge(5)
    source.merge(0)
    source.resume()
    // The documented contract: "Merging 0 does nothing". The 5 is pending; nothing may take it away.
    let delivered = called.wait()
    #expect(delivered, "\(kind): merge(0) discarded the pending value 5")
    queue.sync {}
    #expect(seen.values == (delivered ? [5] : []))
    source.cancel()
  }

  // MARK: - Queues

  @Test("event, registration and cancel handlers run on the source's queue", arguments: DataKind.allCases)
  func handlersRunOnTheQueue(kind: DataKind) {
    let queue = Queue(label: "data.queue")
    let source = kind.make(queue: queue)
    let onQueue = Recorder<String>()
    let cancelled = Event()
    source.setRegistrationHandler { onQueue.append("registration: \(queue.isCurrent)") }
    source.setEventHandler { onQueue.append("event: \(queue.isCurrent)") }
    source.setCancelHandler {
      onQueue.append("cancel: \(queue.isCurrent)")
      cancelled.signal()
    }
    #expect(source.queue === queue)
    source.resume()
    source.merge(1)
    queue.sync {}
    source.cancel()
    #expect(cancelled.wait())
    #expect(onQueue.values == ["registration: true", "event: true", "cancel: true"])
  }

  @Test("setTarget moves later events to the new queue", arguments: DataKind.allCases)
  func setTargetMovesLaterEvents(kind: DataKind) {
    let oldQueue = Queue(label: "data.old")
    let newQueue = Queue(label: "data.new")
    let source = kind.make(queue: oldQueue)
    let ranOn = Recorder<String>()
    let called = Latch(count: 1)
    let calledAgain = Latch(count: 1)
    source.setEventHandler { [unowned source] in
      ranOn.append("\(source.data): old \(oldQueue.isCurrent), new \(newQueue.isCurrent)")
      if called.isOpen { calledAgain.signal() } else { called.signal() }
    }
    source.resume()
    source.merge(1)
    #expect(called.wait())
    oldQueue.sync {}
    source.setTarget(newQueue)
    #expect(source.queue === newQueue)
    source.merge(2)
    #expect(calledAgain.wait())
    #expect(ranOn.values == ["1: old true, new false", "2: old false, new true"])
    source.cancel()
  }

  @Test("setTarget: an event not yet handled runs on the new queue (documented)")
  func setTargetMovesWaitingEvent() {
    let key = Queue.SpecificKey<String>()
    let oldQueue = Queue(label: "data.queued.old")
    let newQueue = Queue(label: "data.queued.new")
    oldQueue.setSpecific(key, "old")
    newQueue.setSpecific(key, "new")
    let source = DataAddSource(queue: oldQueue)
    let ranOn = Recorder<String>()
    let called = Event()
    source.setEventHandler {
      ranOn.append("\(Queue.currentSpecific(key) ?? "?"): old \(oldQueue.isCurrent), new \(newQueue.isCurrent)")
      called.signal()
    }
    source.resume()
    // The old queue is held, so the event merged now waits for it; then the target changes.
    oldQueue.suspend()
    source.merge(1)
    source.setTarget(newQueue)
    oldQueue.resume()
    #expect(called.wait())
    // libdispatch re-checks a source's target when it drains it: the waiting event moves to the new
    // queue. `Source.setTarget` documents this.
    #expect(ranOn.values == ["new: old false, new true"])
    source.cancel()
  }

  // MARK: - Handlers and life cycle

  @Test("the registration handler runs once, before the first event handler", arguments: DataKind.allCases)
  func registrationHandlerRunsOnce(kind: DataKind) {
    let queue = Queue(label: "data.registration")
    let source = kind.make(queue: queue)
    let order = Recorder<String>()
    let events = Latch(count: 3)
    source.setRegistrationHandler { order.append("registration") }
    source.setEventHandler {
      order.append("event")
      events.signal()
    }
    source.resume()
    for value: UInt in [1, 2, 4] {
      source.merge(value)
      queue.sync {}
    }
    #expect(events.wait())
    #expect(order.values == ["registration", "event", "event", "event"])
    source.cancel()
  }

  @Test(
    "cancel: isCancelled, the cancel handler runs exactly once, no event handler after it", arguments: DataKind.allCases
  )
  func cancelHandlerRunsOnce(kind: DataKind) {
    let queue = Queue(label: "data.cancel")
    let source = kind.make(queue: queue)
    let events = Counter()
    let cancels = Counter()
    let cancelled = Event()
    source.setEventHandler { events.increment() }
    source.setCancelHandler {
      cancels.increment()
      cancelled.signal()
    }
    source.resume()
    #expect(!source.isCancelled)
    source.merge(1)
    queue.sync {}
    #expect(events.current == 1)
    source.cancel()
    #expect(source.isCancelled)
    source.cancel()
    #expect(cancelled.wait())
    source.merge(1)
    queue.sync {}
    queue.sync {}
    #expect(events.current == 1)
    #expect(cancels.current == 1)
    #expect(source.isCancelled)
  }

  @Test("suspended: merges are held and arrive as one coalesced delivery after resume", arguments: DataKind.allCases)
  func suspendedMergesCoalesce(kind: DataKind) {
    let queue = Queue(label: "data.suspend")
    let (source, seen, called) = recordingDataSource(kind, queue: queue)
    source.suspend()
    source.suspend()
    for value: UInt in [1, 2, 4, 8] { source.merge(value) }
    queue.sync {}
    source.resume()
    queue.sync {}
    #expect(seen.values == [], "delivered with one suspend() still outstanding")
    source.resume()
    #expect(called.wait())
    queue.sync {}
    let expected: UInt = kind == .replace ? 8 : 15
    #expect(seen.values == [expected])
    source.cancel()
  }

  @Test("a C function handler gets the context it was given", arguments: DataKind.allCases)
  func functionHandlerGetsContext(kind: DataKind) {
    let queue = Queue(label: "data.function")
    let source = kind.make(queue: queue)
    let called = Event()
    let context = Unmanaged.passRetained(called).toOpaque()
    source.setEventHandler(context: context) { context in
      Unmanaged<Event>.fromOpaque(context!).takeUnretainedValue().signal()
    }
    #expect(source.context == context)
    source.resume()
    source.merge(1)
    #expect(called.wait())
    source.cancel()
    queue.sync {}
    Unmanaged<Event>.fromOpaque(context).release()
  }

  @Test("a data source has handle 0 and mask 0", arguments: DataKind.allCases)
  func handleAndMask(kind: DataKind) {
    let source = kind.make(queue: .global())
    #expect(source.handle == 0)
    #expect(source.mask == 0)
  }
}
