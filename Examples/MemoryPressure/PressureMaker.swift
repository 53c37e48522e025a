// The pressure ExampleMemoryPressure makes so that its levels show: scaffolding, not the lesson.
//
// What a cgroup v1 memory cgroup's tasks stall on, measured on Linux 6.18 without swap: direct
// reclaim when a page charged to the cgroup meets its limit (PSI counts it as a memory stall; the
// task's delay accounting shows it as "freepages"), and waits for refaulting working-set pages. Page
// cache that is only read (a file re-read with `cat`) is cheap to reclaim: 30 to 40 ms of stall a
// second, under the 50 a second the warning needs. Pages mapped into the child must be unmapped
// first: a child reading every page of a mapping twice the limit stalls about 480 ms a second. The
// file is sparse, so its pages are zeros that need no disk I/O. (Anonymous memory past the limit is
// OOM-killed without swap, and lowering the limit reclaims in the writer, which PSI does not count.)
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Children of this program in a memory cgroup of their own, each reading every page of a mapping
/// larger than the cgroup's limit over and over; one more each `patience` without a level.
final class PressureMaker {
  /// The memory cgroup's limit, and the file the children map: twice as large.
  static let limit = 48 << 20
  static let mapping = 96 << 20
  /// How long one more child waits for a level before the next starts, and how many start at most.
  static let patience: Duration = .seconds(10)
  static let children = 3
  /// The argument that makes this program a child (then `runChildIfAsked()` never returns).
  static let childArgument = "--read-mapping"

  /// The cgroup v1 memory cgroup with the limit, and the cgroup v2 the source watches (if any).
  let limited: String
  let counted: String?
  /// The sparse file the children map, already unlinked.
  private let file: Int32
  private var started: [pid_t] = []

  /// Where the source should watch: the children's cgroup v2, or the default.
  var scope: PressureScope { counted.map { .cgroup($0) } ?? .current }

  /// Why it cannot make pressure here.
  struct Unavailable: Error, CustomStringConvertible {
    let description: String
  }

  /// Makes the cgroups and the file; throws why not where it cannot.
  init() throws(Unavailable) {
    guard geteuid() == 0 else { throw Unavailable(description: "making a memory cgroup needs root") }
    guard let memory = cgroupMount(type: "cgroup", option: "memory") else {
      throw Unavailable(description: "no cgroup v1 memory controller is mounted")
    }
    let path = "/var/tmp/gcd-example-pressure-\(getpid())"
    file = open(path, O_RDWR | O_CREAT | O_EXCL, 0o600)
    guard file >= 0 else { throw Unavailable(description: "cannot make \(path)") }
    unlink(path)
    // A tmpfs or ramfs page is reclaimed only to swap: the children would be OOM-killed.
    let deepest = mounts().filter { $0.point == "/" || path.hasPrefix($0.point + "/") }.max { $0.point < $1.point }
    guard let deepest, !["tmpfs", "ramfs"].contains(deepest.type) else {
      close(file)
      throw Unavailable(description: "/var/tmp keeps its files in memory (\(deepest?.type ?? "?"))")
    }
    limited = memory + "/gcd-example-\(getpid())"
    counted = cgroupMount(type: "cgroup2").map { $0 + "/gcd-example-\(getpid())" }
    guard ftruncate(file, off_t(Self.mapping)) == 0, mkdir(limited, 0o755) == 0,
      write("\(Self.limit)", to: limited + "/memory.limit_in_bytes")
    else {
      removeCgroups()
      throw Unavailable(description: "cannot make the memory cgroup \(limited)")
    }
    if let counted, mkdir(counted, 0o755) != 0 {
      removeCgroups()
      throw Unavailable(description: "cannot make \(counted)")
    }
  }

  /// Starts a child, and one more each `patience` until `pressed` is signalled; false when
  /// `children` children saw no level, after saying what they stalled and how they ended.
  func makePressure(until pressed: GCD.Semaphore) -> Bool {
    let pressure = scope.path(of: .memory)
    let before = stallTotal(pressure)
    for count in 1...Self.children {
      var child: pid_t = 0
      let arguments = [CommandLine.arguments[0], Self.childArgument, "\(file)", limited] + (counted.map { [$0] } ?? [])
      let argv = arguments.map { strdup($0) } + [nil]
      let spawned = posix_spawn(&child, "/proc/self/exe", nil, nil, argv, environ)
      argv.forEach { free($0) }
      guard spawned == 0 else {
        say("child \(count): posix_spawn failed: \(String(cString: strerror(spawned)))")
        return false
      }
      started.append(child)
      say("child \(count): reads a \(Self.mapping >> 20) MiB mapping in a \(Self.limit >> 20) MiB memory cgroup")
      if pressed.wait(timeout: Self.patience) { return true }
    }
    let stalled = (stallTotal(pressure) ?? 0) - (before ?? 0)
    let alive = started.filter { kill($0, 0) == 0 }.count
    let kills = contents(of: limited + "/memory.oom_control").split(separator: "\n").first { $0.hasPrefix("oom_kill ") }
    say(
      "no level: \(Self.children) children stalled \(stalled / 1000) ms in all in \(pressure) "
        + "(a warning needs 100 ms in 2 s); \(alive) still running, \(kills ?? "oom_kill ?")")
    return false
  }

