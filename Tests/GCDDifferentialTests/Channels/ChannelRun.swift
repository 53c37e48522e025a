import Synchronization

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The descriptors of Dispatch runs that did not end cleanly, kept open for the life of the process
/// so that their numbers are never given to another sequence (`ChannelRun.finish`).
private let quarantine = Mutex<[Int32]>([])

/// The channel sequences as a family the harness runs.
enum ChannelSequences: SequenceFamily {
  static func generate(_ rng: inout SplitMix64, profile: String) -> [ChannelStep] {
    ChannelStep.generate(&rng, profile: profile)
  }

  static func isKept(_ step: ChannelStep) -> Bool {
    if case .fixture = step { return true }
    return false
  }

  static func observe(_ steps: [ChannelStep], side: Side, deadline: Duration) -> [String] {
    let driver: any ChannelDriver = side == .dispatch ? DispatchChannelDriver() : GCDChannelDriver()
    var fixture = ChannelFixture.socket
    if case .fixture(let chosen) = steps.first { fixture = chosen }
    let run = ChannelRun(driver: driver, fixture: fixture, deadline: deadline)
    for (index, step) in steps.enumerated() { run.perform(step, index: index + 1) }
    return run.finish()
  }
}

/// One run of a channel sequence on one side. As `SourceRun`, it models what libdispatch must
/// deliver after each step (which operations must end, which reads must have delivered what the
/// peer wrote), waits for that, and observes.
final class ChannelRun: @unchecked Sendable {  // all mutable state is in `state`, under its Mutex
  struct Channel {
    var handle: ChannelHandle?
    var slot: Int
    var closed = false
    var stopped = false
    var dropped = false
    var stoppedByDrop = false
    var fromEnded = false
    var lowWater: Int? = nil
    var cleanups: [Int32] = []
    var completedOps = 0
  }

  struct Operation {
    var isRead: Bool
    var channel: Int
    var length: Int
    var queue: Int
    var issuedClosed: Bool
    var delivered = 0
    var done = false
    var error: Int32 = 0
    var afterDone = false
    var outOfOrder = false
    var wrongQueue = false
    var endedByDrop = false
    /// A write on a pipe's write end pending when the reader closed, or queued behind one
    /// (`IntendedDifference.closedReaderEndsWrite`).
    var readerClosed = false
    /// Behind a barrier of its channel that waits for a read a drop left waiting in the Dispatch
    /// run (`IntendedDifference.dropStopsReads`): the package's drop ended that read, so this one
    /// went on; libdispatch's waits until the read ends at the peer's close.
    var behindLeftRead = false
    /// The channel's low-water mark when the operation was issued: it keeps it (libdispatch copies
    /// the channel's parameters into each operation; so does the package's engine).
    var lowWater: Int? = nil
    /// A read a drop left waiting in the Dispatch run (`IntendedDifference.dropStopsReads`).
    var leftWaiting = false
    var owed = false
    var reported = false
    /// The stream's life the read belongs to (`reuseNumber` starts a new one).
    var generation = 0
    /// The first byte a read got, and the byte its next delivery must start with: a read's bytes
    /// are in order within the read; the reads' order is checked at the end, in issue order.
    var firstByte: Int? = nil
    var nextByte: Int? = nil
  }

  struct Barrier {
    var channel: Int
    var before: [Int]
    var ran = false
    var owed = false
    var reported = false
  }

  struct State {
    var channels: [Channel] = []
    var slots: [Int: Int] = [:]
    var operations: [Int] = []
    var ops: [Operation] = []
    var barriers: [Barrier] = []
    var descriptor: Int32 = -1
    var peer: Int32 = -1
    var originalFlags: Int32 = 0
    var identity: [UInt64] = []
    var peerWritten = 0
    var peerShut = false
    var peerClosed = false
    var peerReceived = 0
    var streamOffset = 0
    var closedPeers: [Int32] = []
    var generation = 0
    /// A read on a pipe's write end or a write on its read end was issued: it fails with EBADF
    /// (`IntendedDifference.errorEndsOneOperation`).
    var descriptorFailed = false
    /// A drop left a read waiting in the Dispatch run (its channel had a write pending).
    var readLeftWaiting = false
  }

  let driver: any ChannelDriver
  let fixture: ChannelFixture
  let deadline: Duration
  let queues: [AnyObject]
  let state = Mutex(State())
  let waiter = Waiter()
  var lines: [String] = []
  var timeouts: [String] = []
  var abandoned: Set<String> = []

  init(driver: any ChannelDriver, fixture: ChannelFixture, deadline: Duration) {
    self.driver = driver
    self.fixture = fixture
    self.deadline = deadline
    queues = [driver.makeQueue(index: 0), driver.makeQueue(index: 1)]
    let (ours, peer): (Int32, Int32)
    switch fixture {
    case .socket: (ours, peer) = Posix.socketPair()
    case .pipeReadEnd:
      let (read, write) = Posix.pipePair()
      (ours, peer) = (read, write)
    case .pipeWriteEnd:
      let (read, write) = Posix.pipePair()
      (ours, peer) = (write, read)
    case .pty: (ours, peer) = Posix.ptyPair()
    }
    Posix.setNonBlocking(peer)
    state.withLock {
      $0.descriptor = ours
      $0.peer = peer
      $0.originalFlags = Posix.statusFlags(ours)
      $0.identity = Posix.identity(ours)!
    }
  }

