import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The suites that make real pressure — busy loops, a child thrashing its
/// memory cgroup — run one test at a time, so that one test's load does not
/// count in another's stall figures (the CPU test's busy loops beside the
/// memory test's child take the CPU time it would spend stalling on memory).
@Suite(.serialized)
enum PressureTests {}

/// Why the pressure tests skip, shown by `.enabled(if:_:)`.
let needsPSI: Comment = "skipped: no PSI here (/proc/pressure is missing: no CONFIG_PSI, or psi=0 at boot)"
let needsCPUPressure: Comment = "skipped: making CPU pressure in a cgroup needs PSI, root and a cgroup v2 hierarchy"
let needsMemoryPressure: Comment =
  "skipped: making memory pressure needs PSI, root, the cgroup v1 memory controller and a disk-backed /var/tmp or /tmp"
let examplePressuresHere: Comment = "skipped: the example makes pressure here, and memoryPressure() checks its levels"

/// Whether the kernel has PSI on (`/proc/pressure/*` exists only then).
let pressureAvailable = access("/proc/pressure/memory", F_OK) == 0 && access("/proc/pressure/cpu", F_OK) == 0

/// Whether this process may make cgroups and move processes (root).
let runningAsRoot = geteuid() == 0

/// The mount point of the cgroup v2 hierarchy, if there is one.
let unifiedCgroupMount: String? = cgroupMount { type, _ in type == "cgroup2" }

/// The mount point of the cgroup v1 memory controller, if there is one.
let memoryCgroupV1Mount: String? = cgroupMount { type, options in
  type == "cgroup" && options.split(separator: ",").contains("memory")
}

private func cgroupMount(_ matches: (Substring, Substring) -> Bool) -> String? {
  let text = String(decoding: contentsOfFile("/proc/self/mountinfo"), as: UTF8.self)
  for line in text.split(separator: "\n") {
    let halves = line.split(separator: " - ", maxSplits: 1)
    guard halves.count == 2 else { continue }
    let after = halves[1].split(separator: " ")
    let before = halves[0].split(separator: " ")
    guard after.count >= 3, before.count >= 5, before[3] == "/", matches(after[0], after[2]) else { continue }
    return String(before[4])
  }
  return nil
}

/// Real CPU pressure can be made here: PSI, root, and a cgroup v2 hierarchy
/// to hold the busy children (so that other load on the machine does not count).
let canMakeCPUPressure = pressureAvailable && runningAsRoot && unifiedCgroupMount != nil

/// Real memory pressure can be made here: PSI, root, a cgroup v1 memory
/// controller for the limit, and a disk-backed directory for the file.
let canMakeMemoryPressure =
  pressureAvailable && runningAsRoot && memoryCgroupV1Mount != nil
  && diskBackedTemporaryDirectory != nil

/// A directory whose files live on a disk, not in memory (a tmpfs file
/// cannot be reclaimed without swap: the limited child would be OOM-killed).
let diskBackedTemporaryDirectory: String? = ["/var/tmp", "/tmp"].first { path in
  access(path, W_OK) == 0 && !["tmpfs", "ramfs", "overlay"].contains(fileSystemType(of: path))
}

/// The type of the file system mounted deepest above `path` (mountinfo's longest matching mount point).
private func fileSystemType(of path: String) -> String {
  let text = String(decoding: contentsOfFile("/proc/self/mountinfo"), as: UTF8.self)
  var best = (length: -1, type: "?")
  for line in text.split(separator: "\n") {
    let halves = line.split(separator: " - ", maxSplits: 1)
    guard halves.count == 2, let type = halves[1].split(separator: " ").first else { continue }
    let fields = halves[0].split(separator: " ")
    guard fields.count >= 5 else { continue }
    let point = String(fields[4])
    let covers = point == "/" || path == point || path.hasPrefix(point + "/")
    if covers && point.count > best.length { best = (point.count, String(type)) }
  }
  return best.type
}

