// Reproduces "Performing a Completion Block When a Task Is Done": `average_async(data, len, queue,
// block)` retains the caller's queue, computes on the default global queue, calls `block(avg)` back
// on the caller's queue, and releases the queue.
//
// On Linux: the same calls. The closure's capture of `queue` is the `dispatch_retain`, its end the
// `dispatch_release`. The data is an array captured by value, so the caller cannot free it too early.

import GCD
import Glibc

func average(_ data: [Int32]) -> Int32 {
  Int32(data.reduce(0) { $0 + Int($1) } / max(data.count, 1))
}

func averageAsync(_ data: [Int32], queue: Queue, _ block: @escaping @Sendable (Int32) -> Void) {
  // Capturing `queue` retains it, so it cannot disappear before the completion block is called.
  Queue.global(.default).async {
    let avg = average(data)
    queue.async { block(avg) }
    // The closure's reference to `queue` goes when it returns: the listing's dispatch_release.
  }
}

/// Lets a block name the queue it runs on.
let queueName = Queue.SpecificKey<String>()
/// Signalled by the completion block and by the caller's queue's finalizer.
let done = try! Semaphore(value: 0)

do {
  let callerQueue = Queue(label: "com.example.CallerQueue")
  callerQueue.setSpecific(queueName, callerQueue.label)
  // The finalizer says when the queue is freed (libdispatch calls it for a non-nil context only).
  callerQueue.context = UnsafeMutableRawPointer(strdup(callerQueue.label))
  callerQueue.setFinalizer { context in
    print("finalizer: '\(String(cString: context!.assumingMemoryBound(to: CChar.self)))' is freed")
    free(context)
    done.signal()
  }
  print("average_async(1...100) from '\(callerQueue.label)'s owner, which lets go of it right after")
  averageAsync(Array(1...100), queue: callerQueue) { avg in
    print("completion block: average \(avg), on '\(Queue.currentSpecific(queueName) ?? "another queue")'")
    done.signal()
  }
}
precondition(done.wait(timeout: .seconds(10)) && done.wait(timeout: .seconds(10)), "nothing ran in 10 s")
