import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The source sequences as a family the harness runs.
enum SourceSequences: SequenceFamily {
  static func generate(_ rng: inout SplitMix64, profile: String) -> [SourceStep] {
    SourceStep.generate(&rng, profile: profile)
  }

  static func observe(_ steps: [SourceStep], side: Side, deadline: Duration) -> [String] {
    let driver: any SourceDriver = side == .dispatch ? DispatchSourceDriver() : GCDSourceDriver()
    // A signal the run before raised at a source it then cancelled can still be on its way:
    // libdispatch's handler blocks the signal in the thread it ran on and sends it to the process
    // again, until every thread blocks it and a signalfd takes it. With the signalfd closed by
    // the cancel it stays pending, and the next signalfd made for it (this run's first source of
    // the signal) would read it at once: the run before's signal, not this one's (signal sequence
    // 0xd9d7d3f8ae71933, once in about 2,000). Such a leftover is taken here, and said. After a
    // run that raised one, the drain waits until none has come for 20 ms: under load the handler
    // that sends it again can be that late (seen once: a SIGUSR2 at the next run's first resume).
    let raised = SourceRun.raisedSignals.exchange(false, ordering: .acquiringAndReleasing)
    for signal in Posix.drainPendingSignals([SIGUSR1, SIGUSR2], quiet: raised ? .milliseconds(20) : .zero) {
      Posix.printError(
        "differential: a signal \(signal) the run before left pending was taken before the \(side) run\n")
    }
    let run = SourceRun(driver: driver, deadline: deadline)
    for (index, step) in steps.enumerated() { run.perform(step, index: index + 1) }
    return run.finish()
  }
}

/// One run of a source sequence on one side: the sources, the socket and its peer, and what the
/// handlers saw. The runner keeps its own model of each source's state (activated, suspensions,
/// handler, cancelled) — the same on both sides, since it follows the steps — and after each step
/// waits until everything that state says libdispatch must deliver has been delivered (the
/// "settle"), then writes the observations.
final class SourceRun: @unchecked Sendable {  // all mutable state is in `state`, under its Mutex
  /// Whether a run since the last drain sent a signal (`observe` then drains until quiet).
  static let raisedSignals = Atomic<Bool>(false)

  struct Slot {
    var kind: SourceKind
    var source: SourceHandle?
    /// Which incarnation of the slot the handlers belong to: a dropped source's late calls are
    /// recorded as such, not as the new one's.
    var incarnation: Int
    var queue: Int
    var descriptor: Int32
    var unusable: Int32? = nil
    var activated = false
    var suspensions = 0
    var cancelled = false
    var cancelledBeforeActivation = false
    var handler: Int? = nil
    var cancelVariant = 0
    var registrationSet = false
    var registrations = 0
    var cancels: [Int] = []
    var variantsRan: Set<Int> = []
    var events = 0
    var pendingData: UInt = 0
    var dataSeen: UInt = 0
    var timerPending = false
    var uncertain = false
    /// Suspended by its own handler at an end of the stream no one can compare
    /// (`IntendedDifference.eventWithoutHandler`): one more suspension for a cancel or drop to balance.
    var muted = false
    var pendingSignals = 0
    var signalsSeen: UInt = 0
    var violations: [String] = []
    var reported = ""

    var deliverable: Bool {
      source != nil && unusable == nil && activated && suspensions == 0 && !cancelled && handler != nil
    }
  }

