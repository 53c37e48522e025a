import Synchronization

/// The one state of a source: what its handler blocks share with the `Source` that owns the C
/// source. A source's state is two words and a lock:
///
/// | field | what | who writes | who reads | under |
/// |---|---|---|---|---|
/// | `Source.lifecycle` | started, suspended(n), cancelled | `resume`, `suspend`, `cancel`, `deinit`, a sequence's start and back-pressure | the same | compare-and-swap (`Lifecycle`) |
/// | `target` | the target queue's address and frame flag | `setTarget(_:)` | every handler call | one relaxed word |
/// | `locked.queue` | the target queue, held | `setTarget(_:)` | `queue`, the registration window | the lock |
/// | `locked.cancel`, `cancelInstalled` | the user's cancel handler | `setCancelHandler` | the cancel block, once | the lock |
/// | `locked.registering`, `startsRegistered` | a signal sequence's registration window, and its source's stay on `Registration.queue` | `Source.startRegistered`, its registration | `setTarget(_:)`, the blocks | the lock |
/// | `locked.holdsSource` | the +1 on the C source a source on `Registration.queue` holds for its sent blocks | `startRegistering` | the cancel block, once | the lock |
/// | `locked.rare` | the registration handler and the package's registration and cancel hooks | `setRegistrationHandler`, a signal sequence's start | the registration and cancel blocks, once | the lock |
/// | `locked.rare` | the event sequence: its source, element held, consumer, iterated, finished | `makeEvents()`, `next()`, the loop's end | the event and cancel blocks | the lock |
/// | `OwnedSourceState`'s fields | the package's own work (a watcher's start, a descriptor's cleanup) | `init` | `resume`, the cancel block | immutable |
///
/// Held by the `Source` and by its handler blocks, never by the C source alone: a source whose
/// handlers are set is still released when its last reference goes (no cycle), and a block that
/// runs after the `Source` is gone (a cancel handler, a handler running while the last reference
/// goes) still has the queue it runs on (`locked.queue`). Made on first use: a source that is never
/// given a handler, a target or a sequence has none (`Source.state`).
///
/// An event block captures this one object and the user's closure (an event sequence's block,
/// this object alone), the cancel and registration blocks this object alone; every hook is taken
/// out under the lock and run outside it, once; a continuation is resumed outside it.
///
/// The event sequence (`SourceEvents`) is a view of this state, not a machine of its own: its
/// element, its consumer and its end are fields under the lock, and its back-pressure is the
/// life-cycle word's hold (`Lifecycle.hold`), never the user's `suspend()` count.
///
/// `@unchecked Sendable` only because the class has subclasses (`OwnedSourceState`, and
/// `DescriptorWatch` for the read and write sources in the descriptor fence), which the compiler's
/// check does not allow: every stored property of this class is immutable, atomic or behind
/// `locked`, and the subclasses say what guards theirs.
class SourceState: @unchecked Sendable {
  /// The C source, not retained: the blocks that use it run while libdispatch holds the source.
  /// A block sent on from `Registration.queue` runs after that hold may be gone: it holds a
  /// reference of its own, added while `holdsSource`'s +1 is held (`sendToTarget`), or that +1
  /// itself (the cancel path).
  nonisolated(unsafe) final let raw: OpaquePointer
  /// The target queue and its frame flags in one word (the queue's address with `frameExclusive`
  /// in bit 0, free in an object's address), so a handler starting during `setTarget` reads the
  /// old pair or the new pair, never the new queue with the old flag. Relaxed: the queue it names
  /// is held by `locked.queue` and by libdispatch's target reference.
  final let target: Atomic<UInt>

  /// What an event runs, for a state that keeps the handler itself (`DescriptorWatch`,
  /// `OwnedSourceState`) behind one event block for the source's life: the user's handler, or the
  /// event sequence's delivery.
  enum EventHandler {
    case plain(@Sendable () -> Void)
    case value(@Sendable (UInt) -> Void)
    case sequence
  }

