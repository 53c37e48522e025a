import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// The process's one inotify instance and its router.
///
/// Created on first use and never closed (the per-user limit on instances
/// is small, 128 by default, so the package uses one whatever the number of
/// sources). One internal read source on the instance, on a private serial
/// queue, reads every pending event and routes it, by watch descriptor, to
/// the registered `InotifyWatch`es, which translate it to vnode flags and
/// merge those into their `FileSystemSource`'s DATA_OR source.
///
/// inotify gives two registrations of the same inode the same watch
/// descriptor; the table keeps a list of watches per descriptor (the first
/// watch, each linking the next: no array per descriptor), adds with
/// `IN_MASK_ADD` and removes the kernel watch only when its last entry goes.
/// `IN_IGNORED` (file gone, file system unmounted, watch removed) retires
/// a descriptor. Locks: the table's, then a watch's, never the other way.
final class Inotify: Sendable {
  /// The inotify descriptor (`IN_NONBLOCK | IN_CLOEXEC`).
  let descriptor: Int32
  /// Every registered watch by watch descriptor: the first of its list (`InotifyWatch.next`).
  let table = Mutex<[Int32: InotifyWatch]>([:])
  let queue: Queue
  /// The read source of `descriptor`, on `queue`: never cancelled (the
  /// instance lives as long as the process), and kept here so that it
  /// stays reachable to leak checkers (libdispatch holds an active source
  /// only through a disguised pointer).
  nonisolated(unsafe) let reader: OpaquePointer  // a libdispatch source: thread-safe
  /// The read buffer; used only on `queue`.
  nonisolated(unsafe) private let buffer: UnsafeMutableRawPointer
  private static let bufferSize = 64 * 1024

  private static let instance = Mutex<Inotify?>(nil)

  /// The process's instance, created on first use.
  static func shared(operation: String) throws(GCDError) -> Inotify {
    try instance.withLock { (instance: inout Inotify?) throws(GCDError) -> Inotify in
      if let instance { return instance }
      let created = try Inotify(operation: operation)
      instance = created
      return created
    }
  }

  private init(operation: String) throws(GCDError) {
    descriptor = try checkedCall(operation + ": inotify_init1", detail: Inotify.explainInit) {
      system_inotify_init1()
    }
    queue = Queue(label: "GCD.FileSystemSource.inotify")
    buffer = UnsafeMutableRawPointer.allocate(byteCount: Inotify.bufferSize, alignment: 8)
    guard let reader = Libdispatch.source_create(.read, UInt(descriptor), 0, queue.raw) else {
      fatalError("GCD: libdispatch refused a read source on the inotify descriptor \(descriptor)")
    }
    self.reader = reader
    Libdispatch.source_set_event_handler(reader) { [self] in drain() }
    Libdispatch.activate(reader)
  }

  private static func explainInit(_ error: Int32) -> String? {
    guard error == Errno.tooManyOpenFiles else { return nil }
    return "too many inotify instances for this user (/proc/sys/fs/inotify/max_user_instances = "
      + "\(system_firstLine(of: "/proc/sys/fs/inotify/max_user_instances"))) or no descriptor left in this process"
  }

  private static func explainAddWatch(_ error: Int32) -> String? {
    guard error == Errno.noSpace else { return nil }
    return "the inotify watch limit is reached (/proc/sys/fs/inotify/max_user_watches = "
      + "\(system_firstLine(of: "/proc/sys/fs/inotify/max_user_watches"))); raise it with "
      + "`sysctl fs.inotify.max_user_watches=N`"
  }

