import Synchronization

/// A channel for reading and writing a file descriptor asynchronously:
/// libdispatch's `dispatch_io`, with its handlers, limits, intervals and
/// barriers, made safe to drop.
///
/// A **stream channel over a pipe, a socket, a terminal or another character
/// device** keeps that contract on the
/// package's own ``ReadSource`` and ``WriteSource`` behind the descriptor
/// fence rather than on a C channel: libdispatch's I/O channel waits on such
/// a descriptor with sources of its own, which libdispatch's epoll layer can
/// use after freeing them when the peer hangs up under connection churn
/// (swift-corelibs-libdispatch#949; docs/io.md, "Connection churn"). Such a
/// channel costs no descriptor of its own and has no C channel
/// (``unsafeObject`` is nil). Channels over regular files, and random-access
/// channels, are libdispatch's `dispatch_io`.
///
/// A **stream** channel (pipes, sockets, terminals, or a file read in order)
/// reads and writes in sequence; a **random-access** channel (regular files)
/// reads and writes at offsets. Reads and writes deliver their bytes as
/// ``DispatchBuffer``s to a handler on the queue passed to each call; the
/// cleanup handler, given at creation, runs once on the creation queue when
/// the channel is done with the descriptor.
///
/// What the package adds to the C channel, each for a trap of libdispatch on
/// Linux (docs/io.md lists them):
/// - Dropping the last reference stops the channel's reads and lets its
///   writes finish: pending reads end with `ECANCELED` (none is left waiting
///   for bytes that never come, holding the descriptor), pending writes run
///   to their end and their handlers are called, then the cleanup runs.
///   ``close(stop:)`` with `stop` ends both at once.
/// - A stream channel's reads start with a low-water mark of 1 byte, so each
///   read delivers what arrives (libdispatch's default, one 1 MiB chunk,
///   holds back every smaller amount). Its writes keep libdispatch's
///   default, so a write's handler runs when the write is done rather than
///   after every partial write. Set your own with
///   ``setLimit(lowWater:highWater:)``.
/// - A write to a pipe or socket whose reader is gone fails with `EPIPE`
///   instead of killing the process: the first channel installs a
///   do-nothing `SIGPIPE` handler if the signal still has its default
///   disposition (see docs/io.md). A stream channel's write to a
///   pseudo-terminal's master whose slave closed fails with `EIO` once the
///   terminal is full, as its reads do (libdispatch's waits for good).
/// - ``init(path:flags:mode:type:queue:cleanup:)`` opens the file itself and
///   throws at once (a relative path, a missing file, a FIFO for random
///   access), where the C function returns NULL or reports the error later.
/// - A C channel over a descriptor open for reading and writing (a file
///   opened with `O_RDWR`) reads and writes
///   through two C channels: the writes go through a second one over a
///   close-on-exec duplicate of the descriptor. That is what lets a drop
///   stop the reads alone (`dispatch_io_close` stops every operation of a C
///   channel), and it kept a long write in flight from stalling the reads
///   waiting on a socket when sockets were on C channels (a libdispatch
///   defect: docs/io.md, "One channel reading and writing a socket at once").
///   The pair behaves as one channel: limits, intervals,
///   barriers and closing apply to both, and the cleanup runs once, after
///   both are done.
///
/// A stream channel sets `O_NONBLOCK` on the descriptor and restores the
/// original flags before the cleanup handler runs. Stream channels over one
/// descriptor, and the one-shot calls over it, share one record of the open
/// descriptor, as libdispatch's share its `fd_entry`: the flags are
/// restored, and every one of those channels' cleanups runs, only when the
/// last of them has ended; their writes never interleave (one write at a
/// time writes, from its first byte to its end). A channel made over a
/// number whose descriptor was closed under another channel and reused gets
/// a record of its own (the package asks the kernel what the descriptor is).
///
/// `Sendable`: libdispatch channels are thread-safe, and so is the stream
/// engine (`StreamEngine`: its state is confined to a serial queue).
///
/// The corresponding C type is `dispatch_io_t`.
public final class IOChannel: @unchecked Sendable {  // the C channel is thread-safe; `reader` is behind a Mutex
  /// How a channel reaches the bytes of its descriptor.
  public enum ChannelType: Sendable, Hashable {
    /// In sequence, ignoring offsets (pipes, sockets, any descriptor).
    ///
    /// The corresponding C constant is `DISPATCH_IO_STREAM`.
    case stream
    /// At offsets from the file position at creation (regular files only).
    ///
    /// The corresponding C constant is `DISPATCH_IO_RANDOM`.
    case randomAccess

