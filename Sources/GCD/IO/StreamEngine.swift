import Synchronization

/// A stream channel over a pipe, a socket or a character device (a terminal, `/dev/null`), on
/// the package's own read and write sources: the
/// descriptor is watched through the descriptor fence (docs/sources-linux.md), never by
/// libdispatch's own I/O channel, whose sources on the raw descriptor are exposed to
/// swift-corelibs-libdispatch#949 under connection churn. `IOChannel` keeps its contract: reads
/// with a low- and a high-water mark and an interval, writes in order with their progress,
/// barriers, `close(stop:)`, the cleanup exactly once, a drop that stops the reads and lets the
/// writes finish, channels made from this one.
///
/// **One queue, one story.** Every field marked "on `queue`" is read and written only on `queue`,
/// a serial queue of the engine's own: submissions from any thread arrive there with `async` (in
/// the order each thread made them), and the read and write sources, the interval's timer and
/// their cancel handlers all target it. So the engine has no lock; its handlers run on the queues
/// their operations named, submitted from `queue` in the order of the bytes.
///
/// **Order.** Reads run one at a time in the order submitted, writes likewise, the two directions
/// at once. An operation uses the descriptor only while it is first in its direction's line of the
/// descriptor's record (`StreamDescriptor`), which every channel and one-shot call over the
/// descriptor shares: writes never interleave, and operations run in the order submitted. A barrier waits until every operation submitted before it has ended; operations
/// submitted after it wait in `later` until it has run (on `queue`, the descriptor usable).
///
/// **Handlers.** Each operation's handler calls run one after another, in order, on the queue it
/// named, whatever its kind (`HandlerCalls`), as libdispatch's serial queue per operation runs them.
///
/// **Lifetime.** The engine holds its sources, and their handlers hold the engine: the cycle keeps
/// a channel with work alive after its wrapper is gone, and ends when the engine finishes (the
/// channel closed and every operation ended): the sources are cancelled, and once their cancel
/// handlers ran (the fence has let the descriptor go) the engine leaves its descriptor's record
/// (`StreamDescriptor`). The last channel over the descriptor to leave restores the flags, closes
/// the descriptor when a channel owns it, and runs every channel's cleanup once, on its queue.
///
/// `@unchecked Sendable`: the immutable fields are set in `init`; the rest is confined to `queue`,
/// or atomic (`closedFlag`).
final class StreamEngine: @unchecked Sendable {
  let descriptor: Int32
  /// Serial; the confinement of every field marked "on `queue`".
  let queue = Queue(label: "GCD.IOChannel.stream")
  private let cleanupQueue: Queue
  private let cleanup: @Sendable (Int32) -> Void
  /// Close the descriptor at the end (a channel that opened it itself).
  private let closing: Bool
  /// The record this engine uses the descriptor through (its saved flags, its users), on `queue`;
  /// nil for a channel made from one already closed, which never had the descriptor.
  private var record: StreamDescriptor?
  /// The record whose lines this engine's operations take their tickets in, at submission (any
  /// thread): `record` from the start, or the parent's (a channel made from one closed refuses its
  /// operations, which leave the line at once).
  private let lineRecord: StreamDescriptor?
  /// The descriptor is open for reading only (`O_RDONLY`) or writing only (`O_WRONLY`): stopping
  /// that one direction ends the channel, as closing a C channel with `DISPATCH_IO_STOP` does.
  private let readOnly: Bool
  private let writeOnly: Bool
  /// Closed: `IOChannel.fileDescriptor` is -1.
  let closedFlag = Atomic<Bool>(false)

  /// The handler calls of one operation: each call is made once the one before it has returned,
  /// on the operation's queue, in the order they were sent — on a concurrent queue too, as
  /// libdispatch's serial queue per operation (targeting the caller's) runs them.
  final class HandlerCalls: Sendable {
    typealias Call = (done: Bool, data: DispatchBuffer?, error: Int32)
    /// Where the calls run; nil: on the engine's queue, as they are sent (a `read(upTo:)` read's,
    /// whose handler only hands the bytes to the waiting task: no hop before the task's).
    let queue: Queue?
    let handler: IOChannel.Handler
    /// The calls sent and not yet made, and whether a block on `queue` is making them.
    private let outbox = Mutex<(calls: [Call], draining: Bool)>(([], false))

    init(queue: Queue?, handler: @escaping IOChannel.Handler) {
      self.queue = queue
      self.handler = handler
    }

    func send(done: Bool, data: DispatchBuffer?, error: Int32) {
      guard let queue else { return handler(done, data, error) }
      let start = outbox.withLock { outbox in
        outbox.calls.append((done, data, error))
        defer { outbox.draining = true }
        return !outbox.draining
      }
      if start { queue.async { self.drain() } }
    }

    /// Makes the calls in order until none is left (one block: the next call cannot start beside
    /// the one before it).
    private func drain() {
      while let call = next() { handler(call.done, call.data, call.error) }
    }

