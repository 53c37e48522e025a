import Synchronization

/// The fence between libdispatch and the pipes, sockets and terminals that read and write sources
/// watch (swift-corelibs-libdispatch#949; docs/sources-linux.md, "Descriptor sources: the fence").
///
/// libdispatch's epoll layer frees the record of a descriptor that reported a hang-up or an error
/// while its manager thread may still use it (a use after free under connection churn). So a
/// `ReadSource` or `WriteSource` never shows libdispatch its descriptor. The process has one epoll
/// instance of the package's own, created on first use and never closed, which holds every
/// watched descriptor once, with the union of its sources' interests, one-shot; libdispatch never
/// sees that instance either: a thread of the package's own (`GCD.descriptors`, made with the
/// instance, all signals blocked) waits in `epoll_wait` on it for the life of the process. Each
/// source's C object is a DATA_OR source on the user's queue: the reader thread takes the ready
/// descriptors out of the instance and merges 1 into the C source of each armed watch that the
/// event concerns (an event costs one `epoll_wait` and one hop, as libdispatch's own: its manager
/// thread's wait, then the merge into the source on its queue); the watch re-arms after its handler has run (`rearm`), and the modification
/// asks the kernel again, so data the handler left behind, or that came meanwhile, fires at once:
/// the level semantics of a libdispatch read or write source. A suspended source merges what comes
/// and runs no handler, so it is not re-armed and the kernel stops reporting it.
///
/// A source costs no descriptor of its own: a connection's read and write sources take only the
/// user's. The registration answers what an `fstat` used to: `EBADF` for a descriptor that is not
/// open, `EPERM` for a file epoll cannot watch (a regular file, a directory, a character device
/// with no poll operation such as `/dev/null` or `/dev/zero`), which the caller refuses (a
/// directory) or watches as always ready (what `poll` reports for a file with no poll operation;
/// libdispatch would stand an `eventfd` in for a regular file, and refuse a device's registration,
/// whose source would then never fire).
///
/// Interleavings: the table is cut into stripes by descriptor number, each one `Mutex`; everything
/// the fence does concerns one descriptor, and its entry, its watches' list and armed counts, its
/// generation and its kernel registration change only under its stripe's lock. Every merge, arm,
/// re-arm and removal happens under it, so a watch's C source is merged only while the watch is in
/// the table, and the table holds a reference to it (retained in `register`, released in
/// `unregister`, outside the lock). The reader takes the lock per record, not per batch, so a
/// batch never holds up the re-arms of other descriptors. Each registration of a descriptor number
/// carries a generation in its key (`generation << 32 | descriptor`; the generation counts per
/// stripe), bumped on every `EPOLL_CTL_ADD`: a record read by the reader after its
/// registration was removed, or after the number was closed and reused, finds another generation,
/// or no entry, and is dropped — the reader never follows a pointer the kernel hands back.
/// `unregister` runs in the source's cancel path before the user's cancel handler (which may close
/// the descriptor), so the `EPOLL_CTL_DEL` always precedes the close and any reuse of the number.
/// `DescriptorFenceTests` and the churn tests (4 threads creating and cancelling under the
/// scribbling allocator, TSan) cover it.
final class DescriptorFence: Sendable {
  /// The fence, made on first use (its creation can fail: `EMFILE`).
  private static let made = Mutex<DescriptorFence?>(nil)

  /// The fence's address once made (it is never freed: `made` holds it), for the watches, which
  /// are made only after it (`instance`): a watch does not carry a word to name it.
  private static let address = Atomic<UInt>(0)

  /// The process's fence, made already (a watch exists only after `shared` returned it).
  static var instance: DescriptorFence {
    Unmanaged<DescriptorFence>.fromOpaque(
      UnsafeRawPointer(bitPattern: address.load(ordering: .acquiring)).unsafelyUnwrapped
    )
    .takeUnretainedValue()
  }

  /// The process's fence.
  ///
  /// - Throws: `GCDError` naming `operation` and `epoll_create1` when the process has no descriptor
  ///   left for it, or `pthread_create` (`EAGAIN`) when no thread can be made for its reader (then
  ///   the next source tries again).
  static func shared(_ operation: @autoclosure () -> String) throws(GCDError) -> DescriptorFence {
    try made.withLock { made throws(GCDError) -> DescriptorFence in
      if let made { return made }
      let instance = try checkedCall(operation() + ": epoll_create1", detail: explainCreate) { system_epoll_create() }
      let fence = DescriptorFence(instance: instance)
      let error = system_startThread(named: "GCD.descriptors") { fence.read() }
      if error != 0 {
        system_close(instance)
        throw GCDError(
          operation: operation() + ": pthread_create", errno: error,
          detail: "no thread for the descriptor sources' reader (one for the process)")
      }
      made = fence
      address.store(UInt(bitPattern: Unmanaged.passUnretained(fence).toOpaque()), ordering: .releasing)
      return fence
    }
  }