    var raw: UInt { self == .stream ? Libdispatch.ioStream : Libdispatch.ioRandom }
  }

  /// What a read or write handler receives: whether the operation is
  /// complete, the bytes read (for a write, the bytes not yet written),
  /// and an `errno` value (0 for none).
  public typealias Handler = @Sendable (_ done: Bool, _ data: DispatchBuffer?, _ error: Int32) -> Void

  /// The C channel of the reads, and of everything else unless `writer`
  /// exists; nil when the descriptor was unusable from the start.
  @usableFromInline let raw: OpaquePointer?
  /// For a C channel over a descriptor open for reading and writing (a file
  /// opened `O_RDWR`): the C channel of the writes, over a duplicate of the
  /// descriptor (see the type's discussion); nil otherwise.
  let writer: OpaquePointer?
  /// Whether a drop closes `raw` with `DISPATCH_IO_STOP`: it carries the
  /// reads (false only when its descriptor is write-only, so that `raw`
  /// carries nothing but writes, which a drop lets finish).
  let dropStopsRaw: Bool
  /// The errno value of an unusable descriptor (0 when `raw` exists).
  let failure: Int32
  /// The channel's type.
  public let type: ChannelType
  let reader: ChannelReader
  /// For a stream channel over a pipe, a socket or a character device: the package's own engine, on read and write
  /// sources behind the descriptor fence (`StreamEngine`); then `raw` and `writer` are nil.
  let engine: StreamEngine?

  /// The C channel, borrowed: valid while this wrapper is alive. Do not
  /// release it. Nil for a channel over a descriptor that was unusable from
  /// the start (see ``init(fileDescriptor:type:queue:cleanup:)``), and for a
  /// stream channel over a pipe or a socket, which runs on the package's own
  /// read and write sources rather than on a C channel (docs/io.md). For a
  /// descriptor open for reading and writing, this is the C channel of the
  /// reads; its writes go through a second one.
  public var unsafeObject: OpaquePointer? { raw }

  /// Creates a channel over a descriptor you opened.
  ///
  /// The descriptor stays yours: do not close it, or use it elsewhere, until
  /// `cleanup` runs; close it there. An invalid descriptor (`EBADF`), a
  /// directory (`EISDIR`) or a pipe or socket for random access (`ESPIPE`)
  /// is reported to every read and write, and `cleanup` runs at once. (The
  /// package checks these itself with `fstat`: libdispatch would run the
  /// cleanup while it still keeps a record of the descriptor number, so a
  /// descriptor opened later with the same number would inherit the error.)
  ///
  /// - Parameters:
  ///   - fileDescriptor: The open descriptor.
  ///   - type: Stream or random access.
  ///   - queue: Where `cleanup` runs.
  ///   - cleanup: Called once with the descriptor when the channel no
  ///     longer uses it (after ``close(stop:)``, or when the channel is
  ///     dropped: its reads stopped, its writes ended; for a stream channel,
  ///     once every stream channel over the descriptor has ended).
  ///
  /// The corresponding C function is `dispatch_io_create`.
  public convenience init(
    fileDescriptor: Int32, type: ChannelType, queue: Queue, cleanup: @escaping @Sendable (Int32) -> Void
  ) {
    self.init(descriptor: fileDescriptor, type: type, queue: queue, closing: false, cleanup: cleanup)
  }

