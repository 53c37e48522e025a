import Testing

/// Stream-channel sequences through `DispatchIO` and through GCD's `IOChannel`, compared
/// (docs/reliability.md, "Differential tests"). `make test` runs 680 from seed 38; the 265
/// scenario sequences (`ChannelScenarios`) run under `make differential` (GCD_DIFF_SCENARIOS=1).
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

  @Test(
    "the async forms: read(upTo:) and write(_:) awaited, their tasks cancelled before, while waiting, after",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func async() async {
    await Differential.run(ChannelScenarios.self, profile: "async", budget: 40)
  }

  @Test(
    "one-shot reads and writes beside a channel over the same descriptor",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func oneShots() async {
    await Differential.run(ChannelScenarios.self, profile: "oneshot", budget: 30)
  }

  @Test(
    "a packet-mode pipe (pipe2(O_DIRECT)): writes of several packets, two channels",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func packetPipe() async {
    await Differential.run(ChannelScenarios.self, profile: "packet", budget: 60)
  }

  @Test(
    "a FIFO whose writer closes and another opens: the end of file ends one read",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func fifo() async {
    await Differential.run(ChannelScenarios.self, profile: "fifo", budget: 40)
  }

  @Test(
    "two channels and one-shots over one descriptor: writes whole, reads in turn, barriers",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func sharedDescriptor() async {
    await Differential.run(ChannelScenarios.self, profile: "shared", budget: 40)
  }

  @Test(
    "a barrier after close(): it waits for earlier operations, later ones end in their turn",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func closeThenBarrier() async {
    await Differential.run(ChannelScenarios.self, profile: "closebarrier", budget: 15)
  }

  @Test(
    "a number closed under a channel and reused: a new channel reads the new descriptor",
    .enabled(if: DifferentialConfig.scenarios, "make differential runs it (GCD_DIFF_SCENARIOS=1)"))
  func reusedNumber() async {
    await Differential.run(ChannelScenarios.self, profile: "reused", budget: 40)
  }
}
