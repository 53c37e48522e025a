/// The file-system events a `FileSystemSource` can watch, named after the
/// C vnode flags (`dispatch_source_vnode_flags_t`), with the same raw values.
///
/// On Linux they come from inotify:
///
/// | flag       | inotify event                                                          |
/// |------------|------------------------------------------------------------------------|
/// | `.write`   | `IN_MODIFY`; for a directory `IN_CREATE`, `IN_DELETE`, `IN_MOVED_*`    |
/// | `.extend`  | `IN_MODIFY` that made the file larger                                  |
/// | `.attrib`  | `IN_ATTRIB`                                                            |
/// | `.link`    | `IN_ATTRIB` that changed the link count; a subdirectory created, removed or moved |
/// | `.rename`  | `IN_MOVE_SELF`                                                         |
/// | `.delete`  | `IN_ATTRIB` that dropped the link count to 0, or `IN_DELETE_SELF`      |
/// | `.revoke`  | `IN_UNMOUNT`                                                           |
public struct FileSystemEvents: OptionSet, Sendable, Hashable, CustomStringConvertible {
  /// The `dispatch_source_vnode_flags_t` bits.
  public let rawValue: UInt

  /// Creates the event set whose bits are these `DISPATCH_VNODE_*` flags.
  ///
  /// - Parameter rawValue: `DISPATCH_VNODE_*` bits.
  public init(rawValue: UInt) { self.rawValue = rawValue }

  /// Every event: delete, write, extend, attrib, link, rename and revoke.
  public static let all: FileSystemEvents = [.delete, .write, .extend, .attrib, .link, .rename, .revoke]

  /// The file was deleted (its last name removed). `DISPATCH_VNODE_DELETE`.
  public static let delete = FileSystemEvents(rawValue: 0x1)
  /// The file's data changed; for a directory, an entry was added, removed
  /// or renamed. `DISPATCH_VNODE_WRITE`.
  public static let write = FileSystemEvents(rawValue: 0x2)
  /// The file grew. `DISPATCH_VNODE_EXTEND`.
  public static let extend = FileSystemEvents(rawValue: 0x4)
  /// The file's metadata changed (permissions, owner, times, links). `DISPATCH_VNODE_ATTRIB`.
  public static let attrib = FileSystemEvents(rawValue: 0x8)
  /// The file's link count changed. `DISPATCH_VNODE_LINK`.
  public static let link = FileSystemEvents(rawValue: 0x10)
  /// The file was renamed or moved. `DISPATCH_VNODE_RENAME`.
  public static let rename = FileSystemEvents(rawValue: 0x20)
  /// The file system holding the file was unmounted. `DISPATCH_VNODE_REVOKE`.
  public static let revoke = FileSystemEvents(rawValue: 0x40)

  static let names: [(FileSystemEvents, String)] = [
    (.delete, ".delete"), (.write, ".write"), (.extend, ".extend"), (.attrib, ".attrib"),
    (.link, ".link"), (.rename, ".rename"), (.revoke, ".revoke"),
  ]

  /// `[.write, .extend]`-style: the named flags, then any unnamed bits in hex.
  public var description: String { describeFlags(self, names: FileSystemEvents.names) }
}

/// Watches a file or directory for the changes in `FileSystemEvents`;
/// `firedEvents` holds the flags that fired since the handler last ran,
/// merged (ORed) exactly as a vnode source merges them.
///
/// The source keeps the file itself, not its name: after a rename it keeps
/// watching the file under its new name, which `path` returns.
///
/// On Linux the source is built on the process's one inotify instance
/// (shared by every `FileSystemSource`) and an `O_PATH | O_CLOEXEC`
/// descriptor on the file, which the source owns and closes exactly once:
/// when the file is deleted, or when the source is cancelled or dropped.
/// Events are delivered from the first `resume()`.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_VNODE`.
public final class FileSystemSource: EventSetSource<FileSystemEvents>, @unchecked Sendable {
  /// The events the source watches (`mask`).
  public var watchedEvents: FileSystemEvents { watch.events }
  let watch: InotifyWatch
  /// The descriptor returned by `handle`.
  let watchedDescriptor: Int32

