/// What a channel sequence's descriptor is.
enum ChannelFixture: String, Sendable, Hashable {
  /// One end of an AF_UNIX stream pair; the runner is the peer on the other.
  case socket
  /// A pipe's read end; the runner writes into its write end.
  case pipeReadEnd
  /// A pipe's write end (write-only); the runner reads its read end.
  case pipeWriteEnd
  /// A pseudo-terminal's master; the runner is its slave, in raw mode (no echo, no line editing,
  /// bytes passed unchanged). The slave's end reads as `EIO` on the master, not as end of file.
  case pty

  /// Whether reads and writes share the descriptor (a socket or a terminal), and so libdispatch's
  /// one record of it (`IntendedDifference.readsBesideWrites`).
  var isDuplex: Bool { self == .socket || self == .pty }
}

/// One step of a channel sequence. Slots (0...2) name channels; as with sources, a step that does
/// not apply in the current state is skipped the same way on both sides.
enum ChannelStep: CustomStringConvertible, Sendable, Hashable {
  /// The fixture; always the first step (a sequence shrunk without it uses a socket).
  case fixture(ChannelFixture)
  /// A stream channel over the descriptor in `slot` (cleanup on the serial queue).
  case open(slot: Int)
  /// A stream channel made from the one in `from` (`init(channel:)`).
  case openFrom(slot: Int, from: Int)
  /// A read of `length` bytes, its handler on the serial (or the concurrent) queue.
  case read(slot: Int, length: Int, concurrent: Bool)
  /// A write of `bytes` bytes of the pattern, its handler on the serial (or concurrent) queue.
  case write(slot: Int, bytes: Int, concurrent: Bool)
  case setLimit(slot: Int, lowWater: Int?, highWater: Int?)
  case barrier(slot: Int)
  case close(slot: Int, stop: Bool)
  /// The last reference let go (`IntendedDifference.dropStopsReads`).
  case drop(slot: Int)
  case peerWrite(bytes: Int)
  /// The peer reads until every write that can end has ended.
  case peerDrain
  case peerShutdown
  case peerClose
  /// Every channel closed with `.stop`, their cleanups awaited, and the descriptor's number taken
  /// by a new socket (`dup2`) with a new peer.
  case reuseNumber
  /// The descriptor's O_NONBLOCK flag, where both sides have set it for sure.
  case observeFlags

  var description: String {
    switch self {
    case .fixture(let fixture): "fixture \(fixture)"
    case .open(let slot): "c\(slot) = channel(descriptor)"
    case .openFrom(let slot, let from): "c\(slot) = channel(from: c\(from))"
    case .read(let slot, let length, let concurrent):
      "c\(slot).read(length: \(length)) on \(concurrent ? "concurrent" : "serial") queue"
    case .write(let slot, let bytes, let concurrent):
      "c\(slot).write(\(bytes) bytes) on \(concurrent ? "concurrent" : "serial") queue"
    case .setLimit(let slot, let lowWater, let highWater):
      "c\(slot).setLimit(lowWater: \(lowWater.map(String.init) ?? "nil"), highWater: \(highWater.map(String.init) ?? "nil"))"
    case .barrier(let slot): "c\(slot).barrier"
    case .close(let slot, let stop): "c\(slot).close(stop: \(stop))"
    case .drop(let slot): "drop c\(slot)"
    case .peerWrite(let bytes): "peer writes \(bytes) bytes"
    case .peerDrain: "peer reads until the writes end"
    case .peerShutdown: "peer ends its writing half"
    case .peerClose: "peer closes"
    case .reuseNumber: "close every channel (stop), await cleanups, dup2 a new socket onto the number"
    case .observeFlags: "observe O_NONBLOCK"
    }
  }