    private func next() -> Call? {
      outbox.withLock { outbox in
        if outbox.calls.isEmpty {
          outbox.draining = false
          return nil
        }
        return outbox.calls.removeFirst()
      }
    }
  }

  /// A read: how many bytes it still wants, and those read but not yet delivered.
  /// `@unchecked Sendable`: made by the submitting thread and handed to `queue` by `async` (the
  /// hand-off orders the two), then used only on `queue`.
  final class ReadOperation: @unchecked Sendable {
    /// Its place in the descriptor's read line (`StreamDescriptor.enter`); nil: no line.
    var ticket: UInt64?
    var remaining: Int
    let calls: HandlerCalls
    var pending = DispatchBuffer()
    /// The channel's marks when the read was submitted: a later `setLimit` applies to later
    /// operations (libdispatch copies the channel's parameters into each operation it makes).
    var lowWater = 1
    var highWater = Int.max
    /// Takes what the descriptor holds now and ends, `EAGAIN` when it holds nothing more
    /// (`IOChannel.readAvailable`): it never waits for the read source.
    let nowOnly: Bool
    /// Ends as soon as it holds the low-water mark's bytes (`IOChannel.read(upTo:)`): no read stays
    /// in flight between two calls, so the next call may read on its own thread (`readNow`).
    let untilFirst: Bool
    /// - Parameter queue: Where the handler runs; nil: on the engine's queue (`HandlerCalls`), for
    ///   `IOChannel.read(upTo:)`, whose handler only hands the bytes to the waiting task.
    init(
      length: Int, queue: Queue?, nowOnly: Bool = false, untilFirst: Bool = false,
      handler: @escaping IOChannel.Handler
    ) {
      remaining = length
      self.nowOnly = nowOnly
      self.untilFirst = untilFirst
      calls = HandlerCalls(queue: queue, handler: handler)
    }
  }

  /// A write: the bytes not yet written, and how many were written since its handler last heard.
  /// `@unchecked Sendable` as `ReadOperation`.
  final class WriteOperation: @unchecked Sendable {
    var rest: DispatchBuffer
    let calls: HandlerCalls
    var unreported = 0
    /// The channel's low-water mark when the write was submitted (as a read's).
    var lowWater = Int.max
    /// Its `done` call was sent: a cancellation of its task comes too late to stop anything.
    var completed = false
    /// Its place in the descriptor's write line (`StreamDescriptor.enter`); nil: no line.
    var ticket: UInt64?
    /// - Parameter queue: Where the handler runs; nil: on the engine's queue (`HandlerCalls`), for
    ///   `IOChannel.write(_:)`, whose handler only resumes the waiting task.
    init(data: DispatchBuffer, queue: Queue?, handler: @escaping IOChannel.Handler) {
      rest = data
      calls = HandlerCalls(queue: queue, handler: handler)
    }
  }

  enum Item {
    case read(ReadOperation)
    case write(WriteOperation)
    case barrier(@Sendable () -> Void)
    /// A read or write submitted after `close()` behind a barrier that waits: it ends with
    /// `ECANCELED` in its turn, once the barrier ran (libdispatch's channel queue holds it there).
    indirect case refused(Item)
  }

  // On `queue`:
  /// The reads that may run, the first one running.
  private var reads: [ReadOperation] = []
  /// The writes that may run, the first one running.
  private var writes: [WriteOperation] = []
  /// From the first barrier not yet run: what waits for it, in order.
  private var later: [Item] = []
  private var readLowWater = 1
  private var writeLowWater = Int.max
  private var highWater = Int.max
  private var interval: (timer: TimerSource, strict: Bool)?
  private var readSource: ReadSource?
  private var readWaiting = false
  private var writeSource: WriteSource?
  private var writeWaiting = false
  /// Why no read can ever succeed (a descriptor open for writing only, a read source that could not
  /// be made): every read ends with it; nil while they can. The end of file, or a failed `read(2)`,
  /// ends one read only: the next reads again (a FIFO's new writer, a terminal after Ctrl-D), as
  /// libdispatch's next read does.
  private var readEnded: Int32?
  /// Why the writes cannot go on (a write source that could not be made, a terminal hung up); 0
  /// while they can.
  private var writeFailure: Int32 = 0
  /// The last read filled what it asked for (or the read source reported more than was read): a
  /// read submitted now asks the descriptor first, and waits for the read source only if it says
  /// `EAGAIN`. True at the start, so a channel's first read takes bytes already queued (a
  /// subprocess's output) without arming the source and waiting for its event.
  private var readMayHaveMore = true
  /// In the write source's handler: the descriptor said it was writable (or hung up).
  private var writeWoken = false
  private var readsStopped = false
  private var writesStopped = false
  private var closed = false
  private var finishing = false
  private var sourcesLeft = 0