  /// Kills the children and removes their memory cgroup.
  func stop() {
    remove(limited)
    for child in started { waitpid(child, nil, 0) }
    close(file)
  }

  /// Removes the cgroups (the cgroup v2 after the source watching it is cancelled).
  func removeCgroups() {
    remove(limited)
    if let counted { remove(counted) }
  }

  /// In a child (its arguments: `childArgument`, the file's descriptor, the cgroups to join), reads
  /// a byte of every page of the whole file, mapped, over and over until its parent is gone.
  /// `MemoryPressureSourceTests` runs this executable so, for the same pressure.
  static func runChildIfAsked() {
    let arguments = CommandLine.arguments
    guard arguments.count >= 3, arguments[1] == childArgument, let file = Int32(arguments[2]) else { return }
    let parent = getppid()
    for cgroup in arguments.dropFirst(3) where !write("\(getpid())", to: cgroup + "/cgroup.procs") { exit(2) }
    var status = stat()
    guard fstat(file, &status) == 0, case let size = Int(status.st_size), size > 0 else { exit(3) }
    guard let base = mmap(nil, size, PROT_READ, MAP_SHARED, file, 0), base != MAP_FAILED else { exit(3) }
    let page = sysconf(Int32(_SC_PAGESIZE))
    var sum: UInt8 = 0
    while getppid() == parent {
      for offset in stride(from: 0, to: size, by: page) { sum &+= base.load(fromByteOffset: offset, as: UInt8.self) }
    }
    exit(Int32(sum >> 7))
  }
}

/// The cumulative `some` stall in the pressure file `path`, in µs.
private func stallTotal(_ path: String) -> Int? {
  let some = contents(of: path).split(separator: "\n").first { $0.hasPrefix("some ") }
  return some?.split(separator: " ").first { $0.hasPrefix("total=") }.flatMap { Int($0.dropFirst(6)) }
}

/// Kills every process in `cgroup` and removes it.
private func remove(_ cgroup: String) {
  for _ in 0..<500 {
    for pid in contents(of: cgroup + "/cgroup.procs").split(separator: "\n") { kill(pid_t(pid) ?? 0, SIGKILL) }
    if rmdir(cgroup) == 0 || errno == ENOENT { return }
    usleep(10_000)
  }
}

/// Writes `value` to `file` (a cgroup setting); false when it cannot.
private func write(_ value: String, to file: String) -> Bool {
  let descriptor = open(file, O_WRONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return false }
  defer { close(descriptor) }
  return value.withCString { Glibc.write(descriptor, $0, strlen($0)) } == strlen(value)
}

/// A small file's text (a cgroup's or /proc's), empty when it cannot be read.
private func contents(of file: String) -> String {
  let descriptor = open(file, O_RDONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return "" }
  defer { close(descriptor) }
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 4096)
  while case let count = read(descriptor, &chunk, chunk.count), count > 0 { bytes += chunk[0..<count] }
  return String(decoding: bytes, as: UTF8.self)
}

/// The mount points in /proc/self/mountinfo, with their file system types and super options.
private func mounts() -> [(point: String, type: Substring, options: [Substring])] {
  contents(of: "/proc/self/mountinfo").split(separator: "\n").compactMap { line in
    let halves = line.split(separator: " - ", maxSplits: 1)
    guard halves.count == 2 else { return nil }
    let before = halves[0].split(separator: " ")
    let after = halves[1].split(separator: " ")
    guard before.count >= 5, after.count >= 3 else { return nil }
    return (String(before[4]), after[0], after[2].split(separator: ","))
  }
}

/// The mount point of a cgroup hierarchy.
private func cgroupMount(type: String, option: String? = nil) -> String? {
  mounts().first { mount in mount.type == type && option.map { mount.options.contains(Substring($0)) } != false }?.point
}
