import Synchronization

/// One PSI trigger and how libdispatch learns that it fired.
///
/// A trigger is a pressure file opened `O_RDWR | O_NONBLOCK` with
/// `"<some|full> <threshold µs> <window µs>"` and a NUL written to it. The
/// kernel then reports `EPOLLPRI` on that descriptor each time the stall
/// within the window crosses the threshold (at most once per window). The
/// descriptor itself is always readable (`EPOLLIN`), so a libdispatch read
/// source on it would fire on every poll; libdispatch watches no `EPOLLPRI`.
/// So the trigger sits in an epoll descriptor of its own, registered for
/// `EPOLLPRI` only, and a libdispatch read source watches that epoll
/// descriptor, which is readable exactly when the trigger has fired.
///
/// One epoll descriptor per trigger, not one for all: when libdispatch's
/// epoll polls ours, the kernel polls the trigger, and polling a PSI trigger
/// consumes its event (`psi_trigger_poll` swaps it to 0). Our own
/// `epoll_wait` afterwards may then report nothing — measured on Linux 6.18
/// with two triggers in one epoll descriptor: one of the two fires was lost.
/// With one trigger per epoll descriptor, the read source firing is the
/// event, whatever `epoll_wait` reports; the drain only empties the ready
/// list and notices a trigger whose file is gone (`EPOLLERR`: its cgroup
/// was removed), which is taken out of the epoll set so it does not spin.
///
/// Both descriptors are `O_CLOEXEC`, owned here, closed exactly once: by
/// `stop()` while idle, otherwise in the read source's cancel handler, after
/// libdispatch has stopped watching the epoll descriptor.
final class PressureTrigger: InternalReaderOwner {
  /// The queue every pressure reader runs on: their handlers are a drain
  /// and a merge.
  static let queue = Queue(label: "GCD.PressureSource.triggers")

  /// The trigger: the pressure file opened for writing, the trigger written.
  let descriptor: Int32
  /// The epoll descriptor holding `descriptor` for `EPOLLPRI`.
  let epoll: Int32
  private let phase = Mutex(WatcherPhase<InternalReader>.idle)

  /// Opens `path`, writes the trigger and makes the epoll descriptor.
  ///
  /// - Throws: `GCDError` naming `operation`, the call and errno, with the
  ///   kernel's rules for an `EINVAL`.
  init(path: String, stall: String, threshold: UInt32, window: UInt32, operation: String) throws(GCDError) {
    let explain = { (error: Int32) in PressureFile.explain(error, path: path) }
    let descriptor = try checkedCall(operation + ": open(\"\(path)\", O_RDWR)", detail: explain) {
      system_openPressureTrigger(path)
    }
    let spec = "\(stall) \(threshold) \(window)"
    do {
      _ = try checkedCall(operation + ": write(\"\(spec)\") to \(path)", detail: explain) {
        system_writeWithNul(descriptor, spec)
      }
      epoll = try checkedCall(operation + ": epoll_create1") { system_epoll_create() }
    } catch {
      system_close(descriptor)
      throw error
    }
    self.descriptor = descriptor
    do {
      _ = try checkedCall(operation + ": epoll_ctl(EPOLL_CTL_ADD, EPOLLPRI)") {
        system_epoll_addPriority(epoll, descriptor)
      }
    } catch {
      system_close(epoll)
      system_close(descriptor)
      throw error
    }
  }

  /// Starts watching: `fired` runs on `PressureTrigger.queue` each time the
  /// trigger fires (once per merged batch of fires).
  func start(_ fired: @escaping @Sendable () -> Void) {
    startReading(epoll, queue: PressureTrigger.queue.raw) { _ in
      { [epoll, descriptor] in
        let reported = system_epoll_drain(epoll)
        if reported & system_epollError != 0 {
          // The file is gone (its cgroup was removed): it will never fire again.
          system_epoll_remove(epoll, descriptor)
          return
        }
        fired()
      }
    }
  }

  /// Stops watching and closes both descriptors (now while idle, else in
  /// the reader's cancel handler). Later calls do nothing.
  func stop() { stopReading() }

  func withReaderPhase<Result: Sendable>(_ body: (inout WatcherPhase<InternalReader>) -> Result) -> Result {
    phase.withLock { body(&$0) }
  }

  func closeDescriptors() {
    system_close(epoll)
    system_close(descriptor)
  }
}