  /// Opens `path` and creates a channel that owns the descriptor.
  ///
  /// The file is opened at once with `open(2)` (close-on-exec), so errors
  /// are thrown here; a relative path is resolved against the current
  /// directory now. The channel closes the descriptor itself, just before
  /// `cleanup` runs. (Opening a FIFO blocks until the other end is opened,
  /// as `open` does, unless `flags` has `O_NONBLOCK`.)
  ///
  /// - Parameters:
  ///   - path: The file to open.
  ///   - flags: `open(2)` flags such as `O_RDONLY`, `O_WRONLY | O_CREAT`.
  ///   - mode: The permissions of a file `O_CREAT` creates (`mode_t`).
  ///   - type: Stream or random access.
  ///   - queue: Where `cleanup` runs.
  ///   - cleanup: Called once with the (already closed) descriptor number
  ///     when the channel is done with the file.
  /// - Throws: `GCDError` with `open`'s errno (`ENOENT`, `EACCES`, …),
  ///   `EISDIR` for a directory, `ESPIPE` for a FIFO or socket opened for random access.
  ///
  /// The corresponding C function is `dispatch_io_create_with_path`.
  public convenience init(
    path: String, flags: Int32, mode: UInt32 = 0o644, type: ChannelType, queue: Queue,
    cleanup: @escaping @Sendable (Int32) -> Void = { _ in }
  ) throws(GCDError) {
    let operation = "IOChannel(path: \"\(path)\", flags: \(flags))"
    let descriptor = try checkedCall(operation) { system_open(path, flags, mode) }
    var failure: Int32?
    if let status = system_fstat(descriptor) {
      if status.isDirectory { failure = Errno.isDirectory }
      if status.isStream && type == .randomAccess { failure = Errno.illegalSeek }
    } else {
      failure = system_errno
    }
    if let failure {
      system_close(descriptor)
      throw GCDError(
        operation: operation, errno: failure,
        detail: failure == Errno.illegalSeek ? "a FIFO or socket can only be read as a stream" : nil)
    }
    self.init(descriptor: descriptor, type: type, queue: queue, closing: true, cleanup: cleanup)
  }

  /// Creates a channel of another type over the same descriptor as `channel`.
  ///
  /// The descriptor is let go (and `channel`'s cleanup runs) only when
  /// every channel over it is done.
  ///
  /// Made from a channel that is already closed (its descriptor may be
  /// gone, and its number another file's), the new channel never touches
  /// the number: every operation ends with `ECANCELED`, ``fileDescriptor``
  /// is -1, and `cleanup` runs at once with -1. A channel that cannot use
  /// the descriptor for another reason (random access over a pipe, a
  /// socket or a terminal: `ESPIPE`; a `channel` over an unusable
  /// descriptor: its errno) reports that errno to every operation, and its
  /// cleanup also gets -1: the descriptor is not its to close.
  ///
  /// - Parameters:
  ///   - channel: The channel whose descriptor to share.
  ///   - type: Stream or random access.
  ///   - queue: Where `cleanup` runs.
  ///   - cleanup: Called once with the descriptor when this channel no longer uses it.
  ///
  /// The corresponding C function is `dispatch_io_create_with_io`.
  public init(
    channel: IOChannel, type: ChannelType, queue: Queue, cleanup: @escaping @Sendable (Int32) -> Void = { _ in }
  ) {
    system_catchBrokenPipe()
    let descriptor = channel.reader.descriptor
    self.type = type
    reader = ChannelReader(descriptor: descriptor)
    var failure = channel.failure
    if failure == 0, type == .stream, let parent = channel.engine {
      raw = nil
      writer = nil
      self.failure = 0
      dropStopsRaw = false
      engine = StreamEngine(parent: parent, cleanupQueue: queue, cleanup: cleanup)
      return
    }
    if failure == 0, let parent = channel.engine {
      // Random access over a pipe, a socket or a character device.
      failure = parent.closedFlag.load(ordering: .acquiring) ? Errno.canceled : Errno.illegalSeek
    } else if failure == 0, type == .randomAccess, channel.fileDescriptor >= 0,  // asked only while open
      let status = system_fstat(descriptor), status.isStream
    {
      failure = Errno.illegalSeek
    }
    engine = nil
    guard failure == 0, let source = channel.raw else {
      self.raw = nil
      self.writer = nil
      self.failure = failure
      dropStopsRaw = false
      // The descriptor is not this channel's to close.
      queue.async { cleanup(-1) }
      return
    }
    // A channel made from one whose writes have a C channel of their own
    // writes through a channel made from that one.
    let box = CleanupBox(
      descriptor: descriptor, closing: false, body: cleanup, channels: channel.writer == nil ? 1 : 2, derived: true)
    let reads = Self.create(type: type, from: source, queue: queue, box: box)
    self.raw = reads
    self.writer = channel.writer.map { Self.create(type: type, from: $0, queue: queue, box: box) }
    self.failure = 0
    dropStopsRaw = channel.writer != nil || !system_isWriteOnly(descriptor)
    if type == .stream && !system_isWriteOnly(descriptor) { Libdispatch.io_set_low_water(reads, 1) }
  }

