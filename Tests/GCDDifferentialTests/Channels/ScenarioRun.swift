import Synchronization

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Descriptors of runs that did not end cleanly, kept open for the life of the process so that
/// their numbers never meet another sequence (as `ChannelRun`'s).
private let scenarioQuarantine = Mutex<[Int32]>([])

/// The scenario sequences as a family the harness runs.
enum ChannelScenarios: SequenceFamily {
  static func generate(_ rng: inout SplitMix64, profile: String) -> [ScenarioStep] {
    ScenarioStep.generate(&rng, profile: profile)
  }

  static func isKept(_ step: ScenarioStep) -> Bool {
    if case .fixture = step { return true }
    return false
  }

  static func observe(_ steps: [ScenarioStep], side: Side, deadline: Duration) -> [String] {
    let driver: any ChannelDriver & OneShotDriver =
      side == .dispatch ? DispatchChannelDriver() : GCDChannelDriver()
    var fixture = ScenarioFixture.socket
    if case .fixture(let chosen) = steps.first { fixture = chosen }
    let run = ScenarioRun(driver: driver, fixture: fixture, deadline: deadline)
    for (index, step) in steps.enumerated() { run.perform(step, index: index + 1) }
    return run.finish()
  }
}

/// A gate the scenarios' tasks wait at once their call ended, so that a task can be cancelled
/// after its call ended and before it ends itself; the run opens it at its end.
final class CallGate: Sendable {
  private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

  func wait() async {
    await withCheckedContinuation { continuation in
      let now = state.withLock { state -> Bool in
        if state.open { return true }
        state.waiters.append(continuation)
        return false
      }
      if now { continuation.resume() }
    }
  }

  func open() {
    let waiters = state.withLock { state in
      state.open = true
      defer { state.waiters = [] }
      return state.waiters
    }
    for waiter in waiters { waiter.resume() }
  }
}

/// One run of a scenario sequence on one side. As `ChannelRun`, it models what libdispatch must
/// deliver after each step, waits for that (up to the deadline), and observes. The model: reads
/// (channels' and one-shots') take the descriptor's bytes in turn, in the order issued (one
/// operation queue per descriptor and direction); a read with the low-water mark 1 takes what is
/// there, a one-shot read ends with what is there; the end of file ends each read pending then; a
/// write of at most 4,096 bytes ends when it fits; the peer's drain ends the rest; a barrier runs
/// once the operations before it ended, and holds those after it.
final class ScenarioRun: @unchecked Sendable {  // all mutable state is in `state`, under its Mutex
  enum Kind: String { case read, write, oneShotRead = "one-shot read", oneShotWrite = "one-shot write" }

  struct Channel {
    var handle: ChannelHandle?
    var face: AsyncFace?
    var slot: Int
    var closed = false
    var stopped = false
    /// Opened before the number was taken by another descriptor: no operation is issued on it.
    var stale = false
    var cleanups = 0
    var readsStopped = false
    var writesStopped = false
  }

  struct Operation {
    var kind: Kind
    var channel: Int?
    var length: Int
    var issuedClosed = false
    var generation = 0
    var mark: UInt8 = 0
    var delivered = 0
    var done = false
    var error: Int32 = 0
    var afterDone = false
    var outOfOrder = false
    var wrongQueue = false
    var firstByte: Int? = nil
    var nextByte: Int? = nil
    /// The model's account: the bytes it gave a one-shot read, and that the read's turn is over.
    var modelTaken = 0
    var modelComplete = false
    var endedBeforeBarrier = false
    var isRead: Bool { kind == .read || kind == .oneShotRead }
  }

  struct Call {
    var isRead: Bool
    var channel: Int
    var length: Int
    var mark: UInt8
    var cancelledBefore: Bool
    var task: Task<Void, Never>? = nil
    var outcome: CallOutcome? = nil
    var cancelled: String? = nil
    /// The bytes returned, checked against the stream.
    var inOrder = true
  }

  struct Barrier {
    var channel: Int
    var before: [Int]
    var ran = false
    var ranAfterItsOperations = true
  }

