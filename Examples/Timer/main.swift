// Reproduces `CreateDispatchTimer(interval, leeway, queue, block)` and `MyCreateTimer()` ("Creating a
// Timer"): a TIMER source started at `dispatch_walltime(NULL, 0)`, so it fires at once and then every
// interval, running `MyPeriodicTask` on the main queue; `MyStoreTimer` keeps it for later use.
//
// On Linux: the same calls; the wall clock is CLOCK_REALTIME. No run loop drains the main queue, so the
// program calls `Queue.dispatchMain()` and ends with `exit(0)` from the last tick. The listing's 30 s interval
// and 1 s leeway become the interval argument and a twentieth of it.
//
// Usage: ExampleTimer [interval in seconds, default 0.2] [ticks, default 5]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments
let interval = Duration.seconds(arguments.count > 1 ? Double(arguments[1]) ?? 0.2 : 0.2)
let ticks = arguments.count > 2 ? Int(arguments[2]) ?? 5 : 5

func createDispatchTimer(
  interval: Duration, leeway: Duration, queue: Queue, block: @escaping @Sendable () -> Void
) -> TimerSource {
  let timer = TimerSource(queue: queue)
  timer.schedule(start: .wallClock(), interval: interval, leeway: leeway)
  timer.setEventHandler(block)
  timer.resume()
  return timer
}

/// Where the application keeps its timer.
let storedTimer = Mutex<TimerSource?>(nil)

func myStoreTimer(_ timer: TimerSource) {
  storedTimer.withLock { $0 = timer }
}

let start = ContinuousClock.now
let tick = Atomic<Int>(0)

func myPeriodicTask() {
  let n = tick.add(1, ordering: .relaxed).newValue
  let onMain = Queue.main.isCurrent ? "on the main queue" : "off the main queue"
  print(
    "MyPeriodicTask: tick \(n) of \(ticks) at \(Int((ContinuousClock.now - start) / .milliseconds(1))) ms, \(onMain)")
  if n == ticks {
    storedTimer.withLock { $0?.cancel() }
    exit(0)
  }
}

func myCreateTimer() {
  let aTimer = createDispatchTimer(
    interval: interval, leeway: interval / 20, queue: .main, block: { myPeriodicTask() })
  // Store it somewhere for later use.
  myStoreTimer(aTimer)
}

myCreateTimer()
Queue.dispatchMain()