  /// - Parameter splitting: Give the writes of a descriptor open for reading
  ///   and writing their own C channel (false for the one-shot calls, which
  ///   only read or only write).
  init(
    descriptor: Int32, type: ChannelType, queue: Queue, closing: Bool, splitting: Bool = true,
    cleanup: @escaping @Sendable (Int32) -> Void
  ) {
    system_catchBrokenPipe()
    self.type = type
    reader = ChannelReader(descriptor: descriptor)
    var failure: Int32 = 0
    var duplicate: Int32 = -1
    var isRegular = false
    var onEngine = false
    if let status = system_fstat(descriptor) {
      if status.isDirectory { failure = Errno.isDirectory }
      if status.isStream && type == .randomAccess { failure = Errno.illegalSeek }
      onEngine = failure == 0 && (status.isStream || (type == .stream && status.isCharacterDevice))
      if failure == 0 && !onEngine && splitting && system_isReadWrite(descriptor) {
        duplicate = system_duplicate(descriptor)
        if duplicate < 0 { failure = system_errno }
      }
      isRegular = status.isRegular
    } else {
      failure = system_errno
    }
    guard failure == 0 else {
      raw = nil
      writer = nil
      engine = nil
      self.failure = failure
      dropStopsRaw = false
      queue.async {
        if closing { system_close(descriptor) }
        cleanup(descriptor)
      }
      return
    }
    if onEngine {
      raw = nil
      writer = nil
      self.failure = 0
      dropStopsRaw = false
      engine = StreamEngine(descriptor: descriptor, closing: closing, cleanupQueue: queue, cleanup: cleanup)
      return
    }
    engine = nil
    if duplicate >= 0 {
      // Both C channels find the flags libdispatch wants already set (O_NONBLOCK for a stream,
      // blocking for a regular file, which it reads on its disk queues), so neither changes them
      // at its end; the last cleanup restores the caller's flags.
      let flags = system_statusFlags(descriptor)
      if flags >= 0 {
        system_setStatusFlags(descriptor, isRegular ? flags & ~system_nonBlocking : flags | system_nonBlocking)
      }
      let box = CleanupBox(
        descriptor: descriptor, closing: closing, body: cleanup, channels: 2, duplicate: duplicate, flags: flags)
      raw = Self.create(type: type, descriptor: descriptor, queue: queue, box: box)
      writer = Self.create(type: type, descriptor: duplicate, queue: queue, box: box)
    } else {
      let box = CleanupBox(descriptor: descriptor, closing: closing, body: cleanup, channels: 1)
      raw = Self.create(type: type, descriptor: descriptor, queue: queue, box: box)
      writer = nil
    }
    self.failure = 0
    dropStopsRaw = duplicate >= 0 || !system_isWriteOnly(descriptor)
    // Reads deliver what arrives. Writes keep libdispatch's default: at 1 byte their handler would
    // run after every partial write, with a new buffer for the rest each time.
    if type == .stream && !system_isWriteOnly(descriptor), let raw { Libdispatch.io_set_low_water(raw, 1) }
  }

