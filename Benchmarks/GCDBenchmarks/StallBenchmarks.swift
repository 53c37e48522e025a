import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The stall monitor (issue 39): its cost on (async with a monitor watching, against the `async`
// row of the same run, monitor off), and whether it finds what it should — every blocked queue,
// soon after the threshold; no report for short work; a starved pool within twice the threshold.
// libdispatch has no monitor: the C and Dispatch columns of the last three rows are n/a.

func stallBenchmarks(_ c: CLibrary?) -> [Benchmark] {
  let none = Runner.unavailable("n/a (no stall monitor)")
  return [
    Benchmark(
      name: "async_watched",
      title: "async onto a serial queue + drain, a StallMonitor watching (C and Dispatch: the async row's code)",
      count: 500_000,
      runners: [.c: c.runner("async"), .gcd: .run(gcdAsyncWatched), .dispatch: .run(dispatchAsync)]),
    Benchmark(
      name: "stall_report",
      title: "N serial queues blocked 1 s at once, threshold 200 ms: ms from crossing it to the report (max)",
      unit: "ms", count: 100, quickCount: 2, repeats: 3,
      shownExtras: [("p50", "p50 ms", 1), ("reported", "queues reported", 1), ("queues", "queues", 1)],
      runners: [.c: none, .gcd: .run(gcdStallReport), .dispatch: none]),
    Benchmark(
      name: "stall_quiet",
      title: "N items of 1 ms on 4 serial queues and 100 N empty ones, threshold 200 ms: reports made",
      unit: "reports", count: 10_000, quickCount: 20, repeats: 1,
      runners: [.c: none, .gcd: .run(gcdStallQuiet), .dispatch: none]),
    Benchmark(
      name: "stall_pool",
      title: "the default global pool starved (64 blocking items), threshold 200 ms: ms to the report",
      unit: "ms", count: 1, quickCount: 1, repeats: 3,
      runners: [.c: none, .gcd: .run(gcdStallPool), .dispatch: none]),
  ]
}

/// The `async` row's GCD code, with a monitor watching.
@inline(never)
func gcdAsyncWatched(_ count: Int) -> Sample {
  let monitor = StallMonitor(threshold: .seconds(10))
  defer { monitor.cancel() }
  return gcdAsync(count)
}

/// Collects `monitor`'s reports on a thread of its own until `done` returns true for the ones so far.
private func collectReports(
  _ monitor: StallMonitor, until done: @escaping @Sendable ([StallReport]) -> Bool
) -> [StallReport] {
  let collected = Mutex<[StallReport]>([])
  let finished = DispatchSemaphore(value: 0)
  let reports = monitor.makeReports()
  Task.detached {
    for await report in reports {
      let enough = collected.withLock { reports -> Bool in
        reports.append(report)
        return done(reports)
      }
      if enough { break }
    }
    finished.signal()
  }
  _ = finished.wait(timeout: .now() + 30)
  return collected.withLock { $0 }
}

private func milliseconds(_ duration: Duration) -> Double {
  Double(duration.components.seconds) * 1000 + Double(duration.components.attoseconds) / 1e15
}

@inline(never)
func gcdStallReport(_ count: Int) -> Sample {
  let threshold = Duration.milliseconds(200)
  let monitor = StallMonitor(threshold: threshold)
  defer { monitor.cancel() }
  let run = UInt32.random(in: 0...UInt32.max)
  let labels = (0..<count).map { "bench.stall.\(run).\($0)" }
  let queues = labels.map { Queue(label: $0) }
  for queue in queues { queue.async { usleep(1_000_000) } }
  let wanted = Set(labels)
  let reports = collectReports(monitor) { reports in
    Set(reports.filter { !$0.ended && wanted.contains($0.queueLabel) }.map(\.queueLabel)).count == wanted.count
  }
  for queue in queues { queue.sync {} }
  var first: [String: Duration] = [:]
  for report in reports where !report.ended && wanted.contains(report.queueLabel) {
    if first[report.queueLabel] == nil { first[report.queueLabel] = report.duration }
  }
  let late = first.values.map { milliseconds($0 - threshold) }.sorted()
  check(first.count == count, "stall_report: \(first.count) of \(count) blocked queues reported")
  return Sample(
    value: late.last ?? 0,
    extras: ["p50": late.isEmpty ? 0 : late[late.count / 2], "reported": Double(first.count), "queues": Double(count)])
}

@inline(never)
func gcdStallQuiet(_ count: Int) -> Sample {
  let monitor = StallMonitor(threshold: .milliseconds(200))
  let reports = monitor.makeReports()
  let run = UInt32.random(in: 0...UInt32.max)
  let labels = (0..<5).map { "bench.quiet.\(run).\($0)" }
  let queues = labels.map { Queue(label: $0) }
  let group = Group()
  for index in 0..<count { group.async(on: queues[index % 4]) { usleep(1000) } }
  for _ in 0..<(100 * count) { group.async(on: queues[4]) {} }
  group.wait()
  monitor.cancel()
  let found = Mutex(0)
  let finished = DispatchSemaphore(value: 0)
  Task.detached {
    for await report in reports where labels.contains(report.queueLabel) { found.withLock { $0 += 1 } }
    finished.signal()
  }
  finished.wait()
  return Sample(value: Double(found.withLock { $0 }))
}

@inline(never)
func gcdStallPool(_ count: Int) -> Sample {
  let threshold = Duration.milliseconds(200)
  let monitor = StallMonitor(threshold: threshold)
  defer { monitor.cancel() }
  // More than the pool will have: libdispatch adds threads to a pool whose workers block, and
  // those stay for a few seconds, into the next run.
  let blockers = 64
  let release = DispatchSemaphore(value: 0)
  for _ in 0..<blockers { Queue.global().async { _ = release.wait(timeout: .now() + 2) } }
  let reports = collectReports(monitor) { reports in
    reports.contains { $0.kind == .pool && !$0.ended && $0.queueLabel.hasPrefix("com.apple.root.default-qos") }
  }
  for _ in 0..<blockers { release.signal() }
  let first = reports.first { $0.kind == .pool && !$0.ended && $0.queueLabel.hasPrefix("com.apple.root.default-qos") }
  check(first != nil, "stall_pool: the starved default pool was not reported")
  return Sample(value: first.map { milliseconds($0.duration) } ?? 0)
}
