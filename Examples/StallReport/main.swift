// StallReport: a serial queue blocked on purpose and a global pool starved on purpose, each
// reported by a `StallMonitor` as it happens — which queue, which thread, how long, where — and
// once more when it ends. Then the blocked queue's statistics.
//
// Usage: ExampleStallReport            the two stalls, reported through makeReports()
//        ExampleStallReport --quiet    only a blocked queue, no monitor in the code: run it with
//                                      GCD_STALL_REPORT=100ms to get the reports on standard error

import GCD
import Glibc

/// A call that blocks its thread, as a synchronous database driver or a DNS lookup does.
func blockingCall(milliseconds: UInt32) { usleep(milliseconds * 1000) }

if CommandLine.arguments.contains("--quiet") {
  let queue = Queue(label: "com.example.quiet")
  await queue.run { blockingCall(milliseconds: 700) }
  print("quiet: done")
  exit(0)
}

// What a service does once, at start: watch, and log each report.
let monitor = StallMonitor(threshold: .milliseconds(200))
let reports = monitor.makeReports()

// 1. A serial queue blocked by one piece of work that runs 1 s.
let database = Queue(label: "com.example.database")
for _ in 0..<20 { database.async { blockingCall(milliseconds: 1) } }
database.async { blockingCall(milliseconds: 1000) }
for await report in reports {
  guard report.kind == .queue, report.queueLabel == "com.example.database" else { continue }
  print(report)
  if report.ended { break }
}

// 2. The global pool starved: more blocking work than it has threads, so new work waits.
let threads = 4 * Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))
for _ in 0..<threads { Queue.global().async { blockingCall(milliseconds: 1200) } }
for await report in reports {
  guard report.kind == .pool, report.queueLabel.hasPrefix("com.apple.root.default-qos") else { continue }
  print(report)
  if report.ended { break }
}

// The blocked queue's counts and times since the monitor started.
for statistics in monitor.statistics() where statistics.queueLabel == "com.example.database" {
  print(
    "statistics: '\(statistics.queueLabel)' submitted \(statistics.submitted), started \(statistics.started),"
      + " completed \(statistics.completed); run p50 \(statistics.runTime.p50), max \(statistics.runTime.max)")
}
monitor.cancel()