  /// A C channel over `descriptor` whose cleanup releases one reference of `box`.
  private static func create(type: ChannelType, descriptor: Int32, queue: Queue, box: CleanupBox) -> OpaquePointer {
    guard
      let raw = Libdispatch.io_create_f(
        type.raw, descriptor, queue.raw, Unmanaged.passRetained(box).toOpaque(), cleanupTrampoline)
    else { fatalError("GCD: IOChannel(fileDescriptor: \(descriptor)): dispatch_io_create returned NULL") }
    return raw
  }

  /// A C channel made from `source` whose cleanup releases one reference of `box`.
  private static func create(type: ChannelType, from source: OpaquePointer, queue: Queue, box: CleanupBox)
    -> OpaquePointer
  {
    guard
      let raw = Libdispatch.io_create_with_io_f(
        type.raw, source, queue.raw, Unmanaged.passRetained(box).toOpaque(), cleanupTrampoline)
    else { fatalError("GCD: IOChannel(channel:): dispatch_io_create_with_io returned NULL") }
    return raw
  }

  /// Dropping the channel stops its reads (none is left waiting for bytes
  /// that never come, holding the descriptor) and lets its writes run to
  /// their end, their handlers called, before the cleanup. The reads have a
  /// C channel of their own unless the descriptor is read-only or write-only
  /// (see `writer`), so stopping that C channel stops nothing else.
  deinit {
    engine?.drop()
    if let raw {
      Libdispatch.io_close(raw, dropStopsRaw ? Libdispatch.ioStop : 0)
      Libdispatch.release(raw)
    }
    if let writer {
      Libdispatch.io_close(writer, 0)
      Libdispatch.release(writer)
    }
  }

  /// Calls `body` with each C channel: none, the one, or the reads' and the writes'.
  private func eachChannel(_ body: (OpaquePointer) -> Void) {
    if let raw { body(raw) }
    if let writer { body(writer) }
  }

  /// The descriptor, or -1 once the channel is closed.
  ///
  /// The corresponding C function is `dispatch_io_get_descriptor`.
  public var fileDescriptor: Int32 {
    if let engine { return engine.closedFlag.load(ordering: .acquiring) ? -1 : engine.descriptor }
    return raw.map(Libdispatch.io_get_descriptor) ?? -1
  }

  // MARK: Reading and writing

  /// Reads up to `length` bytes, delivering them to `handler` on `queue`
  /// as they arrive.
  ///
  /// The handler runs one or more times: with `done` false and some bytes
  /// each time the low-water mark or the interval is reached, then once
  /// with `done` true when `length` bytes were read, at end of file (data
  /// empty or short, error 0), or on an error (errno; `ECANCELED` after
  /// ``close(stop:)``). A negative `length` ends at once with `EINVAL`.
  ///
  /// The calls of one read run one at a time and in order, on any queue
  /// (libdispatch gives each operation a serial queue targeting `queue`);
  /// nothing is delivered after the call with `done` true. The calls of
  /// different operations are not ordered with each other on a concurrent
  /// queue.
  ///
  /// - Parameters:
  ///   - offset: For a random-access channel, where to start, relative to
  ///     the file position at creation; ignored by a stream channel.
  ///   - length: The most bytes to read; `Int.max` reads to end of file.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives `done`, the bytes and an errno value.
  ///
  /// The corresponding C function is `dispatch_io_read`.
  public func read(offset: Int = 0, length: Int, queue: Queue, handler: @escaping Handler) {
    if let engine, length >= 0 { return engine.read(length: length, queue: queue, handler: handler) }
    guard let raw, length >= 0 else {
      let error = failure != 0 ? failure : Errno.invalidArgument
      queue.async { handler(true, nil, error) }
      return
    }
    Libdispatch.io_read_f(
      raw, offset, length, queue.raw, Unmanaged.passRetained(HandlerBox(handler)).toOpaque(), handlerTrampoline)
  }

