/// What the pressure sources share about the kernel's pressure files: where
/// they are (the process's cgroup v2 directory or `/proc/pressure`), how a
/// trigger is written, what the kernel's refusals mean, and how the
/// cumulative stall totals are read.
enum PressureFile {
  /// The kernel's limits on a trigger (kernel/sched/psi.c, `psi_trigger_create`).
  static let windowMinimum: Int64 = 500_000
  static let windowMaximum: Int64 = 10_000_000
  /// Without `CAP_SYS_RESOURCE` a window must be a whole multiple of this
  /// (such triggers ride the 2 s averaging work instead of a real-time poller).
  static let unprivilegedWindowStep: Int64 = 2_000_000

  // MARK: Durations

  /// `duration` in whole microseconds, saturating at `Int64`'s bounds
  /// instead of trapping (`.seconds(Int64.max)` is `Int64.max`).
  static func microseconds(_ duration: Duration) -> Int64 {
    let (seconds, attoseconds) = duration.components
    let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000)
    if overflow { return seconds < 0 ? .min : .max }
    let (sum, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000_000)
    if overflow2 { return seconds < 0 ? .min : .max }
    return sum
  }

  /// The kernel's rules, for the message of an `EINVAL`.
  static var rules: String {
    let privileged = hasSystemResourceCapability
    return "the kernel takes a window of 500 ms to 10 s and a threshold above 0 µs and no longer than the window; "
      + "without CAP_SYS_RESOURCE the window must also be a whole multiple of 2 s (2, 4, 6, 8 or 10 s), "
      + "and this process \(privileged ? "has" : "lacks") CAP_SYS_RESOURCE"
  }

  /// Checks what the kernel would read wrongly (it parses two `u32`s): a
  /// threshold or window below 1 µs or beyond `UInt32.max` µs. What is
  /// inside that range the kernel judges itself.
  static func check(threshold: Duration, window: Duration, operation: String) throws(GCDError) -> (UInt32, UInt32) {
    let thresholdMicroseconds = microseconds(threshold)
    let windowMicroseconds = microseconds(window)
    for (name, value) in [("threshold", thresholdMicroseconds), ("window", windowMicroseconds)]
    where value < 1 || value > Int64(UInt32.max) {
      throw GCDError(
        operation: operation, errno: Errno.invalidArgument,
        detail: "a \(name) of \(value < 1 ? "less than 1 µs" : "more than \(UInt32.max) µs") is out of range; \(rules)")
    }
    return (UInt32(thresholdMicroseconds), UInt32(windowMicroseconds))
  }

  // MARK: Where

  /// The pressure file of `resource` in `scope`.
  static func path(_ resource: String, in scope: PressureScope) -> String {
    switch scope {
    case .system: "/proc/pressure/\(resource)"
    case .cgroup(let directory): directory + "/\(resource).pressure"
    }
  }

  /// The process's own scope: its cgroup v2 directory (from the `0::` line
  /// of `/proc/self/cgroup`, under the cgroup2 mount of
  /// `/proc/self/mountinfo`) when that is a cgroup other than the root and
  /// has pressure files, else the system.
  ///
  /// In a cgroup namespace (a container) the process's cgroup reads as `/`
  /// and the mount shows it at its root: `cgroup.events`, which every
  /// cgroup but the true root has, tells the container's cgroup from the
  /// host's root (whose pressure is the system's).
  static func currentScope() -> PressureScope {
    guard case .success(let membership) = system_readSmallFile("/proc/self/cgroup"),
      case .success(let mounts) = system_readSmallFile("/proc/self/mountinfo"),
      let directory = cgroupDirectory(membership: membership, mountinfo: mounts),
      system_exists(directory + "/cgroup.events"), system_exists(directory + "/memory.pressure")
    else { return .system }
    return .cgroup(directory)
  }

  /// The cgroup v2 directory that `membership` (the text of
  /// `/proc/<pid>/cgroup`) names, under the cgroup2 mount in `mountinfo`;
  /// nil when there is no unified hierarchy.
  static func cgroupDirectory(membership: String, mountinfo: String) -> String? {
    guard
      let line = membership.split(separator: "\n").first(where: { $0.hasPrefix("0::") }),
      case let path = String(line.dropFirst(3)), path.hasPrefix("/")
    else { return nil }
    for mount in mountinfo.split(separator: "\n") {
      // "36 25 0:30 <root> <mount point> <options> [optional fields] - <type> <source> <options>"
      let halves = mount.split(separator: " - ", maxSplits: 1)
      guard halves.count == 2, halves[1].split(separator: " ").first == "cgroup2" else { continue }
      let fields = halves[0].split(separator: " ")
      guard fields.count >= 5 else { continue }
      let root = unescape(fields[3])
      let mountPoint = unescape(fields[4])
      // In a cgroup namespace the paths are the namespace's and the root is "/".
      var relative = path == "/" ? "" : path
      if root != "/" {
        guard path == root || path.hasPrefix(root + "/") else { continue }
        relative = String(path.dropFirst(root.count))
      }
      return mountPoint == "/" ? (relative.isEmpty ? "/" : relative) : mountPoint + relative
    }
    return nil
  }

  /// mountinfo escapes space, tab, newline and backslash as `\ooo`.
  private static func unescape(_ field: Substring) -> String {
    var bytes: [UInt8] = []
    var rest = Array(field.utf8)[...]
    while let byte = rest.first {
      if byte == UInt8(ascii: "\\"), rest.count >= 4,
        let value = UInt8(String(decoding: rest.dropFirst().prefix(3), as: UTF8.self), radix: 8)
      {
        bytes.append(value)
        rest = rest.dropFirst(4)
      } else {
        bytes.append(byte)
        rest = rest.dropFirst()
      }
    }
    return String(decoding: bytes, as: UTF8.self)
  }

  // MARK: Errors

  /// What an errno from opening a pressure file or writing a trigger means.
  static func explain(_ error: Int32, path: String) -> String? {
    switch error {
    case Errno.noSuchFileOrDirectory:
      "no pressure file at \(path): the kernel has no PSI (CONFIG_PSI), was booted with psi=0 (or without psi=1 "
        + "when built CONFIG_PSI_DEFAULT_DISABLED=y), or the cgroup does not exist"
    case Errno.notSupported:
      "PSI is disabled for \(path) (psi=0 at boot, or 0 written to the cgroup's cgroup.pressure)"
    case Errno.permissionDenied, Errno.notPermitted:
      "a trigger needs \(path) open for writing, which this user may not do"
    case Errno.invalidArgument: "the kernel refused the trigger: \(rules)"
    case Errno.noMemory: "the kernel could not allocate the trigger"
    default: nil
    }
  }

  /// Whether this process has `CAP_SYS_RESOURCE` (bit 24 of `CapEff` in
  /// `/proc/self/status`), which lifts the 2 s rule on windows.
  static var hasSystemResourceCapability: Bool {
    guard case .success(let status) = system_readSmallFile("/proc/self/status"),
      let line = status.split(separator: "\n").first(where: { $0.hasPrefix("CapEff:") }),
      let bits = UInt64(line.dropFirst("CapEff:".count).trimmingPrefix(while: { $0 == "\t" || $0 == " " }), radix: 16)
    else { return false }
    return bits & (1 << 24) != 0
  }

  // MARK: Totals

  /// The cumulative stall totals (µs) of a pressure file's text: the
  /// `total=` of its `some` line and of its `full` line (0 when absent).
  static func totals(of text: String) -> (some: UInt64, full: UInt64)? {
    var some: UInt64?
    var full: UInt64 = 0
    for line in text.split(separator: "\n") {
      guard let field = line.split(separator: " ").first(where: { $0.hasPrefix("total=") }),
        let value = UInt64(field.dropFirst("total=".count))
      else { continue }
      if line.hasPrefix("some ") { some = value } else if line.hasPrefix("full ") { full = value }
    }
    return some.map { ($0, full) }
  }

  /// The totals of the pressure file at `path` now; nil when it cannot be read.
  static func totals(at path: String) -> (some: UInt64, full: UInt64)? {
    guard case .success(let text) = system_readSmallFile(path) else { return nil }
    return totals(of: text)
  }
}