  struct State {
    var slots: [Int: Slot] = [:]
    var incarnations = 0
    var socket: Int32 = -1
    var duplicate: Int32 = -1
    var peer: Int32 = -1
    var identities: [String: [UInt64]] = [:]
    var peerWritten = 0
    var peerWriteShut = false
    var peerClosed = false
    var eofPending = false
    var eofSeen = false
    /// `IntendedDifference.eventWithoutHandler`: the socket had bytes or its end (the peer shut
    /// its writing half) to report while a started read source had no handler. Until the number
    /// is reused, the runs do not wait for read events, nor compare what the readers read or
    /// whether they saw the end: the oracle's source may have gone silent, bytes and end included.
    var readUncertain = false
    /// The same for the writing side: the peer closed while a started write source had no
    /// handler. Until the number is reused, write events are not waited for, nor write errors
    /// compared.
    var writeUncertain = false
    /// The descriptor numbers a write source's handler has filled (written until `EAGAIN`):
    /// `IntendedDifference.readerAfterFullWriter`.
    var filledByWriter: Set<Int32> = []
    var closedPeers: [Int32] = []
    var readTotal = 0
    var readErrors: Set<Int32> = []
    var readOutOfOrder = false
    var writtenTotal = 0
    var writtenSinceStep = 0
    var writeErrors: Set<Int32> = []
    var peerReceived = 0
    var peerOutOfOrder = false
    var lateCalls = 0
  }

  let driver: any SourceDriver
  let deadline: Duration
  let queues: [AnyObject]
  let state = Mutex(State())
  let waiter = Waiter()
  var lines: [String] = []

  init(driver: any SourceDriver, deadline: Duration) {
    self.driver = driver
    self.deadline = deadline
    queues = [driver.makeQueue(index: 0), driver.makeQueue(index: 1)]
    let (socket, peer) = Posix.socketPair()
    Posix.setNonBlocking(socket)
    Posix.setNonBlocking(peer)
    let duplicate = dup(socket)
    state.withLock {
      $0.socket = socket
      $0.peer = peer
      $0.duplicate = duplicate
      $0.identities = ["socket": Posix.identity(socket)!, "peer": Posix.identity(peer)!]
    }
  }

  // MARK: Steps

