import Synchronization

/// Reports, as it happens, a queue blocked by one piece of work that runs too long, or a global
/// pool whose work does not start: which queue, which thread, how long, where.
///
/// A monitor is process-wide: made with a threshold, it watches every queue the package runs work
/// on (`async`, `sync`, `after`, group work, source handlers, work items, the jobs of an actor on
/// a `SerialQueue`) and probes the global queues. Dropping it, or `cancel()`, stops it. With no
/// monitor, each submission or run of the package's work pays the check of one word.
///
/// A stall is reported when it crosses the threshold, again each time its duration doubles, and
/// once more when it ends (`ended`, with the total duration):
///
/// ```swift
/// let monitor = StallMonitor(threshold: .milliseconds(200))
/// Task {
///   for await report in monitor.makeReports() { log.warning("\(report)") }
/// }
/// ```
///
/// A process that never mentions the monitor prints its reports on standard error, one line each
/// beginning `GCD stall:`, when started with `GCD_STALL_REPORT=500ms` (a duration in `ms` or `s`).
///
/// The monitor's own thread reads each thread's record without a lock, so a report is made even
/// while every worker of the pool is blocked (its delivery to `makeReports()` then waits for a
/// thread to run the consuming task; the environment variable's printer writes at once).
public final class StallMonitor: Sendable {
  /// How long one piece of work may run, or wait to start on a global queue, before it is reported.
  public let threshold: Duration

  let core: StallMonitorCore

  /// Starts watching.
  ///
  /// - Parameter threshold: How long one piece of work may run on a queue, or work may wait to
  ///   start on a global queue, before it is reported. At least 10 ms (a shorter one is raised to
  ///   10 ms: the monitor's thread checks at a quarter of the shortest threshold, at most every
  ///   5 ms).
  public init(threshold: Duration) {
    let clamped = max(threshold, .milliseconds(10))
    self.threshold = clamped
    core = StallMonitorCore(threshold: clamped, printsToStandardError: false)
    StallWatcher.shared.add(core)
  }

  deinit { core.cancel() }

  /// Stops the monitor: no report after this, and every report sequence ends once it has
  /// delivered what it holds. Calling it again does nothing.
  public func cancel() { core.cancel() }

  /// The reports from now on, as they are made. Each call makes a new sequence; each holds at
  /// most the 1,024 newest reports its consumer has not taken. It ends when the monitor is
  /// cancelled or dropped, or when its task is cancelled.
  public func makeReports() -> Reports { Reports(subscription: core.subscribe()) }

  /// Each watched queue's counts and times since the previous call (since the monitor started,
  /// for the first), busiest first. The counts are kept while any monitor lives, and cleared when
  /// the last one goes.
  ///
  /// `submitted` counts `async`, `asyncBarrier`, group work and notifications; `started` and
  /// `completed` count every piece of work that ran (source handlers, work items, `sync`,
  /// actor jobs too). The wait time is measured for the submissions counted. p50 and p99 are the
  /// upper bound of their power-of-two bucket (under 1 µs, then 1, 2, 4 µs …); `max` is the
  /// smaller of the interval's highest bucket bound and the longest sample since the monitor
  /// started (exact when that sample is in this interval).
  public func statistics() -> [QueueStatistics] { core.statistics() }

  /// The reports of a monitor, as an asynchronous sequence that never throws.
  public struct Reports: AsyncSequence, Sendable {
    /// A report.
    public typealias Element = StallReport
    /// The sequence never throws.
    public typealias Failure = Never

    let subscription: StallSubscription

    /// The iterator; every iterator of one sequence takes from the same buffer.
    public func makeAsyncIterator() -> AsyncIterator { AsyncIterator(subscription: subscription) }

    /// The iterator of `Reports`.
    public struct AsyncIterator: AsyncIteratorProtocol {
      let subscription: StallSubscription

      /// The next report, waiting for it; nil once the monitor is cancelled or dropped and the
      /// buffer is empty, or when the task is cancelled.
      public mutating func next() async -> StallReport? { await subscription.next() }

