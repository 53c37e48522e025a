#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Scale curves (`--scale`, `make bench-scale`, `make bench-scale-quick`): how
// the cost of an operation and the memory of an object grow with the number
// of objects live at once, for C, GCD and Dispatch in the same run. See
// docs/performance.md, "Scale".

/// One point of a curve for one variant: ns per operation and, where the
/// row measures it, heap bytes per live object.
struct ScalePoint {
  var nsPerOperation: Double
  var bytesPerObject: Double?
}

/// How a variant runs one point: timed at `n` objects, and (optionally)
/// the heap bytes per object with `n` live.
struct ScaleRunner {
  let timed: (Int) -> Double
  let memory: ((Int) -> Double)?
}

/// One curve.
struct ScaleRow {
  let name: String
  let title: String
  /// What one operation is, for the table ("ns per timer").
  let operation: String
  /// The counts of a full run and of `--quick` (two small ones).
  let counts: [Int]
  let quickCounts: [Int]
  /// Timed rounds per point in a full run (quick runs use 3).
  var rounds = 5
  let runners: [Variant: ScaleRunner]
  let unavailable: [Variant: String]
  /// Where C cannot express the row: the same work with Swift tasks and no
  /// GCD (the floor any await pays), measured in the same rounds; the
  /// target compares GCD's growth with it as it would with C's.
  var floor: (title: String, timed: (Int) -> Double)?
  /// The memory ratio `--quick` fails above: the 1.5 target, or for a row
  /// known to miss it (said in docs/performance.md) the level measured, so
  /// that CI catches it getting worse.
  var quickMemoryLimit = 1.5
  /// The ratio of GCD's bytes per object over Dispatch's that `--quick` fails above, for a row
  /// whose Dispatch column the package must not fall behind in memory (issue 26's 1.1 target, where
  /// it is met); nil: not guarded.
  var quickDispatchMemoryLimit: Double?
}

/// The measured points of one row.
struct ScaleResult {
  let row: ScaleRow
  var counts: [Int] = []
  /// Per variant, per count: the samples of the timed rounds.
  var times: [Variant: [[Double]]] = [:]
  var bytes: [Variant: [Double?]] = [:]
  var floorTimes: [[Double]] = []

  /// The floor's figure at a count.
  func floor(_ index: Int, quick: Bool) -> Double? {
    guard index < floorTimes.count, !floorTimes[index].isEmpty else { return nil }
    return quick ? floorTimes[index].min() : Statistics.median(floorTimes[index])
  }

  /// The median of the rounds (the full run's figure).
  func median(_ variant: Variant, _ index: Int) -> Double? {
    guard let samples = times[variant]?[index], !samples.isEmpty else { return nil }
    return Statistics.median(samples)
  }

  /// The smallest of the rounds (the quick check's figure: load only adds time).
  func minimum(_ variant: Variant, _ index: Int) -> Double? { times[variant]?[index].min() }

  /// Cost per operation at the largest count over that at the smallest.
  func growth(_ variant: Variant, quick: Bool) -> Double? {
    guard counts.count >= 2 else { return nil }
    let figure = quick ? minimum : median
    guard let first = figure(variant, 0), let last = figure(variant, counts.count - 1), first > 0 else {
      return nil
    }
    return last / first
  }

  /// GCD's heap bytes per object over C's, at the largest count that has both.
  var memoryRatio: Double? { memoryRatio(over: .c) }

  /// GCD's heap bytes per object over `variant`'s, at the largest count that has both.
  func memoryRatio(over variant: Variant) -> Double? {
    for index in counts.indices.reversed() {
      if let gcd = bytes[.gcd]?[index] ?? nil, let other = bytes[variant]?[index] ?? nil, other > 0 {
        return gcd / other
      }
    }
    return nil
  }

  /// The verdict of the targets (issue 20): where C's curve is flat (grows
  /// at most 1.3×), GCD's grows at most 1.3×; where C's grows, GCD's
  /// growth is within 1.2× of C's; where the row has a tasks floor, GCD's
  /// growth is within 1.3× of the floor's (or flat); with neither, GCD's is
  /// flat (1.3×). Memory per object at most 1.5× C's.
  func verdict(quick: Bool) -> (text: String, holds: Bool) {
    guard let gcd = growth(.gcd, quick: quick) else { return ("GCD not measured", true) }
    var parts: [String] = []
    var holds = true
    let last = counts.count - 1
    // A row with a tasks floor compares with it: its C column (where there is one) measures other work.
    if let first = floor(0, quick: quick), let end = floor(last, quick: quick), first > 0 {
      let reference = end / first
      holds = gcd <= 1.3 * max(1, reference)
      parts.append("floor grows \(fixed(reference, 2))×, GCD \(fixed(gcd, 2))× ≤ 1.3 × max(1, floor's)")
    } else if let c = growth(.c, quick: quick) {
      if c <= 1.3 {
        holds = gcd <= 1.3
        parts.append("C flat (\(fixed(c, 2))×), GCD \(fixed(gcd, 2))× ≤ 1.3×")
      } else {
        holds = gcd <= 1.2 * c
        parts.append("C grows \(fixed(c, 2))×, GCD \(fixed(gcd, 2))× ≤ 1.2 × C's")
      }
    } else {
      holds = gcd <= 1.3
      parts.append("no C curve, GCD \(fixed(gcd, 2))× ≤ 1.3×")
    }
    if let memory = memoryRatio {
      let limit = quick ? row.quickMemoryLimit : 1.5
      let shown = (limit * 10).rounded() == limit * 10 ? fixed(limit, 1) : fixed(limit, 2)
      parts.append("memory GCD/C \(fixed(memory, 2)) ≤ \(shown)")
      if memory > limit { holds = false }
    }
    if quick, let limit = row.quickDispatchMemoryLimit, let memory = memoryRatio(over: .dispatch) {
      parts.append("memory GCD/Dispatch \(fixed(memory, 2)) ≤ \(fixed(limit, 2))")
      if memory > limit { holds = false }
    }
    return ((holds ? "holds: " : "BROKEN: ") + parts.joined(separator: "; "), holds)
  }
}