  func perform(_ step: SourceStep, index: Int) {
    var note = ""
    anticipateEventsWithoutHandler(step)
    switch step {
    case .create(let slot, let kind, let onDuplicate, let queue):
      drop(slot)
      settle()
      if kind.isDescriptor && state.withLock({ $0.socket < 0 }) {
        note = "skipped (no socket)"
        break
      }
      let descriptor = state.withLock { onDuplicate ? $0.duplicate : $0.socket }
      create(slot, kind: kind, descriptor: kind.isDescriptor ? descriptor : -1, queue: queue)
    case .createOnClosedNumber(let slot, let kind):
      drop(slot)
      settle()
      create(slot, kind: kind, descriptor: Posix.closedNumber(), queue: 0)
    case .setHandler(let slot, let variant):
      guard let source = usable(slot) else { break }
      let incarnation = state.withLock { $0.slots[slot]!.incarnation }
      driver.setEventHandler(source) { [weak self] value in
        self?.event(slot: slot, incarnation: incarnation, variant: variant, value: value)
      }
      state.withLock { $0.slots[slot]!.handler = variant }
    case .clearHandler(let slot):
      guard let source = usable(slot) else { break }
      driver.clearEventHandler(source)
      state.withLock { $0.slots[slot]!.handler = nil }
    case .setCancelHandler(let slot):
      // `IntendedDifference.cancelHandlerOnce`.
      guard let source = usable(slot), !state.withLock({ $0.slots[slot]!.cancelled }) else {
        note = "skipped"
        break
      }
      setCancelHandler(source, slot: slot, variant: 1)
    case .setRegistrationHandler(let slot):
      guard let source = usable(slot) else { break }
      setRegistrationHandler(source, slot: slot)
    case .resume(let slot):
      guard let source = usable(slot), !state.withLock({ $0.slots[slot]!.cancelled }) else {
        note = "skipped"
        break
      }
      // Not a resume that would start a source with no handler and a signal or merge pending: on
      // both sides its queue drops that event for want of a handler, or a handler set at the
      // next step gets it first, by timing (signal sequence 0xe795629ad1f8d055: suspended, a
      // signal, resumed, then a handler).
      let racing = state.withLock { state -> Bool in
        let entry = state.slots[slot]!
        let starts = !entry.activated || entry.suspensions == 1
        return starts && entry.handler == nil && (entry.pendingSignals > 0 || entry.pendingData != 0)
      }
      if racing {
        note = "skipped (it would start the source with no handler and an event pending)"
        break
      }
      // `IntendedDifference.readerAfterFullWriter`: a read source that starts on a number whose
      // live write source has filled the socket stays silent on libdispatch, bytes included.
      state.withLock { state in
        let entry = state.slots[slot]!
        guard entry.kind == .read, !entry.activated || entry.suspensions == 1,
          state.filledByWriter.contains(entry.descriptor),
          state.slots.values.contains(where: {
            $0.kind == .write && $0.descriptor == entry.descriptor && $0.source != nil && $0.unusable == nil
              && !$0.cancelled
          })
        else { return }
        state.readUncertain = true
      }
      let balances = state.withLock { state -> Bool in
        var entry = state.slots[slot]!
        defer { state.slots[slot] = entry }
        if !entry.activated {
          entry.activated = true
          return true
        }
        if entry.suspensions > 0 {
          entry.suspensions -= 1
          return true
        }
        return false
      }
      if balances { driver.resume(source) } else { note = "skipped (nothing to balance)" }
    case .suspend(let slot):
      guard let source = usable(slot), !state.withLock({ $0.slots[slot]!.cancelled }) else {
        note = "skipped"
        break
      }
      state.withLock { $0.slots[slot]!.suspensions += 1 }
      driver.suspend(source)
    case .cancel(let slot):
      guard let source = usable(slot), !state.withLock({ $0.slots[slot]!.cancelled }) else {
        note = "skipped"
        break
      }
      // `IntendedDifference.cancelCompletes`: the package's cancel balances the suspensions and
      // starts a source never started; the oracle's run does that itself.
      let (balance, wasActivated) = state.withLock { state -> (Int, Bool) in
        var entry = state.slots[slot]!
        defer { state.slots[slot] = entry }
        let taken = (entry.suspensions + (entry.muted ? 1 : 0), entry.activated)
        if !entry.activated { entry.cancelledBeforeActivation = true }
        Self.writeSourceEnds(entry, in: &state)
        entry.muted = false
        entry.cancelled = true
        entry.activated = true
        entry.suspensions = 0
        return taken
      }
      driver.cancel(source)
      if driver.dropNeedsBalancing {
        for _ in 0..<balance { driver.resume(source) }
        if !wasActivated { driver.resume(source) }
      }
    case .drop(let slot):
      drop(slot)
    case .merge(let slot, let value):
      guard let source = usable(slot), state.withLock({ $0.slots[slot]!.kind.isData }) else { break }
      state.withLock {
        guard !$0.slots[slot]!.cancelled else { return }
        if $0.slots[slot]!.kind == .add {
          $0.slots[slot]!.pendingData &+= value
        } else {
          $0.slots[slot]!.pendingData |= value
        }
      }
      driver.merge(source, value)
    case .schedule(let slot):
      guard let source = usable(slot), state.withLock({ $0.slots[slot]!.kind == .timer }) else { break }
      // A timer that would fire with no handler to see it is scheduled far away: whether it fires
      // before the next step sets a handler would be a matter of timing.
      let near = state.withLock { state -> Bool in
        let entry = state.slots[slot]!
        let near = !entry.cancelled && (entry.handler != nil || entry.suspensions > 0)
        state.slots[slot]!.timerPending = near
        return near
      }
      driver.schedule(source, after: near ? .milliseconds(1) : .seconds(3600))
    case .raise(let kind):
      // Only while a source of the signal is registered: otherwise the signal would take its
      // default action (the end of the process).
      // Nor while one of its sources is started with no handler: libdispatch merges a signal on
      // its manager thread, so whether it is dropped for want of a handler or reaches one set at
      // the next step is a matter of timing.
      let registered = state.withLock { state -> Bool in
        let listening = state.slots.values.filter { $0.kind == kind && $0.registrations > 0 && !$0.cancelled }
        guard !listening.isEmpty else { return false }
        if listening.contains(where: { $0.suspensions == 0 && $0.handler == nil }) { return false }
        for (key, entry) in state.slots where entry.kind == kind && entry.registrations > 0 && !entry.cancelled {
          state.slots[key]!.pendingSignals += 1
        }
        return true
      }
      if registered {
        SourceRun.raisedSignals.store(true, ordering: .releasing)
        kill(getpid(), kind.signalNumber)
      } else {
        note = "skipped"
      }
    case .peerWrite(let bytes):
      state.withLock { state in
        guard !state.peerWriteShut, state.peer >= 0 else { return }
        let wrote = Posix.writePattern(state.peer, offset: state.peerWritten, count: bytes)
        if wrote > 0 { state.peerWritten += wrote }
        if wrote < bytes { note = "peer wrote \(max(wrote, 0)) of \(bytes)" }
      }
    case .peerDrain:
      peerDrain()
    case .peerShutdown:
      state.withLock { state in
        guard !state.peerWriteShut, state.peer >= 0 else { return }
        shutdown(state.peer, Int32(SHUT_WR))
        state.peerWriteShut = true
        state.eofPending = true
      }
    case .peerClose:
      state.withLock { state in
        guard state.peer >= 0 else { return }
        // Shut down both ways, closed at the end: a close with bytes unread would make the read
        // handler's next read fail with ECONNRESET or end, by timing.
        shutdown(state.peer, Int32(SHUT_RDWR))
        state.closedPeers.append(state.peer)
        state.peer = -1
        state.peerClosed = true
        if !state.peerWriteShut { state.eofPending = true }
        state.peerWriteShut = true
      }
    case .reuseNumber:
      reuseNumber()
    }
    settle()
    report("\(index). \(step)" + (note.isEmpty ? "" : " — \(note)"))
  }

