/// Where signal sources register when a sequence starts them (`makeEvents()`, `sequence(of:)`,
/// `withSignals`), and where they stay: a serial queue of the package's own, so that making the
/// sequence returns once the kernel watches, and the sequence's deliveries and end come, whatever
/// the user's queue is doing (suspended, inactive, held by the caller).
/// Only a signal needs the wait (`Source.losesEventsBeforeRegistration`).
///
/// libdispatch installs a source on its manager thread, then runs the registration handler on the
/// source's target queue: the only part of a registration that needs a queue. A source started here
/// targets this queue from before its activation to its end: libdispatch counts a new target of an
/// active source as deprecated use, and `LIBDISPATCH_STRICT=1` stops the process on it. Only the
/// package's own handlers run here (a sequence's event block, the signal deliveries, the end of a
/// sequence); the user's registration, cancel and event handlers are sent on to the source's queue
/// (`SourceState.sendToTarget`), which `setTarget(_:)` then only records.
///
/// A serial queue is overcommit: libdispatch gives it a thread even when every worker is busy, so
/// the wait is as long as the manager thread's install and one handler call — microseconds.
enum Registration {
  /// The queue, marked with `Libdispatch.registrationKey` so a handler block can tell it runs here.
  static let queue: Queue = {
    let queue = Queue(label: "GCD.registration")
    let key = Libdispatch.registrationKey
    Libdispatch.queue_set_specific(queue.raw, key, UnsafeMutableRawPointer(mutating: key), nil)
    return queue
  }()

  /// Whether the calling thread runs a block of `queue` (a source's handler block, while the source
  /// still targets it).
  static var isCurrent: Bool { Libdispatch.get_specific(Libdispatch.registrationKey) != nil }
}

extension Source {
  /// Claims the source's first start (`Lifecycle.claimStart`): true when this call starts it, and
  /// the source is then active in the word and inactive in C until `startRegistered` activates it.
  final func claimStart() -> Bool {
    lifecycle.update { $0.claimStart() } == .activate
  }

  /// Activates `sources`, each claimed by `claimStart()`, registering on `Registration.queue`, and
  /// returns once every one is registered (the kernel watches it) or cancelled; each stays on that
  /// queue and sends the user's handlers on to its own.
  ///
  /// Each source's target is the registration queue from while it is inactive (set before
  /// activation, so at once, and never changed again); its registration block runs the package's
  /// hook first (`endRegistration`, then the group's leave), the user's registration handler after
  /// it, on the user's queue. A source cancelled before it registers never runs its registration
  /// handler (as in C): its cancel block runs the hook instead.
  static func startRegistered(_ sources: [Source]) {
    if Registration.isCurrent {
      // Only a handler of the package's runs there, and none makes a sequence; a user's event
      // handler set on a source while its sequence registers could, and would wait on itself.
      fatalError("GCD: a sequence was made from a handler running on GCD.registration; make it on the source's queue")
    }
    let registered = Group()
    for source in sources {
      registered.enter()
      let state = source.state
      state.startRegistering()
      Libdispatch.set_target_queue(source.raw, Registration.queue.raw)
      state.setRegistration(hook: { [state] in
        state.endRegistration()
        registered.leave()
      })
      source.runStartHook()
      Libdispatch.activate(source.raw)
    }
    _ = Libdispatch.group_wait(registered.raw, Libdispatch.timeForever)
  }
}
