// The pressure ExampleMemoryPressure makes so that its levels show: scaffolding, not the lesson. A task in a
// cgroup v1 memory cgroup stalls (as PSI counts it) in direct reclaim when a page charged to it meets the limit:
// a child reading every page of a sparse mapping twice the limit stalls ~480 ms a second (Linux 6.18, no swap).
import GCD
import Glibc

/// Children of this program in a memory cgroup of their own (`limit`), each reading every page of a
/// `mapping` over and over; one more each 10 s without a level, `children` at most.
final class PressureMaker {
  static let (limit, mapping, children) = (48 << 20, 96 << 20, 3)
  /// The cgroup v1 memory cgroup with the limit, then the cgroup v2 the source watches (if any).
  let cgroups: [String]
  /// The sparse file the children map (unlinked), and the children started.
  private let file: Int32
  private var started: [pid_t] = []
  /// Where the source should watch: the children's cgroup v2, or the default.
  var scope: PressureScope { cgroups.count > 1 ? .cgroup(cgroups[1]) : .current }

  /// Makes the cgroups (where systemd mounts them) and the file; where it cannot, says why and exits 0.
  init() {
    let (memory, unified) = ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified")
    guard geteuid() == 0 else { Self.unavailable("making a memory cgroup needs root") }
    guard access(memory + "/memory.limit_in_bytes", F_OK) == 0 else { Self.unavailable("no cgroup v1 \(memory)") }
    // A tmpfs or ramfs page is reclaimed only to swap: the children would be OOM-killed.
    let mounts = lines(of: "/proc/self/mounts").map { $0.split(separator: " ") }
    let under = mounts.filter { $0.count > 2 && "/var/tmp/".hasPrefix($0[1] == "/" ? "/" : $0[1] + "/") }
    guard let disk = under.max(by: { $0[1].count < $1[1].count })?[2], !["tmpfs", "ramfs"].contains(disk) else {
      Self.unavailable("/var/tmp keeps its files in memory (tmpfs or ramfs)")
    }
    let path = "/var/tmp/gcd-example-pressure-\(getpid())"
    file = open(path, O_RDWR | O_CREAT | O_EXCL, 0o600)
    if file >= 0 { unlink(path) }
    let hierarchies = access(unified + "/cgroup.procs", F_OK) == 0 ? [memory, unified] : [memory]
    cgroups = hierarchies.map { $0 + "/gcd-example-\(getpid())" }
    guard file >= 0, ftruncate(file, off_t(Self.mapping)) == 0, cgroups.allSatisfy({ mkdir($0, 0o755) == 0 }),
      write("\(Self.limit)", to: cgroups[0] + "/memory.limit_in_bytes")
    else {
      removeCgroups()
      Self.unavailable("cannot make \(path) or the cgroups \(cgroups)")
    }
  }

  /// Says why there are no levels to show here, and exits 0.
  static func unavailable(_ why: String) -> Never {
    say("cannot make memory pressure here: \(why)")
    exit(0)
  }

  /// Starts a child, and one more each 10 s until `pressed` is signalled, then kills them and removes
  /// their memory cgroup; false when `children` saw no level, after saying what they stalled and how.
  func makePressure(until pressed: GCD.Semaphore) -> Bool {
    let (pressure, before) = (scope.path(of: .memory), stallTotal(in: scope.path(of: .memory)))
    let argv = ([CommandLine.arguments[0], "--read-mapping", "\(file)"] + cgroups).map { strdup($0) } + [nil]
    defer {
      argv.forEach { free($0) }
      for child in started where kill(child, SIGKILL) == 0 { waitpid(child, nil, 0) }
      rmdir(cgroups[0])
      close(file)
      say("children: stopped")
    }
    for count in 1...Self.children {
      var child: pid_t = 0
      let spawned = posix_spawn(&child, "/proc/self/exe", nil, nil, argv, environ)
      guard spawned == 0 else {
        say("child \(count): posix_spawn failed: \(String(cString: strerror(spawned)))")
        return false
      }
      started.append(child)
      say("child \(count): reads a \(Self.mapping >> 20) MiB mapping in a \(Self.limit >> 20) MiB memory cgroup")
      if pressed.wait(timeout: .seconds(10)) { return true }
    }
    let kills = lines(of: cgroups[0] + "/memory.oom_control").first { $0.hasPrefix("oom_kill ") } ?? "oom_kill ?"
    say(
      "no level: \(Self.children) children stalled \((stallTotal(in: pressure) - before) / 1000) ms in all in "
        + "\(pressure) (a warning needs 100 ms in 2 s); \(started.filter { kill($0, 0) == 0 }.count) still running, "
        + kills)
    return false
  }

  func removeCgroups() { for cgroup in cgroups { rmdir(cgroup) } }  // The cgroup v2 once its source is cancelled.

  /// In a child (`--read-mapping`, the file's descriptor, the cgroups to join), reads a byte of every
  /// page of the file, mapped, until its parent is gone. `MemoryPressureSourceTests` runs it too.
  static func runChildIfAsked() {
    let arguments = CommandLine.arguments
    guard arguments.count >= 3, arguments[1] == "--read-mapping", let file = Int32(arguments[2]) else { return }
    let parent = getppid()
    for cgroup in arguments.dropFirst(3) where !write("\(getpid())", to: cgroup + "/cgroup.procs") { exit(2) }
    var status = stat()
    guard fstat(file, &status) == 0, case let size = Int(status.st_size), size > 0,
      let base = mmap(nil, size, PROT_READ, MAP_SHARED, file, 0), base != MAP_FAILED
    else { exit(3) }
    var sum: UInt8 = 0
    while getppid() == parent {
      for offset in stride(from: 0, to: size, by: 4096) { sum &+= base.load(fromByteOffset: offset, as: UInt8.self) }
    }
    exit(Int32(sum >> 7))
  }
}

/// The cumulative `some` stall in the pressure file `path`, in µs (0 when it cannot be read).
private func stallTotal(in path: String) -> Int {
  let some = lines(of: path).first { $0.hasPrefix("some ") }?.split(separator: " ").last ?? ""
  return Int(some.dropFirst("total=".count)) ?? 0
}

/// Writes `value` to `file` (a cgroup setting); false when it cannot.
private func write(_ value: String, to file: String) -> Bool {
  guard let stream = fopen(file, "we") else { return false }
  let written = fputs(value, stream) >= 0
  return fclose(stream) == 0 && written
}

/// The lines of a small file (a cgroup's or /proc's), none when it cannot be read.
private func lines(of file: String) -> [Substring] {
  guard let stream = fopen(file, "re") else { return [] }
  defer { fclose(stream) }
  var (bytes, chunk) = ([UInt8](), [UInt8](repeating: 0, count: 4096))
  while case let count = fread(&chunk, 1, chunk.count, stream), count > 0 { bytes += chunk[..<count] }
  return String(decoding: bytes, as: UTF8.self).split(separator: "\n")
}
