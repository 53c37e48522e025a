import Synchronization

/// What the stream channels over one descriptor number share, as `dispatch_io`'s fd entry: the
/// status flags from before the first of them set `O_NONBLOCK`, how many of them have not ended,
/// and what waits for the last one.
///
/// One record per number, process-wide. The first channel over a number makes it (and sets
/// `O_NONBLOCK`); each later one joins it; the last to end removes it, restores the flags, closes
/// the descriptor if a channel opened it itself, and runs every channel's cleanup — so no channel
/// restores blocking mode, or lets a cleanup close the descriptor, under another one still using
/// it. The table's lock is held while the flags are read, set and restored, so a channel made
/// over the number while the last one ends reads the caller's flags, never the engine's.
///
/// **A record answers only for the descriptor it saw opened.** The package cannot see a number
/// closed and reused behind its back (a user's `close` or `dup2` under an open channel), so a
/// record keeps what the kernel says the descriptor is — its file (`st_dev`, `st_ino`) and its
/// access mode — and a channel made over the number asks the kernel again (one `fstat`, one
/// `fcntl`): a record whose descriptor is gone is left to the channels that still use it, out of
/// the table, and the new channel makes a record of its own. A record whose descriptor is gone
/// restores no flags and closes nothing when its last channel ends: the number is another file's.
///
/// **One operation at a time per direction.** Each direction's turn (`takeTurn`) is held by one
/// engine at a time, from an operation's first byte to its end, and passed on in the order asked:
/// the writes of every channel and one-shot write over the descriptor never interleave, and a read
/// of one channel never takes bytes from the middle of another's (libdispatch's operation queue per
/// descriptor and direction).
///
/// `@unchecked Sendable`: `flags` and `identity` are set in `init`; the rest is guarded by
/// `table`'s lock, and the turns by `turns`'.
final class StreamDescriptor: @unchecked Sendable {
  let descriptor: Int32
  /// The status flags before `O_NONBLOCK` was set; -1 when they could not be read.
  let flags: Int32
  /// What the descriptor was when the record was made: its file and access mode (nil when `fstat`
  /// failed).
  private let identity: Identity?
  // Under `table`'s lock:
  private var users = 1
  private var closing = false
  private var cleanups: [Cleanup] = []
  /// Out of the table: its descriptor was found closed (and its number reused).
  private var gone = false
  private typealias Cleanup = (queue: Queue, body: @Sendable (Int32) -> Void)

  /// Who reads and who writes now, and who asked next, in order.
  private let turns = Mutex(PerDirection(Turn()))

  private static let table = Mutex<[Int32: StreamDescriptor]>([:])

  /// A descriptor's file and access mode, as the kernel says now.
  private struct Identity: Equatable {
    var device: UInt64
    var inode: UInt64
    var accessMode: Int32

    init?(_ descriptor: Int32) {
      let mode = system_statusFlags(descriptor)
      guard mode >= 0, let file = system_fstat(descriptor) else { return nil }
      (device, inode, accessMode) = (file.device, file.inode, mode & system_accessMode)
    }
  }

  private init(descriptor: Int32, identity: Identity?) {
    self.descriptor = descriptor
    self.identity = identity
    flags = system_statusFlags(descriptor)
    if flags >= 0 && flags & system_nonBlocking == 0 { system_setStatusFlags(descriptor, flags | system_nonBlocking) }
  }

  /// The record of `descriptor`, made (the descriptor made non-blocking) or joined; a record over
  /// the number whose descriptor is not this one (closed and reused since) is left out.
  static func join(_ descriptor: Int32) -> StreamDescriptor {
    table.withLock { table in
      let identity = Identity(descriptor)
      if let record = table[descriptor] {
        // The record's descriptor is non-blocking until its last channel ends: a descriptor of
        // the same file and mode that is blocking was opened anew under the number.
        if record.identity == identity && identity != nil && system_statusFlags(descriptor) & system_nonBlocking != 0 {
          record.users += 1
          return record
        }
        record.gone = true
      }
      let record = StreamDescriptor(descriptor: descriptor, identity: identity)
      table[descriptor] = record
      return record
    }
  }

  // MARK: The turns

  /// A direction of the descriptor, each with its turn.
  enum Direction {
    case reads, writes
  }

  /// One direction's turn: who holds it, and who asked next, in order.
  struct Turn {
    var holder: StreamEngine?
    var waiting: [StreamEngine] = []
  }

