import CDispatch
import CGCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The process events a `ProcSource` can watch, named after the C flags
/// (`dispatch_source_proc_flags_t`), with the same raw values.
///
/// On Linux only `.exit` can be delivered: `.fork`, `.exec` and `.signal`
/// need `ptrace` or the kernel's process-events connector (privileged), so
/// `ProcSource` rejects them with `ENOTSUP` rather than never firing.
public struct ProcEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
  public let rawValue: UInt

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

  public var description: String { describeFlags(self, names: ProcEvents.names) }
}

/// Watches another process (any process, not only a child) and fires when
/// it exits; `data` holds the `ProcEvents` bits that fired (`.exit`).
///
/// The source does not reap the process: a parent still calls `waitpid`.
/// `.exit` is delivered once, even when the process had already exited
/// before `resume()`.
///
/// On Linux the source holds a `pidfd_open(2)` descriptor on the process
/// from creation (so the pid cannot be reused under it) and, from the first
/// `resume()`, an internal read source on it; the descriptor is closed once,
/// when the exit has been delivered or when this source is cancelled or
/// dropped, whichever comes first. Once started, the descriptor is closed
/// in the internal source's cancel handler, asynchronously, shortly after
/// the cancel: a tight loop that creates and cancels thousands of started
/// `ProcSource`s can hold that many descriptors for a moment (and meet the
/// descriptor limit); pace such loops.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_PROC`.
public final class ProcSource: SourceCore, Source, @unchecked Sendable {
  /// The watched process.
  public let pid: pid_t
  /// The events the source watches (`mask`).
  public let watchedEvents: ProcEvents
  let watcher: PidWatcher

  /// Creates a source that watches process `pid` for `events`, with
  /// handlers on `queue`.
  ///
  /// - Throws: `GCDError` with `ESRCH` when there is no process `pid` (it
  ///   never existed, or it has exited and been reaped); `ENOTSUP` for
  ///   `.fork`, `.exec` and `.signal`, which Linux cannot deliver to an
  ///   unprivileged process; `EINVAL` for a pid below 1 or unknown bits.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(pid: pid_t, events: ProcEvents = .exit, queue: Queue) throws(GCDError) {
    let operation = "ProcSource(pid: \(pid), events: \(events))"
    let known = ProcEvents.names.reduce(ProcEvents()) { $0.union($1.0) }
    guard events.isSubset(of: known) else {
      throw GCDError(
        operation: operation, errno: EINVAL,
        detail: "unknown event bits 0x\(String(events.subtracting(known).rawValue, radix: 16))")
    }
    let unsupported = events.subtracting(.exit)
    guard unsupported.isEmpty else {
      throw GCDError(
        operation: operation, errno: ENOTSUP,
        detail: "unsupported on Linux: \(unsupported) (only .exit can be observed without ptrace or"
          + " the privileged process-events connector)")
    }
    guard pid > 0 else {
      throw GCDError(operation: operation, errno: EINVAL, detail: "a process id is 1 or more")
    }
    let descriptor = cgcd_pidfd_open(pid, 0)
    guard descriptor >= 0 else {
      let error = Glibc.errno
      let detail: String? =
        switch error {
        case ESRCH: "no process with this id (it never existed, or it exited and was reaped)"
        case ENOSYS: "pidfd_open(2) needs Linux 5.3 or later"
        case EINVAL: "not a process id (a thread id that is not its process's main thread?)"
        default: nil
        }
      throw GCDError(operation: operation + ": pidfd_open", errno: error, detail: detail)
    }
    let watcher = PidWatcher(descriptor: descriptor, bits: events.intersection(.exit).rawValue)
    let created: OpaquePointer
    do {
      created = try SourceCore.create(type: cgcd_source_type_data_or(), handle: 0, mask: 0, queue: queue)
    } catch {
      watcher.stop()
      throw error
    }
    self.pid = pid
    self.watchedEvents = events
    self.watcher = watcher
    super.init(
      created: created, queue: queue, ownedCleanup: { watcher.stop() }, onActivate: { watcher.start() })
    watcher.setTarget(raw)
  }

  /// The `ProcEvents` bits that fired, as a raw value (`.exit`).
  public var data: UInt { dispatch_source_get_data(raw) }
  /// The events that fired: what the event being handled reports (`.exit`).
  public var firedEvents: ProcEvents { ProcEvents(rawValue: data) }
  /// The events the source watches, as a raw value.
  public var mask: UInt { watchedEvents.rawValue }
  /// The watched pid.
  public var handle: UInt { UInt(truncatingIfNeeded: Int(pid)) }
}

/// The Linux half of a `ProcSource`: the pidfd and the internal read source
/// that turns its readability into one `.exit` merged into the user source.
///
/// The descriptor is closed exactly once: by `stop()` if the internal
/// source was never started, otherwise in the internal source's cancel
/// handler (after libdispatch has stopped watching it). The internal
/// source is cancelled by its own event handler (a pidfd stays readable
/// after the exit) or by `stop()`, whichever comes first.
final class PidWatcher: @unchecked Sendable {
  enum Phase {
    /// Not started; the descriptor is open.
    case idle
    /// The internal source watches the descriptor.
    case running(SourceRef)
    /// The descriptor is closed.
    case closed
  }

  /// A C source pointer held in `Sendable` state (libdispatch objects are thread-safe).
  struct SourceRef: @unchecked Sendable {
    let raw: OpaquePointer
  }

  struct State {
    var phase = Phase.idle
    /// The user's DATA_OR source, retained while the internal source runs.
    var target: SourceRef?
  }

  let descriptor: Int32
  /// The bits merged into the user source on exit (0 when `.exit` is not watched).
  let bits: UInt
  let state = Mutex(State())

  init(descriptor: Int32, bits: UInt) {
    self.descriptor = descriptor
    self.bits = bits
  }

  func setTarget(_ target: OpaquePointer) { state.withLock { $0.target = SourceRef(raw: target) } }

  /// Starts the internal source (the user source's first `resume()`).
  func start() {
    let started = state.withLock { (state: inout State) -> SourceRef? in
      guard case .idle = state.phase, let target = state.target?.raw,
        let created = cgcd_source_create(
          cgcd_source_type_read(), UInt(descriptor), 0, Queue.global().raw.raw)
      else { return nil }
      let reader = OpaquePointer(created)
      cgcd_retain(target.raw)
      let bits = bits
      let descriptor = descriptor
      dispatch_source_set_event_handler(reader) {
        // A pidfd stays readable once the process has exited: deliver once
        // and stop watching. No event handler runs after the cancel.
        if bits != 0 { dispatch_source_merge_data(target, bits) }
        dispatch_source_cancel(reader)
      }
      dispatch_source_set_cancel_handler(reader) { [self] in
        close(descriptor)
        self.state.withLock { $0.phase = .closed }
        cgcd_release(target.raw)
        cgcd_release(reader.raw)
      }
      state.phase = .running(SourceRef(raw: reader))
      return SourceRef(raw: reader)
    }
    if let started { dispatch_activate(started.raw.object) }
  }

  /// Stops watching and closes the descriptor (the user source's cancel path).
  func stop() {
    let close: Bool = state.withLock { state in
      switch state.phase {
      case .idle:
        state.phase = .closed
        return true
      case .running(let reader):
        // Cancelled under the lock: its cancel handler (which releases it)
        // takes the lock before it can release the C object.
        dispatch_source_cancel(reader.raw)
        return false
      case .closed:
        return false
      }
    }
    if close { Glibc.close(descriptor) }
  }
}
