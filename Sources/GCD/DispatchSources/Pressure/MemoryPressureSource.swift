/// The memory pressure levels a `MemoryPressureSource` reports, named after
/// the C flags (`dispatch_source_memorypressure_flags_t`), with the same raw
/// values.
public struct MemoryPressureEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
  /// The `DISPATCH_MEMORYPRESSURE_*` bits.
  public let rawValue: UInt

  /// Creates the set whose bits are these `DISPATCH_MEMORYPRESSURE_*` flags.
  ///
  /// - Parameter rawValue: `DISPATCH_MEMORYPRESSURE_*` bits.
  public init(rawValue: UInt) { self.rawValue = rawValue }

  /// Pressure is back to normal: it stayed below the warning threshold for
  /// a full window. `DISPATCH_MEMORYPRESSURE_NORMAL`.
  public static let normal = MemoryPressureEvents(rawValue: 0x1)
  /// Tasks are stalling on memory: shed what is cheap to rebuild (caches).
  /// `DISPATCH_MEMORYPRESSURE_WARN`.
  public static let warning = MemoryPressureEvents(rawValue: 0x2)
  /// Every task is stalling on memory at times (thrashing): free all you
  /// can. `DISPATCH_MEMORYPRESSURE_CRITICAL`.
  public static let critical = MemoryPressureEvents(rawValue: 0x4)

  /// Every level: normal, warning and critical.
  public static let all: MemoryPressureEvents = [.normal, .warning, .critical]

  static let names: [(MemoryPressureEvents, String)] = [
    (.normal, ".normal"), (.warning, ".warning"), (.critical, ".critical"),
  ]

  /// `[.warning]`-style: the named flags, then any unnamed bits in hex.
  public var description: String { describeFlags(self, names: MemoryPressureEvents.names) }
}

/// Reports memory pressure as Darwin's memory-pressure source does: the
/// level (`.warning`, `.critical`, back to `.normal`) each time it changes;
/// `firedEvents` is the level the event reports.
///
/// On Linux the levels come from the kernel's pressure stall information
/// (PSI) for memory, in `scope`: the process's own cgroup v2 when it has
/// one (what a container's memory limit acts on), else the whole system.
/// Two kernel triggers, each a stall threshold within `window`:
///
/// | level | when |
/// |---|---|
/// | `.warning` | some task stalled on memory for `warningThreshold` (100 ms) within 2 s: 5% of its time spent in reclaim, refaults or swap-in |
/// | `.critical` | every task stalled at once for `criticalThreshold` (200 ms) within 2 s: 10% of the time nothing in the scope made progress |
/// | `.normal` | after a full window (2 s) whose `some` stall, read from the file's cumulative `total`, stayed below the warning threshold, with no trigger fired |
///
/// Levels rise as the kernel fires (a critical fire from `.normal` reports
/// `.critical` alone) and fall a window at a time (`.critical`, then
/// `.warning` after a window whose `full` stall stayed below the critical
/// threshold, then `.normal`). A fire at the current level reports
/// nothing. Levels not in `watchedEvents` are tracked but not delivered.
///
/// The source holds four descriptors, closed once when it is cancelled or
/// dropped: each trigger's pressure file and the epoll descriptor that
/// holds it (see `PressureSource`).
///
/// The corresponding C type is a `dispatch_source_t` of type
/// `DISPATCH_SOURCE_TYPE_MEMORYPRESSURE` (Darwin only).
public final class MemoryPressureSource: EventSetSource<MemoryPressureEvents>, @unchecked Sendable {
  /// The window both triggers measure over, and the quiet time before
  /// `.normal`: 2 s, the shortest the kernel accepts from a process without
  /// `CAP_SYS_RESOURCE` (and the period at which it evaluates such
  /// triggers, so a shorter one would gain nothing there).
  public static let window: Duration = .seconds(2)
  /// The `some` stall within `window` that reports `.warning`: 100 ms (5%).
  public static let warningThreshold: Duration = .milliseconds(100)
  /// The `full` stall within `window` that reports `.critical`: 200 ms (10%).
  public static let criticalThreshold: Duration = .milliseconds(200)

  /// The levels the source reports (`mask`).
  public let watchedEvents: MemoryPressureEvents
  /// Where memory pressure is measured.
  public let scope: PressureScope
  let watcher: MemoryPressureWatcher

  /// Creates a source that reports changes to the levels in `events` of the
  /// memory pressure in `scope`, with handlers on `queue`.
  ///
  /// - Parameters:
  ///   - events: The levels to report (not empty); `.normal` too to learn
  ///     when pressure is over.
  ///   - scope: Where to measure: the process's own cgroup or the system
  ///     (`PressureScope.current`, the default), or a given one.
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `ENOENT` when there is no memory pressure
  ///   file (no PSI, PSI off at boot, no such cgroup), `ENOTSUP` when PSI is
  ///   disabled for the scope, `EACCES` or `EPERM` when the file cannot be
  ///   opened for writing, `EINVAL` for an empty event set.
  ///   Bits beside `.normal`, `.warning` and `.critical` stop the process
  ///   with a message naming the source (a programmer error).
  ///
  /// The corresponding C function is `dispatch_source_create` with
  /// `DISPATCH_SOURCE_TYPE_MEMORYPRESSURE` (Darwin); on Linux PSI triggers.
  public init(
    events: MemoryPressureEvents = [.warning, .critical], scope: PressureScope = .current, queue: Queue
  ) throws(GCDError) {
    let operation = "MemoryPressureSource(events: \(events), scope: \(scope))"
    guard !events.isEmpty else {
      throw GCDError(operation: operation, errno: Errno.invalidArgument, detail: "no levels to report")
    }
    requireKnownBits(events, of: .all, operation, "no such memory-pressure level")
    let path = scope.path(of: .memory)
    let triggers = try MemoryPressureWatcher.triggers(path: path, operation: operation)
    let created: OpaquePointer
    do {
      created = try Source.create(.dataReplace, queue: queue)
    } catch {
      triggers.0.stop()
      triggers.1.stop()
      throw error
    }
    let watcher = MemoryPressureWatcher(triggers: triggers, path: path, events: events, target: created)
    watchedEvents = events
    self.scope = scope
    self.watcher = watcher
    super.init(created: created, queue: queue, watcher: watcher)
  }

  /// The levels the source reports, as a raw value.
  public override var mask: UInt { watchedEvents.rawValue }
}