  /// One watched descriptor: its registration's generation, its watches (a list through the
  /// watches themselves: no array to allocate, and a watch leaves it in constant time, however many
  /// sources share the descriptor) and how many of them are armed, per direction.
  ///
  /// 24 bytes (the counts 32 bits, `oneShot` a bit of the kernel mask's word): the table holds one
  /// per descriptor number up to the largest, so an idle read source pays it up to twice (the
  /// array's growth).
  struct Entry {
    var generation: UInt32
    /// `kernelMask`, and `oneShot` in its top bit (no event bit of epoll's that the mask holds:
    /// `EPOLLIN`, `EPOLLRDHUP`, `EPOLLOUT`).
    private var maskWord: UInt32 = Entry.oneShotBit
    private static let oneShotBit: UInt32 = 1 << 31
    /// Not retained: a watch is in the list only between `register` and `unregister`, and both run
    /// while its source's state is held strongly (by the creating thread, then by the `Source`,
    /// whose `cancel()` or `deinit` installs the C source's cancel block before it lets go, then by
    /// that block, which runs `unregister` before it returns); the reader follows the list only
    /// under the table lock, so it never reaches a watch that has left.
    unowned(unsafe) var first: DescriptorWatch?
    /// The armed watches of each direction.
    var armedReaders: UInt32 = 0
    var armedWriters: UInt32 = 0

    /// The events the kernel reports, edge-triggered: the mask last given to `epoll_ctl`. A record
    /// leaves it as it is, but of a one-shot registration (0 then, until it is modified again); a
    /// direction no watch took twice in a row leaves it (`record`), and comes back with the next
    /// re-arm of a watch of that direction.
    var kernelMask: UInt32 {
      get { maskWord & ~Entry.oneShotBit }
      set {
        assert(newValue & Entry.oneShotBit == 0, "an epoll mask with the entry's one-shot bit")
        maskWord = newValue | (maskWord & Entry.oneShotBit)
      }
    }

    /// The registration is one-shot (`EPOLLONESHOT`): a new one (a connection's first event may
    /// well be its last — a handler that answers and cancels — and the kernel had better not
    /// report the peer's close meanwhile), or the last re-arm had to ask the kernel (its handler
    /// did not say it emptied the descriptor), so the next will too, and no edge is reported
    /// while that handler runs (a listening socket's connections, say). A re-arm after a handler
    /// that emptied the descriptor makes it persistent, and the next such re-arm costs nothing.
    var oneShot: Bool {
      get { maskWord & Entry.oneShotBit != 0 }
      set { maskWord = newValue ? maskWord | Entry.oneShotBit : maskWord & ~Entry.oneShotBit }
    }

    init(generation: UInt32) { self.generation = generation }

    /// The events the kernel is to report: the union of the armed watches' interests.
    var mask: UInt32 {
      (armedReaders > 0 ? DescriptorWatch.readEvents : 0) | (armedWriters > 0 ? DescriptorWatch.writeEvents : 0)
    }

    /// Links `watch` in, armed or not.
    mutating func insert(_ watch: DescriptorWatch, armed: Bool = true) {
      watch.next = first
      first?.previous = watch
      first = watch
      watch.inTable = true
      if armed { arm(watch) }
    }

    /// Unlinks `watch`.
    mutating func remove(_ watch: DescriptorWatch) {
      if watch.armed { disarm(watch) }
      if let previous = watch.previous { previous.next = watch.next } else { first = watch.next }
      watch.next?.previous = watch.previous
      watch.next = nil
      watch.previous = nil
      watch.inTable = false
    }

    mutating func arm(_ watch: DescriptorWatch) {
      watch.armed = true
      if watch.writable { armedWriters += 1 } else { armedReaders += 1 }
    }

    mutating func disarm(_ watch: DescriptorWatch) {
      watch.armed = false
      if watch.writable { armedWriters -= 1 } else { armedReaders -= 1 }
    }

    // The transitions: each runs under the stripe's lock and returns the mask to give the kernel
    // (`EPOLL_CTL_MOD`, edge-triggered), or nil for no call; the caller records a modification
    // that succeeded as `kernelMask`. Pure but for the watches' own fields, so the model test
    // (`DescriptorFenceModelTests`) runs these very functions over every interleaving.

    /// A record of the kernel's (an edge: the direction became ready, or more came): `merge` each
    /// armed watch the events concern, which is disarmed, its drain state a new epoch; a watch of
    /// that direction that is not armed (its handler is pending or running, its source suspended
    /// or not started) has `missed` the edge, and asks the kernel again when it re-arms. The
    /// registration stays as it is — no call — unless a direction reached no armed watch twice
    /// in a row, or has no watch at all: that direction leaves the mask (a suspended source's
    /// descriptor stops waking the reader), until a watch of it re-arms.
    mutating func record(
      readable: Bool, writable: Bool, hungUp: Bool = false, merge: (DescriptorWatch) -> Void
    ) -> UInt32? {
      var delivered: UInt32 = 0
      var missedTwice: UInt32 = 0
      var listed: UInt32 = 0
      var next = first
      while let watch = next {
        next = watch.next
        listed |= watch.events
        if hungUp { watch.hungUp = true }
        guard watch.writable ? writable : readable else { continue }
        if watch.armed {
          // The new epoch before the merge: the merge may run the handler at once on another
          // thread, whose reads and re-arm must see this epoch's word, not the last one's bits (a
          // handler that saw the last epoch's "emptied" re-armed with no call over a packet it
          // left, and lost it; issue 52, `packetPipeFiresForEveryPacket` under TSan).
          watch.newEpoch()
          disarm(watch)
          watch.missed = false
          merge(watch)
          delivered |= watch.events
        } else {
          if watch.missed { missedTwice |= watch.events }
          watch.missed = true
        }
      }
      if oneShot {
        // The registration fired and is off: on again for the watches still armed.
        kernelMask = 0
        return mask != 0 ? mask : nil
      }
      let concerned = (readable ? DescriptorWatch.readEvents : 0) | (writable ? DescriptorWatch.writeEvents : 0)
      let dropped = concerned & kernelMask & ~delivered & (missedTwice | ~listed)
      return dropped != 0 ? kernelMask & ~dropped : nil
    }

