// Reproduces "Waiting on Groups of Queued Tasks": `dispatch_group_async(group, global queue, ^{ … })`,
// other work, `dispatch_group_wait(group, DISPATCH_TIME_FOREVER)`, `dispatch_release(group)`; then
// `dispatch_group_notify`, and a `dispatch_group_wait` with a timeout.
//
// On Linux: the same calls. The group goes with its last reference (no `dispatch_release`), and
// `wait(timeout:)` returns true when the group is done instead of `dispatch_group_wait`'s 0.
//
// Usage: ExampleGroupWait [tasks, default 8]

import GCD
import Glibc
import Synchronization

let taskCount = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 8 : 8
let queue = Queue.global(.default)
var group: Group? = Group()
let finished = Atomic<Int>(0)
let notified = try Semaphore(value: 0)

// Add a task to the group
for task in 1...taskCount {
  group!.async(on: queue) {
    usleep(UInt32(5_000 * (task % 4 + 1)))  // some asynchronous work
    finished.add(1, ordering: .relaxed)
  }
}
// Instead of blocking, notify submits a block once the group is empty.
group!.notify(on: queue) {
  print("notify: \(finished.load(ordering: .relaxed)) of \(taskCount) tasks finished")
  notified.signal()
}

// Do some other work while the tasks execute.
print("other work while the tasks run: \(finished.load(ordering: .relaxed)) of \(taskCount) finished so far")

// When you cannot make any more forward progress, wait on the group to block the current thread.
group!.wait()
print("dispatch_group_wait returned: \(finished.load(ordering: .relaxed)) of \(taskCount) tasks finished")

// Release the group when it is no longer needed.
group = nil
notified.wait()

// A timed wait: with one piece of work (counted with enter()) outstanding, it times out.
let timed = Group()
timed.enter()
print(
  "wait(timeout: 50 ms) with one enter() outstanding: \(timed.wait(timeout: .milliseconds(50)) ? "done" : "timed out")")
queue.async { timed.leave() }
print("wait(timeout: 10 s) after the matching leave(): \(timed.wait(timeout: .seconds(10)) ? "done" : "timed out")")
