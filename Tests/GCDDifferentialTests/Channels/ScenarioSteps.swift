/// What a scenario sequence's descriptor is (`ScenarioRun`).
enum ScenarioFixture: String, Sendable, Hashable {
  /// One end of an AF_UNIX stream pair; the runner is the peer on the other.
  case socket
  /// A pipe's read end; the runner writes into its write end.
  case pipeReadEnd
  /// A pipe's write end; the runner reads its read end.
  case pipeWriteEnd
  /// A packet-mode pipe's read end (`pipe2(O_DIRECT)`); the runner writes packets into it.
  case packetPipe
  /// A FIFO's read end; the runner is its writer, which closes and opens again.
  case fifo
  /// A pipe's read end whose number a new pipe's read end may take (`dup2`) while channels are
  /// open over it.
  case reusedPipe

  /// Whether the descriptor is read (the peer writes) or written (the peer reads), or both.
  var reads: Bool { self != .pipeWriteEnd }
  var writes: Bool { self == .socket || self == .pipeWriteEnd }
}

/// One step of a scenario sequence: the async forms, one-shots, several channels over one
/// descriptor, packet pipes, FIFOs, close then barrier, a number reused under a channel. Slots
/// (0...1) name channels; calls (`asyncRead`, `asyncWrite`) are numbered in the order generated. A
/// step that does not apply in the current state is skipped the same way on both sides.
enum ScenarioStep: CustomStringConvertible, Sendable, Hashable {
  case fixture(ScenarioFixture)
  /// A stream channel over the descriptor in `slot` (a channel already there is closed first).
  case open(slot: Int)
  /// A callback read of `length` bytes (serial queue).
  case read(slot: Int, length: Int)
  /// A callback write of `bytes` bytes (serial queue).
  case write(slot: Int, bytes: Int)
  case barrier(slot: Int)
  case close(slot: Int, stop: Bool)
  /// `IOChannel.read(fileDescriptor:length:)` / `DispatchIO.read(fromFileDescriptor:maxLength:)`.
  case oneShotRead(length: Int)
  /// `IOChannel.write(fileDescriptor:data:)` / `DispatchIO.write(toFileDescriptor:data:)`.
  case oneShotWrite(bytes: Int)
  /// `try await read(upTo:)` in a task of its own (call `call`), the task cancelled before it.
  case asyncRead(slot: Int, length: Int, call: Int, cancelledBefore: Bool)
  /// `try await write(_:)` in a task of its own (call `call`), the task cancelled before it.
  case asyncWrite(slot: Int, bytes: Int, call: Int, cancelledBefore: Bool)
  /// The task of call `call` cancelled: while its call waits, or after it ended.
  case cancelCall(Int)
  case peerWrite(bytes: Int)
  /// The peer reads until every write that can end has ended.
  case peerDrain
  /// The peer goes away: a pipe's or FIFO's writer closes (end of file), a pipe's reader closes
  /// (`EPIPE`), a socket's peer shuts down its writing half.
  case peerClose
  /// A FIFO gets a new writer.
  case peerReopen
  /// A new pipe's read end `dup2`'d onto the descriptor's number while channels over the old
  /// one are open; the runner writes into the new pipe.
  case replaceNumber

  var description: String {
    switch self {
    case .fixture(let fixture): "fixture \(fixture)"
    case .open(let slot): "c\(slot) = channel(descriptor)"
    case .read(let slot, let length): "c\(slot).read(length: \(length))"
    case .write(let slot, let bytes): "c\(slot).write(\(bytes) bytes)"
    case .barrier(let slot): "c\(slot).barrier"
    case .close(let slot, let stop): "c\(slot).close(stop: \(stop))"
    case .oneShotRead(let length): "one-shot read(length: \(length))"
    case .oneShotWrite(let bytes): "one-shot write(\(bytes) bytes)"
    case .asyncRead(let slot, let length, let call, let before):
      "call\(call): try await c\(slot).read(upTo: \(length))\(before ? ", its task cancelled before" : "")"
    case .asyncWrite(let slot, let bytes, let call, let before):
      "call\(call): try await c\(slot).write(\(bytes) bytes)\(before ? ", its task cancelled before" : "")"
    case .cancelCall(let call): "cancel call\(call)'s task"
    case .peerWrite(let bytes): "peer writes \(bytes) bytes"
    case .peerDrain: "peer reads until the writes end"
    case .peerClose: "peer closes"
    case .peerReopen: "a new writer opens the FIFO"
    case .replaceNumber: "dup2 a new pipe's read end onto the number, channels open"
    }
  }

