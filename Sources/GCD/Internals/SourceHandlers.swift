import Synchronization

/// What a source's handler blocks share: the target queue (read by every
/// handler call, for its frame) and the cancel handler. Held by the blocks
/// and by the source, never by the C source alone: a source whose handlers
/// are set is still released when its last reference goes (no cycle).
final class SourceHandlers: Sendable {
  /// The C source, not retained: the blocks that use it run while
  /// libdispatch holds the source.
  nonisolated(unsafe) let raw: OpaquePointer
  /// The target queue and its frame flags.
  let targetRaw: Atomic<UInt>
  let targetFlags: Atomic<UInt>
  let cancel: Mutex<(handler: Source.CancelHandler, installed: Bool)>
  /// The user's registration handler and the package's own hook (an event
  /// sequence waiting for registration), run by the registration block.
  let registration = Mutex<(handler: Source.CancelHandler, hook: (@Sendable () -> Void)?)>((handler: .none, hook: nil))
  /// Run at cancellation after the user's cancel handler: the event
  /// sequence's end (set once, by `SourceEvents`).
  let cancelHook = Mutex<(@Sendable () -> Void)?>(nil)
  /// Run once at cancellation, after the user's cancel handler.
  let ownedCleanup: (@Sendable () -> Void)?

  init(raw: OpaquePointer, target: Queue, ownedCleanup: (@Sendable () -> Void)?) {
    self.raw = raw
    targetRaw = Atomic(UInt(bitPattern: UnsafeMutableRawPointer(target.raw)))
    targetFlags = Atomic(target.flags & frameExclusive)
    cancel = Mutex((handler: .none, installed: ownedCleanup != nil))
    self.ownedCleanup = ownedCleanup
  }

  func target(_ queue: Queue) {
    targetRaw.store(UInt(bitPattern: UnsafeMutableRawPointer(queue.raw)), ordering: .relaxed)
    targetFlags.store(queue.flags & frameExclusive, ordering: .relaxed)
  }

  /// A closure as a handler block that runs inside a frame of the target queue.
  func block(_ handler: @escaping @Sendable () -> Void) -> @convention(block) () -> Void {
    return { [self] in
      let queue = OpaquePointer(bitPattern: targetRaw.load(ordering: .relaxed)).unsafelyUnwrapped
      withFrame(queue: queue, flags: targetFlags.load(ordering: .relaxed), handler)
    }
  }

  /// Records the user's cancel handler; true when the cancel block is not
  /// installed yet (the caller installs it).
  func setCancelHandler(_ handler: Source.CancelHandler) -> Bool {
    cancel.withLock { cancel in
      cancel.handler = handler
      defer { cancel.installed = true }
      return !cancel.installed
    }
  }

  /// The one cancel handler libdispatch sees: the user's, then the owner's cleanup.
  func installCancelBlock() {
    let run: @Sendable () -> Void = { [self] in
      let handler = cancel.withLock { cancel in
        defer { cancel.handler = .none }
        return cancel.handler
      }
      switch handler {
      case .none: break
      case .closure(let closure): closure()
      case .function(let function): function(Libdispatch.get_context(raw))
      }
      cancelHook.withLock { hook in
        defer { hook = nil }
        return hook
      }?()
      ownedCleanup?()
    }
    Libdispatch.source_set_cancel_handler(raw, block(run))
  }

  /// Sets the package's hook run after the user's cancel handler, and
  /// installs the cancel block if it is not yet.
  func setCancelHook(_ hook: @escaping @Sendable () -> Void) {
    cancelHook.withLock { $0 = hook }
    let install = cancel.withLock { cancel in
      defer { cancel.installed = true }
      return !cancel.installed
    }
    if install { installCancelBlock() }
  }

  /// Records the user's registration handler, or the package's hook, and
  /// installs a registration block that runs both, the user's first, once.
  /// Installed on every call, as the C function is: libdispatch runs a block
  /// set after registration at once.
  func setRegistration(handler: Source.CancelHandler? = nil, hook: (@Sendable () -> Void)? = nil) {
    registration.withLock { registration in
      if let handler { registration.handler = handler }
      if let hook { registration.hook = hook }
    }
    let run: @Sendable () -> Void = { [self] in
      let (handler, hook) = registration.withLock { registration in
        defer { (registration.handler, registration.hook) = (.none, nil) }
        return (registration.handler, registration.hook)
      }
      switch handler {
      case .none: break
      case .closure(let closure): closure()
      case .function(let function): function(Libdispatch.get_context(raw))
      }
      hook?()
    }
    Libdispatch.source_set_registration_handler(raw, block(run))
  }
}
