import Synchronization

/// The process's one monitor thread: it runs while a `StallMonitor` is alive, reads every
/// thread's record (Internals/Stall.swift) each tick — a quarter of the shortest threshold,
/// between 5 and 100 ms — probes the global queues, and hands what it found to each monitor.
///
/// A plain thread, not a queue: it must run while every worker of the pool is blocked. The only
/// lock it takes is its own list's (`state`), which no watched work holds: the work it watches
/// writes its records without a lock.
final class StallWatcher: Sendable {
  static let shared = StallWatcher()

  private struct State {
    var cores: [ObjectIdentifier: StallMonitorCore] = [:]
    var threadRunning = false
  }

  private let state = Mutex(State())

  /// The global queues probed for a starved pool, with their report labels.
  private let pools: [(queue: Queue, label: String)] = [
    (Queue.global(qos: .userInitiated), "com.apple.root.user-initiated-qos (QoS userInitiated)"),
    (Queue.global(qos: .default), "com.apple.root.default-qos (QoS default)"),
    (Queue.global(qos: .utility), "com.apple.root.utility-qos (QoS utility)"),
  ]

  func add(_ core: StallMonitorCore) {
    let start = state.withLock { state -> Bool in
      state.cores[ObjectIdentifier(core)] = core
      stallSetWatching(true)
      if state.threadRunning { return false }
      state.threadRunning = true
      return true
    }
    if start {
      let error = system_startThread(named: "gcd.stall") { [self] in run() }
      if error != 0 {
        state.withLock { $0.threadRunning = false }
        system_writeStandardError("GCD: StallMonitor: pthread_create failed (errno \(error)); no stall reports\n")
      }
    }
  }

  func remove(_ core: StallMonitorCore) {
    state.withLock { state in
      state.cores[ObjectIdentifier(core)] = nil
      if state.cores.isEmpty {
        // With no monitor, no queue's deinit clears its row: the rows would go stale, and a new
        // queue at a freed one's address would continue its counts. The next monitor starts clean.
        stallSetWatching(false)
        stallClear()
      }
    }
  }

  /// The monitor thread's loop; it ends when the last monitor goes.
  private func run() {
    var probes = [PoolProbe](repeating: PoolProbe(), count: pools.count)
    while true {
      let cores = state.withLock { state -> [StallMonitorCore] in
        if state.cores.isEmpty { state.threadRunning = false }
        return Array(state.cores.values)
      }
      if cores.isEmpty { return }
      let shortest = cores.map(\.threshold).min()!
      let now = stallNow
      let running = stallRunning(now: now, atLeast: shortest)
      var pools: [StallPool] = []
      for index in probes.indices {
        if let submitted = probes[index].submitted {
          if let started = stallProbeStart(slot: index) {
            pools.append(StallPool(slot: index, label: self.pools[index].label, submitted: submitted, started: started))
            probes[index].submitted = nil
          } else {
            pools.append(StallPool(slot: index, label: self.pools[index].label, submitted: submitted, started: nil))
          }
        }
        if probes[index].submitted == nil {
          probes[index].submitted = stallNow
          stallProbe(self.pools[index].queue.raw, slot: index)
        }
      }
      for core in cores { core.observe(running: running, pools: pools, now: now) }
      stallSleep(nanoseconds: min(max(shortest / 4, 5_000_000), 100_000_000))
    }
  }

  private struct PoolProbe {
    var submitted: UInt64?
  }
}

/// A probe of a global queue: submitted at `submitted`, started at `started` (nil: not yet).
struct StallPool {
  let slot: Int
  let label: String
  let submitted: UInt64
  let started: UInt64?
}

/// A monitor's state: its reports' schedule (touched by the monitor thread only), its
/// subscriptions and its statistics baseline.
final class StallMonitorCore: Sendable {
  /// The threshold in nanoseconds.
  let threshold: UInt64
  let printsToStandardError: Bool

  private enum Key: Hashable {
    case queue(record: UInt, depth: UInt32, start: UInt64)
    case pool(slot: Int, submitted: UInt64)
  }

  private struct Tracked {
    /// The duration (ns) at which the next report is due.
    var next: UInt64
    let running: StallRunning?
  }

  private struct State {
    var cancelled = false
    var subscriptions: [StallSubscription] = []
    var baseline: [UInt: StallQueueRow] = [:]
  }

  private let state = Mutex(State())
  /// The stalls reported and not yet ended: only the monitor thread reads and writes it.
  private let tracked = Mutex<[Key: Tracked]>([:])

  init(threshold: Duration, printsToStandardError: Bool) {
    let components = threshold.components
    self.threshold = UInt64(components.seconds) * 1_000_000_000 + UInt64(components.attoseconds / 1_000_000_000)
    self.printsToStandardError = printsToStandardError
    let rows = stallQueueRows()
    state.withLock { state in
      for row in rows { state.baseline[row.queue] = row }
    }
  }