  // MARK: Steps

  func perform(_ step: ChannelStep, index: Int) {
    var note = ""
    switch step {
    case .fixture:
      if index != 1 { note = "skipped (not first)" }
    case .open(let slot):
      drop(slot)
      awaitEndedRecord()
      let descriptor = state.withLock { $0.descriptor }
      let id = newChannel(slot: slot, fromEnded: false)
      let handle = driver.open(descriptor: descriptor, queue: queues[0], cleanup: cleanup(id))
      state.withLock { $0.channels[id].handle = handle }
    case .openFrom(let slot, let from):
      guard slot != from,
        let (parent, ended) = state.withLock({ state -> (ChannelHandle, Bool)? in
          guard let id = state.slots[from], let handle = state.channels[id].handle else { return nil }
          // A channel made from one that never had the descriptor never has it either.
          return (handle, state.channels[id].closed || state.channels[id].fromEnded)
        })
      else {
        note = "skipped (no c\(from))"
        break
      }
      drop(slot)
      let id = newChannel(slot: slot, fromEnded: ended)
      let handle = driver.open(from: parent, queue: queues[0], cleanup: cleanup(id))
      state.withLock { $0.channels[id].handle = handle }
    case .read(let slot, let length, let concurrent):
      guard let (id, handle) = live(slot) else {
        note = "skipped (no c\(slot))"
        break
      }
      let busy = state.withLock { state in
        state.ops.contains { $0.isRead && !$0.done && $0.channel != id && !$0.endedByDrop }
      }
      if busy {
        note = "skipped (another channel's read is pending)"
        break
      }
      if let skipped = failingOperationRule(isRead: true) ?? hangUpRule() ?? sharedBarrierRule(id, isBarrier: false) {
        note = skipped
        break
      }
      if state.withLock({ writeStallsReads($0) }) {
        note = "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
        break
      }
      let op = issue(isRead: true, channel: id, length: length, queue: concurrent ? 1 : 0)
      driver.read(handle, length: length, queue: queues[concurrent ? 1 : 0], handler: call(op))
    case .write(let slot, let bytes, let concurrent):
      guard let (id, handle) = live(slot) else {
        note = "skipped (no c\(slot))"
        break
      }
      if let skipped = sharedBarrierRule(id, isBarrier: false) ?? failingOperationRule(isRead: false) {
        note = skipped
        break
      }
      let op = issue(isRead: false, channel: id, length: bytes, queue: concurrent ? 1 : 0)
      driver.write(
        handle, bytes: (0..<bytes).map { UInt8($0 % 251) }, queue: queues[concurrent ? 1 : 0], handler: call(op))
    case .setLimit(let slot, let lowWater, let highWater):
      guard let (id, handle) = live(slot) else { break }
      state.withLock { if let lowWater { $0.channels[id].lowWater = lowWater } }
      driver.setLimit(handle, lowWater: lowWater, highWater: highWater)
    case .barrier(let slot):
      guard let (id, handle) = live(slot), state.withLock({ !$0.channels[id].closed }) else {
        note = "skipped"
        break
      }
      if let skipped = hangUpRule() ?? sharedBarrierRule(id, isBarrier: true) {
        note = skipped
        break
      }
      let barrier = state.withLock { state -> Int in
        let before = state.ops.indices.filter { state.ops[$0].channel == id }
        state.barriers.append(Barrier(channel: id, before: before))
        return state.barriers.count - 1
      }
      driver.barrier(handle) { [weak self] in
        self?.state.withLock { $0.barriers[barrier].ran = true }
      }
    case .close(let slot, let stop):
      guard let (id, handle) = live(slot), state.withLock({ !$0.channels[id].closed }) else {
        note = "skipped"
        break
      }
      if stop && state.withLock({ state in state.channels.indices.contains { barrierWaits($0, state) } }) {
        note = "skipped (a barrier waits for an operation) \(IntendedDifference.stopWaitsForBarrier.tag)"
        break
      }
      if stop { awaitQueuedBytesTaken(by: id) }
      state.withLock {
        $0.channels[id].closed = true
        $0.channels[id].stopped = stop
      }
      driver.close(handle, stop: stop)
    case .drop(let slot):
      drop(slot)
    case .peerWrite(let bytes):
      // What does not fit is written again once the reads the model owes have taken their
      // bytes, until nothing more fits: how much a read took while the peer wrote is then not a
      // matter of timing.
      var total = 0
      while total < bytes {
        let wrote = state.withLock { state -> Int in
          guard fixture != .pipeWriteEnd, !state.peerShut, state.peer >= 0 else {
            note = "skipped"
            return 0
          }
          if writeStallsReads(state) {
            note = "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
            return 0
          }
          if state.readLeftWaiting {
            note = "skipped (a read a drop left waiting in the Dispatch run) \(IntendedDifference.dropStopsReads.tag)"
            return 0
          }
          // How much a terminal holds unread is known only while no read gathers below its mark.
          if fixture == .pty
            && state.ops.contains(where: {
              $0.isRead && !$0.done && !$0.endedByDrop && $0.lowWater ?? 1 > 1
            })
          {
            note = "skipped (a read gathers below its low-water mark on a terminal)"
            return 0
          }
          // How much a terminal takes before its writer must wait varies by a few hundred bytes
          // run to run (its buffers are filled by a kernel worker): its peer writes only while
          // at most 4,000 bytes are unread, which it always takes.
          let room = fixture == .pty ? 4000 - (state.peerWritten - state.streamOffset) : bytes - total
          guard room > 0 else { return 0 }
          let wrote = Posix.writePattern(state.peer, offset: state.peerWritten, count: min(bytes - total, room))
          if wrote > 0 { state.peerWritten += wrote }
          return max(wrote, 0)
        }
        if wrote == 0 { break }
        total += wrote
        if total < bytes { settle() }
      }
      if total < bytes && note.isEmpty { note = "peer wrote \(total) of \(bytes)" }
    case .peerDrain:
      peerDrain()
    case .peerShutdown:
      state.withLock { state in
        guard !state.peerShut, state.peer >= 0, fixture != .pipeWriteEnd else { return }
        if writeStallsReads(state) && readWaits(state) {
          note = "skipped (a write of the socket and a read are pending) \(IntendedDifference.readsBesideWrites.tag)"
          return
        }
        if fixture == .socket {
          shutdown(state.peer, Int32(SHUT_WR))
        } else {
          close(state.peer)
          state.peer = -1
          state.peerClosed = true
          if fixture == .pty { markWritesCaught(&state) }
        }
        state.peerShut = true
      }
    case .peerClose:
      if state.withLock({ writeStallsReads($0) && readWaits($0) }) {
        note = "skipped (a write of the socket and a read are pending) \(IntendedDifference.readsBesideWrites.tag)"
        break
      }
      closePeer()
    case .reuseNumber:
      if fixture == .socket && state.withLock({ state in state.channels.indices.contains { barrierWaits($0, state) } })
      {
        note = "skipped (a barrier waits for an operation) \(IntendedDifference.stopWaitsForBarrier.tag)"
        break
      }
      if state.withLock({ $0.readLeftWaiting }) {
        note = "skipped (a read a drop left waiting in the Dispatch run) \(IntendedDifference.dropStopsReads.tag)"
        break
      }
      // A dropped channel's write goes on (on both sides) and no one can stop it: the number is
      // still in use, and replacing the file under it is the caller's error, on either side.
      if state.withLock({ state in
        state.ops.contains { !$0.isRead && !$0.done && state.channels[$0.channel].dropped }
      }) {
        note = "skipped (a dropped channel's write is pending)"
        break
      }
      reuseNumber()
    case .observeFlags:
      break
    }
    settle()
    report("\(index). \(step)" + (note.isEmpty ? "" : " — \(note)"), flags: step == .observeFlags)
  }