  struct State {
    var channels: [Channel] = []
    var slots: [Int: Int] = [:]
    var ops: [Operation] = []
    var calls: [Call] = []
    var callIndex: [Int: Int] = [:]
    var barriers: [Barrier] = []
    var descriptor: Int32 = -1
    var peer: Int32 = -1
    var originalFlags: Int32 = 0
    var identity: [UInt64] = []
    var generation = 0
    var peerWritten = 0
    /// The peer's writing side is gone (its writer closed, or shut down): reads meet the end of file.
    var eof = false
    /// The peer's reading side is gone (a pipe's reader closed): writes fail with EPIPE.
    var readerGone = false
    /// The bytes the peer read: runs of (mark, count).
    var peerRuns: [(UInt8, Int)] = []
    var peerCount: [UInt8: Int] = [:]
    /// The peer's count is not compared once a write may have been cut by timing.
    var peerCountComparable = true
    /// A write call cancelled while pending, and no drain since: the Dispatch model's write goes on
    /// unawaited until the peer reads, so it counts as pending on both sides.
    var cancelledWriteUndrained = false
    /// The next byte the awaited reads must return (stream order), per generation.
    var callStream = 0
    var callReturned = 0
    var nextMark = 0
    var fifoPath: String? = nil
    /// Socket peers shut down, closed at the end.
    var closedPeers: [Int32] = []
  }

  let driver: any ChannelDriver & OneShotDriver
  let fixture: ScenarioFixture
  let deadline: Duration
  let queue: AnyObject
  let state = Mutex(State())
  let waiter = Waiter()
  let gate = CallGate()
  var lines: [String] = []
  var timeouts: [String] = []
  var abandoned: Set<String> = []

  init(driver: any ChannelDriver & OneShotDriver, fixture: ScenarioFixture, deadline: Duration) {
    self.driver = driver
    self.fixture = fixture
    self.deadline = deadline
    queue = driver.makeQueue(index: 0)
    var ours: Int32
    var peer: Int32
    var path: String? = nil
    switch fixture {
    case .socket: (ours, peer) = Posix.socketPair()
    case .pipeReadEnd, .reusedPipe: (ours, peer) = Posix.pipePair()
    case .pipeWriteEnd:
      let (read, write) = Posix.pipePair()
      (ours, peer) = (write, read)
    case .packetPipe: (ours, peer) = Posix.packetPipePair()
    case .fifo:
      path = Posix.makeFIFO()
      ours = Posix.openFIFO(path!, reading: true)
      peer = Posix.openFIFO(path!, reading: false)
    }
    Posix.setNonBlocking(peer)
    state.withLock {
      $0.descriptor = ours
      $0.peer = peer
      $0.fifoPath = path
      $0.originalFlags = Posix.statusFlags(ours)
      $0.identity = Posix.identity(ours)!
    }
  }

  /// Byte `index` of the peer's stream in generation `generation`: each generation its own
  /// pattern, so that a read of the old descriptor's bytes shows.
  private static func streamByte(_ index: Int, generation: Int) -> Int { (index + 97 * generation) % 251 }

  // MARK: Steps