/// Runs every point of `row`: at each count, the rounds of the variants
/// interleaved (the order rotates each round), then one memory pass each.
func measureScale(_ row: ScaleRow, variants: [Variant], quick: Bool, heapInUse: (@convention(c) () -> Int)?)
  -> ScaleResult
{
  var result = ScaleResult(row: row)
  result.counts = quick ? row.quickCounts : row.counts
  let runnable = variants.filter { row.runners[$0] != nil }
  for variant in runnable {
    result.times[variant] = []
    result.bytes[variant] = []
  }
  let rounds = quick ? 5 : row.rounds
  // The runs of one round: each variant, and the floor last (key nil).
  var bodies: [(Variant?, (Int) -> Double)] = runnable.map { ($0, row.runners[$0]!.timed) }
  if let floor = row.floor { bodies.append((nil, floor.timed)) }
  for count in result.counts {
    note("  \(row.name) n=\(count)")
    for (_, body) in bodies { _ = body(count) }  // warm-up
    var samples: [Variant: [Double]] = [:]
    var floorSamples: [Double] = []
    for round in 0..<rounds {
      for index in bodies.indices {
        let (variant, body) = bodies[(index + round) % bodies.count]
        let value = repeated(count, body)
        if let variant { samples[variant, default: []].append(value) } else { floorSamples.append(value) }
        settle(heapInUse)
      }
    }
    result.floorTimes.append(floorSamples)
    for variant in runnable {
      result.times[variant]!.append(samples[variant] ?? [])
      let bytes = row.runners[variant]!.memory.map { $0(count) }
      result.bytes[variant]!.append(bytes)
      settle(heapInUse)
    }
  }
  return result
}

/// One sample: `body` at `count` run again until 5 ms have passed (a
/// point of 10 objects takes microseconds), the mean of its figures.
func repeated(_ count: Int, _ body: (Int) -> Double) -> Double {
  let start = monotonicNanos()
  var sum = 0.0
  var runs = 0
  repeat {
    sum += body(count)
    runs += 1
  } while monotonicNanos() - start < 5_000_000
  return sum / Double(runs)
}

/// Heap bytes per object: `make` builds `count` live objects (returning
/// what keeps them alive), measured once the heap has settled.
func heapPerObject<T>(_ count: Int, _ heapInUse: (@convention(c) () -> Int)?, _ make: (Int) -> T) -> Double {
  guard let heapInUse else { return .nan }
  settle(heapInUse)
  let before = heapInUse()
  let objects = make(count)
  settle(heapInUse)
  let after = heapInUse()
  withExtendedLifetime(objects) {}
  return Double(after - before) / Double(max(count, 1))
}

// MARK: - Limits

/// Raises the soft and hard limit on open descriptors and the inotify
/// watch limit (as root) for the run, and puts them back afterwards.
final class RaisedLimits {
  private var savedFiles = rlimit()
  private var savedWatches: String?
  static let watchesPath = "/proc/sys/fs/inotify/max_user_watches"

  init(files: Int, watches: Int) {
    getrlimit(RLIMIT_NOFILE_VALUE, &savedFiles)
    var wanted = rlimit(rlim_cur: rlim_t(files), rlim_max: max(rlim_t(files), savedFiles.rlim_max))
    if setrlimit(RLIMIT_NOFILE_VALUE, &wanted) != 0 {
      // Without CAP_SYS_RESOURCE the hard limit stays: take all of it.
      note(
        "GCDBenchmarks --scale: cannot raise the descriptor limit to \(files) (errno \(errno)); "
          + "using \(savedFiles.rlim_max)")
      wanted = rlimit(rlim_cur: savedFiles.rlim_max, rlim_max: savedFiles.rlim_max)
      setrlimit(RLIMIT_NOFILE_VALUE, &wanted)
    }
    if let current = RaisedLimits.read(RaisedLimits.watchesPath), let value = Int(current), value < watches {
      if RaisedLimits.write(RaisedLimits.watchesPath, String(watches)) {
        savedWatches = current
      } else {
        note("GCDBenchmarks --scale: cannot raise \(RaisedLimits.watchesPath) to \(watches)")
      }
    }
  }

  func restore() {
    setrlimit(RLIMIT_NOFILE_VALUE, &savedFiles)
    if let savedWatches { _ = RaisedLimits.write(RaisedLimits.watchesPath, savedWatches) }
  }

  static func read(_ path: String) -> String? {
    guard let file = fopen(path, "r") else { return nil }
    defer { fclose(file) }
    var line = [CChar](repeating: 0, count: 64)
    guard fgets(&line, Int32(line.count), file) != nil else { return nil }
    return String(decoding: line.prefix { $0 != 0 && $0 != 10 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  }

  static func write(_ path: String, _ text: String) -> Bool {
    guard let file = fopen(path, "w") else { return false }
    let written = fputs(text + "\n", file) >= 0
    return fclose(file) == 0 && written
  }
}

#if canImport(Glibc)
  let RLIMIT_NOFILE_VALUE = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
#else
  let RLIMIT_NOFILE_VALUE = RLIMIT_NOFILE
#endif

/// The load average over the last minute, and the whole /proc/loadavg line.
func loadAverage() -> String { RaisedLimits.read("/proc/loadavg") ?? "unknown" }
