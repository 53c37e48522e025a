// Reproduces Listing 3-3, "Installing a queue clean up function": `myFinalizerFunction` and
// `createMyQueue` (`malloc` a context, `dispatch_queue_create("com.example.CriticalTaskQueue", NULL)`,
// `dispatch_set_context`, `dispatch_set_finalizer_f`), with tasks that read the context back.
//
// On Linux: the same libdispatch calls (`Queue.context`, `Queue.setFinalizer`). There is no
// `dispatch_release`: the queue goes with its last reference (here the tasks hold it too), and the
// finalizer then runs once, asynchronously, on the queue's target queue.

import GCD
import Glibc

/// The queue's shared data: a C-style struct in malloc'ed memory.
struct MyDataContext {
  var name: UnsafeMutablePointer<CChar>
  var tasksRun: Int
}

/// Signalled by the finalizer: the program waits for it before it ends.
let finalized = try! Semaphore(value: 0)

func myInitializeDataContextFunction(_ data: UnsafeMutablePointer<MyDataContext>) {
  data.initialize(to: MyDataContext(name: strdup("critical data"), tasksRun: 0))
}

func myCleanUpDataContextFunction(_ data: UnsafeMutablePointer<MyDataContext>) {
  print("myCleanUpDataContextFunction: '\(String(cString: data.pointee.name))' after \(data.pointee.tasksRun) tasks")
  free(data.pointee.name)
  data.deinitialize(count: 1)
}

func myFinalizerFunction(_ context: UnsafeMutableRawPointer?) {
  let theData = context!.assumingMemoryBound(to: MyDataContext.self)
  // Clean up the contents of the structure
  myCleanUpDataContextFunction(theData)
  // Now release the structure itself.
  free(theData)
  print("myFinalizerFunction: context freed")
  finalized.signal()
}

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
for task in 1...3 {
  queue!.async { [queue = queue!] in
    let data = queue.context!.assumingMemoryBound(to: MyDataContext.self)
    data.pointee.tasksRun += 1
    print("task \(task) reads context '\(String(cString: data.pointee.name))'")
  }
}
print("dropping the program's reference to '\(queue!.label)' (the C code's dispatch_release)")
queue = nil
precondition(finalized.wait(timeout: .seconds(10)), "the finalizer did not run within 10 s")
