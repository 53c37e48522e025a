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
/// **One line per direction.** Every read and write of every channel and one-shot call over the
/// descriptor takes a ticket in its direction's line when it is submitted (`enter`), and uses the
/// descriptor only while it is first, from its first byte to its end: writes never interleave,
/// and reads and writes run in the order submitted across channels (libdispatch's operation queue
/// per descriptor and direction).
///
/// `@unchecked Sendable`: `flags` and `identity` are set in `init`; the rest is guarded by
/// `table`'s lock, and the lines by `lines`'.
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

  /// The operations of each direction that have not ended, in the order submitted.
  private let lines = Mutex(PerDirection(Line()))

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

  // MARK: The lines

  /// A direction of the descriptor, each with its line.
  enum Direction {
    case reads, writes
  }

  /// One direction's line: the operations of every engine over the descriptor that have not ended,
  /// in the order they were submitted (by ticket). The first one's engine may use the descriptor.
  struct Line {
    var nextTicket: UInt64 = 0
    var tickets: [(ticket: UInt64, engine: StreamEngine)] = []
  }

  /// Gives an operation of `engine` its ticket in `direction`'s line and runs `enqueue` with it,
  /// under the line's lock: an engine's operations reach its queue in the order of their tickets,
  /// whatever threads submit them.
  func enter(_ direction: Direction, _ engine: StreamEngine, _ enqueue: (UInt64) -> Void) {
    lines.withLock { lines in
      let ticket = lines[direction].nextTicket
      lines[direction].nextTicket &+= 1
      lines[direction].tickets.append((ticket, engine))
      enqueue(ticket)
    }
  }

  /// Whether the operation holding `ticket` is first in `direction`'s line: it may use the
  /// descriptor, from its first byte to its end.
  func isFirst(_ direction: Direction, _ ticket: UInt64) -> Bool {
    lines.withLock { $0[direction].tickets.first?.ticket == ticket }
  }

  /// A ticket for a read or write on the caller's thread (`StreamEngine.readNow`, `writeNow`) when
  /// nothing is in `direction`'s line; nil otherwise (the caller submits as usual).
  func enterIfEmpty(_ direction: Direction, _ engine: StreamEngine) -> UInt64? {
    lines.withLock { lines in
      guard lines[direction].tickets.isEmpty else { return nil }
      let ticket = lines[direction].nextTicket
      lines[direction].nextTicket &+= 1
      lines[direction].tickets.append((ticket, engine))
      return ticket
    }
  }

  /// The operation holding `ticket` ended (or never ran): it leaves the line, and the engine of the
  /// operation first in line now is told (`StreamEngine.lineMoved`).
  func leave(_ direction: Direction, _ ticket: UInt64) {
    let next = lines.withLock { lines -> StreamEngine? in
      guard let index = lines[direction].tickets.firstIndex(where: { $0.ticket == ticket }) else { return nil }
      lines[direction].tickets.remove(at: index)
      return index == 0 ? lines[direction].tickets.first?.engine : nil
    }
    next?.lineMoved(direction)
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
    _modify {
      if direction == .reads { yield &reads } else { yield &writes }
    }
  }
}
