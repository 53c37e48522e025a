import Synchronization

extension IOChannel {
  /// Reads up to `maximumLength` bytes: what has arrived, as soon as there
  /// is at least one byte; an empty buffer at end of file.
  ///
  /// On a stream channel over a pipe, a socket or a character device, a call
  /// that finds no read of the channel pending (none submitted before it, no
  /// barrier, low-water mark 1) reads the descriptor on the calling thread and
  /// returns what it holds, at most the high-water mark, without suspending;
  /// only when it holds nothing does the call wait for it to become readable.
  /// Otherwise the package keeps one C read of `maximumLength` bytes in flight
  /// for the channel (on a stream channel, one that ends at its first bytes)
  /// and keeps the bytes it delivers beyond what this call returns for the
  /// next call, so nothing read is lost. A random-access channel reads on
  /// from where the previous call stopped. Do not mix this with
  /// ``read(offset:length:queue:handler:)`` on the same stream channel.
  ///
  /// Cancelling the waiting task stops the channel's reads (the bytes in
  /// flight cannot be given back to the stream) and throws `GCDError` with
  /// `ECANCELED`; later calls throw `ECANCELED` too. The writes go on: a
  /// descriptor open for reading and writing (a socket) writes through a C
  /// channel of its own, which the cancellation leaves alone. A cancellation
  /// reaches only its own call's wait: a call made by a task already
  /// cancelled throws `ECANCELED` at once and stops nothing, and one that
  /// got `EBUSY` beside another task's wait leaves that wait alone.
  ///
  /// The end of file, or a failed read, ends one call: the next call reads
  /// again (a FIFO that gets a new writer, a terminal after Ctrl-D).
  ///
  /// - Parameter maximumLength: The most bytes to return (0 returns an empty buffer at once).
  /// - Returns: Between 1 and `maximumLength` bytes, or none at end of file.
  /// - Throws: `GCDError` with the errno of a failed read (`ECONNRESET`;
  ///   `ECANCELED` when the task was cancelled or after a stop; `EBUSY` when
  ///   another `read(upTo:)` is waiting; `EINVAL` for a negative length).
  ///
  /// The corresponding C function is `dispatch_io_read`.
  public func read(upTo maximumLength: Int) async throws(GCDError) -> DispatchBuffer {
    try await read(upTo: maximumLength, isolation: #isolation)
  }

  /// `read(upTo:)`, waiting in `actor`'s isolation (for `Chunks`' `next(isolation:)`).
  func read(upTo maximumLength: Int, isolation actor: isolated (any Actor)?) async throws(GCDError)
    -> DispatchBuffer
  {
    let operation = "IOChannel.read(upTo: \(maximumLength))"
    guard maximumLength >= 0 else { throw GCDError(operation: operation, errno: Errno.invalidArgument) }
    let reader = self.reader
    // A stream channel with no read owed (in flight, kept, waiting): read what the descriptor
    // holds now on this thread, and wait only when it holds nothing (`StreamEngine.readNow`).
    if let engine, !Task.isCancelled, reader.state.withLock({ $0.mayReadInline(maximumLength) }) {
      let found = engine.readNow(upTo: maximumLength)
      if let outcome = reader.state.withLock({ $0.readInline(found) }) {
        return try Self.result(outcome, operation)
      }
    }
    // A task cancelled before its call owns nothing of the channel's: it ends here, and the reads
    // (another task's wait among them) go on.
    if Task.isCancelled {
      throw GCDError(operation: operation, errno: Errno.canceled, detail: "the task was cancelled")
    }
    var busy = false
    let call = reader.state.withLock { $0.newCall() }
    await withTaskCancellationHandler {
      await withCheckedContinuation { continuation in
        let action = reader.state.withLock { $0.read(upTo: maximumLength, call: call, continuation) }
        if case .busy = action { busy = true }
        perform(action, reader)
        // A cancellation that came before the wait was registered found no waiter (this call's).
        if Task.isCancelled { perform(reader.state.withLock { $0.cancel(call: call) }, reader) }
      }
    } onCancel: {
      perform(reader.state.withLock { $0.cancel(call: call) }, reader)
    }
    if busy {
      throw GCDError(
        operation: operation, errno: Errno.busy, detail: "another read(upTo:) of this channel is waiting")
    }
    return try Self.result(reader.state.withLock { $0.takeHandoff() }, operation)
  }

  /// The bytes of a `read(upTo:)`, or its error.
  private static func result(_ outcome: ReadOutcome, _ operation: String) throws(GCDError) -> DispatchBuffer {
    switch outcome {
    case .success(let bytes): return bytes
    case .failure(.cancelled):
      throw GCDError(operation: operation, errno: Errno.canceled, detail: "the task was cancelled")
    case .failure(.errno(let error)):
      throw GCDError(
        operation: operation, errno: error,
        detail: error == Errno.busy ? "another read(upTo:) of this channel is waiting" : nil)
    }
  }

  /// Reads what the descriptor holds now, up to `maximumLength` bytes, without waiting for more
  /// (``readAvailable(upTo:queue:handler:)``): the bytes, and whether the end of file came.
  /// Empty and not ended: nothing there now.
  ///
  /// - Throws: `GCDError` with the errno of a failed read (`ECANCELED` after a stop; `EINVAL` for
  ///   a negative length).
  ///
  /// The corresponding C function: none (`read(2)` until `EAGAIN`, in the channel's order).
  public func readAvailable(upTo maximumLength: Int) async throws(GCDError) -> (bytes: DispatchBuffer, ended: Bool) {
    let gathered = AvailableBytes()
    let error: Int32 = await withCheckedContinuation { continuation in
      readAvailable(upTo: maximumLength, queue: reader.queue) { done, data, error in
        if let data { gathered.bytes.withLock { $0.append(data) } }
        if done { continuation.resume(returning: error) }
      }
    }
    let bytes = gathered.bytes.withLock { $0 }
    switch error {
    case 0: return (bytes, bytes.count < maximumLength)
    case Errno.wouldBlock: return (bytes, false)
    default: throw GCDError(operation: "IOChannel.readAvailable(upTo: \(maximumLength))", errno: error)
    }
  }

  /// Carries out what the read state machine asked for, outside its lock.
  private func perform(_ action: ReadStateMachine.Action, _ reader: ChannelReader) {
    switch action {
    case .none: break
    case .wake(let continuation), .busy(let continuation): continuation.resume()
    case .stop: stopReads()
    case .read(let offset, let length):
      // Through `read(offset:length:queue:handler:)`: a C channel's read, the stream engine's (one
      // that ends at its first bytes), or the unusable descriptor's error.
      let onEngine = engine != nil && length >= 0
      let handler: Handler = { [weak self] done, data, error in
        let (resume, next) = reader.state.withLock {
          $0.delivered(done: done, data: data, error: error, untilFirst: onEngine)
        }
        if case .wake(let continuation) = resume { continuation.resume() }
        if case .read = next {
          // A caller is still waiting after a complete read: read on. The
          // channel is alive (a waiter holds it) unless it was dropped.
          if let self { self.perform(next, reader) } else { Self.failDropped(reader) }
        }
      }
      if let engine, onEngine {
        // Its handler runs on the engine's queue: it only hands the bytes to the waiting task.
        engine.read(length: length, queue: nil, untilFirst: true, handler: handler)
      } else {
        read(offset: offset, length: length, queue: reader.queue, handler: handler)
      }
    }
  }

  /// The channel was dropped while a reader waited for more: end that wait.
  private static func failDropped(_ reader: ChannelReader) {
    let (resume, _) = reader.state.withLock { $0.delivered(done: true, data: nil, error: Errno.canceled) }
    if case .wake(let continuation) = resume { continuation.resume() }
  }

  /// Writes `data` and returns once all of it is written.
  ///
  /// On a stream channel over a pipe, a socket or a character device, a call
  /// that finds no write of the channel pending (none submitted before it, no
  /// barrier) writes on the calling thread, and suspends only for the bytes
  /// the descriptor has no room for, which are written before any later write.
  ///
  /// Cancelling the waiting task while the write is on its way stops the
  /// channel's writes and throws `GCDError` with `ECANCELED`. A cancellation
  /// that comes after the write ended stops nothing: the call returns its
  /// result and the channel writes on. A call made by a task already
  /// cancelled throws `ECANCELED` at once and stops nothing. The reads go on either way: a
  /// descriptor open for reading and writing (a socket) writes through a C
  /// channel of its own.
  ///
  /// - Parameter data: The bytes to write.
  /// - Throws: `GCDError` with the errno of the failed write (`EPIPE` when
  ///   the reader is gone; `ECANCELED` when the task was cancelled or after a stop).
  ///
  /// The corresponding C function is `dispatch_io_write`.
  public func write(_ data: DispatchBuffer) async throws(GCDError) {
    // A task cancelled before its call owns nothing of the channel's: it ends here, and the writes
    // (other tasks' among them) go on.
    if Task.isCancelled {
      throw GCDError(
        operation: "IOChannel.write(\(data.count) bytes)", errno: Errno.canceled, detail: "the task was cancelled")
    }
    // A stream channel with no write pending: write on this thread, and wait only for the rest
    // that finds no room (`StreamEngine.writeNow`).
    var rest: DispatchBuffer?
    var written: Int32?
    if let engine {
      switch engine.writeNow(data) {
      case .closed: break
      case .written(let error): written = error
      case .rest(let unwritten): rest = unwritten
      }
    }
    let cancel = WriteCancellation()
    let error: Int32
    if let written {
      error = written
    } else {
      error = await withTaskCancellationHandler {
        await withCheckedContinuation { continuation in
          let handler: Handler = { done, _, error in
            if done {
              cancel.ended()
              continuation.resume(returning: error)
            }
          }
          // On a stream channel the handler runs on the engine's queue: it only resumes this task.
          if let engine {
            let operation = StreamEngine.WriteOperation(data: rest ?? data, queue: nil, handler: handler)
            cancel.operation(operation, of: engine)
            if rest != nil { engine.handOver(operation) } else { engine.write(operation) }
          } else {
            write(data: data, queue: .global(), handler: handler)
          }
        }
      } onCancel: {
        cancel.cancel(self)
      }
    }
    // A cancellation that stopped the writes while this write was on its way ends it, whatever it
    // wrote; one that came after it ended changed nothing.
    let byCancel = cancel.stopped || (error == Errno.canceled && cancel.cancelled)
    if error == 0 && !byCancel { return }
    throw GCDError(
      operation: "IOChannel.write(\(data.count) bytes)", errno: byCancel ? Errno.canceled : error,
      detail: byCancel ? "the task was cancelled" : nil)
  }

  /// Writes a copy of `bytes` and returns once all of it is written.
  ///
  /// - Parameter bytes: The bytes to write.
  /// - Throws: `GCDError` with the errno of the failed write (`ECANCELED` when the task was cancelled).
  ///
  /// The corresponding C function is `dispatch_io_write`.
  public func write(_ bytes: [UInt8]) async throws(GCDError) { try await write(DispatchBuffer(bytes)) }

  /// The bytes of a stream channel as they arrive, in chunks of at most
  /// `maximumLength` bytes, until end of file.
  ///
  /// Back-pressure: a chunk is read only when the loop asks for the next
  /// one, and at most one C read of `maximumLength` bytes is in flight, so
  /// a slow consumer holds at most that much in memory (lower the
  /// channel's high-water mark to make each delivery smaller). Leaving the
  /// loop early — `break`, a thrown error, a cancelled task — stops the
  /// channel's reads (its writes go on, as for a cancelled
  /// ``read(upTo:)``); after the end of file the channel stays open, for
  /// example to write an answer on a half-closed socket.
  ///
  /// - Parameter maximumLength: The most bytes per chunk.
  /// - Returns: A sequence of non-empty buffers; it throws what
  ///   ``read(upTo:)`` throws.
  ///
  /// The corresponding C function is `dispatch_io_read`.
  public func chunks(maximumLength: Int = 64 * 1024) -> Chunks { Chunks(channel: self, maximumLength: maximumLength) }

  /// The chunks of a stream channel (see ``IOChannel/chunks(maximumLength:)``).
  public struct Chunks: AsyncSequence, Sendable {
    /// A chunk of bytes.
    public typealias Element = DispatchBuffer
    /// What the iteration throws: the errors of ``IOChannel/read(upTo:)``.
    public typealias Failure = GCDError
    let channel: IOChannel
    let maximumLength: Int

    /// Reads the chunks; dropping it before the end stops the channel's reads.
    public struct AsyncIterator: AsyncIteratorProtocol {
      let owner: StopOnRelease

      /// The next chunk, or nil at end of file.
      public mutating func next() async throws(GCDError) -> DispatchBuffer? {
        try await next(isolation: nil)
      }

      /// The next chunk, or nil at end of file, waited for in the caller's
      /// isolation (`for try await` passes it).
      ///
      /// - Parameter actor: The caller's actor (`#isolation`).
      public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async throws(GCDError)
        -> DispatchBuffer?
      {
        if owner.finished.load(ordering: .acquiring) { return nil }
        do {
          let chunk = try await owner.channel.read(upTo: owner.maximumLength, isolation: actor)
          if chunk.isEmpty {
            owner.finished.store(true, ordering: .releasing)
            return nil
          }
          return chunk
        } catch {
          owner.finished.store(true, ordering: .releasing)
          throw error
        }
      }
    }

    /// An iterator over the chunks.
    public func makeAsyncIterator() -> AsyncIterator {
      AsyncIterator(owner: StopOnRelease(channel: channel, maximumLength: maximumLength))
    }
  }

  /// Stops the channel's reads when the last copy of an iterator is gone
  /// before the end (end of file or an error), so that no read is left waiting.
  final class StopOnRelease: Sendable {
    let channel: IOChannel
    let maximumLength: Int
    let finished = Atomic(false)
    init(channel: IOChannel, maximumLength: Int) {
      self.channel = channel
      self.maximumLength = max(maximumLength, 1)
    }
    deinit { if !finished.load(ordering: .acquiring) { channel.stopReads() } }
  }
}

/// The cancellation of one awaited `write(_:)`: a cancellation that comes before the write ended
/// stops the channel's writes (on a stream channel, the engine checks on its queue that the write
/// had not ended: `StreamEngine.cancelWrite`); one that comes after changes nothing.
private final class WriteCancellation: Sendable {
  private struct State {
    var engine: StreamEngine?
    var operation: StreamEngine.WriteOperation?
    var ended = false
    var cancelled = false
    var stopped = false
  }
  private let state = Mutex(State())