  /// Adds a kernel watch on the file `pathDescriptor` (an `O_PATH`
  /// descriptor the new watch takes over, also on failure) and registers a
  /// watch for `events` on it that merges into `target`.
  func register(pathDescriptor: Int32, events: FileSystemEvents, target: OpaquePointer, operation: String)
    throws(GCDError) -> InotifyWatch
  {
    guard let status = system_fstat(pathDescriptor) else {
      let error = GCDError(operation: operation + ": fstat", errno: system_errno)
      system_close(pathDescriptor)
      throw error
    }
    let mask = Inotify.kernelMask(for: events, isDirectory: status.isDirectory)
    do {
      return try table.withLock { (table: inout [Int32: InotifyWatch]) throws(GCDError) -> InotifyWatch in
        // Through /proc/self/fd the watch is on exactly the inode the
        // descriptor holds, whatever happened to the name meanwhile.
        let wd = try checkedCall(operation + ": inotify_add_watch", detail: Inotify.explainAddWatch) {
          system_inotify_add_watch(descriptor, "/proc/self/fd/\(pathDescriptor)", mask | UInt32(IN_MASK_ADD))
        }
        let watch = InotifyWatch(
          center: self, wd: wd, events: events, pathDescriptor: pathDescriptor, isDirectory: status.isDirectory,
          target: target)
        watch.next = table[wd]
        table[wd] = watch
        return watch
      }
    } catch {
      system_close(pathDescriptor)
      throw error
    }
  }

  /// The inotify events needed to produce `events` (vnode flags).
  static func kernelMask(for events: FileSystemEvents, isDirectory: Bool) -> UInt32 {
    let children = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)
    // `IN_ATTRIB` whatever was asked: the last name's removal (a link count of 0) is how the watch
    // learns that the file is deleted and closes its `O_PATH` descriptor, which otherwise keeps the
    // file's space (issue 53: a `.write` watch of a log kept every rotated file). What was not
    // asked for is filtered out before the source sees it.
    var mask = UInt32(IN_UNMOUNT | IN_ATTRIB)
    if !events.isDisjoint(with: [.write, .extend]) { mask |= UInt32(IN_MODIFY) }
    if events.contains(.rename) { mask |= UInt32(IN_MOVE_SELF) }
    if events.contains(.delete) { mask |= UInt32(IN_DELETE_SELF) }
    if isDirectory && !events.isDisjoint(with: [.write, .link]) { mask |= children }
    return mask
  }

  /// Removes `watch` from the table; the kernel watch goes with the last
  /// registration on its descriptor.
  func unregister(_ watch: InotifyWatch, wd: Int32) {
    table.withLock { table in
      guard wd >= 0, let first = table[wd] else { return }
      if first === watch {
        table[wd] = watch.next
        if watch.next == nil { system_inotify_rm_watch(descriptor, wd) }
      } else {
        var previous = first
        while let current = previous.next, current !== watch { previous = current }
        guard previous.next === watch else { return }
        previous.next = watch.next
      }
      watch.next = nil
    }
  }

  /// Reads and routes every pending event (the reader's handler, on `queue`).
  private func drain() {
    while true {
      let count = system_read(descriptor, buffer, Inotify.bufferSize)
      if count < 0 && system_errno == Errno.interrupted { continue }
      guard count > 0 else { return }
      table.withLock { table in
        var offset = 0
        while offset + 16 <= count {
          let wd = buffer.loadUnaligned(fromByteOffset: offset, as: Int32.self)
          let mask = buffer.loadUnaligned(fromByteOffset: offset + 4, as: UInt32.self)
          let nameLength = buffer.loadUnaligned(fromByteOffset: offset + 12, as: UInt32.self)
          offset += 16 + Int(nameLength)
          route(wd: wd, mask: mask, table: &table)
        }
      }
    }
  }

  /// Routes one event (the table is locked).
  private func route(wd: Int32, mask: UInt32, table: inout [Int32: InotifyWatch]) {
    if mask & UInt32(IN_Q_OVERFLOW) != 0 {
      // Events were lost: compare every watch with what it saw last.
      for first in table.values {
        var watch: InotifyWatch? = first
        while let current = watch {
          current.recheck()
          watch = current.next
        }
      }
      return
    }
    let retired = mask & UInt32(IN_IGNORED) != 0
    var watch = table[wd]
    while let current = watch {
      current.handle(mask, retired: retired)
      watch = current.next
    }
    // The kernel watch is gone: no more events for it, nothing to remove; its list comes apart.
    if retired {
      var unlinked = table.removeValue(forKey: wd)
      while let current = unlinked {
        unlinked = current.next
        current.next = nil
      }
    }
  }
}

