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
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_WRITE`.
public final class WriteSource: Source, @unchecked Sendable {
  /// The watched descriptor.
  public var fileDescriptor: Int32 { Int32(truncatingIfNeeded: handle) }

  /// The source's events as an `AsyncSequence` of buffer-space estimates; iterating starts
  /// the source, leaving the loop cancels it (see `SourceEvents`).
  public var events: SourceEvents<UInt> { SourceEvents(source: self, element: { $0 }) }

  /// Creates a write source for `fileDescriptor` whose handlers run on `queue`.
  ///
  /// - Parameters:
  ///   - fileDescriptor: The descriptor to watch; it stays yours.
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `EBADF` when the descriptor is not open,
  ///   `EISDIR` for a directory.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public init(fileDescriptor: Int32, queue: Queue) throws(GCDError) {
    super.init(
      created: try Source.create(
        descriptor: fileDescriptor, .write, queue: queue, operation: "WriteSource(fileDescriptor: \(fileDescriptor))"),
      queue: queue)
  }
}
