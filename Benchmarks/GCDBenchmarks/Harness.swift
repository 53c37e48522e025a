#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The three implementations every operation is measured in.
enum Variant: String, CaseIterable {
  /// libdispatch called from plain C (Benchmarks/c/bench_c.c): the floor.
  case c = "C"
  /// This package.
  case gcd = "GCD"
  /// The toolchain's `import Dispatch` overlay.
  case dispatch = "Dispatch"
}

/// One timed run of one variant: its primary figure (ns per operation, or
/// what the operation's `unit` says) and named secondary figures.
struct Sample {
  var value: Double
  var extras: [String: Double] = [:]

  init(value: Double, extras: [String: Double] = [:]) {
    self.value = value
    self.extras = extras
  }

  /// `count` operations timed from `start` to `end` (monotonic ns).
  init(start: Int64, end: Int64, count: Int) {
    value = Double(end - start) / Double(max(count, 1))
  }
}

/// How a variant of an operation runs: a function of the operation count,
/// or the reason it cannot.
enum Runner {
  case run((Int) -> Sample)
  case unavailable(String)
}

/// One measured operation.
struct Benchmark {
  /// Short machine name (`op=` in the output).
  let name: String
  /// What is measured, for the table.
  let title: String
  /// The unit of `Sample.value`.
  var unit = "ns/op"
  /// Operations per timed run in a full run, and with `--quick`.
  let count: Int
  var quickCount = 3
  /// Timed runs per variant (nil: the command line's `--repeats`).
  var repeats: Int?
  /// Secondary figures to show, by key, with their label and scale.
  var shownExtras: [(key: String, label: String, scale: Double)] = []
  let runners: [Variant: Runner]
}

/// The samples of one variant of one operation.
struct Measurement {
  let variant: Variant
  var samples: [Sample] = []
  var unavailable: String?

  var median: Double? { samples.isEmpty ? nil : Statistics.median(samples.map(\.value)) }
  var minimum: Double? { samples.map(\.value).min() }

  /// The median over the samples of a secondary figure.
  func extra(_ key: String) -> Double? {
    let values = samples.compactMap { $0.extras[key] }
    return values.isEmpty ? nil : Statistics.median(values)
  }
}

struct BenchmarkResult {
  let benchmark: Benchmark
  var measurements: [Variant: Measurement]

  func ratio(_ numerator: Variant, _ denominator: Variant) -> Double? {
    guard let top = measurements[numerator]?.median, let bottom = measurements[denominator]?.median,
      bottom > 0
    else { return nil }
    return top / bottom
  }
}

enum Statistics {
  static func median(_ values: [Double]) -> Double {
    let sorted = values.sorted()
    let middle = sorted.count / 2
    return sorted.count % 2 == 1 ? sorted[middle] : (sorted[middle - 1] + sorted[middle]) / 2
  }

  /// Median of `values` (ns) as the value, with mean, p99 and max as extras
  /// (the same summary bench_c.c computes).
  static func latencySample(_ values: [Int64]) -> Sample {
    guard !values.isEmpty else { return Sample(value: 0) }
    let sorted = values.sorted()
    let mean = Double(sorted.reduce(0, +)) / Double(sorted.count)
    let p99 = min(sorted.count - 1, (sorted.count * 99 + 99) / 100 - 1)
    return Sample(
      value: Double(sorted[sorted.count / 2]),
      extras: ["mean": mean, "p99": Double(sorted[p99]), "max": Double(sorted.last!)])
  }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock bench_c.c uses too.
@inline(__always)
func monotonicNanos() -> Int64 {
  var time = timespec()
  clock_gettime(CLOCK_MONOTONIC, &time)
  return Int64(time.tv_sec) * 1_000_000_000 + Int64(time.tv_nsec)
}

/// Stops the benchmark when a variant did not do the work it timed.
func check(_ condition: Bool, _ what: @autoclosure () -> String) {
  if !condition { fatalError("GCDBenchmarks: check failed: \(what())") }
}

/// Writes a line to standard error (progress, warnings).
func note(_ text: String) {
  var line = text + "\n"
  line.withUTF8 { bytes in _ = write(2, bytes.baseAddress, bytes.count) }
}

/// Runs every variant of `benchmark`: a warm-up run each, then `repeats`
/// rounds in which every variant runs once, in an order that rotates from
/// round to round so that no variant always runs first or last.
func measure(
  _ benchmark: Benchmark, variants: [Variant], repeats: Int, quick: Bool, countOverride: Int?,
  heapInUse: (@convention(c) () -> Int)?
) -> BenchmarkResult {
  var measurements: [Variant: Measurement] = [:]
  var runnable: [(Variant, (Int) -> Sample)] = []
  for variant in variants {
    switch benchmark.runners[variant] {
    case .run(let body)?:
      measurements[variant] = Measurement(variant: variant)
      runnable.append((variant, body))
    case .unavailable(let reason)?:
      measurements[variant] = Measurement(variant: variant, unavailable: reason)
    case nil:
      measurements[variant] = Measurement(variant: variant, unavailable: "n/a")
    }
  }
  let count = countOverride ?? (quick ? benchmark.quickCount : benchmark.count)
  let rounds = quick ? 1 : repeats
  if !quick {
    for (_, body) in runnable {
      _ = body(max(1, count / 4))
      settle(heapInUse)
    }
  }
  for round in 0..<rounds {
    for index in runnable.indices {
      let (variant, body) = runnable[(index + round) % runnable.count]
      let allocationsBefore = allocationCount?() ?? 0
      var sample = body(count)
      settle(heapInUse)
      // Every thread's, the teardown the settle waited for included (as Benchmarks/callgrind.sh
      // counts them, but over one run: the set-up's few allocations are in it).
      if let allocationCount {
        sample.extras["allocs"] = Double(allocationCount() - allocationsBefore) / Double(count)
      }
      measurements[variant]!.samples.append(sample)
    }
  }
  return BenchmarkResult(benchmark: benchmark, measurements: measurements)
}

/// The process's heap allocations so far, every thread's: `gcd_bench_allocations` of
/// Benchmarks/c/bench_allocations.c, which `make bench` preloads (LD_PRELOAD); nil without it.
let allocationCount: (@convention(c) () -> UInt)? = {
  guard let address = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "gcd_bench_allocations") else { return nil }
  return unsafeBitCast(address, to: (@convention(c) () -> UInt).self)
}()

/// Waits (outside the timed part) until the work a run left to
/// libdispatch's threads is done: until the heap in use has stopped
/// changing for three polls 2 ms apart (`GCD_BENCH_SETTLE_MS` sets the
/// interval; Benchmarks/callgrind.sh uses 50, as threads crawl under
/// valgrind), at most 1,000 polls. A source's teardown goes on after its
/// run returns (libdispatch unregisters a cancelled source and frees it on
/// its own threads); without this wait one run's teardown spills into the
/// next run, and under valgrind into no run at all, so the instruction
/// counts of Benchmarks/callgrind.sh would not repeat.
func settle(_ heapInUse: (@convention(c) () -> Int)?) {
  guard let heapInUse else { return }
  var last = heapInUse()
  var stable = 0
  var polls = 0
  while stable < 3 && polls < 1_000 {
    usleep(settleInterval)
    let now = heapInUse()
    stable = now == last ? stable + 1 : 0
    last = now
    polls += 1
  }
}

/// Microseconds between two polls of `settle`.
let settleInterval: UInt32 = {
  guard let text = getenv("GCD_BENCH_SETTLE_MS"), let milliseconds = UInt32(String(cString: text)) else {
    return 2_000
  }
  return milliseconds * 1_000
}()