      /// `next()`, on the caller's isolation.
      public mutating func next(isolation actor: isolated (any Actor)?) async -> StallReport? {
        await subscription.next()
      }
    }
  }
}

/// One report of a `StallMonitor`: a value a service can log.
public struct StallReport: Sendable, Hashable, CustomStringConvertible {
  /// What stalled.
  public enum Kind: Sendable, Hashable {
    /// One piece of work has run on a queue longer than the threshold.
    case queue
    /// Work submitted to a global concurrent queue has not started within the threshold: the
    /// pool is starved (as blocking calls in async code starve Swift's pool, whose jobs run on
    /// libdispatch's global queues on Linux).
    case pool
  }

  /// `.queue` or `.pool`.
  public let kind: Kind
  /// The blocked queue's label (for `.pool`, the global queue's).
  public let queueLabel: String
  /// The kernel thread id (`gettid`) running the blocked work; nil for `.pool`.
  public let threadID: Int32?
  /// How long it has been blocked when reported; in the report that ends it, the total.
  public let duration: Duration
  /// The code that runs the blocked work: the closure's symbol (demangled) or the C function's,
  /// as `dladdr` names it; nil when unknown (`.pool`).
  public let site: String?
  /// False while the stall lasts; true in the one report made when it ends.
  public let ended: Bool
  /// What the kernel says the thread is doing (`/proc/self/task/TID/stat` state, `wchan`,
  /// `syscall`) when reported; nil for `.pool` and for the report that ends a stall.
  public let kernelState: String?
  /// From the report at four times the threshold on (`.queue`, x86-64, a thread in a system
  /// call): the return addresses found on the blocked thread's stack, symbolicated, innermost
  /// first — the system call's address, then each word above the stack pointer that points just
  /// after a call instruction. A scan read with `process_vm_readv`, not an unwind: the thread is
  /// neither stopped nor signalled, and a stale return address can appear. Empty otherwise.
  public let stack: [String]

  /// One line with all of it, beginning `GCD stall:`.
  public var description: String {
    let length = StallReport.format(duration)
    switch (kind, ended) {
    case (.queue, false):
      var line = "GCD stall: queue '\(queueLabel)' blocked for \(length)"
      if let threadID { line += " on thread \(threadID)" }
      if let kernelState { line += " (\(kernelState))" }
      if let site { line += "; running \(site)" }
      if !stack.isEmpty { line += "; stack: " + stack.joined(separator: " <- ") }
      return line
    case (.queue, true):
      var line = "GCD stall: queue '\(queueLabel)' ended after \(length)"
      if let threadID { line += " on thread \(threadID)" }
      if let site { line += "; ran \(site)" }
      return line
    case (.pool, false):
      return "GCD stall: pool '\(queueLabel)' starved: work submitted \(length) ago has not started"
    case (.pool, true):
      return "GCD stall: pool '\(queueLabel)' ended: work started after \(length)"
    }
  }

  static func format(_ duration: Duration) -> String {
    let milliseconds =
      Double(duration.components.seconds) * 1000
      + Double(duration.components.attoseconds) / 1e15
    if milliseconds >= 1000 {
      return "\((milliseconds / 10).rounded() / 100) s"
    }
    return "\(Int(milliseconds.rounded())) ms"
  }
}

/// One queue's counts and times over an interval (`StallMonitor.statistics()`).
public struct QueueStatistics: Sendable, Hashable {
  /// Percentiles of a time: p50, p99 and the maximum.
  public struct Times: Sendable, Hashable {
    /// Half the samples took at most this long.
    public let p50: Duration
    /// 99 in 100 samples took at most this long.
    public let p99: Duration
    /// The longest sample.
    public let max: Duration
  }

  /// The queue's label.
  public let queueLabel: String
  /// Work submitted (`async`, `asyncBarrier`, group work, notifications).
  public let submitted: Int
  /// Work that started.
  public let started: Int
  /// Work that completed.
  public let completed: Int
  /// From submission to start, for the submissions counted.
  public let waitTime: Times
  /// From start to end.
  public let runTime: Times
}
