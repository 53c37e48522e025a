// Reproduces the suspend/resume passages ("Suspending and Resuming Queues", "Suspending and Resuming
// Dispatch Sources"): `dispatch_suspend` and `dispatch_resume` raise and lower a suspension count that
// must balance; suspension takes effect between work items, never interrupting a running one.
//
// On Linux: the same calls. A `resume()` with no matching `suspend()` stops with a message (libdispatch
// would trap without one), and a queue dropped while suspended is resumed first, so its queued work
// still runs instead of libdispatch crashing on the release of a suspended object. The same holds for
// a source, whose events that arrive while it is suspended are merged into one delivery.
//
// Usage: ExampleSuspendResume [pause in milliseconds, default 100]

import GCD
import Glibc
import Synchronization

let pauseMilliseconds = CommandLine.arguments.count > 1 ? max(Int(CommandLine.arguments[1]) ?? 100, 0) : 100

/// Lets time pass, to show that suspended work does not run meanwhile.
func letTimePass() { usleep(UInt32(pauseMilliseconds * 1000)) }

// MARK: - Queues

func suspendAndResumeAQueue() {
  print("-- queue")
  let queue = Queue(label: "com.example.SuspendableQueue")
  let ran = Mutex<[Int]>([])

  queue.suspend()
  queue.suspend()
  print("suspended twice: suspension count \(queue.suspensionCount)")
  for item in 1...5 {
    queue.async { ran.withLock { $0.append(item) } }
  }
  letTimePass()
  print("while suspended, items run: \(ran.withLock { $0.count }) of 5")

  queue.resume()
  letTimePass()
  print("after one resume (count \(queue.suspensionCount)), items run: \(ran.withLock { $0.count }) of 5")

  queue.resume()
  queue.sync {}
  let items = ran.withLock { $0 }
  print("after the second resume (count \(queue.suspensionCount)), items run: \(items.count) of 5")
  print("they ran in the order submitted: \(items == Array(1...5))")
  print("suspend and resume balanced: \(queue.suspensionCount == 0)")

  // Suspension takes effect between work items: the running one finishes, the next one waits.
  let started = try! Semaphore(value: 0)
  let proceed = try! Semaphore(value: 0)
  let finished = try! Semaphore(value: 0)
  let log = Mutex<[String]>([])
  queue.async {
    started.signal()
    proceed.wait()
    log.withLock { $0.append("running item finished") }
    finished.signal()
  }
  queue.async { log.withLock { $0.append("next item") } }
  started.wait()
  queue.suspend()  // while the first item runs
  proceed.signal()
  finished.wait()
  letTimePass()
  let seen = log.withLock { $0 }
  print("suspended while an item ran, then waited: \(seen.joined(separator: ", "))")
  queue.resume()
  queue.sync {}
  print("the running item finished and the next one waited: \(seen == ["running item finished"])")
  print("after resume: \(log.withLock { $0.joined(separator: ", ") })")

  // Dropping a suspended queue: the library balances the suspension first, so the queued work runs.
  let orphanRan = try! Semaphore(value: 0)
  do {
    let orphan = Queue(label: "com.example.DroppedWhileSuspended")
    orphan.suspend()
    orphan.async { orphanRan.signal() }
  }
  print("a queue dropped while suspended still ran its queued item: \(orphanRan.wait(timeout: .seconds(10)))")
}

// MARK: - Sources

func suspendAndResumeASource() {
  print("-- source")
  let queue = Queue(label: "com.example.SourceQueue")
  let source = DataAddSource(queue: queue)
  let deliveries = Mutex<[UInt]>([])
  let delivered = try! Semaphore(value: 0)
  source.setEventHandler { [unowned source] in
    let data = source.data
    deliveries.withLock { $0.append(data) }
    print("source handler: data \(data)")
    delivered.signal()
  }
  source.resume()
  source.merge(1)
  _ = delivered.wait(timeout: .seconds(10))
  print("source running: merge(1) delivered \(deliveries.withLock { $0 })")

  source.suspend()
  source.suspend()
  for value: UInt in 1...5 { source.merge(value) }
  // Were a delivery due, it would be on the queue ahead of this sync's work item.
  queue.sync {}
  letTimePass()
  print("source suspended twice, merged 1...5: deliveries while suspended: \(deliveries.withLock { $0.count - 1 })")

  source.resume()
  queue.sync {}
  print("source after one resume (one suspend() outstanding), deliveries: \(deliveries.withLock { $0.count - 1 })")

  source.resume()
  _ = delivered.wait(timeout: .seconds(10))
  queue.sync {}
  let afterResume = deliveries.withLock { Array($0.dropFirst()) }
  print("source after the second resume, deliveries: \(afterResume)")
  print("the five merges arrived as one coalesced delivery of 15: \(afterResume == [15])")

  source.merge(7)
  _ = delivered.wait(timeout: .seconds(10))
  queue.sync {}
  let last = deliveries.withLock { $0.last ?? 0 }
  print("source suspend and resume balanced, the next merge is delivered alone: \(last == 7)")
  source.cancel()
}

suspendAndResumeAQueue()
suspendAndResumeASource()
