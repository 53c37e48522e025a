import Synchronization

/// An epoll instance of the package's own between libdispatch and a descriptor that can hang up
/// (swift-corelibs-libdispatch#949; docs/sources-linux.md, "Descriptor sources: the nested epoll").
///
/// libdispatch's epoll layer frees the record of a descriptor that reported a hang-up or an error
/// while its manager thread may still use it (a use after free under connection churn). So a
/// `ReadSource`, a `WriteSource` and a `ProcSource`'s pidfd never show libdispatch the descriptor
/// itself: the descriptor is registered, level-triggered, for `EPOLLIN` (or `EPOLLOUT`) in an
/// instance of its own, and libdispatch watches the instance with a read source. An epoll
/// instance is readable exactly while a descriptor in it is ready — `EPOLLHUP` and `EPOLLERR`
/// count, so end of file and errors still wake the handler — and never reports a hang-up or an
/// error itself. No `epoll_wait` is made on it: libdispatch's own `epoll_wait` sees it readable,
/// and its re-arm after each handler call asks the kernel, which checks the nested descriptor.
///
/// The instance is closed exactly once, by `close()`, in the owning source's cancel path after
/// libdispatch has unregistered it (the cancel handler runs after libdispatch's `EPOLL_CTL_DEL`),
/// or on a creation that fails. The watched descriptor stays its owner's: closing the instance
/// only drops the registration.
final class EpollNest: Sendable {
  /// The epoll instance: what libdispatch watches.
  let instance: Int32
  /// The descriptor registered in it, read for the size estimate.
  let watched: Int32
  /// Whether `watched` is registered for `EPOLLOUT` (a write source) rather than `EPOLLIN`.
  let writable: Bool
  /// Set once the queue-size request has failed on `watched` (a pipe's write end, a listening
  /// socket, a pidfd): the estimate is then 1 without a call, as libdispatch's is. Relaxed: two
  /// threads that read the estimate at once may both make the failing call once; each returns 1.
  private let estimateUnsupported = Atomic<Bool>(false)

  private init(instance: Int32, watched: Int32, writable: Bool) {
    self.instance = instance
    self.watched = watched
    self.writable = writable
  }

  /// An instance holding `descriptor` for `EPOLLIN`, or `EPOLLOUT` when `writable`; nil when epoll
  /// cannot watch the descriptor (`EPERM`: a character device without poll support, say) — then
  /// libdispatch watches it directly, as it always has.
  ///
  /// - Throws: `GCDError` naming `operation` and `epoll_create1` (`EMFILE` when the descriptor
  ///   table is full: the nest takes one descriptor per source) or `epoll_ctl` (`ENOMEM`,
  ///   `ENOSPC` when `max_user_watches` is reached).
  static func make(watching descriptor: Int32, writable: Bool, operation: @autoclosure () -> String)
    throws(GCDError) -> EpollNest?
  {
    let instance = try checkedCall(operation() + ": epoll_create1", detail: explainCreate) { system_epoll_create() }
    do {
      _ = try checkedCall(operation() + ": epoll_ctl(EPOLL_CTL_ADD)", detail: explainAdd) {
        system_epoll_add(instance, descriptor, writable: writable)
      }
    } catch {
      system_close(instance)
      if error.errno == Errno.notPermitted { return nil }
      throw error
    }
    return EpollNest(instance: instance, watched: descriptor, writable: writable)
  }

  /// What libdispatch reported as the source's data when it watched the descriptor: the bytes
  /// queued to read (`SIOCINQ`, as `FIONREAD`; 0 at end of file), or for a write source the bytes
  /// still unsent (`SIOCOUTQ`); 1 where the descriptor does not support the request. Read from the
  /// descriptor now, not when the event was merged.
  var estimate: UInt {
    if estimateUnsupported.load(ordering: .relaxed) { return 1 }
    guard let bytes = system_queuedBytes(watched, output: writable) else {
      estimateUnsupported.store(true, ordering: .relaxed)
      return 1
    }
    return UInt(clamping: bytes)
  }

  /// Closes the instance (its registration of `watched` goes with it). Called once.
  func close() { system_close(instance) }

  /// `close()` as the owning source's cleanup, run once after its cancel handler.
  var closing: @Sendable () -> Void { { [self] in close() } }

  private static func explainCreate(_ error: Int32) -> String? {
    switch error {
    case Errno.tooManyOpenFiles:
      "no descriptor left in this process for the source's epoll instance (each read or write source on a"
        + " pipe or socket takes one, besides the descriptor it watches)"
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

extension FileStatus {
  /// Neither a FIFO, a socket, a character device nor a directory: a regular file or a block
  /// device, which epoll refuses (`EPERM`) and which never hangs up.
  var epollRefuses: Bool { !isStream && !isBidirectional && !isDirectory }
}
