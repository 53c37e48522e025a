import Dispatch
import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Which implementation a run goes through.
enum Side: String, Sendable {
  /// The toolchain's `import Dispatch`: the oracle.
  case dispatch = "Dispatch"
  /// The package.
  case gcd = "GCD"
}

/// What the environment asks for: `make differential SEED=… COUNT=…` sets GCD_DIFF_SEED and
/// GCD_DIFF_COUNT; `make test` sets neither and runs each test's fixed budget from seed 38.
enum DifferentialConfig {
  static let baseSeed: UInt64 = parse(getenv("GCD_DIFF_SEED")) ?? 38

  /// GCD_DIFF_COUNT if set, else `budget`.
  static func count(budget: Int) -> Int { parse(getenv("GCD_DIFF_COUNT")).map { Int($0) } ?? budget }

  /// GCD_DIFF_SHOW=1: print each sequence's steps and both observations (for a replay).
  static let show = getenv("GCD_DIFF_SHOW").map { String(cString: $0) == "1" } ?? false

  /// GCD_DIFF_SCENARIOS=1 (`make differential` sets it): run the channel scenario profiles
  /// (`ChannelScenarios`). Not in `make test` yet: they differ by timing, alone too (issue 52;
  /// docs/reliability.md, "Status", names the seeds).
  static let scenarios = getenv("GCD_DIFF_SCENARIOS").map { String(cString: $0) == "1" } ?? false

  /// GCD_DIFF_ALL=1: go on after a difference (each kind reported once).
  static let surveyAll = getenv("GCD_DIFF_ALL").map { String(cString: $0) == "1" } ?? false

  /// Each differential test's time limit: generous for the fixed budget, and grown with COUNT.
  static let minutes = 10 + (parse(getenv("GCD_DIFF_COUNT")).map { Int($0 / 2_000) } ?? 0)

  /// How long a step waits for what libdispatch must deliver before calling it a hang.
  static let stepDeadline: Duration = .seconds(5)
  /// The same while shrinking a failure already seen (a hang is then expected, and each candidate
  /// that still hangs would otherwise cost the full deadline).
  static let shrinkDeadline: Duration = .seconds(1)

  private static func parse(_ text: UnsafeMutablePointer<CChar>?) -> UInt64? {
    guard let text else { return nil }
    let string = String(cString: text).trimmingCharacters(in: " \t\n")
    if string.isEmpty { return nil }
    if string.hasPrefix("0x") || string.hasPrefix("0X") { return UInt64(string.dropFirst(2), radix: 16) }
    return UInt64(string)
  }

  static func hex(_ seed: UInt64) -> String { "0x" + String(seed, radix: 16) }
}

extension String {
  fileprivate func trimmingCharacters(in set: String) -> String {
    var view = Substring(self)
    while let first = view.first, set.contains(first) { view = view.dropFirst() }
    while let last = view.last, set.contains(last) { view = view.dropLast() }
    return String(view)
  }
}

/// One family of sequences: how to generate one from a seed and how to run it on either side.
protocol SequenceFamily: SendableMetatype {
  associatedtype Step: CustomStringConvertible & Sendable
  /// Generates a sequence from `rng`.
  static func generate(_ rng: inout SplitMix64, profile: String) -> [Step]
  /// Runs `steps` on `side` and returns what a user observed, one line per fact, mapped through
  /// `IntendedDifference` where the two sides differ on purpose.
  static func observe(_ steps: [Step], side: Side, deadline: Duration) -> [String]
  /// Whether shrinking keeps `step` (a channel sequence's fixture: without it the sequence runs on
  /// a socket, where it is another sequence).
  static func isKept(_ step: Step) -> Bool
}

extension SequenceFamily {
  static func isKept(_ step: Step) -> Bool { false }
}

/// How many sequences a family ran, for the summary line.
struct DifferentialOutcome: Sendable {
  var ran = 0
  var failure: String?
}

