/// Where a pressure source measures stalls: the whole system, or one
/// cgroup v2 (what a container's limits act on).
public enum PressureScope: Sendable, Hashable, CustomStringConvertible {
  /// The whole system: `/proc/pressure/<resource>`.
  case system
  /// A cgroup v2 directory (such as `/sys/fs/cgroup/app.slice`): its
  /// `<resource>.pressure` file, which counts the stalls of the tasks in
  /// that cgroup and below it.
  case cgroup(String)

  /// The process's own scope: its cgroup v2 directory (the `0::` line of
  /// `/proc/self/cgroup`, under the cgroup2 mount) when that is a cgroup
  /// other than the root and has pressure files; otherwise the system (the
  /// root cgroup's pressure is the system's). In a container with a cgroup
  /// namespace, the container's own cgroup (its `/`, which is not the
  /// root). Read anew on each use. Without a cgroup v2 hierarchy (cgroup v1
  /// only), `.system`: in a container that is the host's pressure.
  public static var current: PressureScope { PressureFile.currentScope() }

  /// The pressure file of `resource` in this scope.
  ///
  /// - Parameter resource: The resource whose file to name.
  public func path(of resource: PressureSource.Resource) -> String { PressureFile.path(resource.rawValue, in: self) }

  /// `.system` or `.cgroup("/sys/fs/cgroup/…")`.
  public var description: String {
    switch self {
    case .system: ".system"
    case .cgroup(let directory): ".cgroup(\"\(directory)\")"
    }
  }
}

/// Fires when tasks stalled on a resource (memory, CPU or I/O) for longer
/// than `threshold` within `window`: a trigger of the kernel's pressure
/// stall information (PSI). `firedCount` says how many fires this event
/// merges (the kernel fires at most once per window).
///
/// `.some` counts the time at least one task in the scope was stalled on
/// the resource; `.full` the time every non-idle task was at once (no
/// progress at all). A threshold of 100 ms in a 2 s window is "stalled 5%
/// of the time".
///
/// On Linux the source holds the pressure file open for writing with the
/// trigger written to it, and an epoll descriptor of its own holding that
/// descriptor for `EPOLLPRI`, which an internal libdispatch read source
/// watches (libdispatch itself watches no `EPOLLPRI`). Both descriptors are
/// closed once, when the source is cancelled or dropped. A source whose
/// cgroup is removed never fires again.
///
/// The kernel's rules: a window of 500 ms to 10 s, a threshold above zero
/// and no longer than the window; without `CAP_SYS_RESOURCE` (root in a
/// container often lacks it) the window must be a whole multiple of 2 s.
///
/// Darwin has no such source; this is the Linux signal behind
/// `MemoryPressureSource`.
public final class PressureSource: ValueSource, @unchecked Sendable {
  /// The resource whose stalls are measured.
  public enum Resource: String, Sendable, Hashable, CaseIterable {
    /// Waiting for memory: reclaim, refaults of evicted pages, swap-in.
    case memory
    /// Runnable but waiting for a CPU.
    case cpu
    /// Waiting for block I/O.
    case io
  }

  /// Which stall time counts.
  public enum Stall: String, Sendable, Hashable, CaseIterable {
    /// At least one task in the scope was stalled.
    case some
    /// Every non-idle task in the scope was stalled at once.
    case full
  }

  /// The resource watched.
  public let resource: Resource
  /// The stall time that counts.
  public let stall: Stall
  /// The stall time within `window` that fires the source.
  public let threshold: Duration
  /// The window the stall is measured over.
  public let window: Duration
  /// Where the stall is measured.
  public let scope: PressureScope
  let counter: PressureCounter

  /// Creates a source that fires when tasks in `scope` stall on `resource`
  /// for `threshold` or longer within `window`, with handlers on `queue`.
  ///
  /// - Parameters:
  ///   - resource: `.memory`, `.cpu` or `.io`.
  ///   - stall: `.some` (any task stalled) or `.full` (every task stalled).
  ///   - threshold: The stall time that fires (whole microseconds count).
  ///   - window: The window it is measured over.
  ///   - scope: Where to measure: the process's own cgroup or the system
  ///     (`PressureScope.current`, the default), or a given one.
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `ENOENT` when there is no pressure file (no
  ///   PSI in the kernel, PSI off at boot, no such cgroup), `ENOTSUP`
  ///   (`EOPNOTSUPP`) when PSI is disabled for the scope, `EINVAL` for a
  ///   threshold or window the kernel refuses (its rules are in the error's
  ///   `detail`), `EACCES` or `EPERM` when the file cannot be opened for
  ///   writing.
  ///
  /// The corresponding C calls are `open`, `write` of the trigger to the
  /// PSI file, `epoll_create1` and `dispatch_source_create`.
  public init(
    resource: Resource, stall: Stall = .some, threshold: Duration, window: Duration,
    scope: PressureScope = .current, queue: Queue
  ) throws(GCDError) {
    let operation =
      "PressureSource(resource: .\(resource), stall: .\(stall), threshold: \(threshold), window: \(window), scope: \(scope))"
    let (thresholdMicroseconds, windowMicroseconds) = try PressureFile.check(
      threshold: threshold, window: window, operation: operation)
    let trigger = try PressureTrigger(
      path: scope.path(of: resource), stall: stall.rawValue, threshold: thresholdMicroseconds,
      window: windowMicroseconds, operation: operation)
    let created: OpaquePointer
    do {
      created = try Source.create(.dataAdd, queue: queue)
    } catch {
      trigger.stop()
      throw error
    }
    let counter = PressureCounter(trigger: trigger, target: created)
    self.resource = resource
    self.stall = stall
    self.threshold = threshold
    self.window = window
    self.scope = scope
    self.counter = counter
    super.init(created: created, queue: queue, watcher: counter)
  }

  /// The number of fires merged into the event being handled.
  public var firedCount: UInt { data }
  /// The trigger's descriptor (the pressure file, open for writing); closed
  /// once the source is cancelled.
  public override var handle: UInt { UInt(truncatingIfNeeded: Int(counter.trigger.descriptor)) }
}
