import GCD
import Synchronization
import Testing

@Suite("Queue-specific values")
struct QueueSpecificTests {
  struct Settings: Sendable, Equatable {
    var name: String
    var level: Int
  }

  @Test("getSpecific reads back what setSpecific stored, for values of any Sendable type")
  func roundTrip() {
    let queue = Queue(label: "specific.roundtrip")
    let number = Queue.SpecificKey<Int>()
    let text = Queue.SpecificKey<String>()
    let settings = Queue.SpecificKey<Settings>()
    #expect(queue.getSpecific(number) == nil)
    queue.setSpecific(number, 42)
    queue.setSpecific(text, "hello")
    queue.setSpecific(settings, Settings(name: "fast", level: 3))
    #expect(queue.getSpecific(number) == 42)
    #expect(queue.getSpecific(text) == "hello")
    #expect(queue.getSpecific(settings) == Settings(name: "fast", level: 3))
  }

  @Test("two keys of the same value type never collide, and queues do not share values")
  func keysAndQueuesAreIndependent() {
    let first = Queue(label: "specific.first")
    let second = Queue(label: "specific.second", kind: .concurrent)
    let keyA = Queue.SpecificKey<Int>()
    let keyB = Queue.SpecificKey<Int>()
    first.setSpecific(keyA, 1)
    first.setSpecific(keyB, 2)
    second.setSpecific(keyA, 3)
    #expect(first.getSpecific(keyA) == 1)
    #expect(first.getSpecific(keyB) == 2)
    #expect(second.getSpecific(keyA) == 3)
    #expect(second.getSpecific(keyB) == nil)
  }

  @Test("setSpecific(nil) removes the value and releases it")
  func removeReleases() {
    let queue = Queue(label: "specific.remove")
    let key = Queue.SpecificKey<DeinitProbe>()
    let released = Event()
    let deinits = Counter()
    queue.setSpecific(key, DeinitProbe(id: 1, released: released, deinits: deinits))
    #expect(queue.getSpecific(key)?.id == 1)
    queue.setSpecific(key, nil)
    #expect(queue.getSpecific(key) == nil)
    #expect(released.wait())
    #expect(deinits.current == 1)
  }

  @Test("replacing a value releases the old one, exactly once, and keeps the new one")
  func replaceReleasesOld() {
    let queue = Queue(label: "specific.replace")
    let key = Queue.SpecificKey<DeinitProbe>()
    let oldReleased = Event()
    let newReleased = Event()
    let deinits = Counter()
    queue.setSpecific(key, DeinitProbe(id: 1, released: oldReleased, deinits: deinits))
    queue.setSpecific(key, DeinitProbe(id: 2, released: newReleased, deinits: deinits))
    #expect(oldReleased.wait())
    #expect(queue.getSpecific(key)?.id == 2)
    #expect(!newReleased.isSignaled)
    #expect(deinits.current == 1)
  }

  @Test("the values of a queue are released, each exactly once, when the queue dies")
  func releasedWhenQueueDies() {
    let deinits = Counter()
    let firstReleased = Event()
    let secondReleased = Event()
    do {
      let queue = Queue(label: "specific.dies")
      queue.setSpecific(Queue.SpecificKey<DeinitProbe>(), DeinitProbe(released: firstReleased, deinits: deinits))
      queue.setSpecific(Queue.SpecificKey<DeinitProbe>(), DeinitProbe(released: secondReleased, deinits: deinits))
      #expect(queue.sync { true })
    }
    #expect(firstReleased.wait())
    #expect(secondReleased.wait())
    #expect(deinits.current == 2)
  }

  @Test("the values are released only when the queue dies, not while work still holds it")
  func keptWhileWorkPending() {
    let key = Queue.SpecificKey<DeinitProbe>()
    let released = Event()
    let release = Event()
    let seen = Mutex<Int?>(nil)
    do {
      let queue = Queue(label: "specific.pending")
      queue.setSpecific(key, DeinitProbe(id: 9, released: released))
      queue.async {
        release.wait()
        seen.withLock { $0 = Queue.currentSpecific(key)?.id }
      }
    }
    #expect(!released.wait(timeout: briefTimeout))
    release.signal()
    #expect(released.wait())
    #expect(seen.withLock { $0 } == 9)
  }

