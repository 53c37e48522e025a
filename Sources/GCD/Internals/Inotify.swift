import CDispatch
import CGCD
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
/// descriptor; the table keeps a list of watches per descriptor, adds with
/// `IN_MASK_ADD` and removes the kernel watch only when its last entry goes.
/// `IN_IGNORED` (file gone, file system unmounted, watch removed) retires
/// a descriptor.
final class Inotify: @unchecked Sendable {
  struct Table {
    var watches: [Int32: [InotifyWatch]] = [:]
  }

  /// The inotify descriptor (`IN_NONBLOCK | IN_CLOEXEC`).
  let descriptor: Int32
  /// Every registered watch by watch descriptor. Also guards the mutable
  /// state of every `InotifyWatch`.
  let table = Mutex(Table())
  let queue: Queue
  /// The read source of `descriptor`, on `queue`; one reference, never released.
  let reader: OpaquePointer
  /// The read buffer; used only on `queue`.
  private let buffer: UnsafeMutableRawPointer
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
    let descriptor = inotify_init1(Int32(IN_NONBLOCK) | Int32(IN_CLOEXEC))
    guard descriptor >= 0 else {
      let error = Glibc.errno
      throw GCDError(
        operation: operation + ": inotify_init1", errno: error,
        detail: error == EMFILE
          ? "too many inotify instances for this user (/proc/sys/fs/inotify/max_user_instances = "
            + "\(readProcValue("/proc/sys/fs/inotify/max_user_instances")))"
            + " or too many open descriptors in the process" : nil)
    }
    self.descriptor = descriptor
    queue = Queue(label: "GCD.FileSystemSource.inotify")
    buffer = UnsafeMutableRawPointer.allocate(byteCount: Inotify.bufferSize, alignment: 8)
    // The reader is never cancelled: the instance lives as long as the
    // process. It is kept here (libdispatch holds an active source only
    // through a disguised pointer) so that it stays reachable to leak checkers.
    reader = OpaquePointer(
      cgcd_source_create(cgcd_source_type_read(), UInt(descriptor), 0, queue.raw.raw).unsafelyUnwrapped)
    dispatch_source_set_event_handler(reader) { [self] in drain() }
    dispatch_activate(reader.object)
  }

  /// Adds a kernel watch on the file `pathDescriptor` (an `O_PATH`
  /// descriptor the new watch takes over) and registers a watch for
  /// `events` (vnode flags) on it.
  func register(pathDescriptor: Int32, events: UInt, operation: String) throws(GCDError) -> InotifyWatch {
    var status = stat()
    guard fstat(pathDescriptor, &status) == 0 else {
      throw GCDError.fromErrno(operation + ": fstat")
    }
    let isDirectory = status.st_mode & S_IFMT == S_IFDIR
    let mask = Inotify.kernelMask(for: events, isDirectory: isDirectory)
    return try table.withLock { (table: inout Table) throws(GCDError) -> InotifyWatch in
      // Through /proc/self/fd the watch is on exactly the inode the
      // descriptor holds, whatever happened to the name meanwhile.
      let wd = inotify_add_watch(descriptor, "/proc/self/fd/\(pathDescriptor)", mask | UInt32(IN_MASK_ADD))
      guard wd >= 0 else {
        let error = Glibc.errno
        throw GCDError(
          operation: operation + ": inotify_add_watch", errno: error,
          detail: error == ENOSPC
            ? "the inotify watch limit is reached (/proc/sys/fs/inotify/max_user_watches = "
              + "\(readProcValue("/proc/sys/fs/inotify/max_user_watches"))); raise it with "
              + "`sysctl fs.inotify.max_user_watches=N`" : nil)
      }
      let watch = InotifyWatch(
        center: self, wd: wd, events: events, pathDescriptor: pathDescriptor, status: status,
        isDirectory: isDirectory)
      table.watches[wd, default: []].append(watch)
      return watch
    }
  }

  /// The inotify events needed to produce `events` (vnode flags).
  static func kernelMask(for events: UInt, isDirectory: Bool) -> UInt32 {
    let events = FileSystemEvents(rawValue: events)
    let children = UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO)
    var mask = UInt32(IN_UNMOUNT)
    if !events.isDisjoint(with: [.write, .extend]) { mask |= UInt32(IN_MODIFY) }
    if !events.isDisjoint(with: [.attrib, .link, .delete]) { mask |= UInt32(IN_ATTRIB) }
    if events.contains(.rename) { mask |= UInt32(IN_MOVE_SELF) }
    if events.contains(.delete) { mask |= UInt32(IN_DELETE_SELF) }
    if isDirectory && !events.isDisjoint(with: [.write, .link]) { mask |= children }
    return mask
  }

  /// Removes `watch` (its source was cancelled): the kernel watch goes with
  /// the last registration on its descriptor; the watch's `O_PATH`
  /// descriptor is closed and its reference to the user source released.
  func unregister(_ watch: InotifyWatch) {
    let target: OpaquePointer? = table.withLock { table in
      guard watch.registered else { return nil }
      watch.registered = false
      watch.active = false
      if watch.wd >= 0, var list = table.watches[watch.wd],
        let index = list.firstIndex(where: { $0 === watch })
      {
        list.remove(at: index)
        if list.isEmpty {
          table.watches[watch.wd] = nil
          inotify_rm_watch(descriptor, watch.wd)
        } else {
          table.watches[watch.wd] = list
        }
      }
      watch.wd = -1
      watch.closePathDescriptor()
      defer { watch.target = nil }
      return watch.target
    }
    if let target { cgcd_release(target.raw) }
  }

  /// Reads and routes every pending event (the reader's handler, on `queue`).
  private func drain() {
    while true {
      let count = read(descriptor, buffer, Inotify.bufferSize)
      if count < 0 && Glibc.errno == EINTR { continue }
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
  private func route(wd: Int32, mask: UInt32, table: inout Table) {
    if mask & UInt32(IN_Q_OVERFLOW) != 0 {
      // Events were lost: compare every watch with what it saw last.
      for list in table.watches.values {
        for watch in list { watch.deliver(watch.recheck()) }
      }
      return
    }
    guard let list = table.watches[wd] else { return }
    for watch in list { watch.deliver(watch.translate(mask)) }
    if mask & UInt32(IN_IGNORED) != 0 {
      // The kernel watch is gone: no more events for it, nothing to remove.
      table.watches[wd] = nil
      for watch in list { watch.wd = -1 }
    }
  }
}

/// One `FileSystemSource`'s registration on a watch descriptor: the state
/// it needs to turn inotify events into vnode flags. Its mutable state is
/// guarded by the instance's `table` lock.
final class InotifyWatch: @unchecked Sendable {
  unowned let center: Inotify
  /// The vnode flags the source asked for.
  let events: UInt
  let isDirectory: Bool
  /// The watch descriptor, -1 once retired or unregistered.
  var wd: Int32
  /// The `O_PATH | O_CLOEXEC` descriptor that keeps the file reachable (for
  /// `path` and `fstat`); -1 once closed (file deleted, source cancelled).
  var pathDescriptor: Int32
  /// The user's DATA_OR source, retained while registered.
  var target: OpaquePointer?
  var registered = true
  /// True from the source's first `resume()`: events before are not delivered.
  var active = false
  var deleted = false
  var size: Int
  var links: UInt
  var lastPath: String?

  init(center: Inotify, wd: Int32, events: UInt, pathDescriptor: Int32, status: stat, isDirectory: Bool) {
    self.center = center
    self.wd = wd
    self.events = events
    self.pathDescriptor = pathDescriptor
    self.isDirectory = isDirectory
    size = Int(status.st_size)
    links = UInt(status.st_nlink)
  }

  /// Sets the source to merge into (retained until `unregister`).
  func setTarget(_ target: OpaquePointer) {
    cgcd_retain(target.raw)
    center.table.withLock { _ in self.target = target }
  }

  /// The source's first `resume()`: deliver from now on, against fresh baselines.
  func activate() {
    center.table.withLock { _ in
      guard registered else { return }
      if let status = currentStatus() {
        size = Int(status.st_size)
        links = UInt(status.st_nlink)
      }
      lastPath = currentPath()
      active = true
    }
  }

  /// The file's path now (nil once it is deleted or the source cancelled).
  var path: String? { center.table.withLock { _ in currentPath() } }

  // MARK: Under the table lock

  func currentStatus() -> stat? {
    guard pathDescriptor >= 0 else { return nil }
    var status = stat()
    return fstat(pathDescriptor, &status) == 0 ? status : nil
  }

  func currentPath() -> String? {
    guard pathDescriptor >= 0, let status = currentStatus(), status.st_nlink > 0 else {
      return nil
    }
    guard var path = readLink("/proc/self/fd/\(pathDescriptor)") else { return nil }
    if path.hasSuffix(" (deleted)") { path.removeLast(" (deleted)".count) }
    return path
  }

  func closePathDescriptor() {
    if pathDescriptor >= 0 {
      close(pathDescriptor)
      pathDescriptor = -1
    }
  }

  /// The vnode flags an inotify event on the watched file stands for
  /// (before filtering by the flags the source asked for).
  func translate(_ mask: UInt32) -> UInt {
    var flags = FileSystemEvents()
    if mask & UInt32(IN_MODIFY) != 0 {
      flags.insert(.write)
      if let status = currentStatus() {
        if Int(status.st_size) > size { flags.insert(.extend) }
        size = Int(status.st_size)
      }
    }
    if mask & UInt32(IN_ATTRIB) != 0 {
      flags.insert(.attrib)
      if let status = currentStatus() {
        let now = UInt(status.st_nlink)
        if now != links { flags.insert(.link) }
        links = now
        size = Int(status.st_size)
        if now == 0 {
          // The file's last name is gone. While our O_PATH descriptor is
          // open the kernel holds back IN_DELETE_SELF: report the deletion
          // now and let the inode go.
          flags.formUnion(markDeleted())
        }
      }
    }
    if mask & UInt32(IN_MOVE_SELF) != 0 {
      flags.insert(.rename)
      lastPath = currentPath()
    }
    if mask & UInt32(IN_DELETE_SELF) != 0 {
      flags.formUnion(markDeleted())
    }
    if mask & UInt32(IN_UNMOUNT) != 0 {
      flags.insert(.revoke)
    }
    if mask & UInt32(IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO) != 0 {
      flags.insert(.write)
      if mask & UInt32(IN_ISDIR) != 0 { flags.insert(.link) }
    }
    return flags.rawValue
  }

  /// `.delete` the first time the file is found deleted; closes the `O_PATH` descriptor.
  private func markDeleted() -> FileSystemEvents {
    closePathDescriptor()
    if deleted { return [] }
    deleted = true
    return .delete
  }

  /// After a queue overflow: the flags that comparing the file with the
  /// last state seen reveals.
  func recheck() -> UInt {
    guard !deleted else { return 0 }
    guard let status = currentStatus() else { return 0 }
    var flags = FileSystemEvents()
    if Int(status.st_size) != size { flags.insert(.write) }
    if Int(status.st_size) > size { flags.insert(.extend) }
    if UInt(status.st_nlink) != links { flags.formUnion([.link, .attrib]) }
    size = Int(status.st_size)
    links = UInt(status.st_nlink)
    if status.st_nlink == 0 { flags.formUnion(markDeleted()) }
    let path = currentPath()
    if path != lastPath, path != nil {
      flags.insert(.rename)
      lastPath = path
    }
    return flags.rawValue
  }

  /// Merges the flags the source asked for into it (once it is started).
  func deliver(_ flags: UInt) {
    let wanted = flags & events
    guard wanted != 0, active, let target else { return }
    dispatch_source_merge_data(target, wanted)
  }
}

/// The target of a symbolic link (or a /proc/self/fd entry).
func readLink(_ path: String) -> String? {
  var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
  let count = buffer.withUnsafeMutableBufferPointer { buffer in
    buffer.withMemoryRebound(to: CChar.self) { readlink(path, $0.baseAddress!, Int(PATH_MAX)) }
  }
  guard count >= 0 else { return nil }
  return String(decoding: buffer[0..<count], as: UTF8.self)
}

/// The first line of a /proc file ("?" when it cannot be read).
func readProcValue(_ path: String) -> String {
  guard let file = fopen(path, "re") else { return "?" }
  defer { fclose(file) }
  var line = [CChar](repeating: 0, count: 64)
  guard fgets(&line, Int32(line.count), file) != nil else { return "?" }
  return String(decoding: line.prefix { $0 != 0 && $0 != 10 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