  /// Takes `direction`'s turn for `engine` if nobody holds it; otherwise `engine` is next after
  /// those already waiting, and `StreamEngine.turnCame(_:)` tells it when the turn is its. True: the
  /// turn is `engine`'s now.
  func takeTurn(_ direction: Direction, for engine: StreamEngine) -> Bool {
    turns.withLock { turns in
      if turns[direction].holder == nil {
        turns[direction].holder = engine
        return true
      }
      turns[direction].waiting.append(engine)
      return false
    }
  }

  /// Takes `direction`'s turn for `engine` only if nobody holds it or waits for it (a read or write
  /// on the caller's thread, `StreamEngine.readNow` and `writeNow`).
  func tryTurn(_ direction: Direction, for engine: StreamEngine) -> Bool {
    turns.withLock { turns in
      guard turns[direction].holder == nil, turns[direction].waiting.isEmpty else { return false }
      turns[direction].holder = engine
      return true
    }
  }

  /// `engine` is done with `direction`'s turn: the next engine waiting gets it.
  func giveBackTurn(_ direction: Direction, from engine: StreamEngine) {
    passOn(direction, from: engine, holding: true)
  }

  /// `engine` ended while in line for `direction`'s turn, or holding it: it leaves the line, and a
  /// turn it holds goes to the next engine waiting.
  func withdraw(_ direction: Direction, _ engine: StreamEngine) {
    passOn(direction, from: engine, holding: false)
  }

  private func passOn(_ direction: Direction, from engine: StreamEngine, holding: Bool) {
    let next = turns.withLock { turns -> StreamEngine? in
      precondition(!holding || turns[direction].holder === engine, "GCD: IOChannel: a turn given back by a non-holder")
      turns[direction].waiting.removeAll { $0 === engine }
      guard turns[direction].holder === engine else { return nil }
      turns[direction].holder = turns[direction].waiting.isEmpty ? nil : turns[direction].waiting.removeFirst()
      return turns[direction].holder
    }
    next?.turnCame(direction)
  }

  /// One more user of a record that has one already (a channel made from a channel that has not
  /// ended).
  func join() {
    Self.table.withLock { _ in
      precondition(users > 0, "GCD: IOChannel: joined the record of a descriptor whose channels all ended")
      users += 1
    }
  }

  /// The channels over `descriptor` that have not ended, by its record (0 with no record; for tests).
  static func users(of descriptor: Int32) -> Int { table.withLock { $0[descriptor]?.users ?? 0 } }

  /// Whether the descriptor was opened for reading only (`O_RDONLY`).
  var isReadOnly: Bool { flags >= 0 && flags & system_accessMode == system_readOnly }
  /// Whether the descriptor was opened for writing only (`O_WRONLY`).
  var isWriteOnly: Bool { flags >= 0 && flags & system_accessMode == system_writeOnly }

  /// A channel over the descriptor has ended: its cleanup runs on `queue` once the last one has
  /// (after the flags are restored and, when `closing`, the descriptor closed).
  func leave(closing: Bool, cleanupQueue queue: Queue, cleanup: @escaping @Sendable (Int32) -> Void) {
    let last = Self.table.withLock { table -> (cleanups: [Cleanup], closing: Bool)? in
      cleanups.append((queue, cleanup))
      self.closing = self.closing || closing
      users -= 1
      guard users == 0 else { return nil }
      // The number is another descriptor's when this one was closed under its channels: a newer
      // record may stand in the table, and neither the flags nor the descriptor are this record's.
      let ours = !gone && identity != nil && Identity(self.descriptor) == identity
      if !gone { table[self.descriptor] = nil }
      if ours && flags >= 0 { system_setStatusFlags(self.descriptor, flags) }
      return (cleanups, self.closing && ours)
    }
    guard let last else { return }
    let descriptor = self.descriptor
    if last.closing { system_close(descriptor) }
    for (queue, body) in last.cleanups { queue.async { body(descriptor) } }
  }
}

/// A value for each direction of a descriptor.
struct PerDirection<Value> {
  var reads: Value
  var writes: Value

  init(_ value: Value) { (reads, writes) = (value, value) }

  subscript(direction: StreamDescriptor.Direction) -> Value {
    get { direction == .reads ? reads : writes }
    set {
      if direction == .reads { reads = newValue } else { writes = newValue }
    }
  }
}