  /// The handler of a state that keeps it itself (nil until one is set), whether an event found
  /// none (a `DescriptorWatch` is then disarmed until one is set), and whether the cancel path let
  /// the handler go (a handler set later is dropped at once: no event runs any more, and it must
  /// not keep the source). Its transitions are pure.
  struct Handling {
    var handler: EventHandler?
    var starved = false
    var ended = false

    /// An event: the handler to run, or nil (`starved`).
    mutating func event() -> EventHandler? {
      if handler == nil { starved = true }
      return handler
    }

    /// A handler is set: true when an event found none since the last.
    mutating func set(_ new: EventHandler) -> Bool {
      guard !ended else { return false }
      handler = new
      defer { starved = false }
      return starved
    }

    /// The cancel path: the handler, taken out to be released outside the lock.
    mutating func end() -> EventHandler? {
      defer { (handler, ended) = (nil, true) }
      return handler
    }
  }

  /// What a sequence's consumer waits on: the next element's data, or nil at the end.
  typealias Consumer = UnsafeContinuation<UInt?, Never>

  /// The rarer parts, touched only under the lock: a box of their own, so that a source that has
  /// none (most) does not carry their room.
  final class Rare {
    /// The user's registration handler, taken (and cleared) by the block that runs it, once.
    var registration: Source.CancelHandler = .none
    /// The package's registration hook (a signal sequence's start waiting for registration).
    var registrationHook: (@Sendable () -> Void)?
    /// The package's cancel hook (`withSignals`' end waiting for its sources), run once by the cancel
    /// block after the cancel work it runs itself: never on the user's queue.
    var cancelHook: (@Sendable () -> Void)?

    // The event sequence (`SourceEvents`), the one `makeEvents()` that started the source.

    /// The source, held while the sequence runs: its hold and its end need the life-cycle word.
    /// Taken out at the end (the loop's, or the cancel block's), which breaks the cycle it makes
    /// (source, state, source).
    var sequenceSource: Source?
    /// The sequence is over: the source was cancelled, or the loop ended.
    var finished = false
    /// An iterator was made (the sequence's drop no longer ends it).
    var iterated = false
    /// The data of an event taken from the source that the consumer has not asked for yet; the
    /// source is held (`Lifecycle.hold`) while it is here.
    var held: UInt?
    /// The consumer waiting in `next()`.
    var consumer: Consumer?
  }

  struct Locked {
    /// The target queue (the user's, or the last `setTarget(_:)`'s).
    var queue: Queue
    /// The user's cancel handler.
    var cancel: Source.CancelHandler = .none
    /// The cancel block is installed (by the user's cancel handler, a hook, or the cancel of a
    /// source with the package's cleanup).
    var cancelInstalled: Bool
    /// A sequence's start has pointed the C source at `Registration.queue`, and it has not
    /// registered yet (the start waits).
    var registering = false
    /// Set by `Source.startRegistered` before it activates the source: the C source targets
    /// `Registration.queue` from then on, for its whole life (never retargeted once active:
    /// libdispatch counts that as deprecated use, and `LIBDISPATCH_STRICT=1` traps on it).
    /// `setTarget(_:)` records `queue` only, and the user's work is sent on to it (`sendToTarget`).
    var startsRegistered = false
    /// The +1 on the C source taken by `startRegistering`, for the blocks sent on to the user's
    /// queue; released once, by the cancel path (`cancelCallout`).
    var holdsSource = false
    /// The rarer parts (registration, the event sequence), made on first use.
    var rare: Rare?

    /// `rare`, made if it is not yet.
    mutating func madeRare() -> Rare {
      if let rare { return rare }
      let made = Rare()
      rare = made
      return made
    }

    /// Marks the cancel block installed: true for the one caller that is to install it.
    mutating func claimCancelBlock() -> Bool {
      defer { cancelInstalled = true }
      return !cancelInstalled
    }