  /// `IntendedDifference.reopenAfterEnd`: before the Dispatch run makes a channel over the
  /// descriptor whose earlier channels are all closed with no operation pending (their record is
  /// ending), it waits for their cleanups and the caller's flags to be back. The GCD run does not.
  private func awaitEndedRecord() {
    guard driver.side == .dispatch else { return }
    let ending = state.withLock { state in
      // A stop behind a barrier that waits for an operation waits too
      // (`IntendedDifference.stopWaitsForBarrier`): that record is not ending.
      // A channel made from an ended one never joined the record.
      let used = state.channels.filter { !$0.fromEnded }
      return !used.isEmpty && used.allSatisfy { $0.closed }
        && !state.channels.indices.contains { barrierWaits($0, state) }
        && state.ops.allSatisfy { operation in
          // A read a drop's stop ends is ending; one a drop left waiting keeps the record alive.
          let channel = state.channels[operation.channel]
          return operation.done || (operation.endedByDrop && (channel.stopped || channel.stoppedByDrop))
        }
    }
    guard ending else { return }
    let ended = waiter.wait(for: abandoned.contains("record") ? .zero : deadline) {
      state.withLock { state in
        state.channels.allSatisfy { !$0.cleanups.isEmpty || $0.fromEnded }
          && Posix.statusFlags(state.descriptor) == state.originalFlags
      }
    }
    if !ended {
      timeouts.append("the closed channels' record never ended within the deadline")
      abandoned.insert("record")
    }
  }

  private func newChannel(slot: Int, fromEnded: Bool) -> Int {
    state.withLock { state in
      var channel = Channel(slot: slot)
      channel.fromEnded = fromEnded
      state.channels.append(channel)
      state.slots[slot] = state.channels.count - 1
      return state.channels.count - 1
    }
  }

  private func cleanup(_ id: Int) -> @Sendable (Int32) -> Void {
    { [weak self] descriptor in self?.state.withLock { $0.channels[id].cleanups.append(descriptor) } }
  }

  private func live(_ slot: Int) -> (Int, ChannelHandle)? {
    state.withLock { state in
      guard let id = state.slots[slot], let handle = state.channels[id].handle else { return nil }
      return (id, handle)
    }
  }

