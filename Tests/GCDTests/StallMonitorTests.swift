import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// A label no other test uses.
private func uniqueLabel(_ stem: String) -> String { "stall.test.\(stem).\(UInt32.random(in: 0...UInt32.max))" }

/// Blocks the calling thread (a queue's worker) for `milliseconds`; not private, so that its
/// symbol reads `stallTestBlock` in a report's stack.
func stallTestBlock(milliseconds: UInt32) { usleep(milliseconds * 1000) }

/// The reports with `label`, up to and including the one that ends the stall.
private func reportsUntilEnded(_ reports: StallMonitor.Reports, label: String) async -> [StallReport] {
  var found: [StallReport] = []
  for await report in reports where report.queueLabel == label {
    found.append(report)
    if report.ended { break }
  }
  return found
}

/// The threshold doubled `times` times.
private func doubled(_ threshold: Duration, _ times: Int) -> Duration { threshold * (1 << times) }

// The monitor is process-wide, and the tests beside these run while it watches: each test follows
// the reports of its own queue (a unique label) or its own pool (the utility QoS, which no other
// test starves), and asserts invariants, not timings (`make bench` times the reports).
@Suite("StallMonitor", .serialized)
struct StallMonitorTests {
  @Test(
    "a serial queue blocked 2 s: reported past the threshold, again at each doubling, once more when it ends, with the thread, the kernel's view and, past four times the threshold, the stack",
    .timeLimit(.minutes(1)))
  func blockedQueue() async {
    let threshold = Duration.milliseconds(200)
    let monitor = StallMonitor(threshold: threshold)
    let reports = monitor.makeReports()
    let label = uniqueLabel("blocked")
    let queue = Queue(label: label)
    let blocker = Atomic<Int32>(0)
    queue.async {
      blocker.store(currentThreadID(), ordering: .sequentiallyConsistent)
      stallTestBlock(milliseconds: 2000)
    }
    let found = await reportsUntilEnded(reports, label: label)
    monitor.cancel()

    let during = found.filter { !$0.ended }
    #expect(!during.isEmpty && found.last?.ended == true, "\(found)")
    #expect(found.filter(\.ended).count == 1)
    for (index, report) in during.enumerated() {
      #expect(report.kind == .queue)
      // The first is past the threshold; each later one past the next doubling (a late tick may
      // skip one, never report one early).
      #expect(report.duration >= doubled(threshold, index), "\(during)")
      #expect(report.threadID == blocker.load(ordering: .sequentiallyConsistent))
      #expect(report.kernelState?.contains("state ") == true, "\(report)")
      #expect(report.description.hasPrefix("GCD stall: queue '\(label)' blocked for "), "\(report)")
      #expect(report.site != nil)
    }
    #if arch(x86_64)
      // From four times the threshold on, the stack: innermost, the sleep's system call in the C
      // library; then the code that called it.
      let deep = during.filter { $0.duration >= threshold * 4 }
      #expect(!deep.isEmpty, "\(during)")
      for report in deep {
        #expect(report.stack.first?.contains("sleep") == true, "\(report.stack)")
        #expect(report.stack.contains { $0.contains("stallTestBlock") }, "\(report.stack)")
      }
      let early = during.filter { $0.duration < threshold * 4 }
      #expect(early.allSatisfy { $0.stack.isEmpty })
    #endif
    if let end = found.last {
      #expect(end.stack.isEmpty)
      #expect(end.duration >= .milliseconds(2000) && end.duration < .seconds(30), "\(end)")
      #expect(end.threadID == blocker.load(ordering: .sequentiallyConsistent))
      #expect(end.description.hasPrefix("GCD stall: queue '\(label)' ended after "), "\(end)")
    }
  }

