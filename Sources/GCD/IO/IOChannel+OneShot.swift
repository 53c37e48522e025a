import Synchronization

// MARK: - One-shot operations

extension IOChannel {
  /// Reads up to `length` bytes from a descriptor, once, without a channel
  /// of your own.
  ///
  /// The handler runs once with the bytes read and an errno value (`EBADF`
  /// for a descriptor that is not open). From a pipe, a socket or a
  /// terminal it gets what is there as soon as there is something (3 bytes
  /// of up to 100 when 3 are queued), as `dispatch_read` does; from a
  /// regular file, `length` bytes or fewer at end of file. The
  /// descriptor must stay open until then; in the handler you may close it.
  /// (libdispatch's `dispatch_read` calls its handler while its internal
  /// record of the descriptor still exists and the descriptor is still
  /// non-blocking, so closing it there and opening another descriptor with
  /// the same number can attach the new one to the dying record. This
  /// function therefore reads through a stream channel and calls `handler`
  /// once the read has ended and the channel's cleanup has run, after
  /// libdispatch has let go of the descriptor and restored its flags.)
  /// While a stream channel of yours is open over a pipe, a socket or a
  /// character device, that cleanup — and so `handler` — waits for it to
  /// end too, as `dispatch_read`'s handler does.
  ///
  /// - Parameters:
  ///   - fileDescriptor: The descriptor to read.
  ///   - length: The most bytes to read.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives the bytes and an errno value (0 for none).
  ///
  /// The corresponding C function is `dispatch_read`.
  public static func read(
    fileDescriptor: Int32, length: Int, queue: Queue,
    handler: @escaping @Sendable (_ data: DispatchBuffer, _ error: Int32) -> Void
  ) {
    oneShot(fileDescriptor: fileDescriptor, queue: queue, handler: handler) { channel, finish in
      // The deliveries are gathered on a queue of the call's own, so that only `handler` runs on
      // `queue`.
      let gathered = Mutex(DispatchBuffer())
      let handler: Handler = { done, data, error in
        if let data { gathered.withLock { $0.append(data) } }
        if done { finish(gathered.withLock { $0 }, error) }
      }
      let gatherer = Queue(label: "GCD.IOChannel.read(fileDescriptor:)")
      // On a pipe, a socket or a terminal: what is there, as soon as there is something.
      if let engine = channel.engine, length >= 0 {
        engine.read(length: length, queue: gatherer, untilFirst: true, handler: handler)
      } else {
        channel.read(length: length, queue: gatherer, handler: handler)
      }
    }
  }

  /// Writes `data` to a descriptor, once, without a channel of your own.
  ///
  /// The handler runs once: error 0 when everything was written, otherwise
  /// an errno value (`EPIPE` when the reader is gone, `EBADF` for a
  /// descriptor that is not open) and the unwritten rest. As for
  /// ``read(fileDescriptor:length:queue:handler:)``, it runs after
  /// libdispatch has let go of the descriptor, so it may close it.
  ///
  /// - Parameters:
  ///   - fileDescriptor: The descriptor to write.
  ///   - data: The bytes to write.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives the unwritten bytes (empty when all were written) and an errno value.
  ///
  /// The corresponding C function is `dispatch_write`.
  public static func write(
    fileDescriptor: Int32, data: DispatchBuffer, queue: Queue,
    handler: @escaping @Sendable (_ remaining: DispatchBuffer, _ error: Int32) -> Void
  ) {
    oneShot(fileDescriptor: fileDescriptor, queue: queue, handler: handler) { channel, finish in
      channel.write(data: data, queue: queue) { done, remaining, error in
        if done { finish(remaining ?? DispatchBuffer(), error) }
      }
    }
  }

  /// A one-shot call's channel: a stream channel over `fileDescriptor` (left open) that `start`
  /// runs the operation on, calling `finish` once with its outcome (the bytes and the errno
  /// value), which closes the channel. `handler` runs on `queue` once the outcome is in and the
  /// channel has let go of the descriptor (`OneShotJoin`).
  private static func oneShot(
    fileDescriptor: Int32, queue: Queue, handler: @escaping @Sendable (DispatchBuffer, Int32) -> Void,
    start: (_ channel: IOChannel, _ finish: @escaping @Sendable (DispatchBuffer, Int32) -> Void) -> Void
  ) {
    let join = OneShotJoin(queue: queue, handler: handler)
    let channel = IOChannel(
      descriptor: fileDescriptor, type: .stream, queue: queue, closing: false, splitting: false,
      cleanup: { _ in join.released() })
    start(channel) { data, error in
      join.ended(data, error)
      channel.close()
    }
  }
}

/// A one-shot call's two events: its operation ended (with the bytes and
/// the errno value for the handler) and its channel let go of the
/// descriptor. The handler runs once, after both, whichever comes last: a
/// channel over a usable descriptor lets go after the operation's last
/// handler call, one over an unusable descriptor (`EBADF`) at once, before
/// the operation has reported its error.
private final class OneShotJoin: Sendable {
  private let queue: Queue
  private let handler: @Sendable (DispatchBuffer, Int32) -> Void
  private let state = Mutex<(outcome: (DispatchBuffer, Int32)?, released: Bool)>((nil, false))

  init(queue: Queue, handler: @escaping @Sendable (DispatchBuffer, Int32) -> Void) {
    self.queue = queue
    self.handler = handler
  }

  /// The operation ended; on `queue` or the read's gathering queue.
  func ended(_ data: DispatchBuffer, _ error: Int32) {
    let released = state.withLock { state in
      state.outcome = (data, error)
      return state.released
    }
    if released { queue.async { [handler] in handler(data, error) } }
  }

  /// The channel let go of the descriptor; on `queue` (the cleanup's queue).
  func released() {
    let outcome = state.withLock { state in
      state.released = true
      return state.outcome
    }
    if let (data, error) = outcome { handler(data, error) }
  }
}