enum Differential {
  /// Runs `count` sequences of `family` (profile `profile`) from the configured seed: each through
  /// Dispatch, then through GCD, their observations compared. The first difference is shrunk and
  /// recorded as an issue carrying the seed, the minimal sequence and both observations; the run
  /// stops there (each further failing sequence could cost a hang's deadline).
  ///
  /// The sequences run on a thread of their own: they block while they wait, and the cooperative
  /// pool's threads (two on this machine) belong to the other suites' tasks.
  @discardableResult
  static func run<F: SequenceFamily>(
    _ family: F.Type, profile: String, budget: Int, sourceLocation: SourceLocation = #_sourceLocation
  ) async -> DifferentialOutcome {
    let outcome = await onThreadOfItsOwn { runBlocking(family, profile: profile, budget: budget) }
    if let failure = outcome.failure { Issue.record(Comment(rawValue: failure), sourceLocation: sourceLocation) }
    return outcome
  }

  /// The loop `run` runs: sequences until the first difference (or, with GCD_DIFF_ALL=1, until ten
  /// kinds of difference), each reported difference shrunk; the reports joined.
  static func runBlocking<F: SequenceFamily>(_ family: F.Type, profile: String, budget: Int) -> DifferentialOutcome {
    _ = Posix.brokenPipeCaught
    let clock = ContinuousClock()
    let start = clock.now
    var outcome = DifferentialOutcome()
    defer {
      let seconds =
        Double((clock.now - start).components.attoseconds / 10_000_000_000_000_000) / 100
        + Double((clock.now - start).components.seconds)
      print(
        "differential \(F.self) (\(profile)): \(outcome.ran) sequences from seed \(DifferentialConfig.hex(DifferentialConfig.baseSeed)) in \(seconds) s\(outcome.failure == nil ? "" : ", a difference")"
      )
    }
    var seen: Set<String> = []
    let count = DifferentialConfig.count(budget: budget)
    for index in 0..<count {
      let seed = SplitMix64.sequenceSeed(base: DifferentialConfig.baseSeed, index: index)
      var rng = SplitMix64(seed: seed)
      let steps = F.generate(&rng, profile: profile)
      outcome.ran += 1
      guard let difference = compare(family, steps, deadline: DifferentialConfig.stepDeadline, seed: seed) else {
        continue
      }
      // With GCD_DIFF_ALL=1 the run goes on and reports each kind of difference once (the first
      // differing lines with their numbers taken out), up to ten kinds: a survey of every defect a
      // seed range finds, not only the first.
      let kind = signature(difference)
      if seen.contains(kind) { continue }
      seen.insert(kind)
      let report = shrinkAndReport(
        family, profile: profile, steps: steps, first: difference, seed: seed, index: index, count: count)
      outcome.failure = outcome.failure.map { $0 + "\n\n" + report } ?? report
      if !DifferentialConfig.surveyAll || seen.count >= 10 { break }
    }
    return outcome
  }

  /// The kind of a difference: its first differing lines, digits removed.
  static func signature(_ difference: (dispatch: [String], gcd: [String])) -> String {
    let line = zip(difference.dispatch, difference.gcd).first { $0.0 != $0.1 } ?? ("", "")
    return (line.0 + "|" + line.1).filter { !$0.isNumber }
  }

  /// `run` for an exit-test child: no issue recorded (the parent reports), each sequence's seed
  /// printed to standard error before it runs (a crash names its sequence), the first difference
  /// shrunk and returned.
  static func runQuietly<F: SequenceFamily>(_ family: F.Type, profile: String, budget: Int) -> DifferentialOutcome {
    _ = Posix.brokenPipeCaught
    var outcome = DifferentialOutcome()
    let count = DifferentialConfig.count(budget: budget)
    for index in 0..<count {
      let seed = SplitMix64.sequenceSeed(base: DifferentialConfig.baseSeed, index: index)
      Posix.printError("differential: running seed \(DifferentialConfig.hex(seed))\n")
      var rng = SplitMix64(seed: seed)
      let steps = F.generate(&rng, profile: profile)
      outcome.ran += 1
      guard let difference = compare(family, steps, deadline: DifferentialConfig.stepDeadline, seed: seed) else {
        continue
      }
      outcome.failure = shrinkAndReport(
        family, profile: profile, steps: steps, first: difference, seed: seed, index: index, count: count)
      break
    }
    return outcome
  }

