// Reproduces the main dispatch queue passage ("Performing Tasks on the Main Thread"): a globally available
// serial queue, `dispatch_get_main_queue()`, that the program must drain, here with `dispatch_main()`.
//
// On Linux there is no run loop: the program calls `dispatchMain()`, which never returns and ends with
// `exit(0)` from a main-queue work item. libdispatch's own `dispatch_main` would end the main thread and
// drain the main queue on worker threads; `dispatchMain()` drains it on the main thread itself (the
// thread whose id is the process id), as a run loop does, one item at a time, in order.

import GCD
import Glibc
import Synchronization

/// The kernel's id for the current thread (`gettid`), read from /proc: Glibc's `gettid` is not visible
/// to Swift, and `syscall` is variadic.
func currentThreadID() -> pid_t {
  var buffer = [UInt8](repeating: 0, count: 64)
  let length = buffer.withUnsafeMutableBytes { readlink("/proc/thread-self", $0.baseAddress!, $0.count) }
  guard length > 0 else { return -1 }
  // "<pid>/task/<tid>"
  let link = String(decoding: buffer[..<length], as: UTF8.self)
  return pid_t(link.split(separator: "/").last ?? "") ?? -1
}

let producers = 3
let itemsPerProducer = 4
let pid = getpid()
let itemsRun = Atomic<Int>(0)
let itemsOnMainThread = Atomic<Int>(0)
let itemsSeeingMainQueue = Atomic<Int>(0)
let running = Atomic<Int>(0)
let mostAtOnce = Atomic<Int>(0)
let threads = Mutex<Set<pid_t>>([])
let order = Mutex<[String: [Int]]>([:])

print("main thread: pid \(pid), tid \(currentThreadID())")

// A safety net: if the main queue were never drained, end anyway (with a failure status).
Queue.global().after(.seconds(10)) {
  print("the main queue was not drained within 10 s")
  exit(1)
}

/// A work item for the main queue: records where and how it ran.
func mainQueueItem(from producer: String, number: Int) {
  mostAtOnce.max(running.add(1, ordering: .relaxed).newValue, ordering: .relaxed)
  let tid = currentThreadID()
  threads.withLock { _ = $0.insert(tid) }
  if tid == pid { itemsOnMainThread.add(1, ordering: .relaxed) }
  if Queue.main.isCurrent { itemsSeeingMainQueue.add(1, ordering: .relaxed) }
  order.withLock { $0[producer, default: []].append(number) }
  usleep(1_000)
  itemsRun.add(1, ordering: .relaxed)
  running.subtract(1, ordering: .relaxed)
}

// Producers on other queues submit work to the main queue; none of it runs until the program drains it.
let group = Group()
let submitted = Group()
for index in 0..<producers {
  let producer = Queue(label: "com.example.Producer\(index)")
  submitted.async(on: producer) {
    for number in 1...itemsPerProducer {
      group.enter()
      Queue.main.async {
        mainQueueItem(from: producer.label, number: number)
        group.leave()
      }
    }
    print("\(producer.label) (tid \(currentThreadID())) submitted \(itemsPerProducer) items to the main queue")
  }
}

// Another queue may wait for a main-queue item with `sync`, once the main queue is being drained.
group.async(on: Queue.global()) {
  let seen = Queue.main.sync { Queue.main.isCurrent }
  print("Queue.main.sync from a global queue ran on the main queue: \(seen)")
}

// When every item has run, a last main-queue item reports and ends the program.
group.notify(on: Queue.main) {
  let total = producers * itemsPerProducer
  let inOrder = order.withLock { $0.count == producers && $0.values.allSatisfy { $0 == Array(1...itemsPerProducer) } }
  print("main-queue items run: \(itemsRun.load(ordering: .relaxed)) of \(total)")
  print("every item saw Queue.main.isCurrent: \(itemsSeeingMainQueue.load(ordering: .relaxed) == total)")
  print("most main-queue items running at once: \(mostAtOnce.load(ordering: .relaxed))")
  print("each producer's items ran in the order submitted: \(inOrder)")
  print(
    "items on the main thread (tid == pid): \(itemsOnMainThread.load(ordering: .relaxed)) of \(total); "
      + "threads that drained the main queue: \(threads.withLock { $0.count })")
  print("exit(0) from a main-queue work item, on tid \(currentThreadID())")
  exit(0)
}

submitted.wait()
print(
  "items run before the main queue is drained: \(itemsRun.load(ordering: .relaxed)) of \(producers * itemsPerProducer)")
print("the main thread calls dispatchMain()")
dispatchMain()
