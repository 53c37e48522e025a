import Testing

/// Stream-channel sequences through `DispatchIO` and through GCD's `IOChannel`, compared
/// (docs/reliability.md, "Differential tests"). `make test` runs 680 from seed 38.
@Suite("Differential: stream channels against libdispatch", .timeLimit(.minutes(DifferentialConfig.minutes)))
struct ChannelDifferentialTests {
  @Test("one socket: reads, writes, limits, barriers, close both ways, drop, the peer's end")
  func socket() async {
    await Differential.run(ChannelSequences.self, profile: "socket", budget: 200)
  }

  @Test("either end of a pipe, a read on the write-only end included")
  func pipe() async {
    await Differential.run(ChannelSequences.self, profile: "pipe", budget: 120)
  }

  @Test("a pseudo-terminal's master: reads, writes, limits, barriers, close both ways, drop, the slave's end")
  func pty() async {
    await Differential.run(ChannelSequences.self, profile: "pty", budget: 80)
  }

  @Test("two channels on one socket, channels made from live and ended channels, a reused number")
  func shared() async {
    await Differential.run(ChannelSequences.self, profile: "shared", budget: 120)
  }

  @Test("a channel made from one that ended, its number since taken by another socket")
  func fromEnded() async {
    await Differential.run(ChannelSequences.self, profile: "ended", budget: 40)
  }

  @Test("reads delivered in many parts on a concurrent queue")
  func concurrent() async {
    await Differential.run(ChannelSequences.self, profile: "concurrent", budget: 120)
  }
}
