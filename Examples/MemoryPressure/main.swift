// A cache that sheds itself under memory pressure: a MemoryPressureSource reports `.warning`, `.critical` and
// back to `.normal` (Darwin's DISPATCH_SOURCE_TYPE_MEMORYPRESSURE levels; on Linux, from the kernel's pressure
// stall information); the handler drops half the cache on a warning, all of it when critical, and lets it grow
// again at `.normal`. To show the levels it makes pressure of its own when it can (PressureMaker.swift: as root,
// children of this program in a small cgroup v1 memory cgroup), watching their cgroup v2 if any (in a service,
// leave `scope` out: the process's own cgroup, or the system). Otherwise it says why and exits 0.
//
// Usage: ExampleMemoryPressure
import GCD
import Glibc
import Synchronization

// docs: begin handler
/// Watches memory pressure in `scope` and sheds `cache` as it rises: half of it on a warning, all of
/// it when critical; back at `.normal` the cache may grow again. `then` hears each level after that.
func shedUnderPressure(
  _ cache: Cache, in scope: PressureScope = .current, then: @escaping @Sendable (MemoryPressureEvents) -> Void
) throws(GCDError) -> MemoryPressureSource {
  let source = try MemoryPressureSource(
    events: [.normal, .warning, .critical], scope: scope, queue: Queue(label: "memory pressure"))
  source.setEventHandler { [unowned source] in
    let level = source.firedEvents
    switch level {
    case .critical: say("level \(level): shed the whole cache, \(cache.shed(keeping: 0)) entries left")
    case .warning: say("level \(level): shed half the cache, \(cache.shed(keeping: 0.5)) entries left")
    default:
      cache.fill()
      say("level \(level): the cache may grow again, \(cache.shed(keeping: 1)) entries")
    }
    then(level)
  }
  source.resume()
  return source
}

/// What the program keeps because it is cheap to rebuild: 64 entries of 64 KiB.
final class Cache: Sendable {
  let entries = Mutex<[[UInt8]]>([])
  func fill() { entries.withLock { $0 += ($0.count..<64).map { [UInt8](repeating: UInt8($0), count: 64 << 10) } } }

  /// Drops all but `keeping` of the entries; returns how many are left.
  func shed(keeping fraction: Double) -> Int {
    entries.withLock { entries in
      entries.removeLast(entries.count - Int(Double(entries.count) * fraction))
      return entries.count
    }
  }
}
// docs: end handler

/// Prints at once (the handler runs on another thread).
func say(_ line: String) { _ = (line + "\n").withCString { write(STDOUT_FILENO, $0, strlen($0)) } }

// The children that make the pressure are this program again: in one, this call never returns.
PressureMaker.runChildIfAsked()

let cache = Cache()
cache.fill()
say("cache: \(cache.shed(keeping: 1)) entries")

let (pressed, relieved) = (try Semaphore(value: 0), try Semaphore(value: 0))
let pressure = PressureMaker()  // Where it cannot make pressure, it says why and exits 0.
let source: MemoryPressureSource
do {
  source = try shedUnderPressure(cache, in: pressure.scope) { level in
    if level == .normal { relieved.signal() } else { pressed.signal() }
  }
} catch {
  pressure.removeCgroups()
  PressureMaker.unavailable("\(error)")
}
say("watching memory pressure in \(source.scope)")

let sawPressure = pressure.makePressure(until: pressed)
let sawNormal = sawPressure && relieved.wait(timeout: .seconds(20))
source.cancel()
pressure.removeCgroups()
say(sawNormal ? "pressure came and went" : sawPressure ? "no .normal within 20 s" : "no pressure within 30 s")
exit(sawNormal ? 0 : 1)