/// One `FileSystemSource`'s watch: a registration on an inotify watch
/// descriptor and the state it needs to turn inotify events into vnode
/// flags for its source.
final class InotifyWatch: KernelWatcher {
  /// What delivery compares each event with: the file as last seen.
  struct Baseline {
    var size: Int
    var links: UInt
    var path: String?
    var deleted = false
  }

  struct State {
    var phase = WatcherPhase<Baseline>.idle
    /// The watch descriptor, -1 once retired or removed.
    var wd: Int32
    /// The `O_PATH | O_CLOEXEC` descriptor that keeps the file reachable
    /// (for `path` and `fstat`); -1 once closed (file deleted, watch stopped).
    var pathDescriptor: Int32
  }

  let center: Inotify
  /// The vnode flags the source asked for (`FileSystemEvents.all` fits a byte: the source's
  /// initializer refuses other bits), beside `isDirectory`: a watch is 104 bytes, not 112.
  private let eventBits: UInt8
  let isDirectory: Bool
  let target: MergeTarget
  let state: Mutex<State>
  /// The next watch on the same watch descriptor. Read and written only under the center's table
  /// lock (`register`, `unregister`, `route`): a watch unlinked while an event for its descriptor
  /// is routed cannot be, as routing holds that lock too.
  nonisolated(unsafe) var next: InotifyWatch?

  init(
    center: Inotify, wd: Int32, events: FileSystemEvents, pathDescriptor: Int32, isDirectory: Bool,
    target: OpaquePointer
  ) {
    self.center = center
    eventBits = UInt8(events.rawValue)
    self.isDirectory = isDirectory
    self.target = MergeTarget(retaining: target)
    state = Mutex(State(wd: wd, pathDescriptor: pathDescriptor))
  }

  /// The vnode flags the source asked for.
  var events: FileSystemEvents { FileSystemEvents(rawValue: UInt(eventBits)) }

  /// The source's first `resume()`: deliver from now on, against a fresh baseline.
  func start() {
    state.withLock { state in
      guard case .idle = state.phase else { return }
      let status = InotifyWatch.status(state.pathDescriptor)
      // The path is kept only to find a rename the kernel's events missed (`recheck`): a readlink
      // and a string less for a watch that does not ask for renames.
      state.phase = .running(
        Baseline(
          size: status?.size ?? 0, links: status?.links ?? 0,
          path: events.contains(.rename) ? InotifyWatch.path(state.pathDescriptor) : nil))
    }
  }

  /// The source's cancel path: unregister, close the `O_PATH` descriptor,
  /// release the source.
  func stop() {
    let stopped = state.withLock { state -> (wd: Int32, pathDescriptor: Int32)? in
      if case .stopped = state.phase { return nil }
      defer { state = State(phase: .stopped, wd: -1, pathDescriptor: -1) }
      return (state.wd, state.pathDescriptor)
    }
    guard let stopped else { return }
    center.unregister(self, wd: stopped.wd)
    if stopped.pathDescriptor >= 0 { system_close(stopped.pathDescriptor) }
    target.release()
  }

  /// The file's path now (nil once it is deleted or the watch stopped).
  var path: String? { state.withLock { InotifyWatch.path($0.pathDescriptor) } }

  private static func status(_ pathDescriptor: Int32) -> FileStatus? {
    pathDescriptor >= 0 ? system_fstat(pathDescriptor) : nil
  }

  private static func path(_ pathDescriptor: Int32) -> String? {
    guard let status = status(pathDescriptor), status.links > 0,
      var path = system_readlink("/proc/self/fd/\(pathDescriptor)")
    else { return nil }
    if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
    return path
  }

