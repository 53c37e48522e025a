import Synchronization

/// A thread-safe list that work items append to from any thread.
final class Recorder<Element: Sendable>: Sendable {
  private let storage = Mutex<[Element]>([])

  init() {}

  func append(_ element: Element) { storage.withLock { $0.append(element) } }

  /// A copy of everything recorded so far, in order of recording.
  var values: [Element] { storage.withLock { $0 } }

  var count: Int { storage.withLock { $0.count } }
}

/// A thread-safe counter that also remembers the highest value it reached:
/// work items `enter()` and `exit()` it to measure how many of them overlap.
final class OverlapMeter: Sendable {
  private let current = Atomic<Int>(0)
  private let highest = Atomic<Int>(0)

  init() {}

  /// Counts one more running item; returns how many are running now.
  @discardableResult
  func enter() -> Int {
    let now = current.add(1, ordering: .sequentiallyConsistent).newValue
    var seen = highest.load(ordering: .relaxed)
    while now > seen {
      let (exchanged, original) = highest.compareExchange(
        expected: seen, desired: now, ordering: .relaxed)
      if exchanged { break }
      seen = original
    }
    return now
  }

  func exit() { current.subtract(1, ordering: .sequentiallyConsistent) }

  /// How many items are running now.
  var running: Int { current.load(ordering: .sequentiallyConsistent) }

  /// The most items that ever ran at once.
  var maximum: Int { highest.load(ordering: .relaxed) }
}

/// A thread-safe integer.
final class Counter: Sendable {
  private let value = Atomic<Int>(0)

  init() {}

  @discardableResult
  func increment() -> Int { value.add(1, ordering: .sequentiallyConsistent).newValue }

  var current: Int { value.load(ordering: .sequentiallyConsistent) }
}

/// A class whose instances report their own deinit: stored on a queue (as a
/// specific value, a context, a capture) it shows when the owner lets go.
final class DeinitProbe: Sendable {
  let released: Event
  let deinits: Counter?
  let id: Int

  init(id: Int = 0, released: Event = Event(), deinits: Counter? = nil) {
    self.id = id
    self.released = released
    self.deinits = deinits
  }

  deinit {
    deinits?.increment()
    released.signal()
  }
}

/// A mutable box for a value a test hands to work that runs while the test
/// waits for it (`sync`, `apply`), where the type system cannot see that the
/// accesses never overlap. Writers must be serialised by the test's logic.
final class UnsafeBox<Value>: @unchecked Sendable {
  var value: Value
  init(_ value: Value) { self.value = value }
}