    /// `watch` (in the entry, disarmed) waits again after its handler. No call when the kernel
    /// reports its direction, no edge came while it was disarmed, and its handler emptied the
    /// descriptor (`drained`): the next byte, or the next room, is an edge the reader sees. Else a
    /// modification, which asks the kernel again (an `EPOLL_CTL_MOD` polls the file, and queues a
    /// record if the direction is ready): what the handler left, or what came meanwhile, fires at
    /// once — the level semantics of a libdispatch read or write source. The modification makes
    /// the registration one-shot unless the handler emptied the descriptor (see `oneShot`).
    mutating func rearm(_ watch: DescriptorWatch, drained: Bool) -> UInt32? {
      arm(watch)
      if !oneShot && kernelMask | watch.events == kernelMask && drained && !watch.missed && !watch.hungUp {
        return nil
      }
      watch.missed = false
      oneShot = !drained || watch.hungUp
      return oneShot ? mask : kernelMask | mask
    }

    /// `watch` (in the entry, disarmed) arms at its first start: always a call, the watch's first,
    /// which answers for a stale entry (`ENOENT`: the number was closed and reused), and asks the
    /// kernel for what is ready now.
    mutating func start(_ watch: DescriptorWatch) -> UInt32 {
      arm(watch)
      watch.missed = false
      return oneShot ? mask : kernelMask | mask
    }

    /// `watch` leaves: true when it was the last, and the registration goes too (`EPOLL_CTL_DEL`);
    /// otherwise no call — a later edge of a direction no watch has any more leaves the mask then
    /// (`record`).
    mutating func unregister(_ watch: DescriptorWatch) -> Bool {
      remove(watch)
      return first == nil
    }
  }

  /// One stripe's entries by descriptor number: an array the numbers index (they are small and
  /// dense, and a lookup costs no hashing; a stripe holds every `stripeCount`th number, so the
  /// index is the number's quotient), grown to the largest number watched and never shrunk;
  /// generation 0 marks a free slot.
  struct Entries {
    private var slots: [Entry] = []

    subscript(descriptor: Int32) -> Entry? {
      get {
        let index = Int(descriptor) >> DescriptorFence.stripeShift
        guard index < slots.count, slots[index].generation != 0 else { return nil }
        return slots[index]
      }
      set {
        let index = Int(descriptor) >> DescriptorFence.stripeShift
        if let newValue {
          if index >= slots.count {
            slots.reserveCapacity(max(index + 1, 2 * slots.count))
            while slots.count <= index { slots.append(Entry(generation: 0)) }
          }
          slots[index] = newValue
        } else if index < slots.count {
          slots[index] = Entry(generation: 0)
        }
      }
    }

    mutating func removeValue(forKey descriptor: Int32) -> Entry? {
      defer { self[descriptor] = nil }
      return self[descriptor]
    }
  }

  struct Table {
    var entries = Entries()
    /// The stripe's last registration's generation (never 0, which marks a free slot). Per stripe:
    /// a key names its descriptor too, and a descriptor has one stripe.
    var generation: UInt32 = 0

    mutating func nextGeneration() -> UInt32 {
      generation &+= 1
      if generation == 0 { generation = 1 }
      return generation
    }
  }

  /// The epoll instance: what libdispatch watches.
  let instance: Int32
  /// The table, cut into stripes by descriptor number (`descriptor & (stripeCount - 1)`), each
  /// under its own lock: every operation concerns one descriptor, so operations on different
  /// descriptors rarely wait for each other (with one lock, a thousand channels' re-arms and the
  /// reader's batches queued on it: `io_channels` at 1,000).
  private let stripes: [Stripe]

  /// A stripe: a table and its lock, in a box of its own (a `Mutex` cannot be an array's element).
  final class Stripe: Sendable {
    let table = Mutex(Table())
  }

  static let stripeShift = 6
  static let stripeCount = 1 << stripeShift

  /// The stripe that holds `descriptor`'s entry.
  @inline(__always)
  func stripe(_ descriptor: Int32) -> Stripe {
    stripes[Int(descriptor) & (DescriptorFence.stripeCount - 1)]
  }
  /// The reader's records: used only by the reader's thread.
  private let records = EpollRecords(capacity: 64)

  private init(instance: Int32) {
    self.instance = instance
    stripes = (0..<DescriptorFence.stripeCount).map { _ in Stripe() }
  }

  /// The key of a registration: its generation and the descriptor.
  static func key(_ descriptor: Int32, _ generation: UInt32) -> UInt64 {
    UInt64(generation) << 32 | UInt64(UInt32(bitPattern: descriptor))
  }

  /// How `register` went: the descriptor is watched, or epoll refused it: `EPERM` (a file with no
  /// poll operation: a regular file, a directory, a device such as `/dev/null`) or `EINVAL` (the
  /// kernel's limit of paths to one open file through epoll instances).
  enum Registration {
    case watched
    case notPollable
    case overLimit
  }