  /// `IntendedDifference.eventWithoutHandler`, decided before the step: a read (write) source
  /// started with no handler (or left so by this step) while the socket has, or this step gives
  /// it, something to report. Deciding after the step would be too late: in libdispatch the
  /// event that finds no handler can silence the other sources on the descriptor too, while the
  /// package's sources with a handler see it at once.
  private func anticipateEventsWithoutHandler(_ step: SourceStep) {
    let queued = state.withLock { $0.socket >= 0 ? Posix.bytesQueued($0.socket) : 0 }
    state.withLock { state in
      func handlerless(_ kind: SourceKind) -> Bool {
        state.slots.contains { key, entry in
          guard entry.kind == kind, entry.source != nil, entry.unusable == nil, !entry.cancelled else { return false }
          switch step {
          case .resume(let slot) where slot == key:
            return entry.handler == nil && (!entry.activated || entry.suspensions == 1)
          case .clearHandler(let slot) where slot == key: return entry.activated && entry.suspensions == 0
          default: return entry.handler == nil && entry.activated && entry.suspensions == 0
          }
        }
      }
      let peerStep: Bool
      switch step {
      case .peerWrite, .peerShutdown, .peerClose: peerStep = true
      default: peerStep = false
      }
      let ending: Bool
      switch step {
      case .peerShutdown, .peerClose: ending = true
      default: ending = state.peerWriteShut
      }
      // A write source's event that finds no handler at the end silences the readers too.
      if handlerless(.read) && (queued > 0 || state.peerWriteShut || peerStep) || handlerless(.write) && ending {
        state.readUncertain = true
      }
      if case .peerClose = step, handlerless(.write) { state.writeUncertain = true }
      if state.peerClosed && handlerless(.write) { state.writeUncertain = true }
    }
  }

  private func usable(_ slot: Int) -> SourceHandle? {
    state.withLock { state in
      guard let entry = state.slots[slot], entry.unusable == nil else { return nil }
      return entry.source
    }
  }

