/// Fires when a descriptor has room to write.
///
/// Do not size writes by `data`: on Linux libdispatch reports there the
/// bytes still queued for sending on a socket (`SIOCOUTQ`, so 0 on an idle
/// socket) and 1 for pipes and files — not the room left. Write until
/// `EAGAIN` instead.
///
/// The descriptor stays yours: close it in the cancel handler. Use it in
/// non-blocking mode and write until `EAGAIN`, then wait for the next event.
/// A pipe or socket whose reader has gone makes `write` fail with `EPIPE`;
/// ignore `SIGPIPE` (`signal(SIGPIPE, SIG_IGN)`) so that the failure is an
/// error code and not the death of the process.
///
/// A reader that goes away while the pipe is full reaches the handler at once (the next `write`
/// fails with `EPIPE`): on Linux a pipe, socket or terminal sits in the process's one epoll
/// instance of the package's own (the descriptor fence, which costs the source no descriptor),
/// where the pipe's `EPOLLERR` counts as an event — libdispatch itself ignores an `EPOLLERR` that
/// comes alone. The fence also keeps a peer's hang-up away from libdispatch's use-after-free
/// (swift-corelibs-libdispatch#949). A regular file, or a device epoll cannot
/// watch (`/dev/null`), is always ready, as `poll` says, with no descriptor of its own. See
/// docs/sources-linux.md.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_WRITE`
/// (for a pipe or a socket, a `DISPATCH_SOURCE_TYPE_DATA_OR` source the fence merges into).
public final class WriteSource: ValueSource, @unchecked Sendable {
  /// The watched descriptor.
  public var fileDescriptor: Int32 { fenceDescriptor }

  /// The source's watch in the descriptor fence (or always ready); nil only past the kernel's limit
  /// of epoll paths to one file, where libdispatch watches the descriptor.
  var watch: DescriptorWatch? { descriptorWatch }

  /// Creates a write source for `fileDescriptor` whose handlers run on `queue`.
  ///
  /// - Parameters:
  ///   - fileDescriptor: The descriptor to watch; it stays yours.
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `EBADF` when the descriptor is not open,
  ///   `EISDIR` for a directory, `ENOSPC` (naming `epoll_ctl`) when the
  ///   per-user epoll watch limit is reached, `EMFILE` (naming
  ///   `epoll_create1`) when the process's first descriptor source finds no
  ///   descriptor left for the fence's one epoll instance, `EAGAIN` (naming
  ///   `pthread_create`) when it finds no thread left for the fence's reader.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(fileDescriptor: Int32, queue: Queue) throws(GCDError) {
    let (created, watch) = try Source.create(
      descriptor: fileDescriptor, .write, queue: queue, operation: "WriteSource(fileDescriptor: \(fileDescriptor))")
    super.init(created: created, queue: queue, watch: watch)
  }

  /// What libdispatch reports: the bytes still queued for sending on a socket (`SIOCOUTQ`), 1 for
  /// a pipe; read from the descriptor when asked.
  public override var data: UInt { watch?.estimate ?? super.data }

  /// The watched descriptor, as a handle.
  public override var handle: UInt { UInt(bitPattern: Int(fileDescriptor)) }
}