  func cancel() {
    let subscriptions = state.withLock { state -> [StallSubscription] in
      if state.cancelled { return [] }
      state.cancelled = true
      defer { state.subscriptions = [] }
      return state.subscriptions
    }
    StallWatcher.shared.remove(self)
    for subscription in subscriptions { subscription.finish() }
  }

  func subscribe() -> StallSubscription {
    let subscription = StallSubscription()
    let cancelled = state.withLock { state -> Bool in
      if !state.cancelled { state.subscriptions.append(subscription) }
      return state.cancelled
    }
    if cancelled { subscription.finish() }
    return subscription
  }

  /// One tick of the monitor thread.
  func observe(running: [StallRunning], pools: [StallPool], now: UInt64) {
    var reports: [StallReport] = []
    tracked.withLock { tracked in
      var seen = Set<Key>()
      for work in running where now - work.start >= threshold {
        let key = Key.queue(record: work.record, depth: work.depth, start: work.start)
        seen.insert(key)
        let duration = now - work.start
        if let entry = tracked[key], duration < entry.next { continue }
        reports.append(report(work, duration: duration, ended: false))
        tracked[key] = Tracked(next: nextDue(after: duration), running: work)
      }
      for pool in pools {
        let key = Key.pool(slot: pool.slot, submitted: pool.submitted)
        if let started = pool.started {
          if tracked.removeValue(forKey: key) != nil {
            reports.append(poolReport(pool, duration: started &- pool.submitted, ended: true))
          }
          continue
        }
        seen.insert(key)
        let duration = now &- pool.submitted
        guard duration >= threshold, duration < 1 << 62 else { continue }
        if let entry = tracked[key], duration < entry.next { continue }
        reports.append(poolReport(pool, duration: duration, ended: false))
        tracked[key] = Tracked(next: nextDue(after: duration), running: nil)
      }
      for (key, entry) in tracked where !seen.contains(key) {
        guard case .queue = key, let work = entry.running else { continue }
        let (stillRunning, endedAt) = stallStillRunning(work)
        if stillRunning { continue }
        tracked[key] = nil
        reports.append(report(work, duration: (endedAt ?? now) &- work.start, ended: true))
      }
    }
    guard !reports.isEmpty else { return }
    if printsToStandardError {
      system_writeStandardError(reports.map { "\($0)\n" }.joined())
    }
    let subscriptions = state.withLock { $0.cancelled ? [] : $0.subscriptions }
    for subscription in subscriptions {
      for report in reports { subscription.deliver(report) }
    }
  }

  /// The next report's due duration: the threshold doubled past `duration`.
  private func nextDue(after duration: UInt64) -> UInt64 {
    var next = threshold * 2
    while next <= duration { next *= 2 }
    return next
  }

  private func report(_ work: StallRunning, duration: UInt64, ended: Bool) -> StallReport {
    let deep = !ended && duration >= threshold * 4
    return StallReport(
      kind: .queue, queueLabel: work.label, threadID: work.threadID, duration: .nanoseconds(Int64(duration)),
      site: stallSymbol(work.site), ended: ended,
      kernelState: ended ? nil : stallKernelState(threadID: work.threadID),
      stack: deep ? stallStack(threadID: work.threadID) ?? [] : [])
  }

  private func poolReport(_ pool: StallPool, duration: UInt64, ended: Bool) -> StallReport {
    StallReport(
      kind: .pool, queueLabel: pool.label, threadID: nil, duration: .nanoseconds(Int64(duration)), site: nil,
      ended: ended, kernelState: nil, stack: [])
  }

  func statistics() -> [QueueStatistics] {
    let rows = stallQueueRows()
    return state.withLock { state -> [QueueStatistics] in
      var result: [QueueStatistics] = []
      var baseline: [UInt: StallQueueRow] = [:]
      for row in rows {
        baseline[row.queue] = row
        // A row given to another queue, or evicted and made again, starts from zero.
        let before = state.baseline[row.queue].flatMap {
          $0.label == row.label && $0.submitted <= row.submitted && $0.started <= row.started
            && $0.completed <= row.completed ? $0 : nil
        }
        let submitted = Int(row.submitted &- (before?.submitted ?? 0))
        let started = Int(row.started &- (before?.started ?? 0))
        let completed = Int(row.completed &- (before?.completed ?? 0))
        guard submitted > 0 || started > 0 || completed > 0 else { continue }
        let wait = zip(row.wait, before?.wait ?? Array(repeating: 0, count: stallBuckets)).map {
          $0 >= $1 ? $0 - $1 : $0
        }
        let run = zip(row.run, before?.run ?? Array(repeating: 0, count: stallBuckets)).map { $0 >= $1 ? $0 - $1 : $0 }
        result.append(
          QueueStatistics(
            queueLabel: row.label, submitted: submitted, started: started, completed: completed,
            waitTime: Self.times(wait, max: row.waitMax), runTime: Self.times(run, max: row.runMax)))
      }
      state.baseline = baseline
      return result.sorted { $0.started > $1.started }
    }
  }