  /// The doors of the two directions (`readNow(upTo:)`, `writeNow(_:)`): a door is open while the
  /// engine has no operation of its direction to run and none can be owed to an earlier call, so
  /// a caller may use the descriptor in that direction on its own thread.
  struct Door {
    /// A caller may borrow the reads now. Closed by every submission that touches the reads
    /// (before it is sent to `queue`), opened by `run()` once the reads are idle.
    var readOpen = false
    /// A caller is reading now: `run()` leaves the reads, the barriers and the end alone until it
    /// has returned.
    var readBorrowed = false
    /// The same for the writes.
    var writeOpen = false
    var writeBorrowed = false
    /// Submissions sent to `queue` that have not run yet, per direction: the door stays closed.
    var readsOnTheWay = 0
    var writesOnTheWay = 0
    /// `run()` found a door borrowed: the borrower runs the engine again when it returns.
    var kick = false
    /// The high-water mark in force (a borrowed read takes no more).
    var highWater = Int.max
    /// What a borrowed read found for the engine to take over: whether it found the descriptor
    /// empty.
    var emptied = false
    /// The unwritten rest of a borrowed write that found no room: the engine runs it before every
    /// write submitted while the door was borrowed (`handOver`).
    var writeRest: WriteOperation?
    /// The descriptor's record, whose line a borrowed read or write enters (set with the doors).
    var record: StreamDescriptor?
    /// The write line's ticket of a borrowed write's rest, until `handOver` gives it to the rest.
    var restTicket: UInt64?
  }
  /// Locked briefly by the submitting threads, the borrower and `run()`.
  private let door = Mutex(Door())

  /// A stream engine over `descriptor` (a pipe, a socket, a character device), which stays
  /// non-blocking until the last channel over it has ended (`StreamDescriptor`).
  init(descriptor: Int32, closing: Bool, cleanupQueue: Queue, cleanup: @escaping @Sendable (Int32) -> Void) {
    self.descriptor = descriptor
    self.closing = closing
    self.cleanupQueue = cleanupQueue
    self.cleanup = cleanup
    let record = StreamDescriptor.join(descriptor)
    self.record = record
    lineRecord = record
    (readOnly, writeOnly) = (record.isReadOnly, record.isWriteOnly)
    wrongDirection()
    door.withLock { door in
      door.readOpen = readEnded == nil
      door.writeOpen = writeFailure == 0
    }
  }

  /// A stream engine over `parent`'s descriptor, if `parent` is not closed: `parent`'s queue says,
  /// after every call made on `parent` before this one, and this engine's queue waits for the
  /// answer. Made from a closed channel (whose descriptor may be gone, its number another file's),
  /// the engine never uses the number: it is closed from the start, every operation ends with
  /// `ECANCELED`, and its cleanup runs at once with -1.
  init(parent: StreamEngine, cleanupQueue: Queue, cleanup: @escaping @Sendable (Int32) -> Void) {
    descriptor = parent.descriptor
    closing = false
    self.cleanupQueue = cleanupQueue
    self.cleanup = cleanup
    (readOnly, writeOnly) = (parent.readOnly, parent.writeOnly)
    lineRecord = parent.lineRecord
    queue.suspend()
    parent.queue.async {
      if parent.closed {
        self.markClosed()
      } else {
        // Not closed, so not ended: the record still counts `parent`.
        parent.record!.join()
        self.record = parent.record
        self.wrongDirection()
      }
      self.queue.resume()
      self.queue.async { self.run() }
    }
  }

  /// A descriptor open for writing only reads nothing, and one open for reading only writes
  /// nothing: those operations end at once with `EBADF`, as `read(2)` and `write(2)` say (no
  /// readiness event would ever come for them).
  private func wrongDirection() {
    if writeOnly { readEnded = Errno.badFileDescriptor }
    if readOnly { writeFailure = Errno.badFileDescriptor }
  }

  // MARK: Submissions (any thread)

  func read(
    length: Int, queue: Queue?, nowOnly: Bool = false, untilFirst: Bool = false, handler: @escaping IOChannel.Handler
  ) {
    let operation = ReadOperation(
      length: length, queue: queue, nowOnly: nowOnly, untilFirst: untilFirst, handler: handler)
    submitting(writes: false, line: (.reads, { operation.ticket = $0 })) { self.submit(.read(operation)) }
  }

  func write(data: DispatchBuffer, queue: Queue?, handler: @escaping IOChannel.Handler) {
    write(WriteOperation(data: data, queue: queue, handler: handler))
  }

  func write(_ operation: WriteOperation) {
    submitting(reads: false, line: (.writes, { operation.ticket = $0 })) { self.submit(.write(operation)) }
  }

  /// The task awaiting `operation` (`IOChannel.write(_:)`) was cancelled: unless the write has
  /// already ended, the writes stop, as `stopWrites()`; a write that ended is left as it ended, and
  /// the channel as it was.
  func cancelWrite(_ operation: WriteOperation) {
    submitting(reads: false) {
      guard !operation.completed else { return self.run() }
      self.writesStopped = true
      if self.writeOnly { self.markClosed() }
      self.run()
    }
  }