  /// `IntendedDifference.errorEndsOneOperation`: nil when an operation may be issued, else the
  /// note of its skipped step. The one operation of these sequences that fails with `EBADF`, a read
  /// on a pipe's write end or a write on its read end, is issued only while no other operation is
  /// pending, and no operation is issued on the descriptor after it.
  private func failingOperationRule(isRead: Bool) -> String? {
    state.withLock { state in
      let tag = IntendedDifference.errorEndsOneOperation.tag
      if state.descriptorFailed { return "skipped (an operation on the descriptor failed with EBADF) \(tag)" }
      guard isRead ? fixture == .pipeWriteEnd : fixture == .pipeReadEnd else { return nil }
      if state.ops.contains(where: { !$0.done && !$0.endedByDrop }) {
        return "skipped (it fails with EBADF, and an operation is pending) \(tag)"
      }
      state.descriptorFailed = true
      return nil
    }
  }

  private func issue(isRead: Bool, channel: Int, length: Int, queue: Int) -> Int {
    state.withLock { state in
      var operation = Operation(
        isRead: isRead, channel: channel, length: length, queue: queue, issuedClosed: state.channels[channel].closed)
      operation.generation = state.generation
      operation.lowWater = state.channels[channel].lowWater
      // Queued behind a write the reader's close caught: by the model, not by whether that write
      // has ended yet (the package's has, with EPIPE; libdispatch's never does), so that both
      // sides map the same operations (pipe 0xd5de52bce028f17a, one run in several).
      if !isRead && !operation.issuedClosed && state.ops.contains(where: { $0.readerClosed }) {
        operation.readerClosed = true
      }
      // A terminal's write after its slave closed: it fits, or waits for good on one side and
      // ends with EIO on the other (`IntendedDifference.hungUpTerminalEndsWrite`).
      if !isRead && fixture == .pty && state.peerClosed && !operation.issuedClosed { operation.readerClosed = true }
      state.ops.append(operation)
      return state.ops.count - 1
    }
  }

  /// The handler of operation `op`: checks each call's queue, order and bytes.
  private func call(_ op: Int) -> ChannelCall {
    { [weak self] done, bytes, count, error in
      guard let self else { return }
      let queue = driver.currentQueue()
      state.withLock { state in
        var operation = state.ops[op]
        defer { state.ops[op] = operation }
        if queue != operation.queue { operation.wrongQueue = true }
        if operation.done { operation.afterDone = true }
        if operation.isRead {
          // Per read: two reads of one channel with handlers on different queues may run their
          // calls in either order, so the stream's order across reads is checked at the end.
          for byte in bytes {
            if let next = operation.nextByte, Int(byte) != next { operation.outOfOrder = true }
            if operation.firstByte == nil { operation.firstByte = Int(byte) }
            operation.nextByte = (Int(byte) + 1) % 251
          }
          state.streamOffset += count
          operation.delivered += count
        } else {
          operation.delivered = operation.length - count
        }
        if done {
          operation.done = true
          operation.error = error
          // One the peer's close caught ends on one side only (`closedReaderEndsWrite`,
          // `hungUpTerminalEndsWrite`): it says nothing both sides share.
          if !operation.readerClosed { state.channels[operation.channel].completedOps += 1 }
        }
      }
    }
  }

  /// Lets the channel in `slot` go (`IntendedDifference.dropStopsReads`).
  private func drop(_ slot: Int) {
    if let id = state.withLock({ $0.slots[slot] }) { awaitQueuedBytesTaken(by: id) }
    let taken = state.withLock { state -> (ChannelHandle, Bool, Bool)? in
      guard let id = state.slots[slot], let handle = state.channels[id].handle else { return nil }
      state.slots[slot] = nil
      state.channels[id].handle = nil
      state.channels[id].dropped = true
      let pending = state.ops.indices.filter { state.ops[$0].channel == id && !state.ops[$0].done }
      let reading = pending.contains { state.ops[$0].isRead }
      let writing = pending.contains { !state.ops[$0].isRead }
      for op in pending where state.ops[op].isRead { state.ops[op].endedByDrop = true }
      let stop = reading && !writing
      // The Dispatch run's stop waits behind a barrier that waits (`stopWaitsForBarrier`,
      // `barrierPerDescriptor`): it leaves the read waiting too.
      let stopReaches = !state.channels.indices.contains { barrierWaits($0, state) }
      if reading && (writing || (state.channels[id].closed && !state.channels[id].stopped) || !stopReaches) {
        state.readLeftWaiting = true
        let left = Set(pending.filter { state.ops[$0].isRead })
        for op in left { state.ops[op].leftWaiting = true }
        for op in pending where !state.ops[op].isRead {
          let behind = state.barriers.contains { barrier in
            barrier.channel == id && !barrier.before.contains(op) && !left.isDisjoint(with: barrier.before)
          }
          if behind { state.ops[op].behindLeftRead = true }
        }
      }
      if stop && stopReaches && !state.channels[id].closed { state.channels[id].stoppedByDrop = true }
      let wasClosed = state.channels[id].closed
      state.channels[id].closed = true
      return wasClosed ? nil : (handle, stop, true)
    }
    guard let (handle, stop, _) = taken else { return }
    // The oracle's channel closed as the package's drop does (stop the reads when no write is
    // pending), then released; the package's is only released.
    if driver.side == .dispatch { driver.close(handle, stop: stop) }
  }