  private func create(_ slot: Int, kind: SourceKind, descriptor: Int32, queue: Int) {
    // `IntendedDifference.badDescriptorThrows`: the oracle's source on a closed number would be
    // silent; the package throws. Both observe "unusable".
    if kind.isDescriptor && driver.side == .dispatch && fcntl(descriptor, F_GETFD) < 0 {
      let code = errno
      state.withLock { state in
        state.incarnations += 1
        var entry = Slot(kind: kind, incarnation: state.incarnations, queue: queue, descriptor: descriptor)
        entry.unusable = code
        state.slots[slot] = entry
      }
      return
    }
    let result = driver.create(kind, descriptor: descriptor, queue: queues[queue])
    state.withLock { state in
      state.incarnations += 1
      var entry = Slot(kind: kind, incarnation: state.incarnations, queue: queue, descriptor: descriptor)
      switch result {
      case .success(let source): entry.source = source
      case .failure(let error): entry.unusable = error.errno
      }
      state.slots[slot] = entry
    }
    guard case .success(let source) = result else { return }
    setCancelHandler(source, slot: slot, variant: 0)
    // A signal source always has a registration handler: a signal raised before the source is
    // registered would take its default action.
    if kind.isSignal { setRegistrationHandler(source, slot: slot) }
  }

  private func setCancelHandler(_ source: SourceHandle, slot: Int, variant: Int) {
    let incarnation = state.withLock {
      $0.slots[slot]!.cancelVariant = variant
      return $0.slots[slot]!.incarnation
    }
    driver.setCancelHandler(source) { [weak self] in
      self?.recordCall(slot: slot, incarnation: incarnation, of: "cancel handler") { $0.cancels.append(variant) }
    }
  }

  /// A cancel or registration handler's call, recorded on its slot by `update`: a call of an
  /// earlier incarnation of the slot is counted late; one off the slot's queue is a violation.
  private func recordCall(slot: Int, incarnation: Int, of handler: String, _ update: (inout Slot) -> Void) {
    let queue = driver.currentQueue()
    state.withLock { state in
      guard state.slots[slot]?.incarnation == incarnation else {
        state.lateCalls += 1
        return
      }
      if queue != state.slots[slot]!.queue { state.slots[slot]!.violations.append("\(handler) off its queue") }
      update(&state.slots[slot]!)
    }
  }

  private func setRegistrationHandler(_ source: SourceHandle, slot: Int) {
    // Only a handler set before the start is compared: libdispatch runs one set later at the
    // source's next invocation, which is a matter of timing.
    let incarnation = state.withLock {
      if !$0.slots[slot]!.activated { $0.slots[slot]!.registrationSet = true }
      return $0.slots[slot]!.incarnation
    }
    driver.setRegistrationHandler(source) { [weak self] in
      self?.recordCall(slot: slot, incarnation: incarnation, of: "registration handler") { entry in
        if !entry.cancels.isEmpty { entry.violations.append("registration handler after the cancel handler") }
        entry.registrations += 1
      }
    }
  }

