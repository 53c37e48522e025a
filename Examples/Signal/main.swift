// Reproduces `InstallSignalHandler()` ("Monitoring a Signal"): `signal(SIGHUP, SIG_IGN)` so that the
// signal cannot end the program, then a SIGNAL source for SIGHUP on the default global queue whose
// handler calls `MyProcessSIGHUP`.
//
// On Linux: libdispatch reads signals through a signalfd, routed there by a handler of its own. The
// program sends itself SIGHUPs with `kill(getpid(), SIGHUP)`: a burst, whose deliveries merge (`count`
// says how many an event stands for), then a few one at a time, each once the last one was handled.
//
// Usage: ExampleSignal [SIGHUPs in the burst, default 5] [SIGHUPs one at a time, default 3]

import GCD
import Glibc
import Synchronization

let arguments = CommandLine.arguments.dropFirst().compactMap { Int($0) }
let burst = arguments.first ?? 5
let oneAtATime = arguments.dropFirst().first ?? 3
let counted = Atomic<UInt>(0)
let handled = try! Semaphore(value: 0)
let registered = try! Semaphore(value: 0)

func myProcessSIGHUP(_ count: UInt) {
  let total = counted.add(count, ordering: .relaxed).newValue
  print("MyProcessSIGHUP: this event stands for \(count) SIGHUP(s), \(total) so far")
  handled.signal()
}

func installSignalHandler() -> SignalSource? {
  // Make sure the signal does not terminate the application.
  signal(SIGHUP, SIG_IGN)

  guard let source = try? SignalSource(signal: SIGHUP, queue: .global(.default)) else { return nil }
  source.setEventHandler { myProcessSIGHUP(source.count) }
  // Not in the listing: tells the program that the source watches, before it sends signals.
  source.setRegistrationHandler { registered.signal() }
  // Start processing signals
  source.resume()
  return source
}

let source = installSignalHandler()
precondition(source != nil && registered.wait(timeout: .seconds(10)), "the signal source did not start")

print("kill(getpid(), SIGHUP) \(burst) times in a row")
for _ in 0..<burst { kill(getpid(), SIGHUP) }
precondition(handled.wait(timeout: .seconds(10)), "no SIGHUP was handled in 10 s")
while handled.wait(timeout: .milliseconds(200)) {}  // until the burst's last event is in

print("kill(getpid(), SIGHUP) \(oneAtATime) times, each after the handler has run")
for _ in 0..<oneAtATime {
  kill(getpid(), SIGHUP)
  precondition(handled.wait(timeout: .seconds(10)), "no SIGHUP was handled in 10 s")
}
print("sent \(burst + oneAtATime) SIGHUPs; counted \(counted.load(ordering: .relaxed)); the process still runs")