    /// Takes the registration handler and hook out (each runs once).
    mutating func takeRegistration() -> (Source.CancelHandler, (@Sendable () -> Void)?) {
      guard let rare else { return (.none, nil) }
      defer { (rare.registration, rare.registrationHook) = (.none, nil) }
      return (rare.registration, rare.registrationHook)
    }
  }

  /// The one lock: every field but the two words.
  final let locked: Mutex<Locked>

  init(raw: OpaquePointer, queue: Queue) {
    self.raw = raw
    target = Atomic(SourceState.targetWord(queue))
    locked = Mutex(Locked(queue: queue, cancelInstalled: false))
  }

  /// The package's cleanup at cancellation, `first` before the user's cancel handler or after it
  /// (none for a plain source: `OwnedSourceState` overrides it).
  func cleanup(first: Bool) {}

  /// The package's start hook, before the first activation (none for a plain source).
  func startHook() {}

  /// The queue's address and its exclusive bit as one word.
  static func targetWord(_ queue: Queue) -> UInt {
    UInt(bitPattern: UnsafeMutableRawPointer(queue.raw)) | (queue.flags & frameExclusive)
  }

  /// The queue the handlers run on.
  var queue: Queue { locked.withLock { $0.queue } }

  /// Records the new target queue; true when the C source is to be pointed at it now (false for a
  /// source on `Registration.queue`, which stays there and sends the user's work on to `queue`).
  func setTarget(_ queue: Queue) -> Bool {
    locked.withLock { locked in
      locked.queue = queue
      if locked.startsRegistered { return false }
      target.store(SourceState.targetWord(queue), ordering: .relaxed)
      return true
    }
  }

  /// Whether the C source stays on `Registration.queue` (a signal sequence started it): the user's
  /// event handlers set now are sent on to the source's queue (`Source.setEventHandler`).
  var staysOnRegistrationQueue: Bool { locked.withLock { $0.startsRegistered } }

  /// Runs `body` inside a frame of the target queue, read from `target` as one word.
  @inline(__always)
  final func inTargetFrame(_ body: () -> Void) {
    let word = target.load(ordering: .relaxed)
    withFrame(
      queue: OpaquePointer(bitPattern: word & ~frameExclusive).unsafelyUnwrapped, flags: word & frameExclusive, body)
  }

  /// A closure as an event handler block that runs inside a frame of the target queue.
  ///
  /// The blocks of this file capture the state and at most the user's closure: a block that
  /// captures one object alone costs no closure context (Swift passes the object as the context),
  /// only libdispatch's copy of the block.
  final func block(_ handler: @escaping @Sendable () -> Void) -> @convention(block) () -> Void {
    return { [self] in inTargetFrame(handler) }
  }

  /// A value handler as a handler block: `handler` gets the event's data (`eventData`).
  final func valueBlock(_ handler: @escaping @Sendable (UInt) -> Void) -> @convention(block) () -> Void {
    return { [self] in inTargetFrame { handler(eventData()) } }
  }

  /// Sets the user's event handler: the C source's event block. A read or write source in the
  /// descriptor fence keeps its own block for its whole life instead and records the handler
  /// (`DescriptorWatch`): its re-arm must not depend on a block the user may not have set yet.
  func setEventHandler(_ handler: @escaping @Sendable () -> Void) {
    Libdispatch.source_set_event_handler(raw, block(handler))
  }

  /// Sets the user's value handler (`setEventHandler`, with the event's data).
  func setValueHandler(_ handler: @escaping @Sendable (UInt) -> Void) {
    Libdispatch.source_set_event_handler(raw, valueBlock(handler))
  }

  /// Sets the event sequence's handler (`sequenceEvent`), as `setEventHandler` sets the user's.
  func setSequenceHandler() {
    Libdispatch.source_set_event_handler(raw) { [self] in inTargetFrame { sequenceEvent() } }
  }

