// Reproduces the suspend/resume passages ("Suspending and Resuming Queues", "… Dispatch Sources"):
// `dispatch_suspend` and `dispatch_resume` raise and lower a suspension count that must balance; a
// suspended queue starts no block, and a suspended source merges the events that arrive into one.
//
// On Linux: the same calls. A `resume()` with nothing to balance stops with a message (libdispatch
// traps), and a queue or source dropped while suspended is resumed first instead of crashing.
//
// Usage: ExampleSuspendResume [ms to watch for blocks that must not run, default 100]

import GCD
import Glibc
import Synchronization

let watchMicroseconds = UInt32(CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 100 : 100) * 1000
let queue = Queue(label: "com.example.SuspendableQueue")
let ran = Mutex<[Int]>([])

queue.suspend()
queue.suspend()
for block in 1...5 {
  queue.async { ran.withLock { $0.append(block) } }
}
usleep(watchMicroseconds)
print("queue suspended twice (count \(queue.suspensionCount)): \(ran.withLock { $0.count }) of 5 blocks ran")
queue.resume()
usleep(watchMicroseconds)
print("resumed once (count \(queue.suspensionCount)): \(ran.withLock { $0.count }) of 5 blocks ran")
queue.resume()
queue.sync {}
print("resumed twice (count \(queue.suspensionCount)): the blocks ran in the order \(ran.withLock { $0 })")

let source = DataAddSource(queue: queue)
let deliveries = Mutex<[UInt]>([])
let delivered = try! Semaphore(value: 0)
source.setEventHandler {
  deliveries.withLock { $0.append(source.data) }
  delivered.signal()
}
source.resume()
source.suspend()
for value: UInt in 1...5 { source.merge(value) }
usleep(watchMicroseconds)
print("source suspended (isSuspended \(source.isSuspended)), merged 1...5: deliveries \(deliveries.withLock { $0 })")
source.resume()
precondition(delivered.wait(timeout: .seconds(10)), "nothing was delivered in 10 s")
queue.sync {}
print("source resumed (isSuspended \(source.isSuspended)): deliveries \(deliveries.withLock { $0 })")
source.cancel()