  @Test("currentSpecific is the current queue's value inside async, sync and barrier work")
  func currentInsideWork() {
    let queue = Queue(label: "specific.current", kind: .concurrent)
    let key = Queue.SpecificKey<String>()
    queue.setSpecific(key, "mine")
    #expect(queue.sync { Queue.currentSpecific(key) } == "mine")
    #expect(queue.syncBarrier { Queue.currentSpecific(key) } == "mine")
    let seen = Mutex<String?>(nil)
    let done = Event()
    queue.async {
      seen.withLock { $0 = Queue.currentSpecific(key) }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } == "mine")
  }

  @Test("currentSpecific is found through the target queues, the nearest value first")
  func currentThroughTargets() {
    let root = Queue(label: "specific.root")
    let middle = Queue(label: "specific.middle", target: root)
    let leaf = Queue(label: "specific.leaf", kind: .concurrent, target: middle)
    let onlyRoot = Queue.SpecificKey<String>()
    let both = Queue.SpecificKey<String>()
    root.setSpecific(onlyRoot, "root")
    root.setSpecific(both, "root")
    middle.setSpecific(both, "middle")
    #expect(leaf.sync { Queue.currentSpecific(onlyRoot) } == "root")
    #expect(leaf.sync { Queue.currentSpecific(both) } == "middle")
    #expect(root.sync { Queue.currentSpecific(both) } == "root")
    // getSpecific looks at the queue itself only.
    #expect(leaf.getSpecific(onlyRoot) == nil)
  }

  @Test(
    "a value removed with setSpecific(nil) no longer hides the targets' values, as dispatch_queue_set_specific(NULL) does (issue 53)"
  )
  func removedValueUncoversTarget() {
    let root = Queue(label: "specific.removed.root")
    let middle = Queue(label: "specific.removed.middle", target: root)
    let leaf = Queue(label: "specific.removed.leaf", target: middle)
    let key = Queue.SpecificKey<String>()
    root.setSpecific(key, "root")
    middle.setSpecific(key, "middle")
    leaf.setSpecific(key, "leaf")
    #expect(leaf.sync { Queue.currentSpecific(key) } == "leaf")
    leaf.setSpecific(key, nil)
    #expect(leaf.sync { Queue.currentSpecific(key) } == "middle")
    middle.setSpecific(key, nil)
    #expect(leaf.sync { Queue.currentSpecific(key) } == "root")
    #expect(middle.sync { Queue.currentSpecific(key) } == "root")
    root.setSpecific(key, nil)
    #expect(leaf.sync { Queue.currentSpecific(key) } == nil)
    // Set again, nearest first once more.
    leaf.setSpecific(key, "leaf again")
    #expect(leaf.sync { Queue.currentSpecific(key) } == "leaf again")
    #expect(leaf.getSpecific(key) == "leaf again")
    #expect(middle.getSpecific(key) == nil)
  }

  @Test("currentSpecific is nil outside the queues that have the value")
  func currentOutside() {
    let key = Queue.SpecificKey<Int>()
    let queue = Queue(label: "specific.outside")
    queue.setSpecific(key, 1)
    #expect(Queue.currentSpecific(key) == nil)
    #expect(Queue(label: "specific.other").sync { Queue.currentSpecific(key) } == nil)
  }

  @Test("values on the main queue are seen by its work, and can be removed again")
  func mainQueueValue() {
    let key = Queue.SpecificKey<String>()
    Queue.main.setSpecific(key, "main")
    defer { Queue.main.setSpecific(key, nil) }
    #expect(Queue.main.getSpecific(key) == "main")
    let seen = Mutex<String?>(nil)
    let done = Event()
    Queue.main.async {
      seen.withLock { $0 = Queue.currentSpecific(key) }
      done.signal()
    }
    #expect(done.wait())
    #expect(seen.withLock { $0 } == "main")
  }

  @Test("setting and reading values from many threads at once on different keys is safe")
  func concurrentKeys() {
    let queue = Queue(label: "specific.concurrent")
    let keys = (0..<64).map { _ in Queue.SpecificKey<Int>() }
    Queue.global().apply(keys.count) { index in
      queue.setSpecific(keys[index], index)
    }
    #expect(keys.indices.allSatisfy { queue.getSpecific(keys[$0]) == $0 })
  }

  // MARK: - Keys are never confused; replace-and-read is safe

  @Test("a new key of another type, made where a dead key was, never reads the dead key's value")
  func deadKeyAddressReuse() async {
    await #expect(processExitsWith: .success) {
      let queue = Queue(label: "specific.reuse")
      for round in 0..<(runningUnderSanitizer ? 5_000 : 20_000) {
        do { queue.setSpecific(Queue.SpecificKey<String>(), "value \(round)") }
        let other = queue.getSpecific(Queue.SpecificKey<[Int]>())
        requireInChild(other == nil, "round \(round): a fresh [Int] key read a value")
      }
    }
  }

  @Test("replacing a value while other threads read it, and work on the queue reads it, is safe")
  func concurrentReplaceAndRead() async {
    await #expect(processExitsWith: .success) {
      let queue = Queue(label: "specific.replace-read")
      let key = Queue.SpecificKey<ReplacedValue>()
      queue.setSpecific(key, ReplacedValue(0))
      let rounds = runningUnderSanitizer ? 5_000 : 20_000
      let readers = Group()
      let stop = Atomic(false)
      for _ in 0..<2 {
        readers.async(on: Queue.global()) {
          while !stop.load(ordering: .relaxed) {
            let value = queue.getSpecific(key)
            requireInChild(value?.check == value.map { ~$0.id }, "a read value is torn or freed")
          }
        }
      }
      readers.async(on: Queue.global()) {
        while !stop.load(ordering: .relaxed) {
          blocking {
            queue.sync {
              let value = Queue.currentSpecific(key)
              requireInChild(value?.check == value.map { ~$0.id }, "a current value is torn or freed")
            }
          }
        }
      }
      for round in 1...rounds { queue.setSpecific(key, round.isMultiple(of: 97) ? nil : ReplacedValue(round)) }
      stop.store(true, ordering: .relaxed)
      requireInChild(blocking { readers.wait(timeout: .seconds(30)) }, "the readers did not finish")
    }
  }
}

/// A value whose two fields must agree: a read of freed or reused memory breaks them.
final class ReplacedValue: Sendable {
  let id: Int
  let check: Int
  init(_ id: Int) {
    self.id = id
    check = ~id
  }
}