  /// A channel made from one that ended, its number since taken by another socket: a channel
  /// used and closed (either way), the number reused, a channel made from the closed one, the new
  /// peer writing, a read and a write on the new channel, in varying sizes and order.
  static func generateFromEnded(_ rng: inout SplitMix64) -> [ChannelStep] {
    var steps: [ChannelStep] = [.fixture(.socket), .open(slot: 0)]
    if rng.chance(50) { steps.append(.write(slot: 0, bytes: 1 + rng.below(100), concurrent: false)) }
    if rng.chance(50) {
      steps += [.peerWrite(bytes: 1 + rng.below(100)), .read(slot: 0, length: 1 + rng.below(100), concurrent: false)]
    }
    steps.append(.close(slot: 0, stop: rng.chance(50)))
    steps.append(.reuseNumber)
    steps.append(.openFrom(slot: 1, from: 0))
    var tail: [ChannelStep] = [
      .peerWrite(bytes: 1 + rng.below(500)), .read(slot: 1, length: 1 + rng.below(1000), concurrent: rng.chance(30)),
    ]
    if rng.chance(50) { tail.append(.write(slot: 1, bytes: 1 + rng.below(500), concurrent: false)) }
    if rng.chance(30) { tail.append(.peerDrain) }
    if rng.chance(30) { tail.swapAt(0, 1) }
    return steps + tail
  }

  /// Profiles: "socket" (one socket, everything), "pipe" (either end of a pipe), "pty" (a
  /// pseudo-terminal's master, everything but a reused number), "shared" (two channels on one
  /// socket, channels made from channels, a reused number), "concurrent" (reads in many deliveries
  /// on a concurrent queue).
  static func generate(_ rng: inout SplitMix64, profile: String) -> [ChannelStep] {
    if profile == "ended" { return generateFromEnded(&rng) }
    let fixture: ChannelFixture =
      switch profile {
      case "pipe": rng.chance(50) ? .pipeReadEnd : .pipeWriteEnd
      case "pty": .pty
      default: .socket
      }
    var steps: [ChannelStep] = [.fixture(fixture)]
    var open: Set<Int> = []
    let length = 3 + rng.below(12)
    for _ in 0..<length {
      let slot =
        open.isEmpty || rng.chance(10) ? rng.below(profile == "shared" ? 3 : 2) : open.sorted()[rng.below(open.count)]
      let exists = open.contains(slot)
      let other = open.filter { $0 != slot }.sorted()
      let concurrent = profile == "concurrent" ? rng.chance(70) : rng.chance(25)
      let step: ChannelStep = rng.weighted([
        (exists ? 2 : 25, .open(slot: slot)),
        (
          other.isEmpty ? 0 : (profile == "shared" ? 10 : 3),
          .openFrom(slot: slot, from: other.isEmpty ? 0 : other[rng.below(other.count)])
        ),
        (
          exists ? 16 : 1,
          .read(slot: slot, length: [1, 10, 100, 4096, 65536, 200_000][rng.below(6)], concurrent: concurrent)
        ),
        (
          exists ? 12 : 1,
          .write(slot: slot, bytes: rng.chance(70) ? 1 + rng.below(2048) : 1 << 20, concurrent: concurrent)
        ),
        (
          exists ? (profile == "concurrent" ? 8 : 4) : 0,
          .setLimit(
            slot: slot, lowWater: rng.chance(50) ? nil : [1, 16, 1024][rng.below(3)],
            highWater: rng.chance(30) ? nil : [512, 4096][rng.below(2)])
        ),
        (exists ? 4 : 0, .barrier(slot: slot)),
        (exists ? 5 : 0, .close(slot: slot, stop: rng.chance(50))),
        (exists ? 3 : 0, .drop(slot: slot)),
        (fixture == .pipeWriteEnd ? 1 : 14, .peerWrite(bytes: rng.chance(75) ? 1 + rng.below(3000) : 100_000)),
        (fixture == .pipeReadEnd ? 1 : 6, .peerDrain),
        (2, .peerShutdown),
        (1, .peerClose),
        (fixture == .socket ? (profile == "shared" ? 5 : 1) : 0, .reuseNumber),
        (3, .observeFlags),
      ])
      switch step {
      case .open(let slot), .openFrom(let slot, _): open.insert(slot)
      case .drop(let slot): open.remove(slot)
      default: break
      }
      steps.append(step)
    }
    return steps
  }
}