  // MARK: Delivery (on the instance's queue, under the table lock)

  /// One inotify event for this watch; `retired`: the kernel watch is gone.
  func handle(_ mask: UInt32, retired: Bool) {
    let flags = state.withLock { state -> FileSystemEvents in
      if retired { state.wd = -1 }
      guard case .running(var baseline) = state.phase else { return [] }
      let flags = translate(mask, &baseline, &state.pathDescriptor)
      state.phase = .running(baseline)
      return flags
    }
    let asked = flags.intersection(events)
    if !asked.isEmpty { target.merge(asked.rawValue) }
  }

  /// After a queue overflow: the flags that comparing the file with the
  /// baseline reveals.
  func recheck() {
    let flags = state.withLock { state -> FileSystemEvents in
      guard case .running(var baseline) = state.phase, !baseline.deleted,
        let status = InotifyWatch.status(state.pathDescriptor)
      else { return [] }
      var flags = FileSystemEvents()
      if status.size != baseline.size { flags.insert(.write) }
      if status.size > baseline.size { flags.insert(.extend) }
      if status.links != baseline.links { flags.formUnion([.link, .attrib]) }
      baseline.size = status.size
      baseline.links = status.links
      if status.links == 0 { flags.formUnion(InotifyWatch.markDeleted(&baseline, &state.pathDescriptor)) }
      if events.contains(.rename) {
        let path = InotifyWatch.path(state.pathDescriptor)
        if path != baseline.path, path != nil {
          flags.insert(.rename)
          baseline.path = path
        }
      }
      state.phase = .running(baseline)
      return flags
    }
    let asked = flags.intersection(events)
    if !asked.isEmpty { target.merge(asked.rawValue) }
  }

  /// The vnode flags an inotify event on the watched file stands for
  /// (before filtering by the flags the source asked for).
  private func translate(_ mask: UInt32, _ baseline: inout Baseline, _ pathDescriptor: inout Int32)
    -> FileSystemEvents
  {
    var flags = FileSystemEvents()
    if mask & UInt32(IN_MODIFY) != 0 {
      flags.insert(.write)
      if let status = InotifyWatch.status(pathDescriptor) {
        if status.size > baseline.size { flags.insert(.extend) }
        baseline.size = status.size
      }
    }
    if mask & UInt32(IN_ATTRIB) != 0 {
      flags.insert(.attrib)
      if let status = InotifyWatch.status(pathDescriptor) {
        if status.links != baseline.links { flags.insert(.link) }
        baseline.links = status.links
        baseline.size = status.size
        if status.links == 0 {
          // The file's last name is gone. While the O_PATH descriptor is
          // open the kernel holds back IN_DELETE_SELF: report the deletion
          // now and let the inode go.
          flags.formUnion(InotifyWatch.markDeleted(&baseline, &pathDescriptor))
        }
      }
    }
    if mask & UInt32(IN_MOVE_SELF) != 0 {
      flags.insert(.rename)
      baseline.path = InotifyWatch.path(pathDescriptor)
    }
    if mask & UInt32(IN_DELETE_SELF) != 0 {
      flags.formUnion(InotifyWatch.markDeleted(&baseline, &pathDescriptor))
    }
    if mask & UInt32(IN_UNMOUNT) != 0 {
      flags.insert(.revoke)
    }
    if mask & UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO) != 0 {
      flags.insert(.write)
      if mask & UInt32(IN_ISDIR) != 0 { flags.insert(.link) }
    }
    return flags
  }

  /// `.delete` the first time the file is found deleted; closes the `O_PATH` descriptor.
  private static func markDeleted(_ baseline: inout Baseline, _ pathDescriptor: inout Int32) -> FileSystemEvents {
    if pathDescriptor >= 0 {
      system_close(pathDescriptor)
      pathDescriptor = -1
    }
    if baseline.deleted { return [] }
    baseline.deleted = true
    return .delete
  }
}
