import Synchronization

/// What a source's handler blocks share: the target queue (read by every
/// handler call, for its frame) and the hooks they run, behind one lock. Held by the blocks
/// and by the source, never by the C source alone: a source whose handlers
/// are set is still released when its last reference goes (no cycle).
final class SourceHandlers: Sendable {
  /// The C source, not retained: the blocks that use it run while
  /// libdispatch holds the source.
  nonisolated(unsafe) let raw: OpaquePointer
  /// The target queue and its frame flags in one word (the queue's address
  /// with `frameExclusive` in bit 0, free in an object's address), so a
  /// handler starting during `setTarget` reads the old pair or the new pair,
  /// never the new queue with the old flag.
  let target: Atomic<UInt>

  /// The handlers the blocks call, each taken (and cleared) by the block that runs it, once.
  struct Hooks {
    /// The user's cancel handler.
    var cancel: Source.CancelHandler = .none
    /// The cancel block is installed (at once when there is `ownedCleanup`).
    var cancelInstalled: Bool
    /// Run at cancellation after the user's cancel handler: the event sequence's end (set once,
    /// by `SourceEvents`).
    var cancelHook: (@Sendable () -> Void)?
    /// The user's registration handler.
    var registration: Source.CancelHandler = .none
    /// The package's registration hook (a signal sequence's start waiting for registration).
    var registrationHook: (@Sendable () -> Void)?
    /// For a source `Source.startRegistered` started: its queue, held for `sendToTarget`.
    var heldTarget: Queue?
  }

  /// The one lock of the handlers: every hook, taken out under it and run outside it.
  let hooks: Mutex<Hooks>
  /// Run once at cancellation, after the user's cancel handler (or before it, when
  /// `cleanupFirst`).
  let ownedCleanup: (@Sendable () -> Void)?
  /// Whether `ownedCleanup` runs before the user's cancel handler: work that needs the user's
  /// descriptor still open (a nest's `EPOLL_CTL_DEL`), which the user closes in that handler.
  let cleanupFirst: Bool
  /// Set by `Source.startRegistered` before it activates the source: only then can libdispatch run
  /// a handler block on `Registration.queue`, so only then does a block ask where it runs. Relaxed:
  /// stored before `dispatch_activate`, whose release the callouts' invoke acquires.
  let startsRegistered = Atomic(false)

  init(raw: OpaquePointer, target: Queue, ownedCleanup: (@Sendable () -> Void)?, cleanupFirst: Bool = false) {
    self.raw = raw
    self.target = Atomic(SourceHandlers.targetWord(target))
    hooks = Mutex(Hooks(cancelInstalled: ownedCleanup != nil))
    self.ownedCleanup = ownedCleanup
    self.cleanupFirst = cleanupFirst
  }

  /// The queue's address and its exclusive bit as one word.
  static func targetWord(_ queue: Queue) -> UInt {
    UInt(bitPattern: UnsafeMutableRawPointer(queue.raw)) | (queue.flags & frameExclusive)
  }

  /// Records the new target queue (relaxed: the word is the only datum, and
  /// the queue it names is kept alive by the source's `Shared.target` and by
  /// libdispatch's target reference).
  func target(_ queue: Queue) {
    target.store(SourceHandlers.targetWord(queue), ordering: .relaxed)
    if startsRegistered.load(ordering: .relaxed) { hooks.withLock { $0.heldTarget = queue } }
  }

  /// Marks the source as started by `Source.startRegistered` (before it is activated), holding its
  /// queue for the handlers sent on from `Registration.queue`.
  func startRegistering(on queue: Queue) {
    hooks.withLock { $0.heldTarget = queue }
    startsRegistered.store(true, ordering: .relaxed)
  }

  /// A closure as a handler block that runs inside a frame of the target queue.
  func block(_ handler: @escaping @Sendable () -> Void) -> @convention(block) () -> Void {
    return { [self] in
      let word = target.load(ordering: .relaxed)
      let queue = OpaquePointer(bitPattern: word & ~frameExclusive).unsafelyUnwrapped
      withFrame(queue: queue, flags: word & frameExclusive, handler)
    }
  }

