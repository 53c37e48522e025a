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
/// `@unchecked Sendable`: `flags` is set in `init`; the rest is guarded by `table`'s lock.
final class StreamDescriptor: @unchecked Sendable {
  let descriptor: Int32
  /// The status flags before `O_NONBLOCK` was set; -1 when they could not be read.
  let flags: Int32
  // Under `table`'s lock:
  private var users = 1
  private var closing = false
  private var cleanups: [Cleanup] = []
  private typealias Cleanup = (queue: Queue, body: @Sendable (Int32) -> Void)

  private static let table = Mutex<[Int32: StreamDescriptor]>([:])

  private init(descriptor: Int32) {
    self.descriptor = descriptor
    flags = system_statusFlags(descriptor)
    if flags >= 0 && flags & system_nonBlocking == 0 { system_setStatusFlags(descriptor, flags | system_nonBlocking) }
  }

  /// The record of `descriptor`, made (the descriptor made non-blocking) or joined.
  static func join(_ descriptor: Int32) -> StreamDescriptor {
    table.withLock { table in
      if let record = table[descriptor] {
        record.users += 1
        return record
      }
      let record = StreamDescriptor(descriptor: descriptor)
      table[descriptor] = record
      return record
    }
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
      table[self.descriptor] = nil
      if flags >= 0 { system_setStatusFlags(self.descriptor, flags) }
      return (cleanups, self.closing)
    }
    guard let last else { return }
    let descriptor = self.descriptor
    if last.closing { system_close(descriptor) }
    for (queue, body) in last.cleanups { queue.async { body(descriptor) } }
  }
}