  /// Starts watching: `watch` (the state of a source whose C object is a DATA_OR source) gets 1
  /// merged into its C source when its descriptor is readable (or writable, for a write source),
  /// has hung up or has an error; `.notPollable` or `.overLimit` when epoll refuses the
  /// descriptor, which leaves `watch` out of the fence. The descriptor's first watch is registered
  /// armed (`EPOLL_CTL_ADD`, which answers for the descriptor); a watch of a descriptor registered
  /// already joins its entry disarmed until its source starts (`start`, whose modification then
  /// answers for a stale entry), after an `F_GETFD` that answers `EBADF` for a number closed under
  /// the entry.
  ///
  /// - Throws: `GCDError` naming `operation` and `epoll_ctl`: `EBADF` (not an open descriptor),
  ///   `ENOSPC` (the per-user watch limit), `ENOMEM`.
  func register(_ watch: DescriptorWatch, operation: @autoclosure () -> String) throws(GCDError) -> Registration {
    let descriptor = watch.descriptor
    let target = watch.raw
    Libdispatch.retain(target)
    let outcome: Result<Registration, GCDError> = stripe(descriptor).table.withLock { table in
      if table.entries[descriptor] != nil {
        // The descriptor is registered: a later source joins its entry disarmed and arms when it
        // starts (`start`, whose modification also finds a stale entry: the number closed and
        // reused). A connection's write source that never starts costs the kernel nothing. The
        // number may have been closed under the entry's sources, though (against the rule, or by
        // another part of the program): `F_GETFD` answers `EBADF` for it, as `init` must, and
        // costs no more than asking; it changes nothing in the registration.
        guard system_isOpen(descriptor) else { return .failure(registrationError(operation(), system_errno)) }
        table.entries[descriptor]!.insert(watch, armed: false)
        watch.arming = .atStart
        return .success(.watched)
      }
      if let error = add(watch, to: &table) {
        // EPERM: a file epoll cannot watch. EINVAL: the kernel's limit of paths to one open file
        // through epoll instances (1,000 descriptors of one file in the fence). The caller decides
        // (`Source.create(descriptor:)`).
        if error == Errno.notPermitted { return .success(.notPollable) }
        if error == Errno.invalidArgument { return .success(.overLimit) }
        return .failure(registrationError(operation(), error))
      }
      return .success(.watched)
    }
    switch outcome {
    case .success(let registration):
      if registration != .watched { Libdispatch.release(target) }
      return registration
    case .failure(let error):
      Libdispatch.release(target)
      throw error
    }
  }

  /// Under the stripe's lock, for a descriptor with no entry: a new registration (a new
  /// generation, `EPOLL_CTL_ADD`) of `watch` alone, armed, in `table`; nil, or the errno of the
  /// refused addition, which leaves `table` and `watch` as they were.
  private func add(_ watch: DescriptorWatch, to table: inout Table) -> Int32? {
    let descriptor = watch.descriptor
    var entry = Entry(generation: table.nextGeneration())
    entry.insert(watch)
    let key = DescriptorFence.key(descriptor, entry.generation)
    let flags = system_epollEdge | system_epollOneShot
    guard system_epoll_control(instance, modify: false, descriptor, events: entry.mask | flags, key: key) == 0 else {
      let error = system_errno
      entry.remove(watch)
      return error
    }
    entry.kernelMask = entry.mask
    table.entries[descriptor] = entry
    return nil
  }

  /// The reader, on a thread of its own for the life of the process: it waits in `epoll_wait` on
  /// the instance, and each ready record merges into the armed watches it concerns, which are
  /// disarmed, and re-arms the registration for the others (one-shot disables all of it).
  private func read() -> Never {
    while true {
      let count = records.wait(instance, timeout: -1)
      guard count > 0 else { continue }
      for index in 0..<count {
        let key = records.key(index)
        let descriptor = Int32(bitPattern: UInt32(truncatingIfNeeded: key))
        let events = records.events(index)
        let finished = stripe(descriptor).table.withLock { table -> [DescriptorWatch] in
          guard let generation = table.entries[descriptor]?.generation,
            generation == UInt32(truncatingIfNeeded: key >> 32)
          else {
            return []  // removed, or replaced: a record of an earlier registration
          }
          let failed = events & system_epollError != 0
          let readable = failed || events & (system_epollIn | system_epollReadHangUp) != 0
          let writable = failed || events & system_epollOut != 0
          // A watch that delivers once (a pidfd: its process has exited, for good) leaves the
          // table with its event; the others are merged and wait for their re-arm. (An empty array
          // allocates nothing: a read or write source's event costs what it did.)
          var finished: [DescriptorWatch] = []
          let hungUp = failed || events & system_epollReadHangUp != 0
          let mask = table.entries[descriptor]!.record(readable: readable, writable: writable, hungUp: hungUp) {
            watch in
            Libdispatch.source_merge_data(watch.raw, watch.mergeValue)
            if watch.deliversOnce { finished.append(watch) }
          }
          for watch in finished where table.entries[descriptor]!.unregister(watch) {
            table.entries[descriptor] = nil
            system_epoll_remove(instance, descriptor)
          }
          // One-shot: on again for the watches still armed. Persistent: a direction that reached no
          // armed watch twice leaves the registration.
          if let entry = table.entries[descriptor], let mask, modify(descriptor, mask, oneShot: entry.oneShot, key: key)
          {
            table.entries[descriptor]!.kernelMask = mask
          }
          return finished
        }
        for watch in finished { watch.left() }
      }
    }
  }

