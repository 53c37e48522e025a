import Synchronization

/// The state behind `IOChannel.read(upTo:)`: one C read at a time, bytes it
/// delivers beyond what the waiting caller asked for kept for the next call.
///
/// In the style of swift-async-algorithms: the state machine below runs
/// under the lock and returns an action; continuations are resumed outside
/// the lock; task cancellation enters as an event; each waiter is resumed
/// exactly once. The outcome itself is handed over through the state (the
/// woken task takes it under the lock), so every buffer crosses threads
/// under the Mutex.
final class ChannelReader: Sendable {
  /// The descriptor the channel was created over (for `IOChannel(channel:)`'s cleanup).
  let descriptor: Int32
  let state = Mutex(ReadStateMachine())
  /// Where a C channel's reads' handlers run: serial, so that the deliveries of one
  /// read and the next read it starts (another operation, not ordered with
  /// the first on a concurrent queue) reach the state machine in order. A
  /// stream channel's run on its engine's queue, serial too.
  let queue = Queue(label: "GCD.IOChannel.read(upTo:)")

  init(descriptor: Int32) { self.descriptor = descriptor }
}

/// What a `read(upTo:)` gets: bytes (empty at end of file) or an errno value.
typealias ReadOutcome = Result<DispatchBuffer, ReadFailure>

/// Why a `read(upTo:)` failed.
enum ReadFailure: Error {
  /// An errno value from libdispatch (or EBUSY: another read was waiting).
  case errno(Int32)
  /// The waiting task was cancelled (the channel was stopped for it).
  case cancelled
}

struct ReadStateMachine: ~Copyable {
  typealias Continuation = CheckedContinuation<Void, Never>

  /// Delivered bytes no caller has taken yet.
  private var pending = DispatchBuffer()
  /// Whether a C read is in flight, and how many bytes it asked for and got.
  private var outstanding = false
  private var requested = 0
  private var received = 0
  /// For a random-access channel: where the next C read starts.
  private var offset = 0
  /// How the last read ended, for the next call when no call was waiting: 0 at end of file,
  /// otherwise the errno value; nil when nothing is owed. A call takes it once: the end of file, or
  /// an error, ends one call (the next reads again, as libdispatch's next read does; the reads of a
  /// stopped channel end with `ECANCELED` each).
  private var ended: Int32?
  /// The task cancelled while waiting (the error that follows is its cancellation).
  private var cancelled = false
  /// The waiting task's continuation, how much it asks for, and the number of its call (`nextCall`),
  /// so that a cancellation reaches the wait of the task that was cancelled and no other.
  private var waiter: (continuation: Continuation, limit: Int, call: UInt64)?
  /// The number the next `read(upTo:)` call gets.
  private var nextCall: UInt64 = 0
  /// The outcome for the waiter just woken, until it takes it.
  private var handoff: ReadOutcome?
  /// A caller reads on its own thread now (`StreamEngine.readNow`).
  private var readingInline = false

  /// What the caller of an event must do once the lock is released.
  enum Action {
    case none
    /// Resume the continuation: its outcome is in the hand-off slot.
    case wake(Continuation)
    /// Resume the continuation: another read is waiting (`EBUSY`), nothing is handed over.
    case busy(Continuation)
    /// Start a C read of `length` bytes at `offset`.
    case read(offset: Int, length: Int)
    /// Stop the channel (a waiting task was cancelled).
    case stop
  }

  /// A task waits for bytes (for tests).
  var isWaiting: Bool { waiter != nil }

  /// A number for a `read(upTo:)` call: its wait, and its cancellation, carry it.
  mutating func newCall() -> UInt64 {
    defer { nextCall &+= 1 }
    return nextCall
  }