  /// Reads what the descriptor holds now, up to `length` bytes, without waiting for more: for a
  /// consumer whose producer has exited while a descriptor it passed on (a grandchild's copy of a
  /// pipe) may hold the end of file back.
  ///
  /// The handler runs with `done` true once, after the reads submitted before this one: the bytes
  /// read, and error 0 when `length` bytes were read or the end of file came (fewer bytes: the
  /// end, as for ``read(offset:length:queue:handler:)``), `EAGAIN` when the descriptor holds
  /// nothing more now, or the errno of a failed read. (More than the high-water mark comes first
  /// in calls with `done` false.) A negative `length` ends at once with `EINVAL`. On a channel
  /// over a regular file, which never makes a read wait, it is
  /// ``read(offset:length:queue:handler:)``.
  ///
  /// - Parameters:
  ///   - length: The most bytes to read; `Int.max` for all there is.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives `done`, the bytes and an errno value.
  ///
  /// The corresponding C function: none (`read(2)` until `EAGAIN`, in the channel's order).
  public func readAvailable(upTo length: Int, queue: Queue, handler: @escaping Handler) {
    if let engine, length >= 0 { return engine.read(length: length, queue: queue, nowOnly: true, handler: handler) }
    read(length: length, queue: queue, handler: handler)
  }

  /// Writes `data`, reporting progress to `handler` on `queue`.
  ///
  /// The handler runs with `done` false and the bytes still to write as
  /// parts are written (when the low-water mark or interval says so), then
  /// once with `done` true: error 0 when everything was written, otherwise
  /// an errno value (`EPIPE` when the reader is gone, `EIO` when a
  /// pseudo-terminal's slave closed and the terminal is full) and the
  /// unwritten rest.
  ///
  /// - Parameters:
  ///   - offset: For a random-access channel, where to start, relative to
  ///     the file position at creation; ignored by a stream channel.
  ///   - data: The bytes to write.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives `done`, the unwritten bytes and an errno value.
  ///
  /// The corresponding C function is `dispatch_io_write`.
  public func write(
    offset: Int = 0, data: DispatchBuffer, queue: Queue, handler: @escaping Handler = { _, _, _ in }
  ) {
    if let engine { return engine.write(data: data, queue: queue, handler: handler) }
    guard let raw else {
      let error = failure
      queue.async { handler(true, data, error) }
      return
    }
    Libdispatch.io_write_f(
      writer ?? raw, offset, data.storage.raw, queue.raw, Unmanaged.passRetained(HandlerBox(handler)).toOpaque(),
      handlerTrampoline)
  }

  /// Writes a copy of `bytes`, reporting progress to `handler` on `queue`.
  ///
  /// - Parameters:
  ///   - offset: For a random-access channel, where to start; ignored by a stream channel.
  ///   - data: The bytes to write.
  ///   - queue: Where `handler` runs.
  ///   - handler: Receives `done`, the unwritten bytes and an errno value.
  ///
  /// The corresponding C function is `dispatch_io_write`.
  public func write(offset: Int = 0, data: [UInt8], queue: Queue, handler: @escaping Handler = { _, _, _ in }) {
    write(offset: offset, data: DispatchBuffer(data), queue: queue, handler: handler)
  }

  // MARK: Limits, intervals, barriers, closing