  /// Arms `watch` when its source first starts (a watch that joined a registered descriptor is
  /// disarmed until then). The modification, made even when the kernel reports the direction
  /// already, is the first call for that watch, so it answers for the descriptor too: `ENOENT`
  /// says the number was closed and now names another file (the old registration left with the
  /// old file; its watches, whose sources are still live, will never fire): the entry is replaced
  /// by a new registration of this watch alone, and the old watches stay silent, as the kernel
  /// leaves them. Any other failure leaves the watch silent, as a descriptor closed under a live
  /// source is (`rearm`).
  func start(_ watch: DescriptorWatch) {
    let descriptor = watch.descriptor
    let stale: [DescriptorWatch] = stripe(descriptor).table.withLock { table in
      guard watch.inTable, !watch.armed else { return [] }
      let mask = table.entries[descriptor]!.start(watch)
      let generation = table.entries[descriptor]!.generation
      if modify(
        descriptor, mask, oneShot: table.entries[descriptor]!.oneShot, key: DescriptorFence.key(descriptor, generation))
      {
        table.entries[descriptor]!.kernelMask = mask
        return []
      }
      guard system_errno == Errno.noSuchFileOrDirectory else { return [] }
      var old = table.entries.removeValue(forKey: descriptor)!
      var stale: [DescriptorWatch] = []
      while let first = old.first {
        old.remove(first)
        if first !== watch { stale.append(first) }
      }
      // Closed, or refused: silent, out of the table (its reference goes with the stale ones').
      if add(watch, to: &table) != nil { stale.append(watch) }
      return stale
    }
    // The table's references to the watches that left it (`register` took them).
    for old in stale { Libdispatch.release(old.raw) }
  }

  /// Arms `watch` again after its handler ran (`Entry.rearm`): with no call when its handler
  /// emptied the descriptor (`drained`) and no edge came meanwhile; else the kernel is asked
  /// again, and reports at once what is still ready. Nothing for a watch no longer in the table,
  /// or armed already.
  func rearm(_ watch: DescriptorWatch, drained: Bool) {
    stripe(watch.descriptor).table.withLock { table in
      guard watch.inTable, !watch.armed else { return }
      let descriptor = watch.descriptor
      guard let mask = table.entries[descriptor]!.rearm(watch, drained: drained) else { return }
      // A failure (the descriptor was closed under its source) leaves the watch silent, as the
      // kernel does.
      let entry = table.entries[descriptor]!
      if modify(descriptor, mask, oneShot: entry.oneShot, key: DescriptorFence.key(descriptor, entry.generation)) {
        table.entries[descriptor]!.kernelMask = mask
      }
    }
  }

  /// `EPOLL_CTL_MOD` of `descriptor`'s registration to `mask`, edge-triggered, one-shot or not
  /// (the modification polls the file and queues a record if it is ready); whether it succeeded.
  /// Counted (`modifications`).
  private func modify(_ descriptor: Int32, _ mask: UInt32, oneShot: Bool, key: UInt64) -> Bool {
    modifications.add(1, ordering: .relaxed)
    let flags = system_epollEdge | (oneShot ? system_epollOneShot : 0)
    return system_epoll_control(instance, modify: true, descriptor, events: mask | flags, key: key) == 0
  }

  /// The `EPOLL_CTL_MOD` calls made so far (tests: a re-arm after a handler that emptied its
  /// descriptor makes none). Relaxed: a count, read after the events it counts were waited for.
  let modifications = Atomic<Int>(0)

  /// Stops watching: takes `watch` out of the table, and the descriptor out of the instance with
  /// its last watch. Called once, in the source's cancel path before the user's cancel handler
  /// (the descriptor still open), or on a creation that fails.
  func unregister(_ watch: DescriptorWatch) {
    let removed = stripe(watch.descriptor).table.withLock { table -> Bool in
      guard watch.inTable else { return false }
      let descriptor = watch.descriptor
      // A connection's two sources, cancelled together, cost one `EPOLL_CTL_DEL` and nothing for
      // the first.
      if table.entries[descriptor]!.unregister(watch) {
        table.entries[descriptor] = nil
        system_epoll_remove(instance, descriptor)
      }
      return true
    }
    if removed { watch.left() }
  }

  /// Whether `watch` waits for the kernel now (tests: a merge disarms it until its handler ran).
  func isArmed(_ watch: DescriptorWatch) -> Bool {
    stripe(watch.descriptor).table.withLock { _ in watch.armed }
  }

  /// What the fence holds for `watch` and its descriptor, for a test's failure message.
  func describe(_ watch: DescriptorWatch) -> String {
    stripe(watch.descriptor).table.withLock { table in
      let entry = table.entries[watch.descriptor]
      return "armed \(watch.armed), missed \(watch.missed), hung up \(watch.hungUp), in table \(watch.inTable), "
        + "drain state \(String(watch.drainState.load(ordering: .relaxed), radix: 16)), "
        + "kernel mask \(entry.map { String($0.kernelMask, radix: 16) } ?? "none"), one-shot \(entry?.oneShot ?? false)"
    }
  }

