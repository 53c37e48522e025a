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
/// The instance leaves the nest exactly once, in the owning source's cancel path after
/// libdispatch has unregistered it (the cancel handler runs after libdispatch's `EPOLL_CTL_DEL`),
/// or on a creation that fails: `release()` takes the watched descriptor out of it, before the
/// user's cancel handler (which may close the descriptor), and gives the empty instance back to a
/// small process-wide pool for the next source; `close()` closes it instead (the pidfd's nest).
/// Reuse saves `epoll_create1` and `close` (and the kernel's allocation and release of the
/// instance's file) per source: a server makes two sources per connection. An instance goes back
/// only when it is empty for certain — its `EPOLL_CTL_DEL` succeeded — and only while the pool
/// holds fewer than `poolCapacity`; otherwise it is closed. The watched descriptor stays its
/// owner's: the nest only drops its registration.
///
/// Interleavings: the pool is a `Mutex`; an instance is in the pool or in exactly one nest, never
/// both (taken out under the lock before `EPOLL_CTL_ADD`, put back under it after
/// `EPOLL_CTL_DEL`). libdispatch may still hold its own source on the instance's number after the
/// cancel handler (the C source is released later), but it has deleted its registration, and a
/// dispatch source touches its handle only while registered; a new source on the reused number is
/// a new registration, as a reused descriptor number always is. `NestedEpollTests.poolReuse`,
/// `poolBounded` and `poolSkipsClosedDescriptor`, and the churn tests (4 threads creating and
/// cancelling under the scribbling allocator) cover it.
final class EpollNest: Sendable {
  /// At most this many idle, empty instances wait in the pool (descriptors the process keeps open
  /// for reuse; close-on-exec).
  static let poolCapacity = 32

  /// The idle instances, each empty.
  private static let pool = Mutex<[Int32]>(
    {
      var idle: [Int32] = []
      idle.reserveCapacity(poolCapacity)
      return idle
    }())

  /// A watched file: its device and inode (every descriptor of one pipe or socket has the same).
  struct WatchedFile: Hashable {
    let device: UInt64
    let inode: UInt64
  }

  /// At most this many nests watch one file at once; a source past them is watched by
  /// libdispatch directly, as a regular file is. The kernel allows at most 500 paths through
  /// nested epoll instances to one open file, and checks them all on each `EPOLL_CTL_ADD` of an
  /// instance: with a nest per source, the 501st source on one file (dups of one socket, or the
  /// same descriptor) failed its registration in libdispatch (`EINVAL`, which libdispatch does
  /// not report) and never fired, and each registration walked every earlier one
  /// (`NestedEpollTests.manySourcesOnOneFile`). A server's connection has one or two sources on
  /// its socket; this many sources on one file is a program watching one descriptor from many
  /// places, which the nest no longer protects past the limit (docs/sources-linux.md).
  static let nestsPerFileLimit = 64

  /// The nests alive per watched file (files with none are not kept).
  private static let nestsPerFile = Mutex<[WatchedFile: Int]>([:])

  /// Counts a nest for `file`; false when `nestsPerFileLimit` already watch it.
  private static func admit(_ file: WatchedFile) -> Bool {
    nestsPerFile.withLock { counts in
      let count = counts[file, default: 0]
      guard count < nestsPerFileLimit else { return false }
      counts[file] = count + 1
      return true
    }
  }

  /// Uncounts a nest for `file`.
  private static func leave(_ file: WatchedFile) {
    nestsPerFile.withLock { counts in
      let count = counts[file, default: 1] - 1
      counts[file] = count > 0 ? count : nil
    }
  }

  /// An empty instance from the pool, or nil.
  private static func takeIdle() -> Int32? { pool.withLock { $0.popLast() } }

  /// Gives an empty instance back; closes it when the pool is full.
  private static func giveBack(_ instance: Int32) {
    let kept = pool.withLock { idle in
      guard idle.count < poolCapacity else { return false }
      idle.append(instance)
      return true
    }
    if !kept { system_close(instance) }
  }

  /// The epoll instance: what libdispatch watches.
  let instance: Int32
  /// The descriptor registered in it, read for the size estimate.
  let watched: Int32
  /// Whether `watched` is registered for `EPOLLOUT` (a write source) rather than `EPOLLIN`.
  let writable: Bool
  /// The file `watched` names, counted in `nestsPerFile`; nil when not counted (a pidfd).
  private let file: WatchedFile?
  /// Set once the queue-size request has failed on `watched` (a pipe's write end, a listening
  /// socket, a pidfd): the estimate is then 1 without a call, as libdispatch's is. Relaxed: two
  /// threads that read the estimate at once may both make the failing call once; each returns 1.
  private let estimateUnsupported = Atomic<Bool>(false)

  private init(instance: Int32, watched: Int32, writable: Bool, file: WatchedFile?) {
    self.instance = instance
    self.watched = watched
    self.writable = writable
    self.file = file
  }

  /// An instance holding `descriptor` for `EPOLLIN`, or `EPOLLOUT` when `writable`; nil when epoll
  /// cannot watch the descriptor (`EPERM`: a character device without poll support, say), or
  /// when `nestsPerFileLimit` nests already watch `file` — then libdispatch watches it directly,
  /// as it always has.
  ///
  /// - Throws: `GCDError` naming `operation` and `epoll_create1` (`EMFILE` when the descriptor
  ///   table is full: the nest takes one descriptor per source) or `epoll_ctl` (`ENOMEM`,
  ///   `ENOSPC` when `max_user_watches` is reached).
  static func make(
    watching descriptor: Int32, writable: Bool, file: WatchedFile? = nil, operation: @autoclosure () -> String
  ) throws(GCDError) -> EpollNest? {
    if let file, !admit(file) { return nil }
    let instance: Int32
    if let idle = takeIdle() {
      instance = idle
    } else {
      do {
        instance = try checkedCall(operation() + ": epoll_create1", detail: explainCreate) { system_epoll_create() }
      } catch {
        if let file { leave(file) }
        throw error
      }
    }
    do {
      _ = try checkedCall(operation() + ": epoll_ctl(EPOLL_CTL_ADD)", detail: explainAdd) {
        system_epoll_add(instance, descriptor, writable: writable)
      }
    } catch {
      giveBack(instance)  // still empty: the add failed
      if let file { leave(file) }
      if error.errno == Errno.notPermitted { return nil }
      throw error
    }
    return EpollNest(instance: instance, watched: descriptor, writable: writable, file: file)
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

  /// Closes the instance (its registration of `watched` goes with it). Called once, instead of
  /// `release()`.
  func close() {
    system_close(instance)
    if let file { EpollNest.leave(file) }
  }

  /// Takes `watched` out of the instance and gives the empty instance to the pool; closes it
  /// instead when the removal fails (`watched` was closed before the cancel handler, or its number
  /// now names another file: the registration may outlive the number, so the instance is not
  /// reused). Called once, once libdispatch no longer watches the instance, and while `watched`
  /// is open: before the user's cancel handler, or on a creation that fails.
  func release() {
    if system_epoll_remove(instance, watched) == 0 {
      EpollNest.giveBack(instance)
      if let file { EpollNest.leave(file) }
    } else {
      close()
    }
  }

  /// `release()` as the owning source's cleanup, run once before its cancel handler.
  var releasing: @Sendable () -> Void { { [self] in release() } }

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