  func barrier(_ body: @escaping @Sendable () -> Void) {
    submitting { self.submit(.barrier(body)) }
  }

  func setLimit(lowWater: Int?, highWater: Int?) {
    submitting {
      if let lowWater {
        self.readLowWater = max(lowWater, 1)
        self.writeLowWater = max(lowWater, 1)
      }
      if let highWater { self.highWater = max(highWater, 1) }
      self.run()
    }
  }

  func setInterval(nanoseconds: UInt64, strict: Bool) {
    queue.async { self.schedule(interval: nanoseconds, strict: strict) }
  }

  /// `close(stop:)`: no operation is accepted after it; with `stop` the submitted ones end now.
  func close(stop: Bool) {
    submitting {
      self.markClosed()
      if stop {
        self.readsStopped = true
        self.writesStopped = true
      }
      self.run()
    }
  }

  /// The reads end now, with `ECANCELED`, and so does every later one; the writes go on (on a
  /// descriptor open for reading only, the channel is closed: it has nothing else to do).
  func stopReads() {
    submitting {
      self.readsStopped = true
      if self.readOnly { self.markClosed() }
      self.run()
    }
  }

  /// The writes end now, with `ECANCELED`, and so does every later one; the reads go on (on a
  /// descriptor open for writing only, the channel is closed).
  func stopWrites() {
    submitting {
      self.writesStopped = true
      if self.writeOnly { self.markClosed() }
      self.run()
    }
  }

  private func markClosed() {
    closed = true
    closedFlag.store(true, ordering: .releasing)
  }

  /// The wrapper is gone: the reads stop (none is left waiting for bytes that never come), the
  /// writes run to their end, then the engine finishes.
  func drop() {
    submitting {
      self.readsStopped = true
      self.markClosed()
      self.run()
    }
  }

  // MARK: Reading on the caller's thread

  /// What `readNow(upTo:)` found.
  enum ReadNow {
    /// Bytes, at least one.
    case bytes(DispatchBuffer)
    /// The end of file (0) or a failed read (the errno): this read's end; the next reads again.
    case ended(Int32)
  }

  /// A read of what the descriptor holds now, on the caller's thread, when the engine has no read
  /// to run (`Door`): nil when the door is closed or the descriptor holds nothing now (then the
  /// caller submits a read as usual). The engine's read order holds: a read submitted before this
  /// call closed the door, and one submitted while it runs waits until it has returned.
  func readNow(upTo limit: Int) -> ReadNow? {
    let borrowed: (highWater: Int, record: StreamDescriptor)? = door.withLock { door in
      guard door.readOpen, !door.readBorrowed, let record = door.record else { return nil }
      door.readBorrowed = true
      return (door.highWater, record)
    }
    guard let (highWater, record) = borrowed else { return nil }
    var found: ReadNow?
    var emptied = false
    // Another channel's read over the descriptor is in line: none here (the caller queues).
    if let ticket = record.enterIfEmpty(.reads, self) {
      // At most what the engine asks for when it asks first; as the engine reads (the read source
      // is suspended: no read is running).
      let (bytes, error) = readChunk(min(limit, highWater, StreamEngine.askFirstBytes))
      record.leave(.reads, ticket)
      emptied = bytes == nil && error == Errno.wouldBlock
      found = bytes.map { .bytes($0) } ?? (emptied ? nil : .ended(error))
    }
    let kick = door.withLock { door in
      door.readBorrowed = false
      if emptied { door.emptied = true }
      defer { door.kick = false }
      return door.kick
    }
    if kick { queue.async { self.run() } }
    return found
  }

  /// What `writeNow(_:)` did.
  enum WriteNow {
    /// Nothing: the door was closed (submit the write as usual).
    case closed
    /// The write ended on the caller's thread: 0 when every byte was written, otherwise the errno.
    case written(Int32)
    /// The descriptor took only part: the rest, still ahead of every later write. The caller
    /// holds the door and hands the rest over at once (`handOver`).
    case rest(DispatchBuffer)
  }

