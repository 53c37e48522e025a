// Reproduces "Adding Tasks to a Queue": `dispatch_async` then `dispatch_sync` on
// `dispatch_queue_create("com.example.MyCustomQueue", NULL)`.
//
// On Linux: the same calls. `sync` also returns its closure's value (used below to read the order in
// which ten more blocks ran). A `sync` onto the queue the caller is running on would deadlock; this
// library stops the process with a message instead.

import GCD
import Synchronization

let myCustomQueue = Queue(label: "com.example.MyCustomQueue")

myCustomQueue.async {
  print("Do some work here.")
}
print("The first block may or may not have run.")

myCustomQueue.sync {
  print("Do some more work here.")
}
print("Both blocks have completed.")

// A serial queue runs its blocks one at a time, in the order they were added.
let order = Mutex<[Int]>([])
for block in 1...10 {
  myCustomQueue.async { order.withLock { $0.append(block) } }
}
let ran = myCustomQueue.sync { order.withLock { $0 } }
print("ten more async blocks, then sync: they ran in the order \(ran)")
