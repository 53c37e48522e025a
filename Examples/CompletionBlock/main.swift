// Reproduces "Performing a Completion Block When a Task Is Done": `average_async(data, len, queue,
// block)`: `dispatch_retain(queue)`, compute on the default global queue, `dispatch_async(queue,
// ^{ block(avg); })`, `dispatch_release(queue)`.
//
// On Linux: the same calls. The closure's capture of `queue` is the `dispatch_retain`, and its release
// when the closure finishes is the `dispatch_release`. The data is a Swift array captured by value, so
// it cannot be freed by the caller before the work runs (the C version must keep `data` alive itself).

import GCD
import Glibc
import Synchronization

/// The listing's `average`.
func average(_ data: [Int32]) -> Int32 {
  Int32(data.reduce(0) { $0 + Int($1) } / max(data.count, 1))
}

/// The listing's `average_async`: the result is handed to `block` on the caller's `queue`.
func averageAsync(_ data: [Int32], queue: Queue, _ block: @escaping @Sendable (Int32) -> Void) {
  // Capturing `queue` retains it, so it cannot disappear before the completion block is called.
  Queue.global(.default).async {
    let avg = average(data)
    print("average computed on the default global queue: \(Queue.global(.default).isCurrent)")
    queue.async { block(avg) }
    // The closure's reference to `queue` goes when it returns: the listing's dispatch_release.
  }
}

/// Steps, in the order they happen: the block runs, then the caller's queue is freed.
let steps = Mutex<[String]>([])
let done = try! Semaphore(value: 0)

/// Runs when the caller's queue is finally freed (its context is non-nil, so libdispatch calls it).
func callerQueueFinalizer(_ context: UnsafeMutableRawPointer?) {
  free(context)
  steps.withLock { $0.append("caller's queue freed") }
  print("the caller's queue is freed now")
  done.signal()
}

let labelKey = Queue.SpecificKey<String>()

do {
  let callerQueue = Queue(label: "com.example.CallerQueue")
  callerQueue.setSpecific(labelKey, "com.example.CallerQueue")
  callerQueue.context = malloc(1)
  callerQueue.setFinalizer(callerQueueFinalizer)

  let data: [Int32] = Array(1...100)
  averageAsync(data, queue: callerQueue) { avg in
    let on = Queue.currentSpecific(labelKey) ?? "another queue"
    print("completion block got average \(avg) on '\(on)'")
    steps.withLock { $0.append("block ran on \(on)") }
    done.signal()
  }
  print("the caller drops its reference to its queue right after calling average_async")
}

guard done.wait(timeout: .seconds(10)), done.wait(timeout: .seconds(10)) else {
  print("the completion block or the finalizer did not run within 10 s")
  exit(1)
}
let order = steps.withLock { $0 }
let expected = ["block ran on com.example.CallerQueue", "caller's queue freed"]
print("result delivered on the caller's queue: \(order.first == expected[0])")
print("caller's queue kept alive until the block ran: \(order == expected)")