  /// Before a stop or a drop ends channel `id`'s pending read: waits until the read has taken the
  /// bytes queued on the descriptor, which a stop then delivers with `done`. With a low-water mark
  /// above 1 the model owes a read nothing before it is complete, so without this wait how much
  /// it gathered before the stop would be a matter of timing.
  private func awaitQueuedBytesTaken(by id: Int) {
    let reading = state.withLock { state in
      fixture != .pipeWriteEnd && !state.channels[id].closed
        && state.ops.contains { $0.isRead && $0.channel == id && !$0.done && !$0.endedByDrop }
    }
    guard reading else { return }
    let descriptor = state.withLock { $0.descriptor }
    if !waiter.wait(for: abandoned.contains("taken") ? .zero : deadline, until: { Posix.bytesQueued(descriptor) == 0 })
    {
      timeouts.append("a pending read never took the bytes queued on the descriptor within the deadline")
      abandoned.insert("taken")
    }
  }

  /// The peer goes away. A socket's peer is shut down both ways and closed only at the end: a
  /// close with bytes unread would make our next read fail with ECONNRESET or end, by timing.
  private func closePeer() {
    state.withLock { state in
      guard state.peer >= 0 else { return }
      if fixture == .socket {
        shutdown(state.peer, Int32(SHUT_RDWR))
        state.closedPeers.append(state.peer)
      } else {
        close(state.peer)
      }
      if fixture == .pipeWriteEnd || fixture == .pty { markWritesCaught(&state) }
      state.peer = -1
      state.peerClosed = true
      state.peerShut = true
    }
  }

  /// The writes pending when the pipe's reader or the terminal's slave closed
  /// (`IntendedDifference.closedReaderEndsWrite`, `hungUpTerminalEndsWrite`).
  private func markWritesCaught(_ state: inout State) {
    // One issued on a closed channel ends with ECANCELED on both sides (libdispatch's behind the
    // channel's barriers, the package's at once).
    // One behind a read a drop left waiting is mapped already (`dropStopsReads`).
    for op in state.ops.indices
    where !state.ops[op].isRead && !state.ops[op].done && !state.ops[op].issuedClosed && !state.ops[op].behindLeftRead {
      state.ops[op].readerClosed = true
    }
  }

  /// Whether `op` counts as pending on both sides although it may have ended on one (a write the
  /// peer's close caught, one behind a read a drop left waiting, such a read), or is pending.
  private func stillPending(_ op: Int, _ state: State) -> Bool {
    (!state.ops[op].done && !state.ops[op].endedByDrop) || flagged(op, state)
  }

  /// Whether `op`'s end differs by side on purpose (a write the peer's close caught, one behind a
  /// read a drop left waiting, such a read).
  private func flagged(_ op: Int, _ state: State) -> Bool {
    state.ops[op].readerClosed || state.ops[op].behindLeftRead || state.ops[op].leftWaiting
  }

  /// `IntendedDifference.barrierPerDescriptor`: the note of a step skipped because libdispatch's
  /// barrier would hold it or wait for it, else nil. A barrier of channel `id` is issued only
  /// while no other channel has an operation pending; no operation of another channel is issued
  /// while a barrier waits.
  private func sharedBarrierRule(_ id: Int, isBarrier: Bool) -> String? {
    let tag = IntendedDifference.barrierPerDescriptor.tag
    return state.withLock { state in
      if isBarrier {
        let others = state.ops.indices.contains { state.ops[$0].channel != id && stillPending($0, state) }
        return others ? "skipped (another channel's operation is pending) \(tag)" : nil
      }
      let waits = state.channels.indices.contains { $0 != id && barrierWaits($0, state) }
      return waits ? "skipped (another channel's barrier waits) \(tag)" : nil
    }
  }

  /// Whether write `op`, which the peer's close caught, is out of any stop's reach on libdispatch:
  /// its channel was dropped, or a barrier waits for it (`IntendedDifference.stopWaitsForBarrier`).
  /// So is a terminal's write behind a read a drop left waiting: that read ends at the slave's
  /// close, and the write then meets the hang-up.
  private func caughtForGood(_ op: Int, _ state: State) -> Bool {
    let channel = state.ops[op].channel
    if state.ops[op].behindLeftRead { return fixture == .pty }
    // A stop of the channel waits behind a barrier that waits for a caught write, for good.
    return state.ops[op].readerClosed
      && (state.channels[channel].dropped
        || state.barriers.contains { $0.channel == channel && $0.before.contains { state.ops[$0].readerClosed } })
  }

  /// `IntendedDifference.hungUpTerminalEndsWrite`: the note of a read or barrier step skipped
  /// because a write the terminal's hang-up caught exists, else nil.
  private func hangUpRule() -> String? {
    guard fixture == .pty, state.withLock({ $0.ops.contains { $0.readerClosed } }) else { return nil }
    return "skipped (a write the terminal's hang-up caught) \(IntendedDifference.hungUpTerminalEndsWrite.tag)"
  }

