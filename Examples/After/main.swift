// Reproduces the `dispatch_after` / `dispatch_after_f` passage of "Creating a Timer": submit a block (or
// a function) to a queue once a time has come; the time may be relative (`dispatch_time`) or absolute
// on the wall clock (`dispatch_walltime`).
//
// On Linux: the same calls. Relative deadlines use the monotonic clock (CLOCK_MONOTONIC), wall-clock
// deadlines CLOCK_REALTIME; `Deadline` converts from Swift's `Duration`.
//
// Usage: ExampleAfter [delay in milliseconds, default 200]

import GCD
import Glibc
import Synchronization

let delayMilliseconds = CommandLine.arguments.count > 1 ? max(Int(CommandLine.arguments[1]) ?? 200, 0) : 200
let delay = Duration.milliseconds(delayMilliseconds)

let queue = Queue(label: "com.example.AfterQueue")
let clock = ContinuousClock()
let start = clock.now
let order = Mutex<[String]>([])
let early = Atomic<Int>(0)
let group = Group()

/// Records that `name` ran, and whether it ran before it was `due` (measured from before it was scheduled).
func ran(_ name: String, due: Duration) {
  let elapsed = clock.now - start
  let milliseconds = elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000
  print("\(name) ran after \(milliseconds) ms")
  if elapsed < due { early.add(1, ordering: .relaxed) }
  order.withLock { $0.append(name) }
  group.leave()
}

/// The `dispatch_after_f` form: a C function and its context.
func runAfterFunction(_ context: UnsafeMutableRawPointer?) {
  ran(String(cString: context!.assumingMemoryBound(to: CChar.self)), due: delay * 3)
}

print("scheduling with a delay of \(delayMilliseconds) ms")

// Relative: dispatch_after(dispatch_time(DISPATCH_TIME_NOW, delay), queue, ^{ ... }).
group.enter()
queue.after(delay) { ran("relative (after \(delayMilliseconds) ms)", due: delay) }

// Absolute, on the wall clock: dispatch_after(dispatch_walltime(&when, 0), queue, ^{ ... }), where `when`
// is a calendar time: now plus twice the delay.
var now = timespec()
clock_gettime(CLOCK_REALTIME, &now)
let when = Int(now.tv_nsec) + 2 * delayMilliseconds * 1_000_000
group.enter()
queue.after(
  deadline: .wallClock(secondsSinceEpoch: now.tv_sec + when / 1_000_000_000, nanoseconds: when % 1_000_000_000)
) {
  ran("wall clock (at now + \(2 * delayMilliseconds) ms)", due: delay * 2)
}

// dispatch_after_f: the function form, three delays from now.
let message = strdup("dispatch_after_f (after \(3 * delayMilliseconds) ms)")!
group.enter()
queue.after(deadline: .now + delay * 3, context: UnsafeMutableRawPointer(message), function: runAfterFunction)

// Like dispatch_async, but later: work submitted now without a delay runs first.
group.enter()
queue.async { ran("async (no delay)", due: .zero) }

guard group.wait(timeout: .seconds(10) + delay * 3) else {
  print("the delayed work did not run in time")
  exit(1)
}
free(message)
let ranInOrder = order.withLock { $0.map { $0.prefix(while: { $0 != " " }) } }
print("order: \(ranInOrder.joined(separator: ", "))")
print("all four ran: \(ranInOrder.count == 4)")
print("none ran before its time: \(early.load(ordering: .relaxed) == 0)")
print("in deadline order: \(ranInOrder == ["async", "relative", "wall", "dispatch_after_f"])")