  /// A write of `data` on the caller's thread when the engine has no write to run (`Door`), as
  /// the engine's own writes: `write(2)` of each region until all is written, the descriptor has
  /// no room (`EAGAIN`: the rest is handed over) or an error.
  func writeNow(_ data: DispatchBuffer) -> WriteNow {
    let record: StreamDescriptor? = door.withLock { door in
      guard door.writeOpen, !door.writeBorrowed, let record = door.record else { return nil }
      door.writeBorrowed = true
      return record
    }
    guard let record else { return .closed }
    // Another channel's or one-shot's write over the descriptor is in line: queue behind it.
    guard let ticket = record.enterIfEmpty(.writes, self) else {
      releaseWriteDoor(rest: nil)
      return .closed
    }
    var written = 0
    var error: Int32 = 0
    data.enumerateRegions { bytes, _ in
      var offset = 0
      while offset < bytes.count {
        let got = system_write(descriptor, bytes.baseAddress! + offset, bytes.count - offset)
        if got > 0 {
          offset += got
          written += got
        } else if got < 0 && system_errno == Errno.interrupted {
          continue
        } else {
          // A write of nothing (no room, or a 0 the engine's own writes would wait on): the rest.
          error = got < 0 ? system_errno : Errno.wouldBlock
          return false
        }
      }
      return true
    }
    // The rest keeps its place, first in the write line: `handOver` gives it the ticket.
    if error == Errno.wouldBlock {
      door.withLock { $0.restTicket = ticket }
      return .rest(data.extracting(written..<data.count))
    }
    record.leave(.writes, ticket)
    releaseWriteDoor(rest: nil)
    return .written(error)
  }

  /// The rest of a borrowed write (`writeNow`'s `.rest`) becomes the engine's first write; its
  /// handler calls come as a submitted write's.
  func handOver(_ rest: WriteOperation) {
    releaseWriteDoor(rest: rest)
  }

  private func releaseWriteDoor(rest: WriteOperation?) {
    let kick = door.withLock { door in
      if let rest { (rest.ticket, door.restTicket) = (door.restTicket, nil) }
      door.writeBorrowed = false
      door.writeRest = rest
      if rest != nil { door.writeOpen = false }
      defer { door.kick = false }
      return door.kick || rest != nil
    }
    if kick { queue.async { self.run() } }
  }

  /// Sends `body` to `queue` as a submission that touches the reads, the writes or both: their
  /// doors stay closed from now until it has run (then `run()` opens them when it may), so no
  /// caller borrows a direction ahead of an operation submitted before it.
  ///
  /// - Parameter line: For a read or write: its direction, and where its ticket in the descriptor's
  ///   line goes; the ticket is taken and the submission queued under the line's lock, so that the
  ///   engine's operations are in its queue in the order of their tickets.
  private func submitting(
    reads: Bool = true, writes: Bool = true,
    line: (direction: StreamDescriptor.Direction, ticket: (UInt64) -> Void)? = nil,
    _ body: @escaping @Sendable () -> Void
  ) {
    door.withLock { door in
      if reads { (door.readOpen, door.readsOnTheWay) = (false, door.readsOnTheWay + 1) }
      if writes { (door.writeOpen, door.writesOnTheWay) = (false, door.writesOnTheWay + 1) }
    }
    let block: @Sendable () -> Void = {
      self.door.withLock { door in
        if reads { door.readsOnTheWay -= 1 }
        if writes { door.writesOnTheWay -= 1 }
      }
      body()
    }
    guard let line, let lineRecord else { return queue.async(block) }
    lineRecord.enter(line.direction, self) { ticket in
      line.ticket(ticket)
      queue.async(block)
    }
  }

  /// On `queue`, first in `run()`: takes what a borrowed read found and a borrowed write's rest,
  /// and says which direction a caller borrows now (the borrower runs the engine again when it
  /// returns).
  private func takeDoor() -> (reads: Bool, writes: Bool) {
    let (readBorrowed, writeBorrowed, emptied, rest) = door.withLock { door in
      if door.readBorrowed || door.writeBorrowed { door.kick = true }
      defer { (door.emptied, door.writeRest) = (false, nil) }
      return (door.readBorrowed, door.writeBorrowed, door.emptied, door.writeRest)
    }
    if emptied { readMayHaveMore = false }
    if let rest {
      rest.lowWater = writeLowWater
      writes.insert(rest, at: 0)
    }
    return (readBorrowed, writeBorrowed)
  }

  /// On `queue`, last in `run()`: opens a direction's door when no operation of it is to run and
  /// none waits behind a barrier, and it goes on (a read delivers what it gets: low-water mark 1).
  private func openDoorsIfIdle() {
    guard later.isEmpty, !closed, record != nil else { return }
    let reading = reads.isEmpty && !readsStopped && readEnded == nil && readLowWater <= 1
    let writing = writes.isEmpty && !writesStopped && writeFailure == 0
    guard reading || writing else { return }
    let highWater = highWater
    door.withLock { door in
      if reading && !door.readBorrowed && door.readsOnTheWay == 0 {
        (door.readOpen, door.highWater, door.record) = (true, highWater, record)
      }
      if writing && !door.writeBorrowed && door.writeRest == nil && door.writesOnTheWay == 0 {
        (door.writeOpen, door.record) = (true, record)
      }
    }
  }

  // MARK: The machine (on `queue`)

