// Reproduces the `dispatch_after` / `dispatch_after_f` passage of "Creating a Timer": like
// `dispatch_async`, but the block (or function) is submitted once a time has come, given relative to
// now (`dispatch_time`) or on the wall clock (`dispatch_walltime`).
//
// On Linux: the same calls. Relative deadlines follow CLOCK_MONOTONIC, wall-clock ones CLOCK_REALTIME;
// a `Deadline` plus a Swift `Duration` is a later deadline.
//
// Usage: ExampleAfter [delay in milliseconds, default 200]

import GCD
import Glibc

let delay = Duration.milliseconds(CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1]) ?? 200 : 200)
let queue = Queue(label: "com.example.AfterQueue")
let start = ContinuousClock.now
let group = Group()

/// Prints when `name` ran, and when it was due, in milliseconds from the start.
func ran(_ name: String, due: Duration) {
  let elapsed = ContinuousClock.now - start
  print("\(name) ran after \(Int(elapsed / .milliseconds(1))) ms (due after \(Int(due / .milliseconds(1))) ms)")
  group.leave()
}

/// The function for `dispatch_after_f`; its context is its name.
func myDelayedFunction(_ context: UnsafeMutableRawPointer?) {
  ran(String(cString: context!.assumingMemoryBound(to: CChar.self)), due: delay * 3)
  free(context)
}

group.enter()
queue.async { ran("dispatch_async", due: .zero) }

group.enter()
queue.after(delay) { ran("dispatch_after(dispatch_time(DISPATCH_TIME_NOW, delay))", due: delay) }

// On the wall clock: a calendar time, now plus twice the delay.
var now = timespec()
clock_gettime(CLOCK_REALTIME, &now)
let when = Int(now.tv_nsec) + Int(delay * 2 / .nanoseconds(1))
group.enter()
queue.after(
  deadline: .wallClock(secondsSinceEpoch: now.tv_sec + when / 1_000_000_000, nanoseconds: when % 1_000_000_000)
) {
  ran("dispatch_after(dispatch_walltime(&when, 0))", due: delay * 2)
}

group.enter()
queue.after(deadline: .now + delay * 3, context: strdup("dispatch_after_f"), function: myDelayedFunction)
group.wait()
