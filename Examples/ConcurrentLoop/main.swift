// Reproduces "Performing Loop Iterations Concurrently": a `for` loop whose iterations are independent
// becomes `dispatch_apply(count, queue, ^(size_t i) { … })` on a global concurrent queue, which runs
// the iterations in any order, at the same time, and returns when all are done.
//
// On Linux: the same call (`Queue.apply`, through `dispatch_apply_f`), run by the calling thread and
// libdispatch's workers, one per core. An `apply` onto the serial queue the caller runs on would
// deadlock; this library stops the process with a message instead.
//
// Usage: ExampleConcurrentLoop [iterations, default 64]

import GCD
import Glibc
import Synchronization

let count = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 64 : 64

/// One independent iteration: enough work (a millisecond or so) to pay for handing it to a thread.
func work(_ index: Int) -> Double {
  var sum = 0.0
  for k in 1...100_000 { sum += sin(Double(index &+ k)) }
  return sum
}

let clock = ContinuousClock()
var serial = [Double](repeating: 0, count: count)
let serialTime = clock.measure {
  for i in 0..<count { serial[i] = work(i) }
}

// The iterations run on several threads at once: the closure is @Sendable and shares state only
// through locks.
let results = Mutex([Double](repeating: .nan, count: count))
let runs = Mutex([Int](repeating: 0, count: count))
let applyTime = clock.measure {
  Queue.global().apply(count) { i in
    let value = work(i)
    results.withLock { $0[i] = value }
    runs.withLock { $0[i] += 1 }
  }
}

print("iterations: \(count); indexes that ran exactly once: \(runs.withLock { $0.filter { $0 == 1 }.count })")
print("results that differ from the serial loop: \(results.withLock { zip($0, serial).filter { $0 != $1 }.count })")
print(
  "serial loop \(Int(serialTime / .milliseconds(1))) ms, dispatch_apply \(Int(applyTime / .milliseconds(1))) ms:"
    + " speed-up \((serialTime / applyTime * 100).rounded() / 100)x on \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) cores")