  /// p50, p99 and max of a histogram: each bucket's upper bound; the maximum is the exact largest
  /// sample when it falls in the highest bucket used, else that bucket's bound.
  private static func times(_ buckets: [UInt32], max exact: UInt64) -> QueueStatistics.Times {
    let total = buckets.reduce(0) { $0 + UInt64($1) }
    // The last bucket has no upper bound: its samples are bounded by the exact maximum.
    func bound(_ bucket: Int) -> UInt64 {
      bucket == stallBuckets - 1 ? .max : bucket == 0 ? 1_000 : 1_000 << UInt64(bucket)
    }
    func percentile(_ fraction: Double) -> Duration {
      guard total > 0 else { return .zero }
      let wanted = UInt64((Double(total) * fraction).rounded(.up))
      var seen: UInt64 = 0
      for (bucket, count) in buckets.enumerated() {
        seen += UInt64(count)
        if seen >= wanted { return .nanoseconds(Int64(min(bound(bucket), exact))) }
      }
      return .nanoseconds(Int64(exact))
    }
    guard let highest = buckets.lastIndex(where: { $0 > 0 }) else {
      return QueueStatistics.Times(p50: .zero, p99: .zero, max: .zero)
    }
    let largest = min(bound(highest), exact)
    return QueueStatistics.Times(p50: percentile(0.5), p99: percentile(0.99), max: .nanoseconds(Int64(largest)))
  }
}

/// One `makeReports()` sequence: a buffer of reports and the consumer waiting for one (a small
/// state machine under a lock; the continuation is resumed outside it; it finishes once).
final class StallSubscription: Sendable {
  private struct State {
    var buffer: [StallReport] = []
    var waiting: CheckedContinuation<StallReport?, Never>?
    var finished = false
  }

  private let state = Mutex(State())
  private static let capacity = 1024

  func deliver(_ report: StallReport) {
    let waiting = state.withLock { state -> CheckedContinuation<StallReport?, Never>? in
      if state.finished { return nil }
      if let waiting = state.waiting {
        state.waiting = nil
        return waiting
      }
      if state.buffer.count == Self.capacity { state.buffer.removeFirst() }
      state.buffer.append(report)
      return nil
    }
    waiting?.resume(returning: report)
  }

  func finish() {
    let waiting = state.withLock { state -> CheckedContinuation<StallReport?, Never>? in
      state.finished = true
      defer { state.waiting = nil }
      return state.waiting
    }
    waiting?.resume(returning: nil)
  }

  /// Cancellation of the consuming task ends the sequence (an event like `finish`).
  private func cancelled() {
    let waiting = state.withLock { state -> CheckedContinuation<StallReport?, Never>? in
      state.finished = true
      state.buffer = []
      defer { state.waiting = nil }
      return state.waiting
    }
    waiting?.resume(returning: nil)
  }

  func next() async -> StallReport? {
    await withTaskCancellationHandler {
      await withCheckedContinuation { (continuation: CheckedContinuation<StallReport?, Never>) in
        enum Action {
          case resume(StallReport?)
          case none
        }
        let action = state.withLock { state -> Action in
          if !state.buffer.isEmpty { return .resume(state.buffer.removeFirst()) }
          if state.finished { return .resume(nil) }
          state.waiting = continuation
          return .none
        }
        if case .resume(let report) = action { continuation.resume(returning: report) }
      }
    } onCancel: {
      cancelled()
    }
  }
}

// MARK: - GCD_STALL_REPORT

/// The monitor the environment variable starts: it lives as long as the process.
private let environmentMonitor = Mutex<StallMonitorCore?>(nil)

/// Parses `500ms`, `2s`, `1.5s`: nil for anything else or a duration of zero.
func stallThreshold(parsing text: String) -> Duration? {
  let trimmed = text.trimmingCharacters(in: " \t")
  let (number, scale): (Substring, Double) =
    if trimmed.hasSuffix("ms") {
      (trimmed.dropLast(2), 1e-3)
    } else if trimmed.hasSuffix("s") {
      (trimmed.dropLast(1), 1)
    } else {
      ("", 0)
    }
  guard let value = Double(number), value > 0, value.isFinite else { return nil }
  return .nanoseconds(Int64(value * scale * 1e9))
}

extension String {
  fileprivate func trimmingCharacters(in characters: String) -> String {
    var text = Substring(self)
    while let first = text.first, characters.contains(first) { text.removeFirst() }
    while let last = text.last, characters.contains(last) { text.removeLast() }
    return String(text)
  }
}

/// Called when the program is loaded (CGCD's constructor) with the value of `GCD_STALL_REPORT`.
@_cdecl("gcd_stall_report_from_environment")
func gcdStallReportFromEnvironment(_ value: UnsafePointer<CChar>) {
  let text = String(cString: value)
  guard let threshold = stallThreshold(parsing: text) else {
    system_writeStandardError(
      "GCD: GCD_STALL_REPORT=\(text) is not a duration (500ms, 2s); no stall reports\n")
    return
  }
  let core = StallMonitorCore(threshold: max(threshold, .milliseconds(10)), printsToStandardError: true)
  environmentMonitor.withLock { $0 = core }
  StallWatcher.shared.add(core)
}
