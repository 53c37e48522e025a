// Reproduces "Waiting on Groups of Queued Tasks": `dispatch_get_global_queue(DISPATCH_QUEUE_PRIORITY_DEFAULT,
// 0)`, `dispatch_group_create`, `dispatch_group_async(group, queue, ^{ ... })`, other work,
// `dispatch_group_wait(group, DISPATCH_TIME_FOREVER)`, `dispatch_release(group)`; plus
// `dispatch_group_notify` and a `dispatch_group_wait` with a timeout.
//
// On Linux: the same calls. There is no `dispatch_release`: the group goes with its last reference,
// and a group dropped with an `enter()` still unmatched is balanced first instead of trapping.
//
// Usage: ExampleGroupWait [tasks, default 8]

import GCD
import Glibc
import Synchronization

let taskCount = CommandLine.arguments.count > 1 ? max(Int(CommandLine.arguments[1]) ?? 8, 1) : 8

let queue = Queue.global(.default)
var group: Group? = Group()
let finished = Atomic<Int>(0)

// Add tasks to the group.
for task in 1...taskCount {
  group!.async(on: queue) {
    usleep(UInt32(5_000 * (task % 4 + 1)))  // some asynchronous work
    finished.add(1, ordering: .relaxed)
  }
}

// Do some other work while the tasks execute.
print("other work while the tasks run: \(finished.load(ordering: .relaxed)) of \(taskCount) finished so far")

// When you cannot make any more forward progress, wait on the group to block the current thread.
group!.wait()
let afterWait = finished.load(ordering: .relaxed)
print("dispatch_group_wait returned with \(afterWait) of \(taskCount) tasks finished")
print("wait returned only after every task: \(afterWait == taskCount)")

// Release the group when it is no longer needed.
group = nil

// notify: instead of blocking, have a closure submitted when the group empties.
let notified = try Semaphore(value: 0)
let seenByNotify = Atomic<Int>(-1)
let notifyGroup = Group()
let notifyFinished = Atomic<Int>(0)
for _ in 1...taskCount {
  notifyGroup.async(on: queue) {
    usleep(5_000)
    notifyFinished.add(1, ordering: .relaxed)
  }
}
notifyGroup.notify(on: Queue(label: "com.example.NotifyQueue")) {
  seenByNotify.store(notifyFinished.load(ordering: .relaxed), ordering: .relaxed)
  notified.signal()
}
guard notified.wait(timeout: .seconds(10)) else {
  print("notify did not run within 10 s")
  exit(1)
}
print("notify ran after every task: \(seenByNotify.load(ordering: .relaxed) == taskCount)")

// A timed wait: while a piece of work (counted with enter()) is still outstanding, the wait times out.
let timedGroup = Group()
timedGroup.enter()
let timedOut = !timedGroup.wait(timeout: .milliseconds(50))
print("wait(timeout: 50 ms) with work outstanding timed out: \(timedOut)")
queue.async { timedGroup.leave() }
let completed = timedGroup.wait(timeout: .seconds(10))
print("after leave(), wait(timeout:) reports completion: \(completed)")