  /// The event handler of every source: what a user's handler would do with each kind.
  private func event(slot: Int, incarnation: Int, variant: Int, value: UInt) {
    let queue = driver.currentQueue()
    let cancelSelf = state.withLock { state -> SourceHandle? in
      guard var entry = state.slots[slot], entry.incarnation == incarnation else {
        state.lateCalls += 1
        return nil
      }
      defer { state.slots[slot] = entry }
      if queue != entry.queue { entry.violations.append("event handler off its queue") }
      if !entry.cancels.isEmpty { entry.violations.append("event handler after the cancel handler") }
      if entry.registrationSet && entry.registrations == 0 {
        entry.violations.append("event handler before the registration handler")
      }
      var counts = true
      var cancel = false
      switch entry.kind {
      case .read:
        // Read what is there; at the end of the stream or on an error, cancel (what a server does).
        let (bytes, end, error) = Posix.drain(entry.descriptor)
        for (offset, byte) in bytes.enumerated() where byte != UInt8((state.readTotal + offset) % 251) {
          state.readOutOfOrder = true
        }
        state.readTotal += bytes.count
        if end && state.readUncertain {
          // `IntendedDifference.eventWithoutHandler`: a source that met the end with no handler (the
          // package's reaches here, the oracle's stays silent) or one started after that. A cancel
          // would show as a cancel handler run at this step on one side only; a suspension (under
          // the lock, so that a cancel or drop that balances it comes after it) is not seen, and
          // stops the end, which stays readable, from calling the handler again.
          mute(&entry)
          counts = false
          break
        }
        if end {
          state.eofSeen = true
          state.eofPending = false
          cancel = true
        }
        if error != 0 {
          state.readErrors.insert(error)
          cancel = true
        }
        counts = !bytes.isEmpty || end || error != 0
      case .write:
        // Fill the socket until it would block; on an error, cancel.
        var wrote = 0
        while true {
          let got = Posix.writePattern(entry.descriptor, offset: state.writtenTotal + wrote, count: 4096)
          if got > 0 {
            wrote += got
            if got == 4096 { continue }
          } else if got < 0 && -got != Int(EAGAIN) && state.writeUncertain {
            // `IntendedDifference.eventWithoutHandler`, the writing side: as at the end of a read.
            mute(&entry)
          } else if got < 0 && -got != Int(EAGAIN) {
            state.writeErrors.insert(Int32(-got))
            cancel = true
          }
          break
        }
        state.writtenTotal += wrote
        state.writtenSinceStep += wrote
        if wrote > 0 && !cancel { state.filledByWriter.insert(entry.descriptor) }
        counts = wrote > 0 || cancel
      case .timer:
        entry.timerPending = false
      case .add, .or:
        entry.pendingData = 0
        entry.dataSeen = entry.kind == .add ? entry.dataSeen &+ value : entry.dataSeen | value
      case .signal1, .signal2:
        entry.pendingSignals = 0
        entry.signalsSeen &+= value
      }
      if counts {
        entry.events += 1
        entry.variantsRan.insert(variant)
      }
      if cancel && !entry.cancelled {
        Self.writeSourceEnds(entry, in: &state)
        entry.cancelled = true
        return entry.source
      }
      return nil
    }
    if let cancelSelf { driver.cancel(cancelSelf) }
  }

  /// Suspends a source from its own handler, once, for `IntendedDifference.eventWithoutHandler`
  /// (called under the state's lock, so that a cancel or drop that balances it comes after it).
  private func mute(_ entry: inout Slot) {
    guard !entry.cancelled && !entry.muted, let source = entry.source else { return }
    driver.suspend(source)
    entry.muted = true
  }

  /// `IntendedDifference.writeCancelKeepsReads`: libdispatch's read sources on a number go
  /// silent once a write source on the same number is cancelled. Called as a write source's
  /// cancel or drop is decided, under the state's lock.
  private static func writeSourceEnds(_ entry: Slot, in state: inout State) {
    guard entry.kind == .write, entry.source != nil else { return }
    let reader = state.slots.values.contains {
      $0.kind == .read && $0.descriptor == entry.descriptor && $0.source != nil && $0.unusable == nil && !$0.cancelled
    }
    if reader { state.readUncertain = true }
  }

  /// Lets the source in `slot` go (`IntendedDifference.safeDrop`): the package's drop cancels and
  /// balances; the oracle's run does that itself first.
  private func drop(_ slot: Int) {
    let taken = state.withLock { state -> (SourceHandle, Int, Bool)? in
      guard var entry = state.slots[slot], let source = entry.source else { return nil }
      let taken = (source, entry.suspensions + (entry.muted ? 1 : 0), entry.activated)
      if !entry.activated { entry.cancelledBeforeActivation = true }
      if !entry.cancelled { Self.writeSourceEnds(entry, in: &state) }
      entry.muted = false
      entry.source = nil
      entry.cancelled = true
      entry.activated = true
      entry.suspensions = 0
      entry.handler = nil
      entry.pendingData = 0
      entry.timerPending = false
      entry.pendingSignals = 0
      state.slots[slot] = entry
      return taken
    }
    guard let (source, balance, wasActivated) = taken else { return }
    if driver.dropNeedsBalancing {
      driver.cancel(source)
      for _ in 0..<balance { driver.resume(source) }
      if !wasActivated { driver.resume(source) }
    }
    // `source` goes out of scope here: the last reference.
  }

