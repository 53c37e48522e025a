import Testing

/// Source sequences through `import Dispatch` and through GCD, compared (docs/reliability.md,
/// "Differential tests"). `make test` runs 2,100 in-process sequences from seed 38; `make
/// differential SEED=… COUNT=…` runs COUNT of each profile from SEED.
@Suite("Differential: sources against libdispatch", .timeLimit(.minutes(DifferentialConfig.minutes)))
struct SourceDifferentialTests {
  @Test("read and write sources on a socket, its duplicate and a reused number")
  func descriptors() async {
    await Differential.run(SourceSequences.self, profile: "descriptors", budget: 900)
  }

  @Test("timers, data add and data or sources")
  func data() async {
    await Differential.run(SourceSequences.self, profile: "data", budget: 600)
  }

  @Test("every in-process kind at once")
  func mixed() async {
    await Differential.run(SourceSequences.self, profile: "mixed", budget: 600)
  }
}