  private func peerDrain() {
    let clock = ContinuousClock()
    let end = clock.now + (abandoned.contains("drain") ? .zero : deadline)
    while true {
      let (peer, wanted) = state.withLock { state -> (Int32, Bool) in
        guard fixture != .pipeReadEnd, state.peer >= 0 else { return (-1, false) }
        let (bytes, _, _) = Posix.drain(state.peer)
        state.peerReceived += bytes.count
        // A barrier whose operations ended is about to run and let the writes behind it go.
        let due = state.barriers.contains { !$0.ran && $0.before.allSatisfy { state.ops[$0].done } }
        let wanted =
          state.ops.indices.contains { !state.ops[$0].isRead && !state.ops[$0].done && !blocked($0, state) }
          || (due && state.ops.contains { !$0.isRead && !$0.done })
        return (state.peer, wanted)
      }
      guard peer >= 0, wanted else { return }
      if clock.now >= end {
        timeouts.append("the peer read until the deadline and the writes never ended")
        abandoned.insert("drain")
        return
      }
      _ = Posix.isReadable(peer, milliseconds: 20)
    }
  }

  private func reuseNumber() {
    guard fixture == .socket else { return }
    // A channel closed without stop is stopped too: a read it left waiting would hold the record
    // past the reuse.
    stopLiveChannels()
    let ended = waiter.wait(for: abandoned.contains("reuse") ? .zero : deadline) {
      state.withLock { state in
        state.channels.allSatisfy { !$0.cleanups.isEmpty } && state.ops.allSatisfy { $0.done || $0.endedByDrop }
      }
    }
    if !ended {
      timeouts.append("the channels' cleanups never ran within the deadline after close(stop: true)")
      abandoned.insert("reuse")
    }
    state.withLock { state in
      let (fresh, peer) = Posix.socketPair()
      Posix.setNonBlocking(peer)
      _ = dup2(fresh, state.descriptor)
      close(fresh)
      if state.peer >= 0 { close(state.peer) }
      state.peer = peer
      state.peerWritten = 0
      state.peerShut = false
      state.peerClosed = false
      state.peerReceived = 0
      state.streamOffset = 0
      state.generation += 1
      state.originalFlags = Posix.statusFlags(state.descriptor)
      state.identity = Posix.identity(state.descriptor)!
    }
  }

  /// Closes with `stop: true` every channel that has a handle and is not stopped (marked closed and
  /// stopped first), then settles.
  private func stopLiveChannels() {
    let live = state.withLock { state in
      state.channels.indices.compactMap { id -> ChannelHandle? in
        guard let handle = state.channels[id].handle, !state.channels[id].stopped else { return nil }
        state.channels[id].closed = true
        state.channels[id].stopped = true
        return handle
      }
    }
    for handle in live { driver.close(handle, stop: true) }
    settle()
  }

  // MARK: Settling and observing

  /// Whether `op` waits behind a barrier of its channel that has not run.
  private func blocked(_ op: Int, _ state: State) -> Bool {
    state.barriers.contains {
      $0.channel == state.ops[op].channel && !$0.ran && !$0.before.contains(op) && $0.before.allSatisfy { $0 < op }
    }
  }

  /// `IntendedDifference.readsBesideWrites`: whether a write of the socket is pending. Then no read
  /// is issued, the peer writes nothing, and it neither shuts down nor closes while a read waits.
  private func writeStallsReads(_ state: State) -> Bool {
    // A write whose end differs by side on purpose counts as pending on both.
    fixture.isDuplex && state.ops.contains { !$0.isRead && (!$0.done || $0.readerClosed || $0.behindLeftRead) }
  }

  /// Whether a read is issued and not ended (neither done nor ended by a drop).
  private func readWaits(_ state: State) -> Bool {
    state.ops.contains { $0.isRead && !$0.done && !$0.endedByDrop }
  }

  /// `IntendedDifference.stopWaitsForBarrier`: whether a barrier of channel `id` waits for an
  /// operation that has not ended.
  private func barrierWaits(_ id: Int, _ state: State) -> Bool {
    // A write the reader's close or the hang-up caught ends on one side only: it counts as waiting.
    state.barriers.contains {
      // One that waits for a flagged operation counts as waiting whether it ran on this side.
      $0.channel == id
        && ($0.before.contains { flagged($0, state) } || (!$0.ran && !$0.before.allSatisfy { state.ops[$0].done }))
    }
  }