  /// Profiles: "async" (the async forms and their tasks' cancellation), "oneshot" (one-shots beside
  /// a channel), "packet" (packet-mode pipes), "fifo" (a FIFO's writer closes and another opens),
  /// "shared" (two channels and one-shots over one descriptor, barriers), "closebarrier" (a barrier
  /// after `close()`, operations behind it), "reused" (a number closed under a channel and reused).
  static func generate(_ rng: inout SplitMix64, profile: String) -> [ScenarioStep] {
    switch profile {
    case "async": generateAsync(&rng)
    case "closebarrier": generateCloseBarrier(&rng)
    case "reused": generateReused(&rng)
    default: generateMixed(&rng, profile: profile)
    }
  }

  private static func readLength(_ rng: inout SplitMix64) -> Int { [1, 10, 100, 4096, 65536][rng.below(5)] }
  private static func writeSize(_ rng: inout SplitMix64) -> Int { rng.chance(85) ? 1 + rng.below(2048) : 1 << 20 }

  static func generateAsync(_ rng: inout SplitMix64) -> [ScenarioStep] {
    let fixture: ScenarioFixture = [.pipeReadEnd, .pipeWriteEnd, .fifo, .socket][rng.below(4)]
    var steps: [ScenarioStep] = [.fixture(fixture), .open(slot: 0)]
    var calls = 0
    for _ in 0..<(4 + rng.below(10)) {
      let step: ScenarioStep = rng.weighted([
        (
          fixture.reads ? 14 : 0,
          .asyncRead(slot: 0, length: [1, 10, 100, 4096][rng.below(4)], call: calls, cancelledBefore: rng.chance(15))
        ),
        (
          fixture.writes ? 12 : 0,
          .asyncWrite(slot: 0, bytes: writeSize(&rng), call: calls, cancelledBefore: rng.chance(15))
        ),
        (calls > 0 ? 9 : 0, .cancelCall(calls > 0 ? rng.below(calls) : 0)),
        (fixture.reads ? 12 : 0, .peerWrite(bytes: 1 + rng.below(3000))),
        (fixture.writes ? 6 : 0, .peerDrain),
        (2, .peerClose),
        (fixture == .fifo ? 5 : 0, .peerReopen),
        (steps.count > 6 ? 1 : 0, .close(slot: 0, stop: rng.chance(50))),
      ])
      switch step {
      case .asyncRead, .asyncWrite: calls += 1
      default: break
      }
      steps.append(step)
    }
    return steps
  }