  /// The stream engine's operation that carries the write (a C channel's has none). Held until the
  /// write ends: the operation's handler holds this object, so holding the operation past its end
  /// would keep both, and the engine, for good.
  func operation(_ operation: StreamEngine.WriteOperation, of engine: StreamEngine) {
    let cancelled = state.withLock { state in
      if !state.ended { (state.engine, state.operation) = (engine, operation) }
      return state.cancelled
    }
    // Cancelled before the operation existed: the engine stops the writes unless it has ended.
    if cancelled { engine.cancelWrite(operation) }
  }

  /// The write's `done` call (any thread): the operation and its engine are let go.
  func ended() { state.withLock { ($0.ended, $0.engine, $0.operation) = (true, nil, nil) } }

  /// The task was cancelled.
  func cancel(_ channel: IOChannel) {
    enum Step { case none, engine(StreamEngine, StreamEngine.WriteOperation), channel }
    let step = state.withLock { state -> Step in
      guard !state.ended else { return .none }
      state.cancelled = true
      if let engine = state.engine, let operation = state.operation { return .engine(engine, operation) }
      // A C channel's write, not ended yet: its writes stop, and this call throws.
      if state.engine == nil && state.operation == nil && channel.engine == nil {
        state.stopped = true
        return .channel
      }
      return .none
    }
    switch step {
    case .none: break
    case .engine(let engine, let operation): engine.cancelWrite(operation)
    case .channel: channel.stopWrites()
    }
  }

  /// This call's cancellation stopped the writes of a C channel (a stream engine's write reports
  /// its own `ECANCELED`).
  var stopped: Bool { state.withLock { $0.stopped } }

  /// The task was cancelled before the write ended.
  var cancelled: Bool { state.withLock { $0.cancelled } }
}

/// The bytes a `readAvailable(upTo:)` gathers: written by its handler calls on the channel reader's
/// queue, read by the awaiting task after the last; under a lock, which orders the two for
/// ThreadSanitizer too (it does not see the continuation's resume as an edge).
private final class AvailableBytes: Sendable {
  let bytes = Mutex(DispatchBuffer())
}
