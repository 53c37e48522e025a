// Reproduces the `dispatch_set_target_queue` passage ("Changing the Target Queue"): the target can be
// changed at any time; work already handed to the old target stays there, later work goes to the new one.
//
// On Linux: the same call (`setTarget`). Re-targeting an active queue is queued behind the work already
// in it, which is why that work stays on the old target. A target cycle stops with a message. A source's
// target changes the same way: its later events run on the new queue (`newQueue.isCurrent` in the handler).
//
// Usage: ExampleTargetQueue [items per phase, default 3]

import GCD
import Glibc
import Synchronization

let itemsPerPhase = CommandLine.arguments.count > 1 ? max(Int(CommandLine.arguments[1]) ?? 3, 1) : 3

/// Each target queue stores its own name: `dispatch_get_specific` on a work item of a queue with no
/// value of its own looks along the queue's target chain, so it names the target the item runs through.
let nameKey = Queue.SpecificKey<String>()

// MARK: - Queues

func retargetAQueue() {
  print("-- queue")
  let targetA = Queue(label: "com.example.TargetA")
  let targetB = Queue(label: "com.example.TargetB")
  targetA.setSpecific(nameKey, "TargetA")
  targetB.setSpecific(nameKey, "TargetB")

  // dispatch_queue_create, then dispatch_set_target_queue, as in C. (A queue made with
  // `Queue(label:target:)` cannot be re-targeted later: libdispatch traps.)
  let queue = Queue(label: "com.example.Work")
  queue.setTarget(targetA)
  let ranThrough = Mutex<[String]>([])
  let group = Group()

  // Hold TargetA, so the first items wait in the queue, already handed to TargetA.
  targetA.suspend()
  for item in 1...itemsPerPhase {
    group.async(on: queue) {
      ranThrough.withLock { $0.append("item \(item) through \(Queue.currentSpecific(nameKey) ?? "?")") }
    }
  }
  queue.setTarget(targetB)
  for item in itemsPerPhase + 1...2 * itemsPerPhase {
    group.async(on: queue) {
      ranThrough.withLock { $0.append("item \(item) through \(Queue.currentSpecific(nameKey) ?? "?")") }
    }
  }
  usleep(50_000)
  print("items run while TargetA is suspended: \(ranThrough.withLock { $0.count }) of \(2 * itemsPerPhase)")
  targetA.resume()
  group.wait()

  let lines = ranThrough.withLock { $0 }
  for line in lines { print(line) }
  let before = lines.prefix(itemsPerPhase).allSatisfy { $0.hasSuffix("TargetA") }
  let after = lines.dropFirst(itemsPerPhase).allSatisfy { $0.hasSuffix("TargetB") }
  print("items queued before setTarget ran through the old target: \(before)")
  print("items queued after setTarget ran through the new target: \(after)")

  // A serial target serializes the queues funneled through it: two queues, one at a time.
  let running = Atomic<Int>(0)
  let peak = Atomic<Int>(0)
  let first = Queue(label: "com.example.First", kind: .concurrent, target: targetB)
  let second = Queue(label: "com.example.Second", kind: .concurrent, target: targetB)
  for index in 0..<8 {
    group.async(on: index % 2 == 0 ? first : second) {
      peak.max(running.add(1, ordering: .relaxed).newValue, ordering: .relaxed)
      usleep(2_000)
      running.subtract(1, ordering: .relaxed)
    }
  }
  group.wait()
  print("two concurrent queues through one serial target, most at once: \(peak.load(ordering: .relaxed))")
}

// MARK: - Sources

func retargetASource() {
  print("-- source")
  let oldQueue = Queue(label: "com.example.OldSourceQueue")
  let newQueue = Queue(label: "com.example.NewSourceQueue")
  let source = DataAddSource(queue: oldQueue)
  let ranOn = Mutex<[String]>([])
  let delivered = try! Semaphore(value: 0)
  source.setEventHandler { [unowned source] in
    let line =
      "event \(source.data): oldQueue.isCurrent \(oldQueue.isCurrent), newQueue.isCurrent \(newQueue.isCurrent)"
    ranOn.withLock { $0.append(line) }
    delivered.signal()
  }
  source.resume()

  // Each merge is delivered before the next one, so every event is its own.
  for value in 1...itemsPerPhase {
    source.merge(UInt(value))
    _ = delivered.wait(timeout: .seconds(10))
  }
  oldQueue.sync {}  // the last handler has returned
  source.setTarget(newQueue)
  print("setTarget(newQueue); the source's queue is now the new one: \(source.queue === newQueue)")
  for value in itemsPerPhase + 1...2 * itemsPerPhase {
    source.merge(UInt(value))
    _ = delivered.wait(timeout: .seconds(10))
  }
  source.cancel()

  let lines = ranOn.withLock { $0 }
  for line in lines { print(line) }
  let before =
    lines.count == 2 * itemsPerPhase
    && lines.prefix(itemsPerPhase).allSatisfy { $0.hasSuffix("oldQueue.isCurrent true, newQueue.isCurrent false") }
  let after =
    lines.count == 2 * itemsPerPhase
    && lines.dropFirst(itemsPerPhase).allSatisfy { $0.hasSuffix("oldQueue.isCurrent false, newQueue.isCurrent true") }
  print("source events before setTarget ran on the old queue: \(before)")
  print("source events after setTarget ran on the new queue: \(after)")
}

retargetAQueue()
retargetASource()