  private func submit(_ item: Item) {
    switch item {
    case .read(let operation): (operation.lowWater, operation.highWater) = (readLowWater, highWater)
    case .write(let operation): operation.lowWater = writeLowWater
    case .barrier, .refused: break
    }
    // After `close()`: a read or write ends with `ECANCELED`, in its turn behind a barrier that
    // waits; a barrier still waits for what was submitted before it (libdispatch's do both); once
    // the engine is finishing, nothing is left to wait for.
    if closed && (finishing || (later.isEmpty && !item.isBarrier)) {
      refuse(item)
    } else if later.isEmpty, !item.isBarrier {
      place(item)
    } else {
      later.append(closed && !item.isBarrier ? .refused(item) : item)
    }
    run()
  }

  /// An operation submitted after `close`: it ends with `ECANCELED`, at once or in its turn behind a
  /// barrier (a barrier submitted once the engine is finishing runs at once).
  private func refuse(_ item: Item) {
    switch item {
    case .read(let operation):
      leaveLine(.reads, operation.ticket)
      send(operation, done: true, data: nil, error: Errno.canceled)
    case .write(let operation):
      operation.completed = true
      leaveLine(.writes, operation.ticket)
      send(operation, done: true, data: operation.rest, error: Errno.canceled)
    case .barrier(let body): body()
    case .refused(let item): refuse(item)
    }
  }

  private func place(_ item: Item) {
    switch item {
    case .read(let operation): reads.append(operation)
    case .write(let operation): writes.append(operation)
    case .barrier: preconditionFailure("GCD: IOChannel: a barrier placed among running operations")
    case .refused(let item): refuse(item)
    }
  }

  /// Moves everything on: the reads, the writes, a barrier whose operations before it have ended
  /// (and what follows it up to the next barrier), the end.
  private func run(readable estimate: Int? = nil) {
    // A caller reads or writes on its own thread now: that direction, the barriers and the end
    // wait for it.
    let borrowed = takeDoor()
    if borrowed.reads || borrowed.writes {
      if !borrowed.reads { pumpReads(estimate: estimate) }
      if !borrowed.writes { pumpWrites() }
      return
    }
    defer { openDoorsIfIdle() }
    pumpReads(estimate: estimate)
    pumpWrites()
    while reads.isEmpty, writes.isEmpty, case .barrier(let body)? = later.first {
      later.removeFirst()
      body()
      while let item = later.first, !item.isBarrier {
        later.removeFirst()
        place(item)
      }
      pumpReads(estimate: nil)
      pumpWrites()
    }
    finishIfDone()
  }

  /// Reads for the first read until it is complete, the descriptor has nothing more now, or the
  /// reads end. `estimate`: the bytes the read source says are queued (nil outside its handler:
  /// then the source is asked first).
  private func pumpReads(estimate: Int?) {
    var available = estimate
    // A read made in this call: an estimate of 0 asks for one read (the end of file, an error),
    // but not after a read took what the estimate said.
    var hasRead = false
    while let operation = reads.first {
      if readsStopped {
        complete(operation, error: Errno.canceled)
        continue
      }
      if let readEnded {
        complete(operation, error: readEnded)
        continue
      }
      if operation.remaining == 0 {
        complete(operation, error: 0)
        continue
      }
      // It reads only while it is first in the descriptor's read line: a read of another channel
      // submitted before it runs to its end first (libdispatch's operation queue per descriptor).
      // A read of what is there now does not wait for one: what comes is that read's; it ends at
      // once, as on an empty descriptor.
      if !isFirst(.reads, operation.ticket) {
        if operation.nowOnly {
          complete(operation, error: Errno.wouldBlock)
          continue
        }
        break
      }
      // Outside the source's handler, after a read that may have left bytes: ask the descriptor
      // first, up to 64 KiB (a read that says EAGAIN costs one call; the source, an arm, an
      // event and a hop).
      if available == nil && readMayHaveMore && !hasRead { available = StreamEngine.askFirstBytes }
      // A read of what is there now asks the descriptor until it says EAGAIN (or the end).
      if operation.nowOnly && (available ?? 0) <= 0 { available = StreamEngine.askFirstBytes }
      // Outside the source's handler, or once the bytes it reported are read (a read would say
      // EAGAIN): wait for the source, which fires at once if more came.
      guard let queued = available, queued >= 0, queued > 0 || !hasRead else {
        waitReadable()
        return
      }
      // At least a small block: an estimate of 0 on a readable descriptor is its end (or an error,
      // or bytes that came since), which one read says.
      let count = min(operation.remaining, max(queued, 1024), 1 << 20)
      let (bytes, error) = readChunk(count)
      hasRead = true
      guard let bytes else {
        if error == Errno.wouldBlock {
          readMayHaveMore = false
          if operation.nowOnly {
            complete(operation, error: Errno.wouldBlock)
            available = nil
            continue
          }
          waitReadable()
          return
        }
        // The end of file, or a failed read, ends this read; the next one asks the descriptor again.
        complete(operation, error: error)
        (readMayHaveMore, hasRead, available) = (true, false, nil)
        continue
      }
      let got = bytes.count
      operation.pending.append(bytes)
      operation.remaining -= got
      available = got < count ? -1 : queued - got
      readMayHaveMore = available.map { $0 > 0 } ?? false
      if operation.remaining == 0 || (operation.untilFirst && operation.pending.count >= operation.lowWater) {
        complete(operation, error: 0)
      } else if !operation.nowOnly {
        deliver(operation)
      }
    }
    if readWaiting, let readSource {
      readWaiting = false
      readSource.suspend()
    }
  }

