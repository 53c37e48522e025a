/// The process events a `ProcSource` can watch, named after the C flags
/// (`dispatch_source_proc_flags_t`), with the same raw values.
///
/// On Linux only `.exit` can be delivered: `.fork`, `.exec` and `.signal`
/// need `ptrace` or the kernel's process-events connector (privileged), so
/// `ProcSource` rejects them with `ENOTSUP` rather than never firing.
public struct ProcEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
  /// The `dispatch_source_proc_flags_t` bits.
  public let rawValue: UInt

  /// Creates the event set whose bits are these `DISPATCH_PROC_*` flags.
  ///
  /// - Parameter rawValue: `DISPATCH_PROC_*` bits.
  public init(rawValue: UInt) { self.rawValue = rawValue }

  /// The process exited. `DISPATCH_PROC_EXIT`.
  public static let exit = ProcEvents(rawValue: 0x8000_0000)
  /// The process forked. `DISPATCH_PROC_FORK` (unsupported on Linux).
  public static let fork = ProcEvents(rawValue: 0x4000_0000)
  /// The process called `exec`. `DISPATCH_PROC_EXEC` (unsupported on Linux).
  public static let exec = ProcEvents(rawValue: 0x2000_0000)
  /// A signal was delivered to the process. `DISPATCH_PROC_SIGNAL` (unsupported on Linux).
  public static let signal = ProcEvents(rawValue: 0x0800_0000)

  /// Every flag (only `.exit` can be watched on Linux).
  public static let all: ProcEvents = [.exit, .fork, .exec, .signal]

  static let names: [(ProcEvents, String)] = [
    (.exit, ".exit"), (.fork, ".fork"), (.exec, ".exec"), (.signal, ".signal"),
  ]

  /// `[.exit]`-style: the named flags, then any unnamed bits in hex.
  public var description: String { describeFlags(self, names: ProcEvents.names) }
}

/// Watches another process (any process, not only a child) and fires when
/// it exits; `firedEvents` says what fired (`.exit`).
///
/// The source does not reap the process: a parent still calls `waitpid`.
/// `.exit` is delivered once, even when the process had already exited
/// before `resume()`.
///
/// On Linux the source watches a pidfd: `init(pid:)` opens one with
/// `pidfd_open(2)` at creation (so the pid cannot be reused under it) and
/// owns it; `init(pidfd:)` watches one the caller holds (from `clone3` or
/// `pidfd_open`) and leaves it open. The pidfd sits in the package's
/// descriptor fence, the one epoll instance that also holds the read and
/// write sources' descriptors (a pidfd hangs up once its process is reaped,
/// which libdispatch's epoll layer must not see:
/// swift-corelibs-libdispatch#949): one descriptor per source from a pid,
/// none from a pidfd. An owned pidfd is closed once, when the exit has been
/// delivered or when this source is cancelled or dropped, whichever comes
/// first.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_PROC`.
public final class ProcSource: EventSetSource<ProcEvents>, @unchecked Sendable {
  /// The watched process (from `init(pidfd:)`: the pidfd's, as `/proc/self/fdinfo` gives it;
  /// -1 when the process had been reaped already).
  public let pid: Int32
  /// The events the source watches (`mask`).
  public let watchedEvents: ProcEvents