  /// Sets how many bytes a read or write gathers before its handler runs
  /// (`lowWater`) and the most one handler call delivers (`highWater`).
  ///
  /// The reads of a stream channel start at a low-water mark of 1 byte
  /// (deliver what arrives); writes, and random-access channels, at
  /// libdispatch's default (one chunk, 1 MiB). The marks set here apply to
  /// reads and writes alike, those called after it: an operation keeps the
  /// marks in force when it was called, as libdispatch's do. A nil value
  /// leaves that mark as it is. Negative values are clamped to 0.
  ///
  /// - Parameters:
  ///   - lowWater: The fewest bytes per handler call, except the last.
  ///   - highWater: The most bytes per handler call.
  ///
  /// The corresponding C functions are `dispatch_io_set_low_water` and `dispatch_io_set_high_water`.
  public func setLimit(lowWater: Int? = nil, highWater: Int? = nil) {
    engine?.setLimit(lowWater: lowWater, highWater: highWater)
    eachChannel { raw in
      if let lowWater { Libdispatch.io_set_low_water(raw, max(lowWater, 0)) }
      if let highWater { Libdispatch.io_set_high_water(raw, max(highWater, 0)) }
    }
  }

  /// Makes handlers run at least every `interval` while an operation
  /// progresses.
  ///
  /// Without `strict`, a handler still waits for the low-water mark; with
  /// it, the handler runs at each interval with what has arrived, however little.
  ///
  /// - Parameters:
  ///   - interval: The longest time between handler calls.
  ///   - strict: Deliver at each interval even below the low-water mark.
  ///
  /// The corresponding C function is `dispatch_io_set_interval`.
  public func setInterval(_ interval: Duration, strict: Bool = false) {
    let nanoseconds = interval.saturatingNonNegativeNanoseconds
    engine?.setInterval(nanoseconds: nanoseconds, strict: strict)
    eachChannel { raw in
      Libdispatch.io_set_interval(raw, nanoseconds, strict ? Libdispatch.ioStrictInterval : 0)
    }
  }

  /// Runs `body` once every operation submitted before it has ended, and
  /// before any submitted after it starts.
  ///
  /// Inside `body`, ``fileDescriptor`` is valid for direct calls such as `fsync`.
  ///
  /// On a channel over a descriptor open for reading and writing, whose reads and
  /// writes go through two C channels, the barrier waits for the operations
  /// of both: the C barrier reached first holds its libdispatch thread until
  /// the other one is reached too, then `body` runs.
  ///
  /// - Parameter body: The work, run on a libdispatch queue of the channel.
  ///
  /// The corresponding C function is `dispatch_io_barrier`.
  public func barrier(_ body: @escaping @Sendable () -> Void) {
    if let engine { return engine.barrier(body) }
    guard let raw else {
      Queue.global().async(body)
      return
    }
    guard writer != nil else {
      Libdispatch.io_barrier_f(raw, Unmanaged.passRetained(WorkBox(body)).toOpaque(), barrierTrampoline)
      return
    }
    let rendezvous = BarrierRendezvous(body)
    eachChannel { raw in
      Libdispatch.io_barrier_f(raw, Unmanaged.passRetained(WorkBox(rendezvous.arrive)).toOpaque(), barrierTrampoline)
    }
  }

  /// Closes the channel: no operation can be submitted after this.
  ///
  /// Without `stop`, submitted operations run to their end (a read waiting
  /// on a pipe that never gets data keeps waiting, and holds the
  /// descriptor); with `stop`, they end at once with `ECANCELED`. Either
  /// way the cleanup handler runs once they have ended.
  ///
  /// - Parameter stop: End the submitted operations now.
  ///
  /// The corresponding C function is `dispatch_io_close`.
  public func close(stop: Bool = false) {
    engine?.close(stop: stop)
    eachChannel { Libdispatch.io_close($0, stop ? Libdispatch.ioStop : 0) }
  }