  @Test(
    "a pool starved by blocking work: a .pool report for its global queue past the threshold, and one when work starts again",
    .timeLimit(.minutes(1)))
  func starvedPool() async {
    let threshold = Duration.milliseconds(200)
    let monitor = StallMonitor(threshold: threshold)
    let reports = monitor.makeReports()
    // Four times as many blocking items as the pool has threads at first (one per core).
    let blockers = 4 * max(2, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
    let released = Event()
    let utility = Queue.global(qos: .utility)
    for _ in 0..<blockers { utility.async { _ = released.wait(timeout: .milliseconds(1500)) } }
    var found: [StallReport] = []
    for await report in reports where report.kind == .pool && report.queueLabel.contains("utility") {
      found.append(report)
      if report.ended { break }
      released.signal()  // the first report is in: let the pool go
    }
    monitor.cancel()
    #expect(found.count >= 2 && found.last?.ended == true, "\(found)")
    if let first = found.first {
      #expect(!first.ended && first.duration >= threshold, "\(first)")
      #expect(first.threadID == nil && first.site == nil)
      #expect(first.description.hasPrefix("GCD stall: pool 'com.apple.root.utility-qos"), "\(first)")
    }
    if let end = found.last { #expect(end.duration >= threshold, "\(end)") }
  }

  @Test(
    "short work raises no report: 1,000 items of 1 ms on four serial queues and 100,000 empty ones",
    .timeLimit(.minutes(2)))
  func noFalsePositive() async {
    let monitor = StallMonitor(threshold: .milliseconds(500))
    let reports = monitor.makeReports()
    let labels = (0..<5).map { uniqueLabel("short\($0)") }
    let queues = labels.map { Queue(label: $0) }
    let group = Group()
    for index in 0..<1000 { group.async(on: queues[index % 4]) { stallTestBlock(milliseconds: 1) } }
    for _ in 0..<100_000 { group.async(on: queues[4]) {} }
    try? await group.wait()
    monitor.cancel()
    var mine: [StallReport] = []
    for await report in reports where labels.contains(report.queueLabel) { mine.append(report) }
    #expect(mine.isEmpty, "\(mine)")
  }

  @Test("statistics count what was submitted, started and completed on a queue, over the interval since the last call")
  func statistics() async {
    let monitor = StallMonitor(threshold: .seconds(5))
    let label = uniqueLabel("statistics")
    let queue = Queue(label: label)
    // The first item holds the queue until every item is submitted, then runs 20 ms: each item
    // behind it waits at least that long, however late its submission came (under ASan, the
    // submissions after a first item that had already started made a wait of 19.99 ms).
    let submitted = Event()
    for index in 0..<50 {
      queue.async {
        guard index == 0 else { return }
        _ = submitted.wait()
        stallTestBlock(milliseconds: 20)
      }
    }
    // Group work leaves its group after the work's end is recorded: the wait sees every count.
    let group = Group()
    for _ in 0..<10 { group.async(on: queue) {} }
    submitted.signal()
    try? await group.wait()
    let rows = monitor.statistics().filter { $0.queueLabel == label }
    #expect(rows.count == 1, "\(rows)")
    if let row = rows.first {
      #expect(row.submitted == 60 && row.started == 60 && row.completed == 60, "\(row)")
      #expect(row.runTime.max >= .milliseconds(20), "\(row)")
      #expect(row.runTime.p50 <= row.runTime.p99 && row.runTime.p99 <= row.runTime.max, "\(row)")
      // The items behind the 20 ms one waited for it.
      #expect(row.waitTime.max >= .milliseconds(20) && row.waitTime.p50 <= row.waitTime.max, "\(row)")
    }
    // Nothing ran on it since: no row.
    #expect(monitor.statistics().filter { $0.queueLabel == label }.isEmpty)
    group.async(on: queue) {}
    try? await group.wait()
    let again = monitor.statistics().filter { $0.queueLabel == label }
    #expect(again.map(\.submitted) == [1] && again.map(\.completed) == [1], "\(again)")
    monitor.cancel()
  }

  @Test("the watched path is on while a monitor lives and off once the last one is cancelled or dropped")
  func watchingFollowsMonitors() async {
    do {
      let first = StallMonitor(threshold: .seconds(1))
      let second = StallMonitor(threshold: .seconds(1))
      #expect(stallWatching)
      first.cancel()
      #expect(stallWatching)
      _ = second
    }
    // Other suites' monitors may run beside this one only if they are in this suite (serialized).
    #expect(!stallWatching)
  }

  @Test("a cancelled monitor's sequence ends; one made after the cancel is empty")
  func cancelEndsSequences() async {
    let monitor = StallMonitor(threshold: .seconds(1))
    let reports = monitor.makeReports()
    monitor.cancel()
    var count = 0
    for await _ in reports { count += 1 }
    for await _ in monitor.makeReports() { count += 1 }
    #expect(count == 0)
  }

  @Test(
    "ExampleStallReport: the blocked queue and the starved pool, each reported and ended, and the queue's statistics",
    .timeLimit(.minutes(2)))
  func example() async throws {
    let run = try await ExampleRun("StallReport")
    run.expectOrder(
      "GCD stall: queue 'com.example.database' blocked for ", "GCD stall: queue 'com.example.database' ended after ",
      "GCD stall: pool 'com.apple.root.default-qos (QoS default)' starved: work submitted ",
      "GCD stall: pool 'com.apple.root.default-qos (QoS default)' ended: work started after ",
      "statistics: 'com.example.database' submitted 21, started 21, completed 21;")
    run.expect("ended after ", times: 1)
  }

  @Test("statistics keep a row for a new queue after 600 others ran work: the least recently used row is given up")
  func statisticsPastTheTable() async {
    let monitor = StallMonitor(threshold: .seconds(5))
    let others = (0..<600).map { Queue(label: uniqueLabel("filler\($0)")) }
    let group = Group()
    for queue in others { group.async(on: queue) {} }
    try? await group.wait()
    let label = uniqueLabel("after-fillers")
    let queue = Queue(label: label)
    for _ in 0..<3 { group.async(on: queue) {} }
    try? await group.wait()
    let rows = monitor.statistics().filter { $0.queueLabel == label }
    #expect(rows.map(\.completed) == [3], "\(rows)")
    monitor.cancel()
    _ = others
  }

  @Test("a queue made where freed ones were gets its own row: rows do not outlive the last monitor or their queue")
  func statisticsAfterQueuesFreed() async {
    let group = Group()
    do {
      let first = StallMonitor(threshold: .seconds(5))
      let fillers = (0..<300).map { Queue(label: uniqueLabel("freed\($0)")) }
      for queue in fillers { group.async(on: queue) {} }
      try? await group.wait()
      first.cancel()
      _ = fillers  // freed here, with no monitor to clear their rows on the way
    }
    // New queues, likely at the addresses just freed, made before the next monitor (so their
    // init clears nothing): each gets a row of its own label and counts.
    let labels = (0..<50).map { uniqueLabel("reborn\($0)") }
    let queues = labels.map { Queue(label: $0) }
    let second = StallMonitor(threshold: .seconds(5))
    for queue in queues { group.async(on: queue) {} }
    try? await group.wait()
    let rows = second.statistics().filter { labels.contains($0.queueLabel) }
    #expect(Set(rows.map(\.queueLabel)) == Set(labels), "\(rows.count) of \(labels.count) rows")
    #expect(rows.allSatisfy { $0.submitted == 1 && $0.completed == 1 }, "\(rows)")
    second.cancel()
    _ = queues
  }

  @Test("a watched queue's statistics row takes at most 256 bytes")
  func bytesPerQueue() {
    #expect(stallBytesPerQueue <= 256)
  }

  @Test("GCD_STALL_REPORT parses a duration in ms or s and refuses anything else")
  func parsing() {
    #expect(stallThreshold(parsing: "500ms") == .milliseconds(500))
    #expect(stallThreshold(parsing: "2s") == .seconds(2))
    #expect(stallThreshold(parsing: " 1.5s ") == .milliseconds(1500))
    for bad in ["", "fast", "500", "0ms", "-1s", "ms", "1h"] { #expect(stallThreshold(parsing: bad) == nil, "\(bad)") }
  }

  @Test(
    "GCD_STALL_REPORT=100ms: a process that never names the monitor prints its reports on standard error",
    .timeLimit(.minutes(2)))
  func environmentVariable() async throws {
    let run = try await ExampleRun("StallReport", arguments: ["--quiet"], environment: ["GCD_STALL_REPORT": "100ms"])
    run.expectOrder("GCD stall: queue 'com.example.quiet' blocked for ", "quiet: done")
    #expect(run.output.contains("(state "), "\(run.output)")
    let refused = try await ExampleRun("StallReport", arguments: ["--quiet"], environment: ["GCD_STALL_REPORT": "fast"])
    refused.expect("GCD: GCD_STALL_REPORT=fast is not a duration")
    #expect(!refused.output.contains("GCD stall:"))
  }
}
