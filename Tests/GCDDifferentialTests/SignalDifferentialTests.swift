import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Signal-source sequences (SIGUSR1 and SIGUSR2, sent with `kill(getpid(), …)`), with data sources
/// beside them, through `import Dispatch` and through GCD. They run in an exit-test child: a signal
/// is process-wide, and one that finds no registered source ends the process, so they stay out of
/// the process the other suites share. The child prints each sequence's seed before running it
/// and its report on a difference; the parent turns a failed or crashed child into one issue with
/// the seed and the steps.
@Suite("Differential: signal sources against libdispatch", .timeLimit(.minutes(DifferentialConfig.minutes)))
struct SignalDifferentialTests {
  static let budget = 150

  @Test("signal sources created, handled, suspended, cancelled and dropped around kill(getpid())")
  func signals() async {
    // The child always ends with a failing exit code, so that the expectation holds whatever
    // happens (a crash included) and the parent gets its standard error to judge: "done" alone is a
    // pass, anything else (a report, or a death with the seed it died in) an issue.
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let outcome = Differential.runQuietly(
        SourceSequences.self, profile: "signals", budget: SignalDifferentialTests.budget)
      if let failure = outcome.failure { Posix.printError(failure + "\n") }
      Posix.printError("differential-child: done, \(outcome.ran) sequences\n")
      exit(EXIT_FAILURE)
    }
    guard let result else { return }
    let output = String(decoding: result.standardErrorContent, as: UTF8.self)
    let lines = output.split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
    let marker = "differential: running seed "
    let rest = lines.filter { !$0.hasPrefix(marker) }.joined(separator: "\n")
    let leftovers = lines.filter { $0.contains("left pending was taken") }.count
    if leftovers > 0 { print("differential signals: \(leftovers) signal(s) a run left pending, taken before the next") }
    if let done = lines.first(where: { $0.hasPrefix("differential-child: done") }),
      !lines.contains(where: { $0.contains("differs from libdispatch") })
    {
      print("differential SourceSequences (signals, in a child): \(done.dropFirst("differential-child: done, ".count))")
      return
    }
    var comment = "The child running the signal sequences ended with \(result.exitStatus).\n"
    if lines.contains(where: { $0.contains("differs from libdispatch") }) {
      comment += rest
    } else if let last = lines.last(where: { $0.hasPrefix(marker) }),
      let seed = UInt64(last.dropFirst(marker.count + 2), radix: 16)
    {
      var rng = SplitMix64(seed: seed)
      let steps = SourceSequences.generate(&rng, profile: "signals")
      comment +=
        "It died during sequence seed \(DifferentialConfig.hex(seed)) (not shrunk: each try would be a process):\n"
      for (number, step) in steps.enumerated() { comment += "  \(number + 1). \(step)\n" }
      comment += "Replay: make differential SEED=\(DifferentialConfig.hex(seed)) COUNT=1\n"
      comment += "Its output:\n" + rest
    } else {
      comment += output
    }
    Issue.record(Comment(rawValue: comment))
  }
}