  /// Stops the reads alone, for a cancelled `read(upTo:)` or a `chunks` loop
  /// left early: on a descriptor open for reading and writing the writes
  /// have their own C channel (`writer`), which goes on; otherwise `raw`
  /// carries one direction only.
  func stopReads() {
    engine?.stopReads()
    if let raw { Libdispatch.io_close(raw, Libdispatch.ioStop) }
  }

  /// Stops the writes alone, for a cancelled `write(_:)`: the writes' own C
  /// channel when there is one, otherwise `raw` (which then carries one
  /// direction only).
  func stopWrites() {
    engine?.stopWrites()
    if let channel = writer ?? raw { Libdispatch.io_close(channel, Libdispatch.ioStop) }
  }
}

// MARK: - Trampolines (one per C callback type; each context is a retained box)

/// The cleanup handler and what the package does before it. Each C channel
/// holds one reference; the last of them to end runs the cleanup.
private final class CleanupBox: Sendable {
  let descriptor: Int32
  let closing: Bool
  let body: @Sendable (Int32) -> Void
  /// The C channels that have not ended yet.
  let remaining: Atomic<Int>
  /// The duplicate the writes went through, closed at the end (-1 for none).
  let duplicate: Int32
  /// The descriptor's status flags to restore at the end (-1: libdispatch restores them).
  let flags: Int32
  /// Made from another channel: a C channel that reports an error to its cleanup never had the
  /// descriptor (its source was closed, its number perhaps reused), so the cleanup gets -1.
  let derived: Bool
  init(
    descriptor: Int32, closing: Bool, body: @escaping @Sendable (Int32) -> Void, channels: Int,
    duplicate: Int32 = -1, flags: Int32 = -1, derived: Bool = false
  ) {
    self.descriptor = descriptor
    self.closing = closing
    self.body = body
    self.remaining = Atomic(channels)
    self.duplicate = duplicate
    self.flags = flags
    self.derived = derived
  }
}

private func cleanupTrampoline(_ context: UnsafeMutableRawPointer?, _ error: Int32) {
  let box = Unmanaged<CleanupBox>.fromOpaque(context!).takeRetainedValue()
  guard box.remaining.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 else { return }
  if box.flags >= 0 { system_setStatusFlags(box.descriptor, box.flags) }
  if box.duplicate >= 0 { system_close(box.duplicate) }
  if box.closing { system_close(box.descriptor) }
  box.body(box.derived && error != 0 ? -1 : box.descriptor)
}

/// The barrier of a channel with two C channels: the first C barrier to be
/// reached waits until the second is, which runs the body and lets it go.
private final class BarrierRendezvous: @unchecked Sendable {  // the C semaphore is thread-safe
  let body: @Sendable () -> Void
  let reached = Mutex(false)
  let released = Libdispatch.semaphore_create(0)
  init(_ body: @escaping @Sendable () -> Void) { self.body = body }
  deinit { Libdispatch.release(released) }

  @Sendable func arrive() {
    let first = reached.withLock { reached in
      defer { reached = true }
      return !reached
    }
    if first {
      _ = Libdispatch.semaphore_wait(released, Libdispatch.timeForever)
    } else {
      body()
      _ = Libdispatch.semaphore_signal(released)
    }
  }
}

/// A read or write handler, released after its `done` call.
final class HandlerBox {
  let body: IOChannel.Handler
  init(_ body: @escaping IOChannel.Handler) { self.body = body }
}

let handlerTrampoline: Libdispatch.IOHandler = { context, done, data, error in
  let box = Unmanaged<HandlerBox>.fromOpaque(context!)
  let buffer = data.map { DispatchBuffer(borrowing: OpaquePointer($0)) }
  box.takeUnretainedValue().body(done, buffer, error)
  if done { box.release() }
}

private final class WorkBox {
  let body: @Sendable () -> Void
  init(_ body: @escaping @Sendable () -> Void) { self.body = body }
}

private func barrierTrampoline(_ context: UnsafeMutableRawPointer?) {
  Unmanaged<WorkBox>.fromOpaque(context!).takeRetainedValue().body()
}