  /// "oneshot", "packet", "fifo", "shared".
  static func generateMixed(_ rng: inout SplitMix64, profile: String) -> [ScenarioStep] {
    let fixture: ScenarioFixture =
      switch profile {
      case "packet": .packetPipe
      case "fifo": .fifo
      // Pipes only: a one-shot write shows at the peer alone, and on a socket whether it is still
      // pending (`IntendedDifference.readsBesideWrites`) would be a matter of timing.
      default: [.pipeReadEnd, .pipeWriteEnd][rng.below(2)]
      }
    let slots = profile == "shared" || profile == "packet" ? 2 : 1
    var steps: [ScenarioStep] = [.fixture(fixture)]
    if profile != "oneshot" || rng.chance(80) { steps.append(.open(slot: 0)) }
    let oneShots = profile == "oneshot" || profile == "shared" || profile == "fifo"
    for _ in 0..<(4 + rng.below(11)) {
      let slot = rng.below(slots)
      let step: ScenarioStep = rng.weighted([
        (3, .open(slot: slot)),
        (fixture.reads ? 12 : 0, .read(slot: slot, length: fixture == .packetPipe ? 65536 : readLength(&rng))),
        (fixture.writes ? 10 : 0, .write(slot: slot, bytes: writeSize(&rng))),
        (oneShots && fixture.reads ? 6 : 0, .oneShotRead(length: readLength(&rng))),
        (oneShots && fixture.writes ? 6 : 0, .oneShotWrite(bytes: writeSize(&rng))),
        (profile == "shared" ? 4 : 1, .barrier(slot: slot)),
        (3, .close(slot: slot, stop: rng.chance(50))),
        (fixture.reads ? 12 : 0, .peerWrite(bytes: 1 + rng.below(fixture == .packetPipe ? 12000 : 3000))),
        (fixture.writes ? 6 : 0, .peerDrain),
        (fixture == .fifo ? 4 : 1, .peerClose),
        (fixture == .fifo ? 4 : 0, .peerReopen),
      ])
      steps.append(step)
    }
    return steps
  }

  /// Operations, `close()` (no stop), then barriers and operations after it in some order, with the
  /// peer writing and reading between.
  static func generateCloseBarrier(_ rng: inout SplitMix64) -> [ScenarioStep] {
    let fixture: ScenarioFixture = [.pipeReadEnd, .pipeWriteEnd, .socket][rng.below(3)]
    var steps: [ScenarioStep] = [.fixture(fixture), .open(slot: 0)]
    func operation(_ rng: inout SplitMix64) -> ScenarioStep {
      rng.weighted([
        (fixture.reads ? 5 : 0, .read(slot: 0, length: readLength(&rng))),
        (fixture.writes ? 5 : 0, .write(slot: 0, bytes: writeSize(&rng))),
        (fixture.reads ? 3 : 0, .peerWrite(bytes: 1 + rng.below(3000))),
        (fixture.writes ? 2 : 0, .peerDrain),
      ])
    }
    for _ in 0..<(1 + rng.below(4)) { steps.append(operation(&rng)) }
    if rng.chance(30) { steps.append(.barrier(slot: 0)) }
    steps.append(.close(slot: 0, stop: false))
    var after: [ScenarioStep] = [.barrier(slot: 0)]
    for _ in 0..<(1 + rng.below(4)) {
      after.append(rng.chance(25) ? .barrier(slot: 0) : operation(&rng))
    }
    if rng.chance(20) { after.append(.peerClose) }
    if rng.chance(30) { after.shuffle(using: &rng) }
    return steps + after
  }

  /// A channel over a pipe's read end, used or not; the number taken by a new pipe's read end
  /// under it; a new channel over the number reading the new pipe; the old channel closed at some
  /// point.
  static func generateReused(_ rng: inout SplitMix64) -> [ScenarioStep] {
    var steps: [ScenarioStep] = [.fixture(.reusedPipe), .open(slot: 0)]
    if rng.chance(50) { steps += [.peerWrite(bytes: 1 + rng.below(2000)), .read(slot: 0, length: readLength(&rng))] }
    if rng.chance(20) { steps.append(.close(slot: 0, stop: rng.chance(50))) }
    steps.append(.replaceNumber)
    var tail: [ScenarioStep] = [
      .open(slot: 1), .peerWrite(bytes: 1 + rng.below(3000)), .read(slot: 1, length: readLength(&rng)),
    ]
    if rng.chance(50) { tail.swapAt(1, 2) }
    if rng.chance(40) { tail.append(.oneShotRead(length: readLength(&rng))) }
    if rng.chance(40) { tail.append(.peerWrite(bytes: 1 + rng.below(3000))) }
    if rng.chance(30) { tail.append(.read(slot: 1, length: readLength(&rng))) }
    tail.insert(.close(slot: 0, stop: rng.chance(50)), at: rng.below(tail.count + 1))
    if rng.chance(30) { tail.append(.peerClose) }
    return steps + tail
  }
}
