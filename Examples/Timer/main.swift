// Reproduces `CreateDispatchTimer(interval, leeway, queue, block)` and `MyCreateTimer()` ("Creating a
// Timer"): a TIMER source started on the wall clock (`dispatch_walltime(NULL, 0)`), so it fires at once and
// then every interval, with its handler on the main queue; `MyStoreTimer` keeps it for later use.
//
// On Linux: the same calls; the wall clock is CLOCK_REALTIME. There is no run loop here to drain the
// main queue, so the program calls `dispatchMain()` and ends with `exit(0)` from the last tick. The
// listing's 30 s interval and 1 s leeway become arguments with short defaults.
//
// Usage: ExampleTimer [interval in seconds, default 0.2] [ticks, default 5]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments
let intervalSeconds = arguments.count > 1 ? Double(arguments[1]) ?? 0.2 : 0.2
let tickCount = arguments.count > 2 ? Int(arguments[2]) ?? 5 : 5
let interval = Duration.milliseconds(Int64(intervalSeconds * 1000))

/// The listing's `CreateDispatchTimer`: a timer on `queue` that fires now, then every `interval`.
func createDispatchTimer(
  interval: Duration, leeway: Duration, queue: Queue, block: @escaping @Sendable () -> Void
) -> TimerSource {
  let timer = TimerSource(queue: queue)
  timer.schedule(start: .wallClock(), interval: interval, leeway: leeway)
  timer.setEventHandler(block)
  timer.resume()
  return timer
}

/// `MyStoreTimer`: where the application keeps its timer ("store it somewhere for later use").
let storedTimer = Mutex<TimerSource?>(nil)

func myStoreTimer(_ timer: TimerSource) {
  storedTimer.withLock { $0 = timer }
}

let clock = ContinuousClock()
let start = clock.now
let ticks = Atomic<Int>(0)
let fires = Atomic<UInt>(0)

func milliseconds(_ duration: Duration) -> Int64 {
  duration.components.seconds * 1000 + duration.components.attoseconds / 1_000_000_000_000_000
}

/// `MyPeriodicTask`: the timer's work, on the main queue.
func myPeriodicTask() {
  let tick = ticks.add(1, ordering: .relaxed).newValue
  let merged = storedTimer.withLock { $0?.fireCount ?? 0 }
  fires.add(merged, ordering: .relaxed)
  print(
    "tick \(tick) at \(milliseconds(clock.now - start)) ms, on the main queue: \(Queue.main.isCurrent),"
      + " fires merged into this event: \(merged)")
  if tick == tickCount {
    storedTimer.withLock { timer in
      timer?.cancel()
      timer = nil
    }
    print("ticks: \(tick) of \(tickCount); fires counted: \(fires.load(ordering: .relaxed))")
    print("first tick at once, then one every \(milliseconds(interval)) ms until the last: done")
    exit(0)
  }
}

/// The listing's `MyCreateTimer`, with the interval and leeway scaled down.
func myCreateTimer() {
  let timer = createDispatchTimer(
    interval: interval, leeway: interval / 20, queue: .main, block: { myPeriodicTask() })
  myStoreTimer(timer)
}

print("wall-clock timer: interval \(milliseconds(interval)) ms, \(tickCount) ticks, handler on the main queue")
myCreateTimer()
dispatchMain()