  /// Creates a source that watches the file or directory at `path` for
  /// `events`, with handlers on `queue`.
  ///
  /// - Parameters:
  ///   - path: The file or directory to watch.
  ///   - events: What to watch for (not empty).
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `ENOENT` (naming the path) when nothing is
  ///   there, `ENOSPC` when the per-user inotify watch limit is reached,
  ///   `EMFILE` when the process has no descriptor left, `EINVAL` for an
  ///   empty event set. Bits beside `FileSystemEvents`' seven stop the
  ///   process with a message naming the source (a programmer error).
  ///
  /// The corresponding C functions are `open(path, O_EVTONLY)` and `dispatch_source_create`.
  public convenience init(path: String, events: FileSystemEvents, queue: Queue) throws(GCDError) {
    let operation = "FileSystemSource(path: \"\(path)\", events: \(events))"
    try FileSystemSource.check(events, operation: operation)
    let center = try Inotify.shared(operation: operation)
    let descriptor = try checkedCall(
      operation + ": open",
      detail: { $0 == Errno.noSuchFileOrDirectory ? "nothing at \(path)" : "cannot open \(path)" }
    ) { system_openPath(path) }
    try self.init(
      center: center, pathDescriptor: descriptor, handle: descriptor, events: events, queue: queue,
      operation: operation)
  }

  /// Creates a source that watches the file `fileDescriptor` refers to for
  /// `events`, with handlers on `queue`. The descriptor stays yours: the
  /// source opens its own (`O_PATH`) through `/proc/self/fd`, so you may
  /// close yours at any time.
  ///
  /// - Parameters:
  ///   - fileDescriptor: An open descriptor on the file or directory to watch.
  ///   - events: What to watch for (not empty).
  ///   - queue: The queue the handlers run on.
  /// - Throws: `GCDError` with `EBADF` when the descriptor is not open,
  ///   `ENOSPC` when the per-user inotify watch limit is reached, `EMFILE`
  ///   when the process has no descriptor left, `EINVAL` for an empty
  ///   event set. Bits beside `FileSystemEvents`' seven stop the process
  ///   with a message naming the source (a programmer error).
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public convenience init(fileDescriptor: Int32, events: FileSystemEvents, queue: Queue) throws(GCDError) {
    let operation = "FileSystemSource(fileDescriptor: \(fileDescriptor), events: \(events))"
    try FileSystemSource.check(events, operation: operation)
    guard fileDescriptor >= 0, system_fstat(fileDescriptor) != nil else {
      throw GCDError(operation: operation, errno: Errno.badFileDescriptor, detail: "not an open file descriptor")
    }
    let center = try Inotify.shared(operation: operation)
    let descriptor = try checkedCall(
      operation + ": open", detail: { _ in "cannot reopen the descriptor through /proc/self/fd" }
    ) { system_openPath("/proc/self/fd/\(fileDescriptor)") }
    try self.init(
      center: center, pathDescriptor: descriptor, handle: fileDescriptor, events: events, queue: queue,
      operation: operation)
  }

  /// Takes over `pathDescriptor` (closed here on failure).
  private init(
    center: Inotify, pathDescriptor: Int32, handle: Int32, events: FileSystemEvents, queue: Queue,
    operation: String
  ) throws(GCDError) {
    let created = try Source.createWatcherTarget(queue: queue, closingOnFailure: pathDescriptor)
    let watch: InotifyWatch
    do {
      watch = try center.register(pathDescriptor: pathDescriptor, events: events, target: created, operation: operation)
    } catch {
      // Never started: cancel, start and release it (a never-started source must not be released).
      Libdispatch.source_cancel(created)
      Libdispatch.activate(created)
      Libdispatch.release(created)
      throw error
    }
    self.watch = watch
    watchedDescriptor = handle
    super.init(created: created, queue: queue, watcher: watch)
  }

  private static func check(_ events: FileSystemEvents, operation: String) throws(GCDError) {
    guard !events.isEmpty else {
      throw GCDError(operation: operation, errno: Errno.invalidArgument, detail: "no events to watch")
    }
    requireKnownBits(events, of: .all, operation, "libdispatch knows no such file-system event")
  }

  /// The file's current path: after a rename, the new one. Nil once the
  /// file is deleted or the source cancelled.
  public var path: String? { watch.path }

  /// The events the source watches, as a raw value.
  public override var mask: UInt { watchedEvents.rawValue }
  /// The descriptor given to `init(fileDescriptor:events:queue:)`, or the
  /// source's own `O_PATH` descriptor for `init(path:events:queue:)`
  /// (closed once the file is deleted or the source cancelled).
  public override var handle: UInt { UInt(truncatingIfNeeded: Int(watchedDescriptor)) }
}
