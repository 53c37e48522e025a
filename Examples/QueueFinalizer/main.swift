// Reproduces Listing 3-3, "Installing a queue clean up function": `myFinalizerFunction` and
// `createMyQueue` (`malloc`, `dispatch_queue_create`, `dispatch_set_context`, `dispatch_set_finalizer_f`).
//
// On Linux: the same libdispatch calls, through `Queue.context` and `Queue.setFinalizer`. There is no
// `dispatch_release`: the queue goes when its last Swift reference (and the work queued on it) goes. The
// finalizer runs asynchronously on the queue's target queue, and only when the context is non-nil.

import GCD
import Glibc
import Synchronization

/// The queue's shared data, as in the listing: a plain C-style struct that lives in malloc'ed memory.
struct MyDataContext {
  var name: UnsafeMutablePointer<CChar>
  var tasksRun: Int
}

/// How many `MyDataContext`s are allocated and not yet freed.
let liveContexts = Atomic<Int>(0)
/// How many times `myFinalizerFunction` ran.
let finalizerRuns = Atomic<Int>(0)
/// Signalled by the finalizer, so that the program can wait for it.
let finalized = try! Semaphore(value: 0)

func myInitializeDataContextFunction(_ data: UnsafeMutablePointer<MyDataContext>) {
  data.initialize(to: MyDataContext(name: strdup("critical data"), tasksRun: 0))
  liveContexts.add(1, ordering: .relaxed)
}

func myCleanUpDataContextFunction(_ data: UnsafeMutablePointer<MyDataContext>) {
  free(data.pointee.name)
  data.deinitialize(count: 1)
  liveContexts.subtract(1, ordering: .relaxed)
}

/// Listing 3-3's `myFinalizerFunction`: libdispatch calls it with the context once the queue is gone.
func myFinalizerFunction(_ context: UnsafeMutableRawPointer?) {
  let theData = context!.assumingMemoryBound(to: MyDataContext.self)
  print("myFinalizerFunction: '\(String(cString: theData.pointee.name))' after \(theData.pointee.tasksRun) tasks")
  // Clean up the contents of the structure.
  myCleanUpDataContextFunction(theData)
  // Now release the structure itself.
  free(theData)
  finalizerRuns.add(1, ordering: .relaxed)
  finalized.signal()
}

/// Listing 3-3's `createMyQueue`.
func createMyQueue() -> Queue {
  let data = malloc(MemoryLayout<MyDataContext>.size)!.bindMemory(to: MyDataContext.self, capacity: 1)
  myInitializeDataContextFunction(data)
  // Create the queue and set the context data.
  let serialQueue = Queue(label: "com.example.CriticalTaskQueue")
  serialQueue.context = UnsafeMutableRawPointer(data)
  serialQueue.setFinalizer(myFinalizerFunction)
  return serialQueue
}

var queue: Queue? = createMyQueue()
print("created '\(queue!.label)' with a malloc'ed context; live contexts: \(liveContexts.load(ordering: .relaxed))")

// Tasks read the shared data back through the queue's context pointer. Each task holds the queue, so
// the queue outlives this program's own reference to it.
for task in 1...3 {
  queue!.async { [queue = queue!] in
    let data = queue.context!.assumingMemoryBound(to: MyDataContext.self)
    data.pointee.tasksRun += 1
    print("task \(task) reads context '\(String(cString: data.pointee.name))', tasks run: \(data.pointee.tasksRun)")
  }
}

print("dropping the program's reference to the queue (the C code's dispatch_release)")
queue = nil

guard finalized.wait(timeout: .seconds(10)) else {
  print("the finalizer did not run within 10 s")
  exit(1)
}

// A queue whose context is nil: libdispatch skips the finalizer. The queue funnels through a serial
// queue of our own, on which libdispatch would submit the finalizer; once that queue has drained what
// was submitted before, a finalizer would have run.
let finalizerTarget = Queue(label: "com.example.FinalizerTarget")
var noContextQueue: Queue? = Queue(label: "com.example.NoContextQueue", target: finalizerTarget)
noContextQueue!.setFinalizer(myFinalizerFunction)
noContextQueue = nil
finalizerTarget.sync {}

print("finalizer runs: \(finalizerRuns.load(ordering: .relaxed)) (once, for the queue with a context)")
print("live contexts after the finalizer: \(liveContexts.load(ordering: .relaxed))")
