// Reproduces "Performing Loop Iterations Concurrently": `dispatch_apply` / `dispatch_apply_f` replacing a
// `for` loop whose iterations are independent; the call returns only when every iteration is done, and
// calling it with the serial queue the code is already running on deadlocks.
//
// On Linux: the same `dispatch_apply_f` (`Queue.apply`; the C-function form is in ExampleFunctionHandlers).
// libdispatch runs the iterations on the calling thread plus its worker threads, one per core. Instead of
// deadlocking, an `apply` onto the serial queue the caller runs on stops the process with a message.
//
// Usage: ExampleConcurrentLoop [iterations, default 64]

import GCD
import Glibc
import Synchronization

let iterations = CommandLine.arguments.count > 1 ? max(Int(CommandLine.arguments[1]) ?? 64, 1) : 64

/// One independent iteration: enough work (about a millisecond) to pay for handing it to a thread.
func work(_ index: Int) -> Double {
  var sum = 0.0
  for k in 1...100_000 { sum += sin(Double(index &+ k)) }
  return sum
}

func seconds(_ duration: Duration) -> Double {
  Double(duration.components.seconds) + Double(duration.components.attoseconds) * 1e-18
}

let clock = ContinuousClock()

// The serial loop the listing replaces (after a warm-up, so that both loops run warm).
_ = work(0)
var serial = [Double](repeating: 0, count: iterations)
let serialTime = clock.measure {
  for index in 0..<iterations { serial[index] = work(index) }
}

// The same loop through dispatch_apply on a global concurrent queue: the iterations run in any order and
// at the same time, and apply returns when all are done. They share state only through locks.
let results = Mutex([Double](repeating: 0, count: iterations))
let runs = Mutex([Int](repeating: 0, count: iterations))
let startOrder = Mutex<[Int]>([])
let threads = Mutex<Set<pthread_t>>([])

/// The iterations run on several threads at once, so `apply` takes a `@Sendable` closure: it can
/// touch only thread-safe state (here `Mutex`es), and the compiler checks that.
func concurrentLoop() {
  Queue.global().apply(iterations) { index in
    runs.withLock { $0[index] += 1 }
    startOrder.withLock { $0.append(index) }
    threads.withLock { _ = $0.insert(pthread_self()) }
    let value = work(index)
    results.withLock { $0[index] = value }
  }
}
let concurrentTime = clock.measure { concurrentLoop() }

print("iterations: \(iterations) on \(sysconf(Int32(_SC_NPROCESSORS_ONLN))) cores")
print("threads that ran iterations: \(threads.withLock { $0.count }) (the caller and libdispatch's workers)")
let inIndexOrder = startOrder.withLock { $0 == Array(0..<iterations) }
print("started in index order this time: \(inIndexOrder) (dispatch_apply promises no order)")
print("every index ran exactly once: \(runs.withLock { $0.allSatisfy { $0 == 1 } })")
print("result equals the serial loop: \(results.withLock { $0 == serial })")
let speedUp = seconds(serialTime) / seconds(concurrentTime)
print(
  "serial loop: \(Int(seconds(serialTime) * 1000)) ms, apply: \(Int(seconds(concurrentTime) * 1000)) ms, "
    + "speed-up: \((speedUp * 100).rounded() / 100)x (near the core count when the machine is otherwise idle)")

// On a serial queue, apply runs the iterations one after another, in index order: correct, no faster.
let serialQueueOrder = Mutex<[Int]>([])
func serialLoop() {
  Queue(label: "com.example.SerialLoop").apply(8) { index in serialQueueOrder.withLock { $0.append(index) } }
}
serialLoop()
print("apply on a serial queue runs in index order: \(serialQueueOrder.withLock { $0 == Array(0..<8) })")