  /// Runs `handler` inside a frame of the target queue (the value handler with `eventData()`).
  final func run(_ handler: EventHandler) {
    switch handler {
    case .plain(let body): inTargetFrame(body)
    case .value(let body): inTargetFrame { body(eventData()) }
    case .sequence: inTargetFrame { sequenceEvent() }
    }
  }

  /// `data` in a handler: the C source's pending data (libdispatch holds the C source while its
  /// handler runs; the block holds this state, which holds the pointer). A read or write source in
  /// the descriptor fence overrides it with its estimate (`DescriptorWatch`).
  func eventData() -> UInt { Libdispatch.source_get_data(raw) }

  // MARK: Cancellation

  /// Records the user's cancel handler, installing the cancel block if it is not yet.
  func setCancelHandler(_ handler: Source.CancelHandler) {
    let install = locked.withLock { locked in
      locked.cancel = handler
      return locked.claimCancelBlock()
    }
    if install { installCancelBlock() }
  }

  /// Installs the cancel block unless it is installed (the cancel of a source with the package's
  /// cleanup, `Source.cleansUp`).
  final func installCancelBlockOnce() {
    let install = locked.withLock { $0.claimCancelBlock() }
    if install { installCancelBlock() }
  }

  /// The one cancel handler libdispatch sees: the user's, then the sequence's end and the
  /// package's cleanup.
  final func installCancelBlock() {
    Libdispatch.source_set_cancel_handler(raw) { [self] in inTargetFrame { cancelCallout() } }
  }

  /// The cancel block's work. A registration that never ran (the source was cancelled first): its
  /// hook ends the start's wait, and neither closure may stay here (libdispatch frees the C block,
  /// not the closures, and a hook holds the source); taken outside the lock, before the rest.
  ///
  /// On `Registration.queue` (a source a signal sequence started), the cancel handlers are sent on
  /// to the source's queue only when the user set one; the package's own part (the sequence's end)
  /// then runs after it, there, as on any source. With none, everything runs here, so that the end
  /// of `withSignals` never waits for the user's queue. Either way the +1 `startRegistering` took
  /// is released last, once: it keeps the C source (and with it the user's context, which its
  /// finalizer may free) until the user's cancel handler has run.
  func cancelCallout() {
    // The user's registration handler never runs then (as in C): released here, outside the lock.
    let (registrationHook, cancelHook, sends, holdsSource) = locked.withLock { locked in
      let (_, registrationHook) = locked.takeRegistration()
      let cancelHook = locked.rare?.cancelHook
      locked.rare?.cancelHook = nil
      let userHandler: Bool
      if case .none = locked.cancel { userHandler = false } else { userHandler = true }
      defer { locked.holdsSource = false }
      return (registrationHook, cancelHook, locked.startsRegistered && userHandler, locked.holdsSource)
    }
    registrationHook?()
    if sends && Registration.isCurrent {
      // No new reference here: the wrapper may have released its last one already (a reference
      // taken now would resurrect the C source, and libdispatch traps); the +1 of
      // `startRegistering`, still held, goes with the block and is released after it.
      send({ [self] in cancelHandlers() }, releasingSource: holdsSource)
    } else {
      cancelHandlers()
      if holdsSource { Libdispatch.release(raw) }
    }
    cancelHook?()
  }

  /// The user's cancel handler, then the event sequence's end and the package's cleanup (the
  /// cleanup first when the state asks: a read or write source leaves the descriptor fence while the
  /// user's descriptor is still open, `DescriptorWatch`).
  final func cancelHandlers() {
    cleanup(first: true)
    call(
      locked.withLock { locked in
        defer { locked.cancel = .none }
        return locked.cancel
      })
    sequenceCancelled()
    cleanup(first: false)
  }

  // MARK: Registration

  /// Records the package's cancel hook (see `Rare.cancelHook`); before the source starts.
  func setCancelHook(_ hook: @escaping @Sendable () -> Void) {
    let install = locked.withLock { locked in
      locked.madeRare().cancelHook = hook
      return locked.claimCancelBlock()
    }
    if install { installCancelBlock() }
  }