  private func registrationError(_ operation: String, _ error: Int32) -> GCDError {
    let detail: String? =
      switch error {
      case Errno.badFileDescriptor: "not an open file descriptor"
      case Errno.noSpace: "the per-user epoll watch limit (/proc/sys/fs/epoll/max_user_watches) is reached"
      default: nil
      }
    return GCDError(operation: operation + ": epoll_ctl", errno: error, detail: detail)
  }

  private static func explainCreate(_ error: Int32) -> String? {
    switch error {
    case Errno.tooManyOpenFiles:
      "no descriptor left in this process for the descriptor sources' epoll instance (one for the process)"
    case Errno.tooManyOpenFilesInSystem: "the system's file table is full"
    default: nil
    }
  }
}

/// A read or write source's state, and its watch of its descriptor in the fence: one object, so a
/// fenced source costs no more objects than a plain one. The fence merges into its C source (`raw`,
/// a DATA_OR source, retained while the watch is in the fence's table); its handlers see the
/// estimate as `data`; its cancel path takes it out of the fence before the user's cancel handler,
/// while the user's descriptor is still open.
///
/// The re-arm never depends on a block the user controls: the C source's event block is the
/// watch's own (`fire`), set when the watch is made and kept for the source's life; the user's
/// handler (or the event sequence) is a field it calls. An event that finds no handler (the source
/// was started before its handler was set) leaves the watch disarmed and marked `starved`, and
/// setting a handler re-arms it, so the handler then sees what is ready, as a libdispatch read or
/// write source does. Without that, libdispatch drops a merge that finds no block, the one-shot
/// registration stays off, and no later data wakes the source (`ReadSourceTests`,
/// `WriteSourceTests`: `handlerSetAfterResume`). The two sides meet under the state's lock (`locked`):
/// whichever of `fire` (no handler) and `setHandler` comes second re-arms.
///
final class DescriptorWatch: SourceState, @unchecked Sendable {
  // The stored properties are ordered so that the object is 136 bytes (glibc's 144-byte chunk: an
  // idle read source's bytes are a scale row's target): the words, the handling (17 bytes of
  // handler), the small fields packed after it, the descriptor last.

  /// The next and previous watch of the same descriptor. Under the fence's table lock; neither is
  /// retained (`DescriptorFence.Entry.first` says why a listed watch is alive).
  unowned(unsafe) var next: DescriptorWatch?
  unowned(unsafe) var previous: DescriptorWatch?

  /// What reads since the last event said (see `drainState`'s bits below).
  fileprivate let drainState = Atomic<UInt64>(0)

  /// The handler, and whether an event found none or the cancel path let it go (`Handling`). Read
  /// and written only under `locked`, the state's one lock (`fire`, `setHandler`, `cleanup`:
  /// none runs with it held).
  @exclusivity(unchecked) private var handling = Handling()

  /// What an event merges into the C source (`mergeValue`): the bit's number, or `noMerge` for 0.
  private let mergeBit: UInt8
  private static let noMerge: UInt8 = 0xFF
  /// A write source's watch (`EPOLLOUT`), rather than a read source's (`EPOLLIN`).
  let writable: Bool
  /// Waiting for the kernel (counted in its entry's mask). Under the fence's table lock.
  var armed = false
  /// In the fence's table. Under the fence's table lock.
  var inTable = false
  /// An edge of its direction came while it was not armed: its re-arm asks the kernel again.
  /// Under the fence's table lock.
  var missed = false
  /// A record said the peer hung up (or an error): the descriptor is readable for good (its end of
  /// file), which no edge will say again, so every re-arm asks the kernel. Under the lock.
  var hungUp = false
  /// A watch whose one event is for good (a pidfd: its process has exited): it leaves the table
  /// with the event (`DescriptorFence.read`), is never re-armed, and an event that found no
  /// handler is merged again when one is set. Its data is the C source's (the merged bits), not
  /// the descriptor's queue size.
  let deliversOnce: Bool
  /// The watch owns its descriptor (a pidfd `ProcSource(pid:)` opened) and closes it when it
  /// leaves the table, once: after its event, or in the cancel path.
  let closesDescriptor: Bool
  /// Set by `register` or `Source.create(descriptor:)` before the source exists; read-only after.
  var arming = Arming.byRegistration
  let descriptor: Int32

  /// What an event merges into the C source: 1 for a read or write source; a process source's
  /// exit bit (`ProcEvents.exit`), or 0 when it does not watch the exit.
  var mergeValue: UInt { mergeBit == DescriptorWatch.noMerge ? 0 : 1 << UInt(mergeBit) }

  /// What a read watch asks the kernel for (a hang-up of the peer's writing side reads as an end of
  /// file), and what a write watch asks for.
  static let readEvents = system_epollIn | system_epollReadHangUp
  static let writeEvents = system_epollOut
  /// This watch's events.
  var events: UInt32 { writable ? DescriptorWatch.writeEvents : DescriptorWatch.readEvents }

