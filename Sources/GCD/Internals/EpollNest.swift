/// An epoll instance of the package's own between libdispatch and a `ProcSource`'s pidfd
/// (swift-corelibs-libdispatch#949; docs/sources-linux.md, "Process sources").
///
/// libdispatch's epoll layer frees the record of a descriptor that reported a hang-up or an error
/// while its manager thread may still use it, and a pidfd hangs up once its process is reaped. So
/// the pidfd is registered, level-triggered, for `EPOLLIN` in an instance of its own, and the
/// process source's internal reader (`PidWatcher`) watches the instance: an epoll instance is
/// readable exactly while a descriptor in it is ready — `EPOLLHUP` counts — and never reports a
/// hang-up or an error itself. No `epoll_wait` is made on it: libdispatch's own `epoll_wait` sees
/// it readable. The instance is closed once, with the pidfd, when the watcher stops.
///
/// (Read and write sources use the process's one `DescriptorFence` instead: a pidfd's watcher is
/// one read source of the package's own that reads the pidfd once and stops, and it stays on its
/// nest.)
final class EpollNest: Sendable {
  /// The epoll instance: what libdispatch watches.
  let instance: Int32

  private init(instance: Int32) {
    self.instance = instance
  }

  /// An instance holding `descriptor` for `EPOLLIN`; nil when epoll cannot watch the descriptor
  /// (`EPERM`).
  ///
  /// - Throws: `GCDError` naming `operation` and `epoll_create1` (`EMFILE` when the descriptor
  ///   table is full) or `epoll_ctl` (`ENOMEM`, `ENOSPC` when `max_user_watches` is reached).
  static func make(watching descriptor: Int32, operation: @autoclosure () -> String) throws(GCDError) -> EpollNest? {
    let instance = try checkedCall(operation() + ": epoll_create1", detail: explainCreate) { system_epoll_create() }
    do {
      _ = try checkedCall(operation() + ": epoll_ctl(EPOLL_CTL_ADD)", detail: explainAdd) {
        system_epoll_add(instance, descriptor, writable: false)
      }
    } catch {
      system_close(instance)
      if error.errno == Errno.notPermitted { return nil }
      throw error
    }
    return EpollNest(instance: instance)
  }

  /// Closes the instance (its registration of the descriptor goes with it). Called once.
  func close() {
    system_close(instance)
  }

  private static func explainCreate(_ error: Int32) -> String? {
    switch error {
    case Errno.tooManyOpenFiles:
      "no descriptor left in this process for the process source's epoll instance (each ProcSource takes one,"
        + " besides its pidfd)"
    case Errno.tooManyOpenFilesInSystem: "the system's file table is full"
    default: nil
    }
  }

  private static func explainAdd(_ error: Int32) -> String? {
    switch error {
    case Errno.noSpace: "the per-user epoll watch limit (/proc/sys/fs/epoll/max_user_watches) is reached"
    case Errno.badFileDescriptor: "not an open file descriptor"
    default: nil
    }
  }
}