  /// Call `call` asks for up to `limit` bytes.
  mutating func read(upTo limit: Int, call: UInt64, _ continuation: Continuation) -> Action {
    if waiter != nil || handoff != nil || readingInline { return .busy(continuation) }
    if !pending.isEmpty { return hand(.success(take(limit)), to: continuation) }
    if let ended {
      self.ended = nil
      return hand(outcome(ended), to: continuation)
    }
    if limit == 0 { return hand(.success(DispatchBuffer()), to: continuation) }
    waiter = (continuation, limit, call)
    return outstanding ? .none : start(limit)
  }

  /// A task asks for up to `limit` bytes on a stream channel: true when it may read them on its
  /// own thread, nothing being owed to or by this machine (no bytes kept, no read in flight, no
  /// waiter, not ended); it then reports with `readInline(_:)`.
  mutating func mayReadInline(_ limit: Int) -> Bool {
    guard limit > 0, waiter == nil, handoff == nil, !readingInline, !outstanding, pending.isEmpty,
      ended == nil
    else { return false }
    readingInline = true
    return true
  }

  /// What the read on the caller's thread found: its outcome, or nil when the descriptor held
  /// nothing (the caller then waits as usual).
  mutating func readInline(_ found: StreamEngine.ReadNow?) -> ReadOutcome? {
    readingInline = false
    switch found {
    case nil: return nil
    case .bytes(let bytes): return .success(bytes)
    case .ended(let error):
      return outcome(error)
    }
  }

  /// The woken task takes its outcome.
  mutating func takeHandoff() -> ReadOutcome {
    defer { handoff = nil }
    return handoff ?? .failure(.errno(Errno.busy))
  }

  private mutating func hand(_ outcome: ReadOutcome, to continuation: Continuation) -> Action {
    handoff = outcome
    return .wake(continuation)
  }

  /// The C read delivered bytes, ended, or both. `untilFirst`: the read was the stream engine's,
  /// which ends at its first bytes (`StreamEngine.ReadOperation.untilFirst`): one that ends short
  /// is not the end of file, one that ends with none is.
  mutating func delivered(done: Bool, data: DispatchBuffer?, error: Int32, untilFirst: Bool = false) -> (
    resume: Action, next: Action
  ) {
    var resume = Action.none
    if let data, !data.isEmpty {
      received += data.count
      pending.append(data)
      if let (continuation, limit, _) = waiter {
        waiter = nil
        resume = hand(.success(take(limit)), to: continuation)
      }
    }
    guard done else { return (resume, .none) }
    outstanding = false
    offset += received
    if error != 0 {
      ended = error
    } else if untilFirst ? received == 0 : received < requested {
      ended = 0
    }
    if let (continuation, _, _) = waiter {
      if let ended {
        waiter = nil
        self.ended = nil
        return (hand(outcome(ended), to: continuation), .none)
      }
      return (resume, start(waiter!.limit))
    }
    return (resume, .none)
  }

  /// The task of call `call` was cancelled: its wait, if it is the one waiting, ends by stopping
  /// the reads (the bytes in flight cannot be given back to the stream). A call that is not
  /// waiting (it returned, or got `EBUSY` beside another task's wait) stops nothing.
  mutating func cancel(call: UInt64) -> Action {
    guard let waiter, waiter.call == call else { return .none }
    cancelled = true
    return .stop
  }

  private mutating func start(_ length: Int) -> Action {
    outstanding = true
    requested = length
    received = 0
    return .read(offset: offset, length: length)
  }

  private mutating func take(_ limit: Int) -> DispatchBuffer {
    if pending.count <= limit {
      defer { pending = DispatchBuffer() }
      return pending
    }
    defer { pending = pending.extracting(limit..<pending.count) }
    return pending.extracting(0..<limit)
  }

  /// The outcome for a waiter once reading has ended; a cancellation is
  /// reported to the waiter it was for, later callers get `ECANCELED`.
  private mutating func outcome(_ ended: Int32) -> ReadOutcome {
    defer { cancelled = false }
    if ended == 0 { return .success(DispatchBuffer()) }
    if ended == Errno.canceled && cancelled { return .failure(.cancelled) }
    return .failure(.errno(ended))
  }
}