  /// `drainState`: what the reads made through the source since its last event say, and an epoch the
  /// fence advances with each merge (`newEpoch`, under the table lock): bit 0, a read found nothing
  /// (`EAGAIN`); bit 1, a read returned fewer bytes than it asked for and that emptied the descriptor;
  /// bits 2 and 3, what such a short read says of this descriptor (`ShortRead`, asked at the watch's
  /// first short read; 0 not asked yet); bit 4, the queue-size request failed on the descriptor
  /// (`estimate`); the epoch above them. A read (`read(into:)`, any thread) loads the word before
  /// its call and sets its bit only if the word is unchanged after it (compare-and-exchange): a
  /// merge in between — an edge the read may not have seen — makes the bit fail to stick, and the
  /// re-arm asks the kernel.
  private static let emptiedBit: UInt64 = 1
  private static let shortBit: UInt64 = 2
  private static let kindShift: UInt64 = 2
  private static let kindMask: UInt64 = 3 << 2
  private static let estimateUnsupportedBit: UInt64 = 1 << 4
  /// The bits a merge keeps: what is known of the descriptor.
  private static let keptBits: UInt64 = kindMask | estimateUnsupportedBit
  private static let epochUnit: UInt64 = 1 << 5
  /// How a watch is armed.
  enum Arming {
    /// By its registration: a descriptor's first watch. Its start takes no lock, nor re-arms a
    /// registration that fired before the source started (that merge is pending).
    case byRegistration
    /// At its source's first start (`start`): a watch that joined its descriptor's registration
    /// disarmed (`register`).
    case atStart
    /// Never: out of the fence for good, ready at every moment — a regular file or a device epoll
    /// cannot watch (`/dev/null`, `/dev/zero`), which `poll` reports readable and writable always.
    /// The watch merges 1 into its C source when the source starts and again after each event
    /// handler, until it is cancelled: the level semantics, with no kernel object.
    case alwaysReady
  }

  /// What an event runs (`SourceState.EventHandler`).
  typealias Handler = EventHandler

  /// The handler and what befell it (`SourceState.Handling`): the model test
  /// (`DescriptorFenceModelTests`) runs its transitions with the fence's.
  typealias Handling = SourceState.Handling

  /// The state of the source whose C object is `raw` (a DATA_OR source); its cancel block, which
  /// takes the watch out of the fence, is installed by the source's cancel (`Source.cleansUp`).
  init(
    raw: OpaquePointer, queue: Queue, fence: DescriptorFence, descriptor: Int32, writable: Bool,
    mergeValue: UInt = 1, deliversOnce: Bool = false, closesDescriptor: Bool = false
  ) {
    precondition(mergeValue & (mergeValue &- 1) == 0, "GCD: a watch merges one bit, or none")
    _ = fence  // made: `DescriptorFence.instance` names it from now on
    self.descriptor = descriptor
    self.writable = writable
    mergeBit = mergeValue == 0 ? DescriptorWatch.noMerge : UInt8(mergeValue.trailingZeroBitCount)
    self.deliversOnce = deliversOnce
    self.closesDescriptor = closesDescriptor
    super.init(raw: raw, queue: queue)
    // The C source is inactive: set at once. The block holds this state unretained: the `Source`
    // holds it until its `deinit`, which (as `cancel()`) installs the cancel block, which holds it
    // until libdispatch has run it; no event block runs after that (`ReadSourceTests`:
    // `endsWhileHandlerRuns`, under ASan in `make sanitize`).
    Libdispatch.source_set_context_handler(raw, Unmanaged.passUnretained(self).toOpaque()) { block in
      Unmanaged<DescriptorWatch>.fromOpaque(Libdispatch.block_context(block)).takeUnretainedValue().fire()
    }
  }

  /// A merge: a new epoch, with no read recorded in it (under the fence's table lock). Acquiring and
  /// releasing: a read that loads the new word sees the merge, and the edge before it.
  func newEpoch() {
    var state = drainState.load(ordering: .relaxed)
    while true {
      let next =
        (state & DescriptorWatch.keptBits) | ((state & ~(DescriptorWatch.epochUnit - 1)) &+ DescriptorWatch.epochUnit)
      let (exchanged, original) = drainState.compareExchange(
        expected: state, desired: next, ordering: .acquiringAndReleasing)
      if exchanged { return }
      state = original
    }
  }

  /// `read(2)` of up to `buffer.count` bytes into `buffer`, again on `EINTR`: the count (0 at the
  /// end of file), or -1 with `errno` set. A read that finds nothing (`EAGAIN`), or that returns
  /// fewer bytes than it asked for where that empties the descriptor, is recorded (`drainState`), so
  /// the re-arm after the handler need not ask the kernel. On a pipe a short read asks the queue
  /// (`FIONREAD`) at once: a packet-mode pipe may hold more packets, and the re-arm must then ask the
  /// kernel, which reports them (issue 52: a handler that reads one packet is called again for the
  /// next). A byte that arrives after that question comes with an edge of its own, which a merge
  /// records (a new epoch, or `missed`).
  func read(into buffer: UnsafeMutableRawBufferPointer) -> Int {
    var before = drainState.load(ordering: .acquiring)
    let got = DescriptorWatch.read(descriptor, into: buffer)
    if buffer.count == 0 { return got }
    var bit: UInt64 = 0
    if got < 0 {
      // Not the end of file: it stays readable for good, and the re-arm must say so again.
      if system_errno == Errno.wouldBlock { bit = DescriptorWatch.emptiedBit }
    } else if got > 0 && got < buffer.count {
      var kind = ShortRead(rawValue: (before & DescriptorWatch.kindMask) >> DescriptorWatch.kindShift)
      if kind == nil {
        let asked = system_shortRead(descriptor)
        let kindBits = asked.rawValue << DescriptorWatch.kindShift
        // Kept across epochs. A merge since the load leaves `before` as it was, which the word (now
        // with the kind's bits) never equals again: the bit below fails, as the read may have
        // missed the merge's edge.
        if drainState.bitwiseOr(kindBits, ordering: .relaxed).oldValue == before { before |= kindBits }
        kind = asked
      }
      switch kind! {
      case .empties: bit = DescriptorWatch.shortBit
      case .saysNothing: break
      case .asksQueue: if system_queuedBytes(descriptor, output: false) == 0 { bit = DescriptorWatch.shortBit }
      }
    }
    if bit != 0 { _ = drainState.compareExchange(expected: before, desired: before | bit, ordering: .releasing) }
    return got
  }

