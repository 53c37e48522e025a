/// One step of a source sequence. Slots (0...2) name the sources; a step on an empty slot, or one
/// that would be misuse in the current state (a resume that balances nothing), is skipped the same
/// way on both sides, so that any subsequence of a sequence is a valid sequence (shrinking drops
/// steps freely).
enum SourceStep: CustomStringConvertible, Sendable, Hashable {
  /// A source in `slot` (dropping what was there), on the socket (`onDuplicate`: on a dup of it),
  /// its handlers on serial queue `queue` (0 or 1).
  case create(slot: Int, kind: SourceKind, onDuplicate: Bool, queue: Int)
  /// A read or write source on a number that is not open.
  case createOnClosedNumber(slot: Int, kind: SourceKind)
  /// Sets (or replaces) the event handler; `variant` tells the two apart in the observations.
  case setHandler(slot: Int, variant: Int)
  case clearHandler(slot: Int)
  /// Replaces the cancel handler every source gets at creation (variant 0) with variant 1.
  case setCancelHandler(slot: Int)
  case setRegistrationHandler(slot: Int)
  case resume(slot: Int)
  case suspend(slot: Int)
  case cancel(slot: Int)
  /// The last reference let go (`IntendedDifference.safeDrop`).
  case drop(slot: Int)
  case merge(slot: Int, value: UInt)
  /// A one-shot timer 1 ms from now.
  case schedule(slot: Int)
  /// The peer writes `bytes` bytes to the socket.
  case peerWrite(bytes: Int)
  /// The peer reads what the socket's write sources wrote.
  case peerDrain
  /// The peer shuts its writing half down (end of file for the readers).
  case peerShutdown
  /// The peer closes its end.
  case peerClose
  /// Every descriptor source dropped, the socket and its duplicate closed, and the socket's number
  /// taken by a new socket (`dup2`), with a new peer, and a new duplicate.
  case reuseNumber
  /// `kill(getpid(), signal)` for a signal kind.
  case raise(SourceKind)

  var description: String {
    switch self {
    case .create(let slot, let kind, let onDuplicate, let queue):
      "create s\(slot) \(kind)\(kind.isDescriptor ? (onDuplicate ? " on dup(socket)" : " on socket") : "") queue q\(queue)"
    case .createOnClosedNumber(let slot, let kind): "create s\(slot) \(kind) on a closed number"
    case .setHandler(let slot, let variant): "s\(slot).setEventHandler(v\(variant))"
    case .clearHandler(let slot): "s\(slot).clearEventHandler"
    case .setCancelHandler(let slot): "s\(slot).setCancelHandler(v1)"
    case .setRegistrationHandler(let slot): "s\(slot).setRegistrationHandler"
    case .resume(let slot): "s\(slot).resume()"
    case .suspend(let slot): "s\(slot).suspend()"
    case .cancel(let slot): "s\(slot).cancel()"
    case .drop(let slot): "drop s\(slot)"
    case .merge(let slot, let value): "s\(slot).merge(\(value))"
    case .schedule(let slot): "s\(slot).schedule(now + 1 ms)"
    case .peerWrite(let bytes): "peer writes \(bytes) bytes"
    case .peerDrain: "peer reads what was written"
    case .peerShutdown: "peer shutdown(SHUT_WR)"
    case .peerClose: "peer close"
    case .reuseNumber: "drop the descriptor sources, close socket and dup, dup2 a new socket onto the number"
    case .raise(let kind): "kill(getpid(), \(kind == .signal1 ? "SIGUSR1" : "SIGUSR2"))"
    }
  }
}

extension SourceStep {
  /// A sequence of 4 to 24 steps. Profiles: "descriptors" (read and write sources on one socket,
  /// its duplicate and a reused number), "data" (timers, add and or sources), "mixed" (all of
  /// those), "signals" (signal sources, with timers and data sources beside them).
  static func generate(_ rng: inout SplitMix64, profile: String) -> [SourceStep] {
    let kinds: [SourceKind] =
      switch profile {
      case "descriptors": [.read, .read, .write]
      case "data": [.timer, .add, .or]
      case "signals": [.signal1, .signal1, .signal2, .add]
      default: [.read, .read, .write, .timer, .add, .or]
      }
    let length = 4 + rng.below(21)
    var steps: [SourceStep] = []
    var created: [Int: SourceKind] = [:]
    for _ in 0..<length {
      // Most steps concern a slot that exists, so that sequences get past creation.
      let slot = created.isEmpty || rng.chance(15) ? rng.below(3) : created.keys.sorted()[rng.below(created.count)]
      let kind = created[slot]
      let step: SourceStep = rng.weighted([
        (
          kind == nil ? 30 : 4,
          .create(slot: slot, kind: kinds[rng.below(kinds.count)], onDuplicate: rng.chance(30), queue: rng.below(2))
        ),
        (
          profile == "descriptors" || profile == "mixed" ? 1 : 0,
          .createOnClosedNumber(slot: slot, kind: rng.chance(50) ? .read : .write)
        ),
        (14, .setHandler(slot: slot, variant: rng.below(2))),
        (3, .clearHandler(slot: slot)),
        (3, .setCancelHandler(slot: slot)),
        (4, .setRegistrationHandler(slot: slot)),
        (14, .resume(slot: slot)),
        (6, .suspend(slot: slot)),
        (4, .cancel(slot: slot)),
        (4, .drop(slot: slot)),
        (kind?.isData == true ? 12 : 1, .merge(slot: slot, value: UInt(1 + rng.below(8)))),
        (kind == .timer ? 12 : 1, .schedule(slot: slot)),
        (kind?.isSignal == true ? 12 : 0, .raise(kind ?? .signal1)),
        (kind?.isDescriptor == true ? 10 : 2, .peerWrite(bytes: rng.chance(80) ? 1 + rng.below(200) : 70_000)),
        (kind == .write ? 6 : 1, .peerDrain),
        (kind?.isDescriptor == true ? 2 : 0, .peerShutdown),
        (kind?.isDescriptor == true ? 1 : 0, .peerClose),
        (kind?.isDescriptor == true ? 2 : 0, .reuseNumber),
      ])
      if case .create(let slot, let kind, _, _) = step { created[slot] = kind }
      if case .createOnClosedNumber(let slot, let kind) = step { created[slot] = kind }
      if case .drop(let slot) = step { created[slot] = nil }
      steps.append(step)
    }
    return steps
  }
}
