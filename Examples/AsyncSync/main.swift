// Reproduces "Adding Tasks to a Queue": `dispatch_async` then `dispatch_sync` on
// `dispatch_queue_create("com.example.MyCustomQueue", NULL)`, printing "The first block may or may not
// have run" and "Both blocks have completed".
//
// On Linux: the same libdispatch calls. `sync` can also return the closure's value. A `sync` onto the
// queue the caller is already running on would deadlock; this library stops with a message instead of
// hanging (not shown here, since it ends the process).

import GCD
import Synchronization

let myCustomQueue = Queue(label: "com.example.MyCustomQueue")
let log = Mutex<[String]>([])

myCustomQueue.async {
  print("Do some work here.")
  log.withLock { $0.append("first block") }
}
let firstRan = log.withLock { !$0.isEmpty }
print("The first block may or may not have run. (this time: \(firstRan ? "it had" : "it had not"))")

myCustomQueue.sync {
  print("Do some more work here.")
  log.withLock { $0.append("second block") }
}
print("Both blocks have completed.")

let order = log.withLock { $0 }
print("order: \(order.joined(separator: ", "))")
print("sync returned after both blocks ran: \(order == ["first block", "second block"])")

// FIFO: a serial queue runs its work items one at a time, in the order they were submitted.
for item in 1...10 {
  myCustomQueue.async { log.withLock { $0.append("item \(item)") } }
}
// `sync` waits for everything queued before it, and hands back the closure's value.
let items = myCustomQueue.sync { log.withLock { Array($0.dropFirst(2)) } }
print("ten async items ran in FIFO order: \(items == (1...10).map { "item \($0)" })")