  /// `read(2)` of `descriptor` into `buffer`, again on `EINTR`; a read of 0 bytes is made too (it
  /// answers `EBADF` for a closed descriptor).
  static func read(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Int {
    var got: Int
    repeat {
      got = system_read(descriptor, buffer.baseAddress ?? UnsafeMutableRawPointer(bitPattern: 1)!, buffer.count)
    } while got < 0 && system_errno == Errno.interrupted
    return got
  }

  /// Whether the reads since the last merge emptied the descriptor: one found nothing, or one was
  /// short and that emptied it (`read(into:)`).
  private func drained() -> Bool {
    if writable { return false }
    return drainState.load(ordering: .acquiring) & (DescriptorWatch.emptiedBit | DescriptorWatch.shortBit) != 0
  }

  /// The C source's event block: the handler, then the re-arm; no handler: no re-arm, `starved`.
  private func fire() {
    guard let handler = locked.withLock({ _ in handling.event() }) else { return }
    run(handler)
    if !deliversOnce { eventDone() }
  }

  /// Records `handler`; re-arms a watch whose event found none (one that delivers once gets its
  /// event merged again: what it reported holds for good).
  private func setHandler(_ handler: Handler) {
    guard locked.withLock({ _ in handling.set(handler) }) else { return }
    if deliversOnce {
      if !Libdispatch.source_testcancel(raw) { Libdispatch.source_merge_data(raw, mergeValue) }
    } else {
      eventDone()
    }
  }

  /// The watch has left the fence's table (its event, or `unregister`): the descriptor it owns is
  /// closed, and the table's reference to the C source (taken in `register`) is given back.
  func left() {
    if closesDescriptor { system_close(descriptor) }
    Libdispatch.release(raw)
  }

  override func setEventHandler(_ handler: @escaping @Sendable () -> Void) { setHandler(.plain(handler)) }
  override func setValueHandler(_ handler: @escaping @Sendable (UInt) -> Void) { setHandler(.value(handler)) }
  override func setSequenceHandler() { setHandler(.sequence) }

  /// What libdispatch reports as a read or write source's data when it watches the descriptor: the
  /// bytes queued to read (`SIOCINQ`, as `FIONREAD`; 0 at end of file), or for a write source the
  /// bytes still unsent (`SIOCOUTQ`); 1 where the descriptor does not support the request. Read
  /// from the descriptor now.
  var estimate: UInt {
    // Once the queue-size request has failed on the descriptor (a pipe's write end, a listening
    // socket), the estimate is 1 without a call, as libdispatch's is (a bit of `drainState`).
    // Relaxed: two threads that read the estimate at once may both make the failing call once.
    if drainState.load(ordering: .relaxed) & DescriptorWatch.estimateUnsupportedBit != 0 { return 1 }
    guard let bytes = system_queuedBytes(descriptor, output: writable) else {
      drainState.bitwiseOr(DescriptorWatch.estimateUnsupportedBit, ordering: .relaxed)
      return 1
    }
    return UInt(clamping: bytes)
  }

  /// Out of the fence before the user's cancel handler (which may close the descriptor), and the
  /// event handler let go, as libdispatch frees a cancelled source's event block before it calls
  /// the cancel handler: a handler that captures its source no longer keeps it (released outside
  /// the lock: its captures' deinit may run any code).
  override func cleanup(first: Bool) {
    guard first else { return }
    DescriptorFence.instance.unregister(self)
    let handler = locked.withLock { _ in handling.end() }
    _ = handler
  }

  override func eventData() -> UInt { deliversOnce ? Libdispatch.source_get_data(raw) : estimate }

  /// After a handler: the watch waits for the kernel again (an always-ready one fires again). Not
  /// once the source is cancelled: its removal follows, with no re-arm before it.
  private func eventDone() {
    if Libdispatch.source_testcancel(raw) { return }
    if arming == .alwaysReady {
      Libdispatch.source_merge_data(raw, 1)
    } else {
      DescriptorFence.instance.rearm(self, drained: drained())
    }
  }

  /// The first start arms a watch that joined its descriptor's registration disarmed, or fires an
  /// always-ready one.
  override func startHook() {
    switch arming {
    case .byRegistration: break
    case .atStart: DescriptorFence.instance.start(self)
    case .alwaysReady: Libdispatch.source_merge_data(raw, 1)
    }
  }
}