  /// Creates a source that watches process `pid` for `events`, with
  /// handlers on `queue`.
  ///
  /// - Throws: `GCDError` with `ESRCH` when there is no process `pid` (it
  ///   never existed, or it has exited and been reaped); `EMFILE` naming
  ///   `pidfd_open` when no descriptor is left (or `epoll_create1`, for the process's first
  ///   source of a descriptor: the fence's instance); `ENOTSUP` for
  ///   `.fork`, `.exec` and `.signal`, which Linux cannot deliver to an
  ///   unprivileged process; `EINVAL` for an empty event set (it would never
  ///   fire) and for a pid below 1. Bits beside
  ///   `ProcEvents`' four stop the process with a message (a programmer
  ///   error, as for `TimerSource.Flags` and `WorkItem.Flags`).
  ///
  /// - Parameters:
  ///   - pid: The process to watch (a `pid_t`).
  ///   - events: What to watch for; only `.exit` on Linux.
  ///   - queue: The queue the handlers run on.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(pid: Int32, events: ProcEvents = .exit, queue: Queue) throws(GCDError) {
    let operation = "ProcSource(pid: \(pid), events: \(events))"
    try ProcSource.check(events, operation)
    guard pid > 0 else {
      throw GCDError(operation: operation, errno: Errno.invalidArgument, detail: "a process id is 1 or more")
    }
    let descriptor = try checkedCall(operation + ": pidfd_open", detail: ProcSource.explain) {
      system_pidfd_open(pid)
    }
    let (created, watch) = try Source.create(
      pidfd: descriptor, bits: events.intersection(.exit).rawValue, owns: true, queue: queue, operation: operation)
    self.pid = pid
    watchedEvents = events
    super.init(created: created, queue: queue, watch: watch)
  }

  /// Creates a source that watches the process `pidfd` refers to, for `events`, with handlers on
  /// `queue`. The source does not close `pidfd` (it is the caller's, as a `ReadSource`'s
  /// descriptor is): keep it open until the source is cancelled. It costs no descriptor.
  ///
  /// - Throws: `GCDError` with `EBADF` when `pidfd` is not an open descriptor, `EINVAL` when it is
  ///   not a pidfd, for an empty event set and on the other errors of `init(pid:events:queue:)`.
  ///
  /// - Parameters:
  ///   - pidfd: A pidfd (from `pidfd_open(2)`, or `clone3` with `CLONE_PIDFD`).
  ///   - events: What to watch for; only `.exit` on Linux.
  ///   - queue: The queue the handlers run on.
  ///
  /// The corresponding C function is `dispatch_source_create` (with the pidfd's process).
  public init(pidfd: Int32, events: ProcEvents = .exit, queue: Queue) throws(GCDError) {
    let operation = "ProcSource(pidfd: \(pidfd), events: \(events))"
    try ProcSource.check(events, operation)
    guard let process = system_pidfdProcess(pidfd) else {
      if !system_isOpen(pidfd) {
        throw GCDError(operation: operation, errno: Errno.badFileDescriptor, detail: "not an open file descriptor")
      }
      throw GCDError(operation: operation, errno: Errno.invalidArgument, detail: "not a pidfd")
    }
    let (created, watch) = try Source.create(
      pidfd: pidfd, bits: events.intersection(.exit).rawValue, owns: false, queue: queue, operation: operation)
    self.pid = process
    watchedEvents = events
    super.init(created: created, queue: queue, watch: watch)
  }

  /// The event set's checks, shared by the initializers.
  private static func check(_ events: ProcEvents, _ operation: String) throws(GCDError) {
    guard !events.isEmpty else {
      throw GCDError(operation: operation, errno: Errno.invalidArgument, detail: "no events to watch")
    }
    requireKnownBits(events, of: .all, operation, "libdispatch knows no such process event")
    let unsupported = events.subtracting(.exit)
    guard unsupported.isEmpty else {
      throw GCDError(
        operation: operation, errno: Errno.notSupported,
        detail: "unsupported on Linux: \(unsupported) (only .exit can be observed without ptrace or"
          + " the privileged process-events connector)")
    }
  }

  /// What an errno from `pidfd_open` means here.
  private static func explain(_ error: Int32) -> String? {
    switch error {
    case Errno.noSuchProcess: "no process with this id (it never existed, or it exited and was reaped)"
    case Errno.noFunction: "pidfd_open(2) needs Linux 5.3 or later"
    case Errno.invalidArgument: "not a process id (a thread id that is not its process's main thread?)"
    case Errno.tooManyOpenFiles: "no descriptor left in this process for the pidfd"
    default: nil
    }
  }

  /// The events the source watches, as a raw value.
  public override var mask: UInt { watchedEvents.rawValue }
  /// The watched pid.
  public override var handle: UInt { UInt(truncatingIfNeeded: Int(pid)) }
}