  /// Records the user's registration handler, or the package's hook, and installs a registration
  /// block that runs both, the package's first, once: the hook ends a start's wait (and the
  /// source's stay on `Registration.queue`), then the user's handler runs on the source's queue.
  /// Installed on every call, as the C function is: libdispatch runs a block set after
  /// registration at once.
  func setRegistration(handler: Source.CancelHandler? = nil, hook: (@Sendable () -> Void)? = nil) {
    locked.withLock { locked in
      if let handler { locked.madeRare().registration = handler }
      if let hook { locked.madeRare().registrationHook = hook }
    }
    Libdispatch.source_set_registration_handler(raw) { [self] in inTargetFrame { registrationCallout() } }
  }

  /// The registration block's work: the package's hook, then the user's handler, each once.
  final func registrationCallout() {
    let ((handler, hook), sendOn) = locked.withLock { locked in
      (locked.takeRegistration(), locked.startsRegistered)
    }
    hook?()
    if case .none = handler { return }
    if sendOn && Registration.isCurrent { sendToTarget { [self] in call(handler) } } else { call(handler) }
  }

  /// Puts the source on `Registration.queue` for good, before `Source.startRegistered` points the
  /// inactive C source there and activates it: its blocks run there (in that queue's frame), and
  /// `setTarget(_:)` only records the queue the user's work is sent on to. Takes the +1 on the C
  /// source its sent blocks rely on (`holdsSource`), while the caller holds the `Source` (so the C
  /// source has a reference to add to), and installs the cancel block, which releases it: a
  /// source with no cancel handler would otherwise have none, and its C source would leak
  /// (LeakSanitizer, `make sanitize`). Again does nothing but reopen the window.
  func startRegistering() {
    let install = locked.withLock { locked in
      locked.registering = true
      if locked.startsRegistered { return false }
      locked.startsRegistered = true
      locked.holdsSource = true
      Libdispatch.retain(raw)
      target.store(SourceState.targetWord(Registration.queue), ordering: .relaxed)
      return locked.claimCancelBlock()
    }
    if install { installCancelBlock() }
  }

  /// The source registered: the start's wait ends. The C source stays on `Registration.queue`:
  /// libdispatch counts a new target of an active source as deprecated use (it logs it once per
  /// process, and `LIBDISPATCH_STRICT=1` stops the process), and a queue of the user's would make
  /// the package's own handlers (a sequence's deliveries, `withSignals`' end) wait for it.
  func endRegistration() {
    locked.withLock { locked in locked.registering = false }
  }

  /// Whether the registration window is open (tests).
  var isRegistering: Bool { locked.withLock { $0.registering } }

  /// Runs `body` on the source's queue, inside its frame, with the C source kept until it has run.
  ///
  /// Called from a registration or event block running on `Registration.queue`, where the C
  /// source holds `Registration.queue`, not the source's queue, and the `Source` may be gone: the
  /// queue comes from `locked.queue`, which this state holds as long as its blocks live, and the
  /// send block holds it too (`RegistrationTests.droppedWithItsQueue`).
  ///
  /// The reference it takes is safe because `startRegistering`'s +1 is still held: only the cancel
  /// path releases that one, and libdispatch runs a source's cancel block after its registration
  /// and event blocks have returned, never beside them. Without it, the wrapper's last release
  /// (a dropped source, right after `makeEvents()` returned from the registration hook) racing
  /// this retain resurrects the C source, and libdispatch traps
  /// (`SignalSourceTests.droppedWithRegistrationHandler`, `droppedOnGlobalQueue`).
  func sendToTarget(_ body: @escaping @Sendable () -> Void) {
    Libdispatch.retain(raw)
    send(body, releasingSource: true)
  }

