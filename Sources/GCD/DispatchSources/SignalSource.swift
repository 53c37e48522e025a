/// Observes deliveries of a signal to the process.
///
/// Deliveries that arrive close together are merged: `count` says how many
/// one event stands for.
///
/// On Linux, libdispatch reads signals from a `signalfd`, and a signal
/// reaches a signalfd only while it is blocked; so when the first source
/// for a signal registers, libdispatch installs its own handler for it
/// (which blocks the signal in the receiving thread and raises it again,
/// towards the signalfd). That replaces the previous disposition —
/// `SIG_IGN`, `SIG_DFL` or your handler — for the rest of the process's
/// life, also after the source is cancelled. So: set `signal(SIGHUP,
/// SIG_IGN)` first as the listing does (it keeps the signal harmless until
/// the source registers), and do not call `signal` or `sigaction` for that
/// signal afterwards: replacing libdispatch's handler silently stops every
/// source of that signal.
///
/// Rejected, by every entry point alike (`init(signal:queue:)`,
/// `withSignals`, `sequence(of:)`, `canObserve(_:)`): the signals that
/// cannot be observed (`SIGKILL`, `SIGSTOP`); those that mean the process
/// is broken (`SIGSEGV`, `SIGBUS`, `SIGILL`, `SIGFPE`); `SIGTRAP`, `SIGSYS`,
/// `SIGPIPE` and `SIGPROF`, which libdispatch never blocks on its threads,
/// so its handler re-raises them on its manager thread forever (measured:
/// the event is lost and that thread spins); and the C library's own (32
/// and 33 on glibc, below `SIGRTMIN`: glibc refuses libdispatch's handler
/// for them).
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_SIGNAL`.
public final class SignalSource: ValueSource, @unchecked Sendable {
  /// Whether a `SignalSource` can observe `signal`: a signal number
  /// (1...64) other than SIGKILL, SIGSTOP, SIGSEGV, SIGBUS, SIGILL, SIGFPE,
  /// SIGTRAP, SIGSYS, SIGPIPE, SIGPROF and the C library's own (from 32 up
  /// to `SIGRTMIN`: 32 and 33 on glibc). `SignalSource(signal:queue:)`, `withSignals` and
  /// `sequence(of:)` throw `EINVAL` exactly when this is false. Two tests,
  /// no system call.
  ///
  /// - Parameter signal: The signal number.
  public static func canObserve(_ signal: Int32) -> Bool {
    signal >= 1 && signal <= 64 && unobservableMask & (1 << UInt64(signal - 1)) == 0
  }

  /// Bit `n - 1` set for each signal `n` that cannot be observed.
  static let unobservableMask: UInt64 =
    (32..<system_sigrtmin()).reduce(unobservableSignals.reduce(0) { $0 | 1 << UInt64($1.number - 1) }) {
      $0 | 1 << UInt64($1 - 1)
    }

  /// Why `signal` cannot be observed, or nil if it can.
  static func rejection(of signal: Int32) -> String? {
    if let entry = unobservableSignals.first(where: { $0.number == signal }) { return "\(entry.name) \(entry.reason)" }
    guard (1...64).contains(signal) else { return "not a signal number (1...64)" }
    let rtmin = system_sigrtmin()
    guard (32..<rtmin).contains(signal) else { return nil }
    return
      "signal \(signal) is the C library's own (glibc: SIGCANCEL 32, SIGSETXID 33; SIGRTMIN is \(rtmin)): glibc refuses libdispatch's handler for it, so no source can observe it"
  }

  /// The one validation of every entry point: `EINVAL` naming `operation` and the reason unless
  /// `signal` can be observed.
  static func check(_ signal: Int32, operation: @autoclosure () -> String) throws(GCDError) {
    if !canObserve(signal) {
      throw GCDError(
        operation: operation(), errno: Errno.invalidArgument, detail: rejection(of: signal) ?? "cannot be observed")
    }
  }

  /// `signals` checked (`check`) with repeats removed: first occurrences, in order.
  static func validated(_ signals: [Int32], operation: @autoclosure () -> String) throws(GCDError) -> [Int32] {
    var unique: [Int32] = []
    unique.reserveCapacity(signals.count)
    for signal in signals where !unique.contains(signal) {
      try check(signal, operation: operation())
      unique.append(signal)
    }
    return unique
  }

  /// Creates a source that observes `signal`, with handlers on `queue`.
  ///
  /// - Parameters:
  ///   - signal: The signal number (`SIGHUP`, `SIGTERM`, …).
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `EINVAL` for a number that is not a signal
  ///   or for a signal that cannot be observed.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(signal: Int32, queue: Queue) throws(GCDError) {
    try SignalSource.check(signal, operation: "SignalSource(signal: \(signal))")
    super.init(created: try Source.create(.signal, handle: UInt(signal), queue: queue), queue: queue)
  }

  /// A signal delivered before the source registers takes its disposition: the sequence waits.
  override var losesEventsBeforeRegistration: Bool { true }

  /// The number of deliveries merged into the event being handled (`data`).
  public var count: UInt { data }

  /// The observed signal.
  public var signal: Int32 { Int32(truncatingIfNeeded: handle) }
}
