// A cache that sheds itself under memory pressure: a MemoryPressureSource reports `.warning`,
// `.critical` and back to `.normal` (Darwin's DISPATCH_SOURCE_TYPE_MEMORYPRESSURE levels, from the
// kernel's pressure stall information on Linux); the handler drops half the cache on a warning, all
// of it when critical, and lets it grow again once pressure is back to normal.
//
// To show the levels it makes pressure of its own when it can (as root, with a cgroup v1 memory
// controller; PressureMaker.swift): children of this program in a new memory cgroup limited to
// 48 MiB read every page of a 96 MiB file mapping over and over, so each page they touch waits for
// the kernel to reclaim another (a memory stall). The source watches the children's cgroup v2 when
// there is one (in a service, leave `scope` out: the default is the process's own cgroup, or the
// system). Without PSI, root or the memory controller it says why and exits 0.
//
// Usage: ExampleMemoryPressure
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The children that make the pressure are this program again: in one, this call never returns.
PressureMaker.runChildIfAsked()

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

let cache = Cache()
cache.fill()
say("cache: \(cache.shed(keeping: 1)) entries")

let pressure: PressureMaker
do {
  pressure = try PressureMaker()
} catch {
  say("cannot make memory pressure here: \(error)")
  exit(0)
}

// docs: begin handler
let levels = Queue(label: "memory pressure")
let source: MemoryPressureSource
do {
  source = try MemoryPressureSource(
    events: [.normal, .warning, .critical], scope: pressure.scope, queue: levels)
} catch {
  pressure.removeCgroups()
  say("cannot make memory pressure here: \(error)")
  exit(0)
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

let sawPressure = pressure.makePressure(until: pressed)
pressure.stop()
say("children: stopped")
let sawNormal = sawPressure && relieved.wait(timeout: .seconds(20))
source.cancel()
pressure.removeCgroups()
say(
  sawPressure
    ? (sawNormal ? "pressure came and went" : "no .normal within 20 s of the children stopping")
    : "no pressure within 30 s")
exit(sawNormal ? 0 : 1)