  /// Both observations when they differ, nil when they are the same.
  static func compare<F: SequenceFamily>(_ family: F.Type, _ steps: [F.Step], deadline: Duration, seed: UInt64? = nil)
    -> (
      dispatch: [String], gcd: [String]
    )?
  {
    // The oracle always gets the full deadline: only the package's hangs are expected while shrinking.
    let oracle = F.observe(steps, side: .dispatch, deadline: DifferentialConfig.stepDeadline)
    let package = F.observe(steps, side: .gcd, deadline: deadline)
    if DifferentialConfig.show {
      print(steps.enumerated().map { "step \($0.offset + 1). \($0.element)" }.joined(separator: "\n"))
      print("Dispatch observed:\n" + oracle.map { "  | \($0)" }.joined(separator: "\n"))
      print("GCD observed:\n" + package.map { "  | \($0)" }.joined(separator: "\n"))
    }
    if oracle == package, let hang = package.first(where: { $0.contains("TIMEOUT") }) {
      // Equal, but both sides waited in vain: worth a line in the log (a hang the table maps, or
      // one that both implementations share).
      let named = seed.map { " (seed \(DifferentialConfig.hex($0)))" } ?? ""
      print("differential: both sides timed out\(named): \(hang.trimmingCharacters(in: " "))")
    }
    return oracle == package ? nil : (oracle, package)
  }

  /// Drops steps one at a time, from the last, while the sequence still differs, until no single
  /// step can go; then formats the report.
  static func shrinkAndReport<F: SequenceFamily>(
    _ family: F.Type, profile: String, steps: [F.Step], first: (dispatch: [String], gcd: [String]), seed: UInt64,
    index: Int, count: Int
  ) -> String {
    var current = steps
    var observed = first
    var runs = 0
    var changed = true
    while changed && runs < 400 {
      changed = false
      var position = current.count - 1
      while position >= 0 && runs < 400 {
        if F.isKept(current[position]) {
          position -= 1
          continue
        }
        var candidate = current
        candidate.remove(at: position)
        runs += 1
        if let still = compare(family, candidate, deadline: DifferentialConfig.shrinkDeadline) {
          current = candidate
          observed = still
          changed = true
        }
        position -= 1
      }
    }
    // The shrunk sequence once more at the full deadline, so the report shows what a replay shows.
    if let final = compare(family, current, deadline: DifferentialConfig.stepDeadline) { observed = final }
    let line =
      zip(observed.dispatch, observed.gcd).enumerated().first { $0.element.0 != $0.element.1 }?.offset
      ?? min(observed.dispatch.count, observed.gcd.count)
    func at(_ lines: [String]) -> String { line < lines.count ? lines[line] : "(nothing more)" }
    var report = """
      \(F.self) (\(profile)): sequence \(index) of \(count), seed \(DifferentialConfig.hex(seed)), differs from libdispatch.
      First difference (observation line \(line)):
        Dispatch: \(at(observed.dispatch))
        GCD:      \(at(observed.gcd))
      Shrunk from \(steps.count) to \(current.count) steps (\(runs) shrinking runs):

      """
    for (number, step) in current.enumerated() { report += "  \(number + 1). \(step)\n" }
    report += "Dispatch observed:\n" + observed.dispatch.map { "  | \($0)\n" }.joined()
    report += "GCD observed:\n" + observed.gcd.map { "  | \($0)\n" }.joined()
    report += "Replay: make differential SEED=\(DifferentialConfig.hex(seed)) COUNT=1"
    return report
  }
}