  func perform(_ step: ScenarioStep, index: Int) {
    var note = ""
    switch step {
    case .fixture:
      if index != 1 { note = "skipped (not first)" }
    case .open(let slot):
      if let id = state.withLock({ $0.slots[slot] }), state.withLock({ !$0.channels[id].closed }) {
        note = "skipped (c\(slot) is open)"
        break
      }
      let (descriptor, id) = state.withLock { state -> (Int32, Int) in
        state.channels.append(Channel(slot: slot))
        state.slots[slot] = state.channels.count - 1
        return (state.descriptor, state.channels.count - 1)
      }
      let handle = driver.open(descriptor: descriptor, queue: queue) { [weak self] _ in
        self?.state.withLock { $0.channels[id].cleanups += 1 }
        self?.waiter.poke()
      }
      let face = driver.asyncFace(handle)
      state.withLock {
        $0.channels[id].handle = handle
        $0.channels[id].face = face
      }
    case .read(let slot, let length), .write(let slot, let length):
      let isRead: Bool
      if case .read = step { isRead = true } else { isRead = false }
      guard let (id, handle) = live(slot) else {
        note = "skipped (no c\(slot))"
        break
      }
      if let skipped = operationRule(isRead: isRead, channel: id, length: length) {
        note = skipped
        break
      }
      let op = issue(isRead ? .read : .write, channel: id, length: length)
      if isRead {
        driver.read(handle, length: length, queue: queue, handler: call(op))
      } else {
        driver.write(handle, bytes: bytes(of: op), queue: queue, handler: call(op))
      }
      submitted()
    case .oneShotRead(let length), .oneShotWrite(let length):
      let isRead: Bool
      if case .oneShotRead = step { isRead = true } else { isRead = false }
      if let skipped = operationRule(isRead: isRead, channel: nil, length: length) {
        note = skipped
        break
      }
      let op = issue(isRead ? .oneShotRead : .oneShotWrite, channel: nil, length: length)
      let descriptor = state.withLock { $0.descriptor }
      let handler = call(op)
      if isRead {
        driver.oneShotRead(descriptor: descriptor, length: length, queue: queue) { bytes, error in
          handler(true, bytes, bytes.count, error)
        }
      } else {
        driver.oneShotWrite(descriptor: descriptor, bytes: bytes(of: op), queue: queue) { rest, error in
          handler(true, [], rest, error)
        }
      }
      submitted()
    case .barrier(let slot):
      guard let (id, handle) = live(slot) else {
        note = "skipped (no c\(slot))"
        break
      }
      if let skipped = barrierRule(id) {
        note = skipped
        break
      }
      let barrier = state.withLock { state -> Int in
        let before = state.ops.indices.filter { state.ops[$0].channel == id }
        state.barriers.append(Barrier(channel: id, before: before))
        return state.barriers.count - 1
      }
      driver.barrier(handle) { [weak self] in
        guard let self else { return }
        state.withLock { state in
          state.barriers[barrier].ran = true
          state.barriers[barrier].ranAfterItsOperations = state.barriers[barrier].before.allSatisfy {
            state.ops[$0].done
          }
        }
        waiter.poke()
      }
      submitted()
    case .close(let slot, let stop):
      guard let (id, handle) = live(slot), state.withLock({ !$0.channels[id].closed }) else {
        note = "skipped (no open c\(slot))"
        break
      }
      if stop && state.withLock({ state in state.barriers.contains { !$0.ran && $0.channel == id } }) {
        note = "skipped (a barrier waits) \(IntendedDifference.stopWaitsForBarrier.tag)"
        break
      }
      if stop { awaitReadsTookTheirBytes() }
      state.withLock { state in
        state.channels[id].closed = true
        state.channels[id].stopped = stop
        if stop && state.ops.contains(where: { !$0.isRead && !$0.done && $0.channel == id }) {
          state.peerCountComparable = false
        }
      }
      driver.close(handle, stop: stop)
      state.withLock { $0.channels[id].face }?.closed()
    case .asyncRead(let slot, let length, let number, let before),
      .asyncWrite(let slot, let length, let number, let before):
      let isRead: Bool
      if case .asyncRead = step { isRead = true } else { isRead = false }
      guard let (id, _) = live(slot), let face = state.withLock({ $0.channels[id].face }) else {
        note = "skipped (no c\(slot))"
        break
      }
      if let skipped = callRule(isRead: isRead, cancelledBefore: before) {
        note = skipped
        break
      }
      if !isRead { peerTake() }
      startCall(number, isRead: isRead, channel: id, length: length, cancelledBefore: before, face: face)
    case .cancelCall(let number):
      note = cancelCall(number)
    case .peerWrite(let bytes):
      note = peerWrite(bytes)
    case .peerDrain:
      peerDrain()
    case .peerClose:
      note = peerClose()
    case .peerReopen:
      state.withLock { state in
        guard fixture == .fifo, let path = state.fifoPath, state.eof else {
          note = "skipped"
          return
        }
        state.peer = Posix.openFIFO(path, reading: false)
        state.eof = false
      }
    case .replaceNumber:
      note = replaceNumber()
    }
    settle()
    report("\(index). \(step)" + (note.isEmpty ? "" : " — \(note)"))
  }

  private func live(_ slot: Int) -> (Int, ChannelHandle)? {
    state.withLock { state in
      guard let id = state.slots[slot], let handle = state.channels[id].handle, !state.channels[id].stale else {
        return nil
      }
      return (id, handle)
    }
  }

  /// libdispatch hands an operation to the descriptor's queue on queues of its own: a short pause
  /// after each submission on the Dispatch side, so that the next one (another channel's) comes
  /// after it there, as it does in the package.
  private func submitted() {
    if driver.side == .dispatch { usleep(2000) }
  }

  private func bytes(of op: Int) -> [UInt8] {
    let (mark, length) = state.withLock { ($0.ops[op].mark, $0.ops[op].length) }
    return [UInt8](repeating: mark, count: length)
  }

  private func newMark(_ state: inout State) -> UInt8 {
    state.nextMark += 1
    return UInt8(1 + state.nextMark % 250)
  }

  /// The note of a read or write step skipped, else nil.
  private func operationRule(isRead: Bool, channel: Int?, length: Int) -> String? {
    state.withLock { state in
      if isRead ? !fixture.reads : !fixture.writes { return "skipped (the descriptor is not open that way)" }
      // `IntendedDifference.barrierPerDescriptor`: libdispatch's barrier holds back every channel's
      // operations over the descriptor, the package's its own channel's.
      if state.barriers.contains(where: { !$0.ran && $0.channel != channel }) {
        return "skipped (another channel's barrier waits) \(IntendedDifference.barrierPerDescriptor.tag)"
      }
      // `IntendedDifference.readsBesideWrites`: a socket's pending write holds its reads on libdispatch.
      if isRead && fixture == .socket && writePending(state) {
        return "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
      }
      // A packet read shorter than the packet drops the rest of it: a read is issued only when it
      // can take every packet queued whole.
      if isRead && fixture == .packetPipe && length < 65536 { return "skipped (a packet would be cut)" }
      // A pipe whose reader closed: the write fails at once (EPIPE) on both sides; one pending
      // when the reader closes is another matter (`closedReaderEndsWrite`), never generated.
      return nil
    }
  }

