/// Fires when a descriptor has data to read (or has reached end of file).
///
/// The descriptor stays yours: close it in the cancel handler, after the
/// source has stopped watching it. Put the descriptor in non-blocking mode
/// (`fcntl(fd, F_SETFL, O_NONBLOCK)`) so a read never blocks the queue.
/// The source fires while the descriptor is readable: a handler may read
/// once and return, and it is called again for what it left (and for the
/// end of file, until you cancel). Read with ``read(into:)``: it tells the
/// source when the descriptor is empty, so the next wait costs no system
/// call; after a handler that reads on its own, the source asks the kernel
/// once (`epoll_ctl`) whether more is there.
/// A regular file is always readable: the handler runs until you cancel the
/// source; read until `read` returns 0 and cancel then.
///
/// On Linux libdispatch does not watch the descriptor itself: a pipe, socket or terminal sits in
/// the process's one epoll instance of the package's own (the descriptor fence, which costs the
/// source no descriptor), which merges its readiness into the source, so that a peer's hang-up
/// cannot reach libdispatch's use-after-free (swift-corelibs-libdispatch#949); the handler sees
/// the same events. The descriptor leaves the fence just before the cancel handler. A regular
/// file, or a device epoll cannot watch (`/dev/null`, `/dev/zero`), is always ready, as `poll`
/// says: the source fires when started and after each handler, with no descriptor of its own
/// (libdispatch would stand an `eventfd` in for a file). See docs/sources-linux.md.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_READ` (for a
/// pipe or a socket, a `DISPATCH_SOURCE_TYPE_DATA_OR` source the fence merges into).
public final class ReadSource: ValueSource, @unchecked Sendable {
  /// Creates a read source for `fileDescriptor` whose handlers run on `queue`.
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
      descriptor: fileDescriptor, .read, queue: queue, operation: "ReadSource(fileDescriptor: \(fileDescriptor))")
    super.init(created: created, queue: queue, watch: watch)
  }

  /// The source's watch in the descriptor fence (or always ready); nil only past the kernel's limit
  /// of epoll paths to one file, where libdispatch watches the descriptor.
  var watch: DescriptorWatch? { descriptorWatch }

  /// An estimate of the bytes available to read (`data`); 0 at end of file.
  public var bytesAvailable: Int { Int(clamping: data) }

  /// The bytes queued to read on the descriptor (`FIONREAD`), read when asked; 0 at end of file,
  /// 1 where the descriptor cannot tell (a listening socket: connections are waiting).
  public override var data: UInt { watch?.estimate ?? super.data }

  /// The watched descriptor.
  public var fileDescriptor: Int32 { fenceDescriptor }

  /// Reads up to `buffer.count` bytes from the descriptor into `buffer`: how many it read, 0 at
  /// the end of file, or nil when nothing is there now (`EAGAIN`: the descriptor is non-blocking).
  /// A read interrupted by a signal (`EINTR`) is made again.
  ///
  /// The read also tells the source when the descriptor is empty — it found nothing, or, on a pipe
  /// or a TCP socket, it returned fewer bytes than it asked for — so the source then waits for the
  /// next byte with no system call. Read here in the event handler, once or until it returns nil;
  /// what you leave fires the handler again. Any thread may call it.
  ///
  /// - Throws: `GCDError` naming `read` and its errno: `ECONNRESET`, `EBADF` (the descriptor was
  ///   closed under the source), `EINVAL`, …
  ///
  /// The corresponding C function is `read`.
  public func read(into buffer: UnsafeMutableRawBufferPointer) throws(GCDError) -> Int? {
    let got = watch?.read(into: buffer) ?? DescriptorWatch.read(fileDescriptor, into: buffer)
    if got >= 0 { return got }
    let error = system_errno
    if error == Errno.wouldBlock { return nil }
    throw GCDError(operation: "ReadSource(fileDescriptor: \(fileDescriptor)).read(into:): read", errno: error)
  }

  /// The watched descriptor, as a handle.
  public override var handle: UInt { UInt(bitPattern: Int(fileDescriptor)) }
}