/// A log that handlers append to from any thread, and that a step waits on: `wait(until:)` checks a
/// condition each time something is recorded (or every 5 ms, for conditions on the kernel's state),
/// up to a deadline.
final class Waiter: Sendable {
  private let changes = Mutex(0)

  func poke() { changes.withLock { $0 &+= 1 } }

  /// Whether `condition` became true before `deadline`.
  func wait(for deadline: Duration, until condition: () -> Bool) -> Bool {
    let clock = ContinuousClock()
    let end = clock.now + deadline
    var pause: Int32 = 50
    while true {
      if condition() { return true }
      if clock.now >= end { return false }
      // A short pause between checks of a condition that is polled (kernel state, counters set on
      // other threads): the deadline, not the pause, decides the outcome.
      usleep(UInt32(pause))
      pause = min(pause * 2, 5000)
    }
  }

  /// A run's `settle`: waits up to `deadline` until `owed` lists nothing that `abandoned` does not
  /// hold. On a timeout, what is still owed goes to `timeouts`, in one line, and to `abandoned`:
  /// what timed out once is not waited for again (its line says so once), so that one hang costs
  /// one deadline and the later steps still wait for everything else.
  func waitForOwed(
    for deadline: Duration, abandoned: inout Set<String>, timeouts: inout [String], _ owed: () -> [String]
  ) {
    var last: [String] = []
    let done = wait(for: deadline) {
      last = owed().filter { !abandoned.contains($0) }
      return last.isEmpty
    }
    if !done {
      timeouts.append("never delivered within the deadline: " + last.joined(separator: "; "))
      abandoned.formUnion(last)
    }
  }
}

/// Runs `body` on a new thread and returns its result.
func onThreadOfItsOwn<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
  await withCheckedContinuation { continuation in
    let work = ThreadWork { continuation.resume(returning: body()) }
    var thread = pthread_t()
    let made = pthread_create(
      &thread, nil,
      { raw in
        Unmanaged<ThreadWork>.fromOpaque(raw!).takeRetainedValue().body()
        return nil
      }, Unmanaged.passRetained(work).toOpaque())
    precondition(made == 0, "pthread_create: \(made)")
    pthread_detach(thread)
  }
}

private final class ThreadWork: Sendable {
  let body: @Sendable () -> Void
  init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

// MARK: - The drivers' queues

/// The key under which a driver's queues carry their index, on each side.
private let dispatchQueueIndexKey = DispatchSpecificKey<Int>()
private let gcdQueueIndexKey = Queue.SpecificKey<Int>()

/// A driver's `makeQueue(index:)` through `import Dispatch`: a queue on which
/// `currentDispatchQueueIndex()` is `index`.
func indexedDispatchQueue(label: String, index: Int, attributes: DispatchQueue.Attributes = []) -> DispatchQueue {
  let queue = DispatchQueue(label: label, attributes: attributes)
  queue.setSpecific(key: dispatchQueueIndexKey, value: index)
  return queue
}

/// A driver's `currentQueue()` through `import Dispatch`: the index of the queue running the caller,
/// or nil.
func currentDispatchQueueIndex() -> Int? { DispatchQueue.getSpecific(key: dispatchQueueIndexKey) }

/// A driver's `makeQueue(index:)` through GCD: a queue on which `currentGCDQueueIndex()` is `index`.
func indexedGCDQueue(label: String, index: Int, kind: Queue.Kind = .serial) -> Queue {
  let queue = Queue(label: label, kind: kind)
  queue.setSpecific(gcdQueueIndexKey, index)
  return queue
}

/// A driver's `currentQueue()` through GCD: the index of the queue running the caller, or nil.
func currentGCDQueueIndex() -> Int? { Queue.currentSpecific(gcdQueueIndexKey) }