  /// Sends `body` on to the source's queue, inside its frame; releases a reference on the C source
  /// after it when `releasingSource` (one the caller holds for it).
  private func send(_ body: @escaping @Sendable () -> Void, releasingSource: Bool) {
    let queue = self.queue
    Libdispatch.async_block(queue.raw) { [raw, queue] in
      withFrame(queue: queue.raw, flags: queue.flags & frameExclusive, body)
      if releasingSource { Libdispatch.release(raw) }
    }
  }

  /// Calls the user's handler (a C function gets the source's context).
  func call(_ handler: Source.CancelHandler) {
    switch handler {
    case .none: break
    case .closure(let closure): closure()
    case .function(let function): function(Libdispatch.get_context(raw))
    }
  }
}

/// The state of a plain source (a timer, a data or a signal source), made on first use: it holds
/// the queue the source was created with for its whole life, beside its current target
/// (`locked.queue`), so that a reader of `Source.queue` that took the queue from the source's word
/// before this state replaced it holds a live object (`Source.word`). 88 bytes: glibc's 96-byte
/// chunk, as the base class's 80.
final class LazySourceState: SourceState, @unchecked Sendable {
  let createdQueue: Queue

  override init(raw: OpaquePointer, queue: Queue) {
    createdQueue = queue
    super.init(raw: raw, queue: queue)
  }
}

/// The state of a source of the package's own kinds, with the kernel watcher that works around
/// the source (inotify, a pressure trigger): made with the source; the watcher starts with the
/// source's first start and stops in its cancel block (installed by the cancel: `Source.cleansUp`).
/// A subclass, so that a plain source's state does not carry these fields.
///
/// It keeps the user's event handler itself, under `locked`, behind one event block installed with
/// the first handler, as `DescriptorWatch` does: a block that captured the handler beside this
/// state would cost a closure context of its own (48 bytes a watched file). The cancel block lets
/// the handler go, as libdispatch frees a cancelled source's event block.
final class OwnedSourceState: SourceState, @unchecked Sendable {
  /// Started at the source's first start, stopped once at cancellation, after the user's cancel
  /// handler.
  let watcher: any KernelWatcher
  /// The user's handler, or the sequence's (`Handling`; an event that finds none does nothing).
  /// Read and written only under `locked`.
  @exclusivity(unchecked) private var handling = Handling()
  /// The event block is installed (with the first handler). Only under `locked`.
  private var blockInstalled = false

  init(raw: OpaquePointer, queue: Queue, watcher: any KernelWatcher) {
    self.watcher = watcher
    super.init(raw: raw, queue: queue)
  }

  override func cleanup(first: Bool) {
    if first {
      // Let the handler go outside the lock: its captures' deinit may run any code.
      let released = locked.withLock { _ in handling.end() }
      _ = released
    } else {
      watcher.stop()
    }
  }

  override func startHook() { watcher.start() }

  override func setEventHandler(_ handler: @escaping @Sendable () -> Void) { setHandler(.plain(handler)) }
  override func setValueHandler(_ handler: @escaping @Sendable (UInt) -> Void) { setHandler(.value(handler)) }
  override func setSequenceHandler() { setHandler(.sequence) }

  /// Records `handler`; the first installs the event block, which captures this state alone.
  private func setHandler(_ new: EventHandler) {
    let install = locked.withLock { _ in
      if handling.ended { return false }
      _ = handling.set(new)
      defer { blockInstalled = true }
      return !blockInstalled
    }
    // The block holds this state unretained, as a `DescriptorWatch`'s does (its `init` says why
    // that is enough: this source cleans up too, `Source.cleansUp`).
    if install {
      Libdispatch.source_set_context_handler(raw, Unmanaged.passUnretained(self).toOpaque()) { block in
        Unmanaged<OwnedSourceState>.fromOpaque(Libdispatch.block_context(block)).takeUnretainedValue().fire()
      }
    }
  }

  /// The event block: the handler recorded now (none once cancelled).
  private func fire() {
    guard let handler = locked.withLock({ _ in handling.event() }) else { return }
    run(handler)
  }
}
