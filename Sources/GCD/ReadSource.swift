/// Fires when a descriptor has data to read (or has reached end of file).
///
/// The descriptor stays yours: close it in the cancel handler, after the
/// source has stopped watching it. Put the descriptor in non-blocking mode
/// (`fcntl(fd, F_SETFL, O_NONBLOCK)`) so a read never blocks the queue, and
/// in each handler call read until `read` fails with `EAGAIN` (or returns 0
/// at end of file): on Linux libdispatch may not report again data that
/// was already there — reading only `bytesAvailable` per call can leave the
/// rest of a pipe, and its end of file, unseen once the writer has closed.
/// A regular file is always readable: the handler runs until you cancel the
/// source; read until `read` returns 0 and cancel then.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_READ`.
public final class ReadSource: Source, @unchecked Sendable {
  /// The source's events as an `AsyncSequence` of bytes-available estimates (read until `EAGAIN` in the loop body); iterating starts
  /// the source, leaving the loop cancels it (see `SourceEvents`).
  public var events: SourceEvents<UInt> { SourceEvents(source: self, element: { $0 }) }

  /// Creates a read source for `fileDescriptor` whose handlers run on `queue`.
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
        descriptor: fileDescriptor, .read, queue: queue, operation: "ReadSource(fileDescriptor: \(fileDescriptor))"),
      queue: queue)
  }

  /// An estimate of the bytes available to read (`data`); 0 at end of file.
  public var bytesAvailable: Int { Int(clamping: data) }

  /// The watched descriptor.
  public var fileDescriptor: Int32 { Int32(truncatingIfNeeded: handle) }
}