  /// The note of a barrier step skipped, else nil (`IntendedDifference.barrierPerDescriptor`).
  private func barrierRule(_ id: Int) -> String? {
    state.withLock { state in
      let tag = IntendedDifference.barrierPerDescriptor.tag
      if state.ops.contains(where: { $0.channel != id && !$0.done && !($0.modelComplete && $0.channel == nil) })
        || state.ops.contains(where: { $0.channel == nil && !$0.done })
      {
        return "skipped (another channel's or a one-shot's operation is pending) \(tag)"
      }
      if state.barriers.contains(where: { !$0.ran && $0.channel != id }) {
        return "skipped (another channel's barrier waits) \(tag)"
      }
      return nil
    }
  }

  private func writePending(_ state: State) -> Bool {
    state.ops.contains { !$0.isRead && !$0.done && !($0.kind == .oneShotWrite && oneShotWriteArrived($0, state)) }
      || state.calls.contains { !$0.isRead && $0.outcome == nil }
      || state.cancelledWriteUndrained
  }

  private func issue(_ kind: Kind, channel: Int?, length: Int) -> Int {
    state.withLock { state in
      var operation = Operation(kind: kind, channel: channel, length: length)
      operation.issuedClosed = channel.map { state.channels[$0].closed } ?? false
      operation.generation = state.generation
      if !operation.isRead { operation.mark = newMark(&state) }
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
        if queue != 0 { operation.wrongQueue = true }
        if operation.done { operation.afterDone = true }
        if operation.isRead {
          for byte in bytes {
            if let next = operation.nextByte, Int(byte) != next { operation.outOfOrder = true }
            if operation.firstByte == nil { operation.firstByte = Int(byte) }
            operation.nextByte = (Int(byte) + 1) % 251
          }
          operation.delivered += count
        } else {
          operation.delivered = operation.length - count
        }
        if done {
          operation.done = true
          operation.error = error
          if let channel = operation.channel {
            operation.endedBeforeBarrier = state.barriers.contains {
              $0.channel == channel && !$0.ran && !$0.before.contains(op) && $0.before.allSatisfy { $0 < op }
            }
          }
        }
      }
      waiter.poke()
    }
  }

  // MARK: The async calls

  private func callRule(isRead: Bool, cancelledBefore: Bool) -> String? {
    state.withLock { state in
      if isRead ? !fixture.reads : !fixture.writes { return "skipped (the descriptor is not open that way)" }
      if cancelledBefore { return nil }
      if isRead && fixture == .socket && writePending(state) {
        return "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
      }
      // Two writes awaited at once go in the order their tasks reach the channel: one at a time.
      if !isRead && state.calls.contains(where: { !$0.isRead && $0.outcome == nil }) {
        return "skipped (a write call is under way)"
      }
      return nil
    }
  }

  private func startCall(
    _ number: Int, isRead: Bool, channel: Int, length: Int, cancelledBefore: Bool, face: AsyncFace
  ) {
    let index = state.withLock { state -> Int in
      let mark = isRead ? 0 : newMark(&state)
      state.calls.append(
        Call(isRead: isRead, channel: channel, length: length, mark: mark, cancelledBefore: cancelledBefore))
      state.callIndex[number] = state.calls.count - 1
      return state.calls.count - 1
    }
    let mark = state.withLock { $0.calls[index].mark }
    let gate = gate
    let task = Task(executorPreference: ScenarioExecutor.shared) { [weak self] in
      if cancelledBefore { withUnsafeCurrentTask { $0?.cancel() } }
      let outcome =
        isRead ? await face.read(upTo: length) : await face.write([UInt8](repeating: mark, count: length))
      self?.ended(index, outcome)
      await gate.wait()
    }
    state.withLock { $0.calls[index].task = task }
    // Until the call ended or waits: a read until the face says it waits, a write until its bytes
    // reach the peer.
    let descriptor = state.withLock { $0.peer }
    let started = waiter.wait(for: abandoned.contains("call") ? .zero : deadline) {
      if state.withLock({ $0.calls[index].outcome != nil }) { return true }
      if isRead { return face.isReadWaiting }
      return descriptor >= 0 && Posix.bytesQueued(descriptor) > 0
    }
    if !started {
      timeouts.append("call\(number) neither ended nor waited within the deadline")
      abandoned.insert("call")
    }
  }

  private func ended(_ index: Int, _ outcome: CallOutcome) {
    state.withLock { state in
      state.calls[index].outcome = outcome
      let call = state.calls[index]
      if case .bytes(let bytes) = outcome {
        if bytes.count > call.length { state.calls[index].inOrder = false }
        for byte in bytes {
          if Int(byte) != Self.streamByte(state.callStream, generation: state.generation) {
            state.calls[index].inOrder = false
          }
          state.callStream += 1
        }
        state.callReturned += bytes.count
      }
      if case .failed(ECANCELED) = outcome, call.cancelled == "while it waited" || call.cancelled == "while pending" {
        if call.isRead {
          state.channels[call.channel].readsStopped = true
        } else {
          state.channels[call.channel].writesStopped = true
        }
      }
    }
    waiter.poke()
  }

  /// Cancels call `number`'s task: the model says whether its call waits (it must, having been
  /// settled as owing nothing) or ended.
  private func cancelCall(_ number: Int) -> String {
    guard let index = state.withLock({ $0.callIndex[number] }) else { return "skipped (no call\(number))" }
    let (task, pending, isRead) = state.withLock { state in
      (state.calls[index].task, state.calls[index].outcome == nil, state.calls[index].isRead)
    }
    guard let task else { return "skipped" }
    state.withLock { state in
      if state.calls[index].cancelled == nil {
        state.calls[index].cancelled = pending ? (isRead ? "while it waited" : "while pending") : "after it ended"
      }
      if pending && !isRead {
        state.peerCountComparable = false
        state.cancelledWriteUndrained = true
      }
    }
    task.cancel()
    return ""
  }

  // MARK: The peer

  private func peerWrite(_ bytes: Int) -> String {
    state.withLock { state in
      guard fixture.reads, state.peer >= 0, !state.eof else { return "skipped" }
      if fixture == .socket && writePending(state) {
        return "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
      }
      if fixture == .packetPipe {
        // Every packet must fit whole in the read that takes it: the head read's room.
        let queued = state.peerWritten - consumed(state)
        let head = state.ops.first { $0.isRead && !$0.done && !$0.issuedClosed && $0.generation == state.generation }
        let room = head.map { $0.length - $0.delivered } ?? 65536
        if queued + bytes > room { return "skipped (a packet would be cut)" }
      }
      let offset = state.peerWritten
      let pattern = (0..<bytes).map { UInt8(Self.streamByte(offset + $0, generation: state.generation)) }
      var done = 0
      while done < bytes {
        let wrote = pattern.withUnsafeBytes { write(state.peer, $0.baseAddress! + done, bytes - done) }
        if wrote <= 0 { break }
        done += wrote
      }
      state.peerWritten += done
      return done < bytes ? "peer wrote \(done) of \(bytes)" : ""
    }
  }

  /// The peer reads what is there now (a write's bytes, by their mark).
  private func peerTake() {
    state.withLock { state in
      guard fixture.writes, state.peer >= 0, !state.readerGone else { return }
      let (bytes, _, _) = Posix.drain(state.peer)
      for byte in bytes {
        state.peerCount[byte, default: 0] += 1
        if let last = state.peerRuns.last, last.0 == byte {
          state.peerRuns[state.peerRuns.count - 1].1 += 1
        } else {
          state.peerRuns.append((byte, 1))
        }
      }
    }
  }

  /// Whether every write under way ended (a one-shot's, by its bytes at the peer).
  private func writesEnded(_ state: State) -> Bool {
    state.ops.allSatisfy { op in
      op.isRead || op.done || (op.kind == .oneShotWrite && (oneShotWriteArrived(op, state) || state.readerGone))
    } && state.calls.allSatisfy { $0.isRead || $0.outcome != nil }
      && state.channels.allSatisfy { ($0.face?.writesInFlight ?? 0) == 0 }
  }

  private func oneShotWriteArrived(_ op: Operation, _ state: State) -> Bool {
    state.peerCount[op.mark, default: 0] >= op.length
  }

  private func peerDrain() {
    guard fixture.writes else { return }
    let clock = ContinuousClock()
    let end = clock.now + (abandoned.contains("drain") ? .zero : deadline)
    while true {
      peerTake()
      let (peer, finished) = state.withLock { state in
        // A barrier whose operations ended lets the writes behind it go.
        (state.peer, writesEnded(state) || state.readerGone)
      }
      if peer < 0 || finished {
        // What the ended writes left queued at the peer, taken too: the next write finds room.
        peerTake()
        state.withLock { $0.cancelledWriteUndrained = false }
        return
      }
      if clock.now >= end {
        timeouts.append("the peer read until the deadline and the writes never ended")
        abandoned.insert("drain")
        return
      }
      _ = Posix.isReadable(peer, milliseconds: 20)
    }
  }

  private func peerClose() -> String {
    state.withLock { state in
      guard state.peer >= 0, !(fixture.reads ? state.eof : state.readerGone) else { return "skipped" }
      // `IntendedDifference.closedReaderEndsWrite`: a write pending when a pipe's reader closes.
      if fixture == .pipeWriteEnd && writePending(state) {
        return "skipped (a write is pending) \(IntendedDifference.closedReaderEndsWrite.tag)"
      }
      if fixture == .socket {
        if writePending(state) {
          return "skipped (a write of the socket is pending) \(IntendedDifference.readsBesideWrites.tag)"
        }
        shutdown(state.peer, Int32(SHUT_WR))
        state.eof = true
        state.closedPeers.append(state.peer)
      } else {
        close(state.peer)
        if fixture.reads { state.eof = true } else { state.readerGone = true }
      }
      state.peer = fixture == .socket ? state.peer : -1
      return ""
    }
  }

  /// A new pipe's read end `dup2`'d onto the number, channels over it open and idle.
  private func replaceNumber() -> String {
    guard fixture == .reusedPipe else { return "skipped" }
    if state.withLock({ state in state.ops.contains { !$0.done } || state.barriers.contains { !$0.ran } }) {
      return "skipped (an operation is pending)"
    }
    state.withLock { state in
      let (read, write) = Posix.pipePair()
      Posix.setNonBlocking(write)
      _ = dup2(read, state.descriptor)
      close(read)
      if state.peer >= 0 { close(state.peer) }
      state.peer = write
      state.eof = false
      state.peerWritten = 0
      state.generation += 1
      for id in state.channels.indices { state.channels[id].stale = true }
      state.originalFlags = Posix.statusFlags(state.descriptor)
      state.identity = Posix.identity(state.descriptor)!
    }
    return ""
  }

  // MARK: Settling

  /// The bytes of this generation the model's reads took.
  private func consumed(_ state: State) -> Int {
    state.ops.reduce(0) { sum, op in
      guard op.isRead, op.generation == state.generation else { return sum }
      return sum + (op.kind == .oneShotRead && !op.done ? op.modelTaken : op.delivered)
    }
  }

  /// Whether a write issued before `op` has not ended.
  private func blockedByEarlierWrite(_ op: Int, _ state: State) -> Bool {
    state.ops[..<op].contains {
      !$0.isRead && !$0.done && !($0.kind == .oneShotWrite && oneShotWriteArrived($0, state))
    }
  }

  /// Whether `op` waits behind a barrier of its channel that has not run.
  private func blocked(_ op: Int, _ state: State) -> Bool {
    guard let channel = state.ops[op].channel else { return false }
    return state.barriers.contains {
      $0.channel == channel && !$0.ran && !$0.before.contains(op) && $0.before.allSatisfy { $0 < op }
    }
  }

  /// Whether the channels over the descriptor all ended (closed, their operations ended): then
  /// the one-shots' handlers run.
  private func channelsEnded(_ state: State) -> Bool {
    state.channels.allSatisfy { channel in channel.closed }
      && state.ops.allSatisfy { $0.channel == nil || $0.done }
  }

  private func owed() -> [String] {
    // A one-shot write shows only at the peer (its handler waits for the channels): the peer reads
    // what is there while one is under way.
    if state.withLock({ state in
      state.ops.contains { $0.kind == .oneShotWrite && !$0.done && !oneShotWriteArrived($0, state) }
    }) {
      peerTake()
    }
    let (descriptor, readable) = state.withLock { ($0.descriptor, fixture.reads) }
    let kernel = readable ? Posix.bytesQueued(descriptor) : 0
    let peerQueued = state.withLock { state in
      fixture.writes && state.peer >= 0 && !state.readerGone ? Posix.bytesQueued(state.peer) : 0
    }
    return state.withLock { state in
      var owed: [String] = []
      let eof = state.eof && fixture.reads
      // Reads, in turn.
      var available = state.peerWritten - consumed(state)
      var reading = true
      for op in state.ops.indices where state.ops[op].isRead && !state.ops[op].done {
        let operation = state.ops[op]
        let channel = operation.channel.map { state.channels[$0] }
        if blocked(op, state) { continue }
        if channel?.stopped == true || operation.issuedClosed || operation.generation != state.generation {
          owed.append("op\(op) ends")
          continue
        }
        if operation.kind == .oneShotRead {
          if !operation.modelComplete && reading {
            if available > 0 {
              state.ops[op].modelTaken = min(available, operation.length)
              available -= state.ops[op].modelTaken
              state.ops[op].modelComplete = true
            } else if eof {
              state.ops[op].modelComplete = true
            } else {
              reading = false
            }
          }
          if state.ops[op].modelComplete && channelsEnded(state) { owed.append("op\(op) one-shot read ends") }
          continue
        }
        guard reading else { continue }
        let need = operation.length - operation.delivered
        if available > 0 {
          owed.append("op\(op) read takes the bytes there")
          if available >= need {
            available -= need
            continue
          }
          available = 0
        }
        if eof {
          owed.append("op\(op) read ends at the end of file")
          continue
        }
        reading = false
      }
      // The reads took what the model gave them when the kernel holds only what is left.
      if readable && kernel > max(available, 0) && !state.ops.contains(where: { !$0.isRead && !$0.done }) {
        if state.ops.contains(where: { $0.isRead && !$0.done && $0.generation == state.generation }) {
          owed.append("the reads take the queued bytes")
        }
      }
      // Writes, in turn.
      var earlier = false
      for op in state.ops.indices where !state.ops[op].isRead {
        let operation = state.ops[op]
        if operation.kind == .oneShotWrite {
          let complete = operation.done || oneShotWriteArrived(operation, state) || state.readerGone
          if !operation.done && channelsEnded(state) && (complete || (!earlier && operation.length <= 4096)) {
            owed.append("op\(op) one-shot write ends")
          }
          if !complete && !earlier && operation.length <= 4096 && !blockedByEarlierWrite(op, state) {
            owed.append("op\(op) one-shot write arrives")
          }
          if !complete { earlier = true }
          continue
        }
        if operation.done { continue }
        if blocked(op, state) { continue }
        let channel = state.channels[operation.channel!]
        var must = channel.stopped || operation.issuedClosed || state.readerGone
        if !earlier && operation.length <= 4096 && peerQueued + operation.length <= 32768 { must = true }
        earlier = true
        if must { owed.append("op\(op) write ends") }
      }
      // Awaited calls.
      let waitingRead = state.calls.indices.first { state.calls[$0].isRead && state.calls[$0].outcome == nil }
      for index in state.calls.indices where state.calls[index].outcome == nil {
        let call = state.calls[index]
        let channel = state.channels[call.channel]
        var must = call.cancelledBefore || call.cancelled == "while it waited" || call.cancelled == "while pending"
        if call.isRead {
          must =
            must || channel.readsStopped || channel.closed || index != waitingRead
            || state.peerWritten > state.callReturned || eof
        } else {
          must =
            must || channel.writesStopped || channel.closed || state.readerGone
            || (call.length <= 4096 && peerQueued + call.length <= 32768)
        }
        if must { owed.append("call\(index) ends") }
      }
      for index in state.barriers.indices where !state.barriers[index].ran {
        if state.barriers[index].before.allSatisfy({ state.ops[$0].done }) { owed.append("barrier\(index) runs") }
      }
      return owed
    }
  }

  func settle() {
    driver.sync(queue)
    waiter.waitForOwed(for: deadline, abandoned: &abandoned, timeouts: &timeouts) { owed() }
    driver.sync(queue)
  }

  /// Before a stop: the pending reads take the bytes queued (a stop's timing must not decide how
  /// much a read gathered).
  private func awaitReadsTookTheirBytes() {
    settle()
  }

  // MARK: Observing

  private func report(_ title: String, final: Bool = false) {
    var out = [title]
    out += timeouts.map { "   TIMEOUT: \($0)" }
    timeouts = []
    guard final else {
      lines += out
      return
    }
    state.withLock { state in
      // The reads of one generation, in the order issued, got consecutive parts of its stream.
      var expected: [Int: Int] = [:]
      for op in state.ops.indices {
        let operation = state.ops[op]
        let name =
          "op\(op) \(operation.kind.rawValue) \(operation.length)\(operation.channel.map { " on c\(state.channels[$0].slot)" } ?? "")"
        var facts: [String] = []
        if !operation.done {
          facts.append("never ended")
        } else {
          facts.append("errno \(operation.error)")
          if operation.isRead || operation.error == 0 { facts.append("\(operation.delivered) bytes") }
        }
        if operation.isRead, let first = operation.firstByte {
          let generation = operation.generation
          let start = expected[generation, default: 0]
          if first != Self.streamByte(start, generation: generation) {
            facts.append("NOT THE BYTES AFTER THE PREVIOUS READ'S")
          }
          expected[generation] = start + operation.delivered
        }
        if operation.afterDone { facts.append("A CALL AFTER done") }
        if operation.outOfOrder { facts.append("BYTES OUT OF ORDER") }
        if operation.wrongQueue { facts.append("A CALL OFF ITS QUEUE") }
        if operation.endedBeforeBarrier { facts.append("ENDED BEFORE THE BARRIER IT WAS SUBMITTED BEHIND") }
        out.append("   \(name): " + facts.joined(separator: ", "))
      }
      for call in state.calls {
        var facts: [String] = []
        switch call.outcome {
        case nil: facts.append("never ended")
        case .bytes(let bytes):
          facts.append("returned \(bytes.isEmpty ? "no" : "1...\(call.length)") bytes")
          if !call.inOrder { facts.append("NOT THE STREAM'S NEXT BYTES") }
        case .end: facts.append("returned the end of file")
        case .written: facts.append("wrote")
        case .failed(let error): facts.append("threw errno \(error)")
        }
        let cancel =
          call.cancelledBefore ? "cancelled before" : call.cancelled.map { "cancelled \($0)" } ?? "not cancelled"
        out.append(
          "   \(call.isRead ? "read(upTo: \(call.length))" : "write(\(call.length) bytes)") on c\(state.channels[call.channel].slot), \(cancel): "
            + facts.joined(separator: ", "))
      }
      for barrier in state.barriers {
        out.append(
          "   barrier on c\(state.channels[barrier.channel].slot): \(barrier.ran ? "ran" : "never ran")"
        )
      }
      if fixture.writes {
        // Each write's bytes arrived in one run (whole), in the order of its channel.
        var seen: Set<UInt8> = []
        var whole = true
        for (mark, _) in state.peerRuns {
          if seen.contains(mark) { whole = false }
          seen.insert(mark)
        }
        out.append(
          "   peer: every write whole \(whole), bytes \(state.peerCountComparable ? String(state.peerCount.values.reduce(0, +)) : "not compared")"
        )
      }
    }
    lines += out
  }

  /// The peer drains and goes away, every channel closed with stop, the one-shots' and calls' ends
  /// and the cleanups awaited; reports the ends, the flags and the descriptor.
  func finish() -> [String] {
    peerDrain()
    state.withLock { state in
      guard state.peer >= 0 else { return }
      if state.closedPeers.contains(state.peer) {
        shutdown(state.peer, Int32(SHUT_RDWR))
      } else {
        close(state.peer)
      }
      state.peer = -1
      state.eof = true
      state.readerGone = true
    }
    settle()
    let live = state.withLock { state in
      state.channels.indices.compactMap { id -> ChannelHandle? in
        guard let handle = state.channels[id].handle, !state.channels[id].stopped else { return nil }
        state.channels[id].closed = true
        state.channels[id].stopped = true
        return handle
      }
    }
    for handle in live { driver.close(handle, stop: true) }
    // Calls still waiting are cancelled (each its own).
    let tasks = state.withLock { state in
      state.calls.indices.compactMap { index -> Task<Void, Never>? in
        state.calls[index].outcome == nil ? state.calls[index].task : nil
      }
    }
    for task in tasks { task.cancel() }
    let ended = waiter.wait(for: deadline) {
      state.withLock { state in
        state.ops.allSatisfy { $0.done } && state.calls.allSatisfy { $0.outcome != nil }
          && state.channels.allSatisfy { $0.cleanups > 0 }
      }
    }
    if !ended { timeouts.append("not every operation, call and cleanup ended within the deadline after the stop") }
    gate.open()
    driver.sync(queue)
    // The record restores the flags as it ends, after the cleanups (libdispatch's a moment later).
    _ = waiter.wait(for: ended ? deadline : .zero) {
      state.withLock { Posix.statusFlags($0.descriptor) == $0.originalFlags }
    }
    report("teardown: the peer closed, every channel closed with stop", final: true)
    state.withLock { state in
      lines.append("   cleanups " + state.channels.map { "c\($0.slot): \($0.cleanups)" }.joined(separator: " "))
      let open = Posix.identity(state.descriptor) == state.identity
      let restored = Posix.statusFlags(state.descriptor) == state.originalFlags
      lines.append("end: descriptor \(open ? "open" : "CLOSED OR REPLACED"), flags restored \(restored)")
      if ended && abandoned.isEmpty && restored {
        close(state.descriptor)
      } else {
        scenarioQuarantine.withLock { $0.append(state.descriptor) }
      }
      if let path = state.fifoPath { unlink(path) }
      for peer in state.closedPeers { close(peer) }
    }
    return lines
  }
}