  /// What the model says libdispatch owes now; marks those operations as owed.
  private func owed() -> [String] {
    let queued = state.withLock { state in
      state.peer >= 0 && fixture != .pipeReadEnd ? Posix.bytesQueued(state.peer) : 0
    }
    return state.withLock { state in
      var owed: [String] = []
      var headRead: Int? = nil
      var earlierWrite = false
      // A read a drop stopped must end (with what it gathered); one a drop left waiting need not.
      for op in state.ops.indices
      where !state.ops[op].done && !state.ops[op].readerClosed && !state.ops[op].behindLeftRead
        && (!state.ops[op].endedByDrop || state.channels[state.ops[op].channel].stoppedByDrop)
      {
        let operation = state.ops[op]
        let channel = state.channels[operation.channel]
        if blocked(op, state) { continue }
        var must = channel.stopped || channel.fromEnded || operation.issuedClosed
        if operation.isRead {
          must = must || channel.stoppedByDrop || fixture == .pipeWriteEnd || state.peerShut
          if headRead == nil {
            headRead = op
            let available = state.peerWritten - state.streamOffset
            if operation.lowWater ?? 1 <= 1 {
              must = must || available > 0
            } else {
              must = must || operation.delivered + available >= operation.length
            }
          }
        } else {
          // A terminal's write after the slave closed waits for room no one makes, on both sides
          // (the master's writes go on filling the slave's buffer): the teardown's stop ends it.
          must = must || fixture == .pipeReadEnd || (state.peerClosed && fixture != .pty)
          // What surely fits: a socket's or a pipe's buffer; a terminal's input queue (4 KiB,
          // what FIONREAD counts) and its flip buffers (64 KiB) behind it.
          if !earlierWrite && operation.length <= 4096 && queued + operation.length <= 32768 { must = true }
          earlierWrite = true
        }
        if must {
          state.ops[op].owed = true
          owed.append("op\(op) \(operation.isRead ? "read" : "write") on c\(channel.slot)")
        }
      }
      for index in state.barriers.indices where !state.barriers[index].ran {
        if state.barriers[index].before.allSatisfy({ state.ops[$0].done }) {
          state.barriers[index].owed = true
          owed.append("barrier\(index) on c\(state.channels[state.barriers[index].channel].slot)")
        }
      }
      return owed
    }
  }

  func settle() {
    for queue in queues { driver.sync(queue) }
    waiter.waitForOwed(for: deadline, abandoned: &abandoned, timeouts: &timeouts) { owed() }
    for queue in queues { driver.sync(queue) }
  }

  private func report(_ title: String, flags: Bool = false, final: Bool = false) {
    var out = [title]
    out += timeouts.map { "   TIMEOUT: \($0)" }
    timeouts = []
    state.withLock { state in
      let exact = state.ops.allSatisfy {
        !$0.isRead || $0.done || $0.endedByDrop || $0.lowWater ?? 1 <= 1
      }
      out.append("   reads delivered \(exact ? String(state.streamOffset) : "?")")
      // Each operation's end is reported at the teardown, in the order they were issued: when an
      // operation the model does not wait for ends is a matter of timing. A step reports a hang
      // (TIMEOUT) for what it waited for.
      // The reads of one stream, in the order they were issued, got consecutive parts of it.
      var chainBroken: Set<Int> = []
      if final {
        var expected: [Int: Int] = [:]
        for op in state.ops.indices where state.ops[op].isRead {
          guard let first = state.ops[op].firstByte else { continue }
          let generation = state.ops[op].generation
          if first != expected[generation, default: 0] { chainBroken.insert(op) }
          expected[generation] = (first + state.ops[op].delivered) % 251
        }
      }
      for op in state.ops.indices where final {
        let operation = state.ops[op]
        state.ops[op].reported = true
        let name =
          "op\(op) \(operation.isRead ? "read" : "write") \(operation.length) on c\(state.channels[operation.channel].slot)"
        var facts: [String]
        if operation.endedByDrop {
          facts = ["ended by drop \(IntendedDifference.dropStopsReads.tag)"]
        } else if operation.behindLeftRead {
          facts = ["behind a read a drop left waiting \(IntendedDifference.dropStopsReads.tag)"]
        } else if operation.readerClosed {
          // Each side's own end: EPIPE for the package; for libdispatch the teardown's stop
          // (ECANCELED), or EPIPE should it have ended it.
          // A terminal's: it fit (no error), the package's EIO, or a stop on either side (one
          // issued on a closed channel, or stopped before it found the terminal full).
          let terminal = fixture == .pty
          let ownError = terminal ? EIO : EPIPE
          let stopped = operation.error == ECANCELED && (driver.side == .dispatch || terminal)
          let documented =
            operation.done && (operation.error == ownError || stopped || (terminal && operation.error == 0))
            || (!operation.done && driver.side == .dispatch && caughtForGood(op, state))
          let row = terminal ? IntendedDifference.hungUpTerminalEndsWrite : .closedReaderEndsWrite
          facts = [
            "pending when the \(terminal ? "terminal's slave" : "pipe's reader") closed, ended as documented \(documented) \(row.tag)"
          ]
        } else if !operation.done {
          facts = ["never ended"]
        } else {
          facts = ["errno \(operation.error)"]
          let whole =
            operation.error == 0 && (!operation.isRead || operation.lowWater ?? 1 <= 1)
          if whole { facts.append("\(operation.delivered) bytes") }
        }
        if operation.afterDone { facts.append("A CALL AFTER done") }
        if operation.outOfOrder { facts.append("BYTES OUT OF ORDER") }
        if chainBroken.contains(op) { facts.append("NOT THE BYTES AFTER THE PREVIOUS READ'S") }
        if operation.wrongQueue { facts.append("A CALL OFF ITS QUEUE") }
        out.append("   \(name): " + facts.joined(separator: ", "))
      }
      for index in state.barriers.indices where final {
        let caught = state.barriers[index].before.first { state.ops[$0].readerClosed }
        if let caught {
          let row = fixture == .pty ? IntendedDifference.hungUpTerminalEndsWrite : .closedReaderEndsWrite
          out.append("   barrier\(index) behind op\(caught), which the peer's close caught \(row.tag)")
        } else {
          out.append("   barrier\(index) \(state.barriers[index].ran ? "ran" : "never ran")")
        }
      }
      if flags {
        let live = state.channels.filter { !$0.closed }
        if !live.isEmpty && live.allSatisfy({ $0.completedOps > 0 }) {
          out.append("   O_NONBLOCK \(Posix.isNonBlocking(state.descriptor)) with \(live.count) live channel(s)")
        } else {
          out.append("   flags not compared")
        }
      }
    }
    lines += out
  }

