// Reproduces `InstallSignalHandler()` ("Monitoring a Signal"): `signal(SIGHUP, SIG_IGN)` so that the
// signal does not end the program, then a SIGNAL source for SIGHUP on the default global queue whose
// handler calls `MyProcessSIGHUP`.
//
// On Linux: libdispatch reads the signal through a signalfd and, when the source is registered,
// installs a handler of its own that routes deliveries there (so the ignored SIGHUP reaches the source).
// Deliveries close together are merged, by the kernel and by the source: `count` says how many one is.
//
// Usage: ExampleSignal [signals in the quick burst, default 5] [signals sent one at a time, default 3]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments
let burst = arguments.count > 1 ? Int(arguments[1]) ?? 5 : 5
let spaced = arguments.count > 2 ? Int(arguments[2]) ?? 3 : 3

let deliveries = Atomic<UInt>(0)
let events = Atomic<Int>(0)
let handled = try! Semaphore(value: 0)
let registered = try! Semaphore(value: 0)

/// `MyProcessSIGHUP`: `count` is the number of deliveries merged into this event.
func myProcessSIGHUP(_ count: UInt) {
  let event = events.add(1, ordering: .relaxed).newValue
  let total = deliveries.add(count, ordering: .relaxed).newValue
  print("MyProcessSIGHUP: event \(event) stands for \(count) SIGHUP(s); \(total) counted so far")
  handled.signal()
}

/// The listing's `InstallSignalHandler`; returns the source so that the program can keep it.
func installSignalHandler() -> SignalSource? {
  // Make sure the signal does not terminate the application.
  signal(SIGHUP, SIG_IGN)

  guard let source = try? SignalSource(signal: SIGHUP, queue: .global()) else { return nil }
  source.setEventHandler { [unowned source] in myProcessSIGHUP(source.count) }
  // Not in the listing: tells this program when the source is watching, before it sends signals.
  source.setRegistrationHandler { registered.signal() }
  // Start processing signals.
  source.resume()
  return source
}

guard let source = installSignalHandler() else {
  print("cannot create the signal source")
  exit(1)
}
guard registered.wait(timeout: .seconds(10)) else {
  print("the source was not registered in 10 s")
  exit(1)
}

// A quick burst: the deliveries come faster than the handler runs, so several are merged into one
// event (and the kernel itself keeps at most one SIGHUP pending, so some may merge even before that).
print("sending \(burst) SIGHUPs in a quick burst")
for _ in 0..<burst { kill(getpid(), SIGHUP) }
guard handled.wait(timeout: .seconds(10)) else {
  print("no SIGHUP event in 10 s")
  exit(1)
}
// Let the burst's events finish before the spaced signals: wait until an interval passes without one.
while handled.wait(timeout: .milliseconds(100)) {}
let burstEvents = events.load(ordering: .relaxed)
let burstCounted = deliveries.load(ordering: .relaxed)

// Spaced: each signal is sent only after the handler has seen the one before, so none can merge.
print("sending \(spaced) SIGHUPs one at a time, each after the handler has run")
for _ in 0..<spaced {
  kill(getpid(), SIGHUP)
  guard handled.wait(timeout: .seconds(10)) else {
    print("no SIGHUP event in 10 s")
    exit(1)
  }
}

let total = deliveries.load(ordering: .relaxed)
let sent = burst + spaced
print("burst: \(burst) sent, \(burstCounted) counted in \(burstEvents) event(s)")
print(
  "spaced: \(spaced) sent, \(total - burstCounted) counted in \(events.load(ordering: .relaxed) - burstEvents) event(s)"
)
print("total deliveries counted by `count`: \(total) of \(sent) sent (merged deliveries count once in the kernel)")
print("the process is still running: no SIGHUP ended it")
source.cancel()