  /// Records the user's cancel handler; true when the cancel block is not
  /// installed yet (the caller installs it).
  func setCancelHandler(_ handler: Source.CancelHandler) -> Bool {
    hooks.withLock { hooks in
      hooks.cancel = handler
      defer { hooks.cancelInstalled = true }
      return !hooks.cancelInstalled
    }
  }

  /// The one cancel handler libdispatch sees: the user's, then the owner's cleanup.
  func installCancelBlock() {
    Libdispatch.source_set_cancel_handler(raw, block { [self] in cancelCallout() })
  }

  /// The cancel block's work. A registration that never ran (the source was cancelled first): its
  /// hook ends the start's wait, and neither closure may stay here (libdispatch frees the C block,
  /// not the closures, and a hook holds the source); taken outside the lock, before the rest.
  func cancelCallout() {
    // The user's registration handler never runs then (as in C): released here, outside the lock.
    let (_, registrationHook) = hooks.withLock { hooks in
      defer { (hooks.registration, hooks.registrationHook) = (.none, nil) }
      return (hooks.registration, hooks.registrationHook)
    }
    registrationHook?()
    if onRegistrationQueue { sendToTarget { [self] in cancelHandlers() } } else { cancelHandlers() }
  }

  /// The user's cancel handler, then the package's hook and cleanup (the cleanup first when
  /// `cleanupFirst`).
  func cancelHandlers() {
    if cleanupFirst { ownedCleanup?() }
    call(
      hooks.withLock { hooks in
        defer { hooks.cancel = .none }
        return hooks.cancel
      })
    hooks.withLock { hooks in
      defer { hooks.cancelHook = nil }
      return hooks.cancelHook
    }?()
    if !cleanupFirst { ownedCleanup?() }
  }

  /// Whether libdispatch runs this handler block on `Registration.queue`: a signal source's
  /// registration handler, its cancel handler before its new target took effect, or any handler
  /// when it stays there (its queue being the default global queue). The user's part then goes to
  /// the source's queue (`sendToTarget`).
  var onRegistrationQueue: Bool { startsRegistered.load(ordering: .relaxed) && Registration.isCurrent }

  /// Runs `body` on the source's queue, inside its frame, with the C source kept until it has run.
  ///
  /// Called from a registration or cancel block running on `Registration.queue`, where the C
  /// source holds `Registration.queue`, not the source's queue, and the `Source` that holds it may
  /// be gone: the queue comes from `Hooks.heldTarget`, which the handlers box keeps as long as its
  /// blocks live, and the send block holds it too (`RegistrationTests.droppedWithItsQueue`).
  func sendToTarget(_ body: @escaping @Sendable () -> Void) {
    guard let queue = hooks.withLock({ $0.heldTarget }) else { return body() }
    Libdispatch.retain(raw)
    Libdispatch.async_block(queue.raw) { [raw, queue] in
      withFrame(queue: queue.raw, flags: queue.flags & frameExclusive, body)
      Libdispatch.release(raw)
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

  /// Sets the package's hook run after the user's cancel handler, and
  /// installs the cancel block if it is not yet.
  func setCancelHook(_ hook: @escaping @Sendable () -> Void) {
    let install = hooks.withLock { hooks in
      hooks.cancelHook = hook
      defer { hooks.cancelInstalled = true }
      return !hooks.cancelInstalled
    }
    if install { installCancelBlock() }
  }

  /// Records the user's registration handler, or the package's hook, and
  /// installs a registration block that runs both, the package's first,
  /// once: the hook ends a start's wait (and the source's stay on
  /// `Registration.queue`), then the user's handler runs on the source's
  /// queue. Installed on every call, as the C function is: libdispatch runs
  /// a block set after registration at once.
  func setRegistration(handler: Source.CancelHandler? = nil, hook: (@Sendable () -> Void)? = nil) {
    hooks.withLock { hooks in
      if let handler { hooks.registration = handler }
      if let hook { hooks.registrationHook = hook }
    }
    Libdispatch.source_set_registration_handler(
      raw,
      block { [self] in
        let (handler, hook) = hooks.withLock { hooks in
          defer { (hooks.registration, hooks.registrationHook) = (.none, nil) }
          return (hooks.registration, hooks.registrationHook)
        }
        hook?()
        if case .none = handler { return }
        if onRegistrationQueue { sendToTarget { [self] in call(handler) } } else { call(handler) }
      })
  }
}