  private func peerDrain() {
    state.withLock { state in
      guard state.peer >= 0 else { return }
      let (bytes, _, _) = Posix.drain(state.peer)
      for (offset, byte) in bytes.enumerated() where byte != UInt8((state.peerReceived + offset) % 251) {
        state.peerOutOfOrder = true
      }
      state.peerReceived += bytes.count
    }
  }

  private func reuseNumber() {
    let descriptorSlots = state.withLock { state in
      state.slots.filter { $0.value.kind.isDescriptor && $0.value.source != nil }.keys.sorted()
    }
    for slot in descriptorSlots { drop(slot) }
    settle()
    state.withLock { state in
      guard state.socket >= 0 else { return }
      let (fresh, peer) = Posix.socketPair()
      Posix.setNonBlocking(fresh)
      Posix.setNonBlocking(peer)
      close(state.duplicate)
      if state.peer >= 0 { close(state.peer) }
      _ = dup2(fresh, state.socket)
      close(fresh)
      state.duplicate = dup(state.socket)
      state.peer = peer
      state.identities = ["socket": Posix.identity(state.socket)!, "peer": Posix.identity(peer)!]
      state.peerWritten = 0
      state.peerWriteShut = false
      state.peerClosed = false
      state.eofPending = false
      state.readUncertain = false
      state.writeUncertain = false
      state.filledByWriter = []
      state.readTotal = 0
      state.writtenTotal = 0
      state.peerReceived = 0
    }
  }

  // MARK: Settling and observing

  /// What the state says libdispatch still owes, as text (empty when nothing).
  private func owed() -> [String] {
    let (socketQueued, writable) = state.withLock { state -> (Int, Bool) in
      state.socket >= 0 ? (Posix.bytesQueued(state.socket), Posix.isWritable(state.socket)) : (0, false)
    }
    return state.withLock { state in
      var owed: [String] = []
      for (key, entry) in state.slots.sorted(by: { $0.key < $1.key }) where entry.unusable == nil {
        let live = entry.source != nil || !entry.cancels.isEmpty || entry.cancelled
        guard live else { continue }
        if entry.deliverable {
          switch entry.kind {
          case .read where (socketQueued > 0 || state.peerWriteShut) && !state.readUncertain:
            owed.append("s\(key) read event (\(socketQueued) bytes queued\(state.eofPending ? ", end of file" : ""))")
          case .write where (writable || state.peerClosed) && !state.writeUncertain:
            owed.append("s\(key) write event (socket writable)")
          case .add, .or:
            if entry.pendingData != 0 { owed.append("s\(key) data event (\(entry.pendingData) merged)") }
          case .timer where entry.timerPending && !entry.uncertain:
            owed.append("s\(key) timer event")
          case .signal1, .signal2:
            if entry.pendingSignals > 0 { owed.append("s\(key) signal event") }
          default: break
          }
        }
        if entry.cancelled && entry.activated && entry.suspensions == 0 && entry.cancels.isEmpty {
          owed.append("s\(key) cancel handler")
        }
        if entry.activated && entry.suspensions == 0 && !entry.cancelledBeforeActivation && entry.registrationSet
          && entry.registrations == 0 && !entry.cancelled
        {
          owed.append("s\(key) registration handler")
        }
      }
      return owed
    }
  }

  private var timeouts: [String] = []
  private var abandoned: Set<String> = []