/// The descriptors open on the pressure file `path` and the epoll
/// descriptors that hold one of them (an epoll descriptor's
/// `/proc/self/fdinfo` lists a `tfd:` line per descriptor it holds), so
/// that descriptors other tests open meanwhile do not count.
func pressureDescriptorCount(of path: String) -> Int { pressureDescriptors(of: path).count }

/// The descriptors `pressureDescriptorCount` counts, with what each is (for messages).
func pressureDescriptors(of path: String) -> [Int32: String] {
  let targets = openDescriptorTargets()
  let files = Set(targets.filter { $0.value == path }.keys)
  let epolls = targets.filter { descriptor, target in
    guard target == "anon_inode:[eventpoll]" else { return false }
    let info = String(decoding: contentsOfFile("/proc/self/fdinfo/\(descriptor)"), as: UTF8.self)
    return info.split(separator: "\n").contains { line in
      guard line.hasPrefix("tfd:") else { return false }
      let fields = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
      return fields.count > 1 && Int32(fields[1]).map(files.contains) == true
    }
  }
  return targets.filter { files.contains($0.key) }.merging(epolls) { first, _ in first }
}

private let cgroupCounter = Atomic<Int>(0)

/// The queue on which `TestCgroup`'s watchdogs run.
private let cgroupWatchdog = Queue(label: "test-cgroup-watchdog")

/// A cgroup made for a test, removed (its processes killed first) by `remove()`.
final class TestCgroup: Sendable {
  let path: String

  /// Makes `<mount>/gcd-test-<pid>-<name or n>`, with `settings` (file name, value) written into it.
  init(under mount: String, name: String? = nil, settings: [(String, String)] = []) throws {
    let number = cgroupCounter.add(1, ordering: .relaxed).newValue
    path = "\(mount)/gcd-test-\(getpid())-\(name ?? String(number))"
    guard mkdir(path, 0o755) == 0 else { throw GCDError(operation: "mkdir(\(path))", errno: errno) }
    for (name, value) in settings { try write(value, to: name) }
    // What a test starts in the cgroup (busy loops, a thrashing reader) ends within 50 s, before the
    // test's 60 s time limit, even when the test never reaches `remove()`: killed from a libdispatch
    // queue, whose threads run while the testing library's cooperative threads are all blocked (it
    // reads an exit test's pipes with blocking reads there). Without it, a test stalled behind a long
    // exit test left its busy loops running, which slowed that child, which stalled the suite longer.
    let path = path
    _ = cgroupWatchdog.after(.seconds(50)) {
      let text = String(decoding: contentsOfFile(path + "/cgroup.procs"), as: UTF8.self)
      for pid in text.split(separator: "\n").compactMap({ pid_t($0) }) { kill(pid, SIGKILL) }
    }
  }

  /// Writes `value` to the cgroup's file `name`.
  func write(_ value: String, to name: String) throws {
    let descriptor = open(path + "/" + name, O_WRONLY | O_CLOEXEC)
    guard descriptor >= 0 else { throw GCDError(operation: "open(\(path)/\(name))", errno: errno) }
    defer { close(descriptor) }
    let bytes = Array(value.utf8)
    guard bytes.withUnsafeBytes({ Glibc.write(descriptor, $0.baseAddress, $0.count) }) == bytes.count else {
      throw GCDError(operation: "write(\(path)/\(name))", errno: errno)
    }
  }

  /// The processes in the cgroup now.
  var processes: [pid_t] {
    String(decoding: contentsOfFile(path + "/cgroup.procs"), as: UTF8.self).split(separator: "\n").compactMap {
      pid_t($0)
    }
  }

