// A cache that sheds itself under memory pressure: a MemoryPressureSource reports `.warning`,
// `.critical` and back to `.normal` (Darwin's DISPATCH_SOURCE_TYPE_MEMORYPRESSURE levels, from the
// kernel's pressure stall information on Linux); the handler drops half the cache on a warning, all
// of it when critical, and lets it grow again once pressure is back to normal.
//
// To show the levels it makes pressure of its own when it can (as root, with a cgroup v1 memory
// controller): a child in a new memory cgroup limited to 48 MiB writes a 400 MiB file and keeps
// re-reading it, so the kernel reclaims the child's page cache over and over. The source watches the
// child's cgroup v2 when there is one (in a service, leave `scope` out: the default is the process's
// own cgroup, or the system). Without PSI, root or the memory controller it says why and exits 0.
//
// Usage: ExampleMemoryPressure
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Prints at once (the handler runs on another thread).
func say(_ line: String) {
  _ = (line + "\n").withCString { write(STDOUT_FILENO, $0, strlen($0)) }
}

/// What the program keeps because it is cheap to rebuild: 64 entries of 64 KiB.
final class Cache: Sendable {
  let entries = Mutex<[Int: [UInt8]]>([:])

  func fill() {
    entries.withLock { entries in
      for key in 0..<64 where entries[key] == nil { entries[key] = [UInt8](repeating: UInt8(key), count: 64 << 10) }
    }
  }

  /// Drops all but `keeping` of the entries; returns how many are left.
  func shed(keeping fraction: Double) -> Int {
    entries.withLock { entries in
      let keep = Int(Double(entries.count) * fraction)
      for key in entries.keys.sorted().dropFirst(keep) { entries[key] = nil }
      return entries.count
    }
  }
}

/// Writes `value` to `file` (a cgroup setting); false when it cannot.
func write(_ value: String, to file: String) -> Bool {
  let descriptor = open(file, O_WRONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return false }
  defer { close(descriptor) }
  return value.withCString { Glibc.write(descriptor, $0, strlen($0)) } == strlen(value)
}

/// The mount point of a cgroup hierarchy from /proc/self/mountinfo.
func cgroupMount(type: String, option: String? = nil) -> String? {
  let descriptor = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return nil }
  defer { close(descriptor) }
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 4096)
  while case let count = read(descriptor, &chunk, chunk.count), count > 0 { bytes += chunk[0..<count] }
  for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
    let halves = line.split(separator: " - ", maxSplits: 1)
    guard halves.count == 2 else { continue }
    let before = halves[0].split(separator: " ")
    let after = halves[1].split(separator: " ")
    guard before.count >= 5, after.count >= 3, after[0] == type else { continue }
    if let option, !after[2].split(separator: ",").contains(Substring(option)) { continue }
    return String(before[4])
  }
  return nil
}

/// Ends the program: nothing to show on this machine, and why.
func explain(_ why: String) -> Never {
  say("cannot make memory pressure here: \(why)")
  exit(0)
}

let cache = Cache()
cache.fill()
say("cache: \(cache.shed(keeping: 1)) entries")

guard geteuid() == 0 else { explain("making a memory cgroup needs root") }
guard let memoryMount = cgroupMount(type: "cgroup", option: "memory") else {
  explain("no cgroup v1 memory controller is mounted")
}
let limited = memoryMount + "/gcd-example-\(getpid())"
let counted = cgroupMount(type: "cgroup2").map { $0 + "/gcd-example-\(getpid())" }
let file = "/var/tmp/gcd-example-pressure-\(getpid())"

/// Removes the cgroups made so far and says why the program stops.
func giveUp(_ why: String) -> Never {
  rmdir(limited)
  if let counted { rmdir(counted) }
  explain(why)
}

guard mkdir(limited, 0o755) == 0, write("\(48 << 20)", to: limited + "/memory.limit_in_bytes") else {
  giveUp("cannot make the memory cgroup \(limited)")
}
if let counted, mkdir(counted, 0o755) != 0 { giveUp("cannot make \(counted)") }

// docs: begin handler
let levels = Queue(label: "memory pressure")
let source: MemoryPressureSource
do {
  source = try MemoryPressureSource(
    events: [.normal, .warning, .critical], scope: counted.map { .cgroup($0) } ?? .current, queue: levels)
} catch {
  giveUp("\(error)")
}
say("watching memory pressure in \(source.scope)")

let pressed = try Semaphore(value: 0)
let relieved = try Semaphore(value: 0)
source.setEventHandler { [unowned source] in
  let level = source.firedEvents
  switch level {
  case .critical: say("level \(level): shed the whole cache, \(cache.shed(keeping: 0)) entries left")
  case .warning: say("level \(level): shed half the cache, \(cache.shed(keeping: 0.5)) entries left")
  default:
    cache.fill()
    say("level \(level): the cache may grow again, \(cache.shed(keeping: 1)) entries")
  }
  if level == .normal { relieved.signal() } else { pressed.signal() }
}
source.resume()
// docs: end handler

// The child: moved into both cgroups before it starts, then the page-cache churn.
let moves = ([limited] + (counted.map { [$0] } ?? [])).map { "echo $$ > \($0)/cgroup.procs && " }.joined()
let script = moves + "dd if=/dev/zero of=\(file) bs=1M count=400 2>/dev/null; while :; do cat \(file) > /dev/null; done"
let argv = [strdup("/bin/sh"), strdup("-c"), strdup(script), nil]
var child: pid_t = 0
precondition(posix_spawn(&child, "/bin/sh", nil, nil, argv, environ) == 0, "posix_spawn failed")
argv.forEach { free($0) }
say("child: re-reads a 400 MiB file in a 48 MiB memory cgroup")

let sawPressure = pressed.wait(timeout: .seconds(30))

/// Kills every process in `cgroup` and removes it.
func remove(_ cgroup: String) {
  for _ in 0..<500 {
    let descriptor = open(cgroup + "/cgroup.procs", O_RDONLY | O_CLOEXEC)
    if descriptor >= 0 {
      var bytes = [UInt8](repeating: 0, count: 4096)
      let count = read(descriptor, &bytes, bytes.count)
      close(descriptor)
      for pid in String(decoding: bytes[0..<max(count, 0)], as: UTF8.self).split(separator: "\n") {
        kill(pid_t(pid) ?? 0, SIGKILL)
      }
    }
    if rmdir(cgroup) == 0 || errno == ENOENT { return }
    usleep(10_000)
  }
}

kill(child, SIGKILL)
remove(limited)
waitpid(child, nil, 0)
unlink(file)
say("child: stopped")
let sawNormal = sawPressure && relieved.wait(timeout: .seconds(20))
source.cancel()
if let counted { remove(counted) }
say(
  sawPressure
    ? (sawNormal ? "pressure came and went" : "no .normal within 20 s of the child stopping")
    : "no pressure within 30 s")
exit(sawNormal ? 0 : 1)
