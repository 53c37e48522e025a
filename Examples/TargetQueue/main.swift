// Reproduces the `dispatch_set_target_queue` passages ("Changing the Target Queue"): the target of a
// queue or of a source can be changed at any time; blocks already handed to the old target stay there,
// later blocks, and later source events, go to the new one.
//
// On Linux: the same call (`setTarget`). Re-targeting an active queue is queued behind the blocks already
// in it, which is why they stay on the old target. A target cycle stops with a message.
//
// Usage: ExampleTargetQueue [blocks (and events) before and after the change, default 3]

import GCD

let count = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 3 : 3

/// Each target stores its name; `Queue.currentSpecific` looks along the target chain, so a block or a
/// handler finds the name of the target it runs through.
let targetName = Queue.SpecificKey<String>()
let oldTarget = Queue(label: "com.example.OldTarget")
let newTarget = Queue(label: "com.example.NewTarget")
oldTarget.setSpecific(targetName, "old target")
newTarget.setSpecific(targetName, "new target")

func report(_ what: String) {
  print("\(what) runs through the \(Queue.currentSpecific(targetName) ?? "?")")
}

// The old target is held, so the first blocks wait in the queue, already handed to the old target.
// (A queue made with `Queue(label:target:)` cannot be re-targeted: libdispatch traps.)
let queue = Queue(label: "com.example.Work")
queue.setTarget(oldTarget)
oldTarget.suspend()
let group = Group()
for block in 1...count {
  group.async(on: queue) { report("block \(block), queued before setTarget,") }
}
queue.setTarget(newTarget)
for block in count + 1...2 * count {
  group.async(on: queue) { report("block \(block), queued after setTarget,") }
}
oldTarget.resume()
group.wait()

// A source: each event is handled before the next merge, and the target changes halfway.
let source = DataAddSource(queue: oldTarget)
let handled = try! Semaphore(value: 0)
source.setEventHandler {
  report("event \(source.data)")
  handled.signal()
}
source.resume()
for value in 1...2 * count {
  if value == count + 1 { source.setTarget(newTarget) }
  source.merge(UInt(value))
  precondition(handled.wait(timeout: .seconds(10)), "event \(value) was not handled in 10 s")
}
source.cancel()