  /// Writes the first write's bytes until it is complete, the descriptor has no room now, or the
  /// writes end.
  private func pumpWrites() {
    while let operation = writes.first {
      if writesStopped || writeFailure != 0 {
        complete(operation, error: writesStopped ? Errno.canceled : writeFailure)
        continue
      }
      // Each write whole: it writes only while it is first in the descriptor's write line, shared
      // by every channel and one-shot write over the descriptor (libdispatch's operation queue per
      // descriptor and direction).
      guard isFirst(.writes, operation.ticket) else { break }
      var written = 0
      var error: Int32 = 0
      operation.rest.enumerateRegions { bytes, _ in
        written = system_write(descriptor, bytes.baseAddress!, bytes.count)
        if written < 0 { error = system_errno }
        return false
      }
      if operation.rest.isEmpty {
        complete(operation, error: 0)
        continue
      }
      if written < 0 {
        if error == Errno.interrupted { continue }
        if error == Errno.wouldBlock {
          // Woken with no room: a hang-up with no room, which stays (a pseudo-terminal's master
          // whose slave closed), would wake the source again at once, for good. Its reads fail
          // with EIO; so do its writes, rather than spin (libdispatch leaves them waiting).
          if writeWoken && system_hungUpWithoutRoom(descriptor) {
            writeFailure = Errno.inputOutput
            continue
          }
          waitWritable()
          return
        }
        complete(operation, error: error)
        continue
      }
      operation.rest = operation.rest.extracting(written..<operation.rest.count)
      operation.unreported += written
      if operation.rest.isEmpty {
        complete(operation, error: 0)
      } else if operation.unreported >= operation.lowWater {
        operation.unreported = 0
        send(operation, done: false, data: operation.rest, error: 0)
      }
    }
    if writeWaiting, let writeSource {
      writeWaiting = false
      writeSource.suspend()
    }
  }

  /// Hands a running read what it gathered, in deliveries of at least the low-water mark and at
  /// most the high-water mark.
  private func deliver(_ operation: ReadOperation) {
    while operation.pending.count >= operation.lowWater {
      let count = min(operation.pending.count, operation.highWater)
      send(operation, done: false, data: take(count, from: operation), error: 0)
    }
  }

  /// Ends the first read: what it gathered (in deliveries of at most the high-water mark), then
  /// `done` with `error`.
  private func complete(_ operation: ReadOperation, error: Int32) {
    reads.removeFirst()
    leaveLine(.reads, operation.ticket)
    while operation.pending.count > operation.highWater {
      send(operation, done: false, data: take(operation.highWater, from: operation), error: 0)
    }
    send(operation, done: true, data: operation.pending, error: error)
  }

  /// Ends the first write: nil data when every byte was written, otherwise the rest. The
  /// descriptor's write turn goes to the next writer.
  private func complete(_ operation: WriteOperation, error: Int32) {
    writes.removeFirst()
    operation.completed = true
    leaveLine(.writes, operation.ticket)
    send(operation, done: true, data: error == 0 ? nil : operation.rest, error: error)
  }

  /// Whether the operation holding `ticket` may use the descriptor: it is first in `direction`'s
  /// line (no ticket: the engine has no line). When it is not, `lineMoved` runs the engine again.
  private func isFirst(_ direction: StreamDescriptor.Direction, _ ticket: UInt64?) -> Bool {
    guard let ticket, let lineRecord else { return true }
    return lineRecord.isFirst(direction, ticket)
  }

  /// An operation that held `ticket` ended: it leaves the line.
  private func leaveLine(_ direction: StreamDescriptor.Direction, _ ticket: UInt64?) {
    if let ticket { lineRecord?.leave(direction, ticket) }
  }

  /// An operation of this engine is first in the descriptor's `direction` line now.
  func lineMoved(_ direction: StreamDescriptor.Direction) {
    queue.async {
      // Bytes may have come while another engine read: ask the descriptor first.
      if direction == .reads { self.readMayHaveMore = true }
      self.run()
    }
  }

  private func take(_ count: Int, from operation: ReadOperation) -> DispatchBuffer {
    if count == operation.pending.count {
      defer { operation.pending = DispatchBuffer() }
      return operation.pending
    }
    defer { operation.pending = operation.pending.extracting(count..<operation.pending.count) }
    return operation.pending.extracting(0..<count)
  }