  /// Kills every process in the cgroup and removes it; true when it is gone.
  @discardableResult
  func remove() -> Bool {
    let deadline = ContinuousClock.now + generousTimeout
    while ContinuousClock.now < deadline {
      for pid in processes { kill(pid, SIGKILL) }
      if rmdir(path) == 0 || errno == ENOENT { return true }
      usleep(10_000)
    }
    return false
  }
}

/// Starts `/bin/sh -c script` after moving the shell into `cgroups` (so
/// that everything it runs is inside them from its first instruction).
func spawnInCgroups(_ cgroups: [TestCgroup], _ script: String) throws -> pid_t {
  let moves = cgroups.map { "echo $$ > \($0.path)/cgroup.procs && " }.joined()
  return try spawnProcess("/bin/sh", ["-c", moves + script])
}

/// Waits until `pid` has moved into `cgroup` (the shell moves itself first).
@available(*, noasync, message: "blocks the thread")
func waitUntilInside(_ cgroup: TestCgroup, _ pid: pid_t) -> Bool {
  pollUntil { cgroup.processes.contains(pid) }
}

/// Kills the child `pid` and reaps it. Every child a test starts is reaped: a zombie left behind
/// keeps Swift Testing's exit-test monitor (`waitid(P_ALL, WNOWAIT)`) finding it instead of the
/// exit test's child, and a later exit test then never ends (seen under `--no-parallel`).
func killAndReap(_ pid: pid_t) {
  kill(pid, SIGKILL)
  reapProcess(pid)
}

/// Makes `path` a sparse file of `size` bytes: holes, no blocks on the disk, its pages zeros.
func makeSparseFile(_ path: String, size: Int) throws {
  let descriptor = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
  guard descriptor >= 0 else { throw GCDError(operation: "open(\(path))", errno: errno) }
  defer { close(descriptor) }
  guard ftruncate(descriptor, off_t(size)) == 0 else { throw GCDError(operation: "ftruncate(\(path))", errno: errno) }
}

/// Starts the child that makes memory pressure, in `cgroups` (a memory cgroup smaller than `file`):
/// `ExampleMemoryPressure`'s own child (`PressureMaker.runChildIfAsked`, `--read-mapping`), which
/// maps `file` read-only and reads a byte of every page over and over, so that each page it touches
/// waits in direct reclaim for another (docs/sources-linux.md, "Making pressure to test it"). The
/// test runs that executable rather than a copy of its loop: tests cannot import an executable
/// target. `prelude` runs in the shell first (taskset's pinning outlives the `exec`). With
/// `niceOnceMapped`, returns once the child has mapped the file, at that nice value: set before, it
/// would slow the child's start (the loader, the Swift runtime) as much as its reading.
///
/// It blocks the calling thread while it waits for the mapping (milliseconds), also from async code:
/// an awaited poll would renice the child late, and the child, alone on its CPU at nice 0 meanwhile,
/// would stall fully (`.critical`, where the test expects `.warning`).
func spawnMappingReader(
  in cgroups: [TestCgroup], of file: String, after prelude: String = "", niceOnceMapped niceness: Int32? = nil
) throws -> pid_t {
  let reader = try #require(
    examplePath("ExampleMemoryPressure"),
    "ExampleMemoryPressure, whose child makes the pressure, is not built: run `swift build --build-tests` first")
  // The shell opens the file as descriptor 3 for the child alone (the test's own stays close-on-exec).
  let child = try spawnInCgroups(cgroups, prelude + "exec \(reader) --read-mapping 3 3< \(file)")
  guard let niceness else { return child }
  let mapped = pollUntil {
    String(decoding: contentsOfFile("/proc/\(child)/maps"), as: UTF8.self).contains(" \(file)\n")
  }
  guard mapped, setpriority(__priority_which_t(PRIO_PROCESS.rawValue), id_t(child), niceness) == 0 else {
    let error = mapped ? errno : ETIME
    killAndReap(child)
    throw GCDError(operation: "setpriority(\(child), \(niceness)) once \(file) is mapped", errno: error)
  }
  return child
}