  /// Closes every channel with `.stop`, closes the peer, releases everything, waits for each
  /// channel's cleanup, and reports the ends, the flags and the descriptor.
  func finish() -> [String] {
    // The peer first: a write blocked on a full socket then ends with EPIPE on both sides rather
    // than waiting on the stop (libdispatch's stop of such a write can take its time, and a record
    // of the number left behind would stall the next sequence that gets the same number).
    // The peer reads what was written first: a peer that closes with unread bytes makes the
    // reader's next read fail with ECONNRESET or end, by timing.
    peerDrain()
    closePeer()
    settle()
    // Channels closed without stop are stopped too: a write that waits for good (a terminal's
    // after its slave closed, on libdispatch) ends with ECANCELED rather than hold the number.
    stopLiveChannels()
    state.withLock { state in
      for id in state.channels.indices { state.channels[id].handle = nil }
    }
    // On libdispatch a write the peer's close caught on a dropped channel, or before a barrier,
    // is out of any stop's reach and waits for good; it holds the record, and with it every
    // channel's cleanup (the number is then kept).
    let ended = waiter.wait(for: deadline) {
      state.withLock { state in
        let oracle = driver.side == .dispatch
        let held = oracle && state.ops.indices.contains { !state.ops[$0].done && caughtForGood($0, state) }
        return state.ops.indices.allSatisfy { state.ops[$0].done || (oracle && caughtForGood($0, state)) }
          && (held || state.channels.allSatisfy { !$0.cleanups.isEmpty })
      }
    }
    if !ended {
      // The package's side names what its record of the number still counts.
      let users =
        driver.side == .gcd
        ? " (the package's record counts \(StreamDescriptor.users(of: state.withLock { $0.descriptor })) channels)" : ""
      timeouts.append(
        "after the peer's close and close(stop: true), not every operation and cleanup ended within the deadline\(users)"
      )
    }
    for queue in queues { driver.sync(queue) }
    report("teardown: the peer closed, every channel closed with stop and released", final: true)
    state.withLock { state in
      // A dropped channel with a write the peer's close caught: on libdispatch that write and the
      // channel's cleanup wait for good, and the record keeps the descriptor non-blocking.
      let held = state.ops.indices.contains { caughtForGood($0, state) }
      let cleanups =
        held
        ? ["held by a dropped channel's write the peer's close caught"]
        : state.channels.enumerated().map { "c\($0.element.slot)#\($0.offset): \($0.element.cleanups.count)" }
      // `IntendedDifference.cleanupGetsDescriptor`: the oracle's cleanup gets an errno (0, or
      // ECANCELED after a stop), the package's the descriptor, which is checked.
      let right =
        driver.side == .dispatch
        || state.channels.allSatisfy { channel in
          // A channel made from one that had ended gets -1: it never used the descriptor.
          channel.cleanups.allSatisfy { $0 == state.descriptor || (channel.fromEnded && $0 == -1) }
        }
      lines.append(
        "   cleanups \(cleanups.joined(separator: " ")), each with its argument as documented \(right) \(IntendedDifference.cleanupGetsDescriptor.tag)"
      )
      let open = Posix.identity(state.descriptor) == state.identity
      let restored = Posix.statusFlags(state.descriptor) == state.originalFlags
      lines.append(
        "end: descriptor \(open ? "open" : "CLOSED OR REPLACED"), flags restored \(held ? "not compared" : String(restored))"
      )
      // The package's record of the number (`StreamDescriptor`) must end with its last channel:
      // one left behind would take in the next channel over the reused number.
      if driver.side == .gcd && ended && StreamDescriptor.users(of: state.descriptor) > 0 {
        lines.append("end: THE PACKAGE'S RECORD OF THE NUMBER OUTLIVED ITS CHANNELS")
      }
      // libdispatch and the package key their record of a descriptor by number: one that has not ended (a channel
      // whose operations or cleanup never came) would take in the next sequence given the number
      // and stall it. Such a number stays open, never reused; every sequence starts clean.
      let clean =
        ended && abandoned.isEmpty && restored
        && state.channels.allSatisfy { !$0.cleanups.isEmpty } && state.ops.allSatisfy { $0.done }
      // The package's side the same way: a run cut short (a deadline of 1 s while shrinking)
      // leaves its channels to end later, and their record must not meet the next sequence.
      if !clean {
        quarantine.withLock { $0.append(state.descriptor) }
      } else {
        close(state.descriptor)
      }
      for peer in state.closedPeers { close(peer) }
    }
    return lines
  }
}