  /// Waits for the queues to drain, then for what is owed, up to the deadline; records a hang.
  func settle() {
    for queue in queues { driver.sync(queue) }
    waiter.waitForOwed(for: deadline, abandoned: &abandoned, timeouts: &timeouts) { owed() }
    for queue in queues { driver.sync(queue) }
    // What libdispatch drops for want of a handler: merges and fires that find an active source
    // with none (for a timer, a matter of timing: its later fires are not compared).
    let queued = state.withLock { $0.socket >= 0 ? Posix.bytesQueued($0.socket) : 0 }
    state.withLock { state in
      for (key, entry) in state.slots
      where entry.source != nil && entry.activated && entry.suspensions == 0
        && !entry.cancelled && entry.handler == nil
      {
        if entry.kind == .read && (queued > 0 || state.peerWriteShut) { state.readUncertain = true }
        if entry.kind == .write && state.peerWriteShut { state.readUncertain = true }
        if entry.kind == .write && state.peerClosed { state.writeUncertain = true }
        state.slots[key]!.pendingData = 0
        state.slots[key]!.pendingSignals = 0
        if entry.timerPending {
          state.slots[key]!.timerPending = false
          state.slots[key]!.uncertain = true
        }
      }
    }
  }

  private func report(_ title: String) {
    var out = [title]
    out += timeouts.map { "   TIMEOUT: \($0)" }
    timeouts = []
    state.withLock { state in
      out.append(
        "   socket: read \(state.readUncertain ? "(not compared)" : state.eofSeen ? "\(state.readTotal) +eof" : "\(state.readTotal)")\(state.readErrors.isEmpty ? "" : " errors \(state.readErrors.sorted())")"
          + "\(state.readOutOfOrder ? " OUT OF ORDER" : ""); written \(state.writtenSinceStep > 0 ? "some" : "none")"
          + "\(state.writeUncertain ? " errors (not compared)" : state.writeErrors.isEmpty ? "" : " errors \(state.writeErrors.sorted())")"
          + "\(state.peerOutOfOrder ? " PEER SAW OUT OF ORDER" : "")")
      state.writtenSinceStep = 0
      for (key, entry) in state.slots.sorted(by: { $0.key < $1.key }) {
        var facts: [String] = []
        if let code = entry.unusable {
          facts.append("unusable errno \(code) \(IntendedDifference.badDescriptorThrows.tag)")
        } else {
          if entry.kind.isData { facts.append("data seen \(entry.dataSeen)") }
          if entry.kind == .timer && !entry.uncertain { facts.append("fired \(entry.events > 0)") }
          if entry.kind.isSignal { facts.append("signals seen \(entry.signalsSeen > 0)") }
          if !entry.kind.isDescriptor && !entry.uncertain { facts.append("variants \(entry.variantsRan.sorted())") }
          if entry.registrationSet { facts.append("registered \(entry.registrations > 0)") }
          facts.append("cancel handlers \(entry.cancels)")
          facts += entry.violations
        }
        let text = "   s\(key) \(entry.kind): " + facts.joined(separator: ", ")
        if text != entry.reported {
          out.append(text)
          state.slots[key]!.reported = text
        }
      }
    }
    lines += out
  }

  /// Drops every source, waits for the cancel handlers, and reports the descriptors.
  func finish() -> [String] {
    let slots = state.withLock { $0.slots.keys.sorted() }
    for slot in slots { drop(slot) }
    settle()
    report("teardown: every source dropped")
    state.withLock { state in
      var facts: [String] = []
      for (name, descriptor) in [("socket", state.socket), ("peer", state.peer)] where descriptor >= 0 {
        let same = Posix.identity(descriptor) == state.identities[name]
        facts.append("\(name) \(same ? "open" : "CLOSED OR REPLACED")")
      }
      if state.duplicate >= 0 { facts.append("dup \(fcntl(state.duplicate, F_GETFD) >= 0 ? "open" : "CLOSED")") }
      lines.append("end: descriptors " + facts.joined(separator: ", "))
      for descriptor in [state.socket, state.duplicate, state.peer] + state.closedPeers where descriptor >= 0 {
        close(descriptor)
      }
    }
    return lines
  }
}