  private func send(_ operation: ReadOperation, done: Bool, data: DispatchBuffer?, error: Int32) {
    operation.calls.send(done: done, data: data, error: error)
  }

  private func send(_ operation: WriteOperation, done: Bool, data: DispatchBuffer?, error: Int32) {
    operation.calls.send(done: done, data: data, error: error)
  }

  /// The read source, made on first need and resumed: its handler reads on.
  private func waitReadable() {
    if readWaiting { return }
    if readSource == nil {
      do throws(GCDError) {
        let source = try ReadSource(fileDescriptor: descriptor, queue: queue)
        source.setEventHandler { estimate in self.run(readable: Int(clamping: estimate)) }
        source.setCancelHandler { self.sourceEnded() }
        readSource = source
      } catch {
        readEnded = error.errno
        pumpReads(estimate: nil)
        return
      }
    }
    readWaiting = true
    readSource!.resume()
  }

  /// The write source, made on first need and resumed: its handler writes on.
  private func waitWritable() {
    if writeWaiting { return }
    if writeSource == nil {
      do throws(GCDError) {
        let source = try WriteSource(fileDescriptor: descriptor, queue: queue)
        source.setEventHandler { _ in
          self.writeWoken = true
          self.run()
          self.writeWoken = false
        }
        source.setCancelHandler { self.sourceEnded() }
        writeSource = source
      } catch {
        writeFailure = error.errno
        pumpWrites()
        return
      }
    }
    writeWaiting = true
    writeSource!.resume()
  }

  /// One `read(2)` of up to `count` bytes into new memory (again on `EINTR`), through the read
  /// source's watch once there is one (a read that empties the descriptor tells it, and its next
  /// wait costs no call): the bytes, or none with 0 at end of file, otherwise the errno.
  private func readChunk(_ count: Int) -> (bytes: DispatchBuffer?, error: Int32) {
    guard let memory = system_allocate(count) else { return (nil, Errno.noMemory) }
    let buffer = UnsafeMutableRawBufferPointer(start: memory, count: count)
    let got = readSource?.watch?.read(into: buffer) ?? DescriptorWatch.read(descriptor, into: buffer)
    guard got > 0 else {
      let error = got < 0 ? system_errno : 0
      system_deallocate(memory)
      return (nil, error)
    }
    let kept = got < count / 2 ? system_shrink(memory, to: got) : memory
    return (DispatchBuffer(bytesNoCopy: UnsafeRawBufferPointer(start: kept, count: got), deallocator: .free), 0)
  }

  /// What a read outside the source's handler asks for at most when it asks the descriptor first.
  static let askFirstBytes = 65_536

  private func schedule(interval nanoseconds: UInt64, strict: Bool) {
    interval?.timer.cancel()
    interval = nil
    guard nanoseconds > 0, !finishing else { return }
    let timer = TimerSource(queue: queue)
    let period = Duration.nanoseconds(Int64(clamping: nanoseconds))
    timer.schedule(start: .now + period, interval: period)
    timer.setEventHandler { _ in self.tick() }
    timer.resume()
    interval = (timer, strict)
  }

  /// The interval has passed: with a strict interval, the running read delivers what it gathered
  /// and the running write reports its progress, however little (nothing when there is none).
  private func tick() {
    guard let interval, interval.strict else { return }
    if let operation = reads.first, !operation.pending.isEmpty {
      send(
        operation, done: false, data: take(min(operation.pending.count, operation.highWater), from: operation),
        error: 0)
    }
    if let operation = writes.first, operation.unreported > 0 {
      operation.unreported = 0
      send(operation, done: false, data: operation.rest, error: 0)
    }
  }

  /// The end, once the channel is closed and nothing is left to do: the sources are cancelled
  /// (their cancel handlers run once the fence has let the descriptor go), then `end`.
  private func finishIfDone() {
    guard closed, !finishing, reads.isEmpty, writes.isEmpty, later.isEmpty else { return }
    finishing = true
    interval?.timer.cancel()
    interval = nil
    for source in [readSource as Source?, writeSource] {
      guard let source else { continue }
      sourcesLeft += 1
      source.cancel()  // a suspended one too: the cancel settles its suspension
    }
    if sourcesLeft == 0 { end() }
  }

  private func sourceEnded() {
    sourcesLeft -= 1
    if sourcesLeft == 0 { end() }
  }

  /// The engine is done with the descriptor: its record runs the cleanup once every channel over
  /// the descriptor is (a channel that never had it runs its cleanup now, with -1).
  private func end() {
    readSource = nil
    writeSource = nil
    guard let record else {
      let cleanup = self.cleanup
      cleanupQueue.async { cleanup(-1) }
      return
    }
    self.record = nil
    record.leave(closing: closing, cleanupQueue: cleanupQueue, cleanup: cleanup)
  }
}

extension StreamEngine.Item {
  var isBarrier: Bool {
    if case .barrier = self { return true }
    return false
  }
}
