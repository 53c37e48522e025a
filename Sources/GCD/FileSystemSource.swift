import CDispatch
import CGCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

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
  public let rawValue: UInt

  public init(rawValue: UInt) { self.rawValue = rawValue }

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

  /// Every flag.
  public static let all: FileSystemEvents = [.delete, .write, .extend, .attrib, .link, .rename, .revoke]

  static let names: [(FileSystemEvents, String)] = [
    (.delete, ".delete"), (.write, ".write"), (.extend, ".extend"), (.attrib, ".attrib"),
    (.link, ".link"), (.rename, ".rename"), (.revoke, ".revoke"),
  ]

  public var description: String { describeFlags(self, names: FileSystemEvents.names) }
}

/// Watches a file or directory for the changes in `FileSystemEvents`;
/// `data` holds the flags that fired since the handler last ran, merged
/// (ORed) exactly as a vnode source merges them.
///
/// The source keeps the file itself, not its name: after a rename it keeps
/// watching the file under its new name, which `path` returns.
///
/// On Linux the source is built on the process's one inotify instance
/// (shared by every `FileSystemSource`) and an `cgcd_o_path() | O_CLOEXEC`
/// descriptor on the file, which the source owns and closes exactly once:
/// when the file is deleted, or when the source is cancelled or dropped.
/// Events are delivered from the first `resume()`.
///
/// The corresponding C type is a `dispatch_source_t` of type `DISPATCH_SOURCE_TYPE_VNODE`.
public final class FileSystemSource: SourceCore, Source, @unchecked Sendable {
  /// The events the source watches (`mask`).
  public let watchedEvents: FileSystemEvents
  let watch: InotifyWatch
  /// The descriptor returned by `handle`.
  let watchedDescriptor: Int32

  /// Creates a source that watches the file or directory at `path` for
  /// `events`, with handlers on `queue`.
  ///
  /// - Throws: `GCDError` with `ENOENT` (naming the path) when nothing is
  ///   there, `ENOSPC` when the per-user inotify watch limit is reached,
  ///   `EINVAL` for an empty or unknown event set.
  ///
  /// The corresponding C functions are `open(path, O_EVTONLY)` and `dispatch_source_create`.
  public convenience init(path: String, events: FileSystemEvents, queue: Queue) throws(GCDError) {
    let operation = "FileSystemSource(path: \"\(path)\", events: \(events))"
    try FileSystemSource.check(events, operation: operation)
    let descriptor = open(path, cgcd_o_path() | O_CLOEXEC)
    guard descriptor >= 0 else {
      let error = Glibc.errno
      throw GCDError(
        operation: operation, errno: error,
        detail: error == ENOENT ? "nothing at \(path)" : "cannot open \(path)")
    }
    try self.init(pathDescriptor: descriptor, handle: descriptor, events: events, queue: queue, operation: operation)
  }

  /// Creates a source that watches the file `fileDescriptor` refers to for
  /// `events`, with handlers on `queue`. The descriptor stays yours: the
  /// source opens its own (`O_PATH`) through `/proc/self/fd`, so you may
  /// close yours at any time.
  ///
  /// - Throws: `GCDError` with `EBADF` when the descriptor is not open,
  ///   `ENOSPC` when the per-user inotify watch limit is reached, `EINVAL`
  ///   for an empty or unknown event set.
  ///
  /// The corresponding C function is `dispatch_source_create`.
  public convenience init(fileDescriptor: Int32, events: FileSystemEvents, queue: Queue) throws(GCDError) {
    let operation = "FileSystemSource(fileDescriptor: \(fileDescriptor), events: \(events))"
    try FileSystemSource.check(events, operation: operation)
    try checkDescriptor(fileDescriptor, rejectingDirectories: false, operation: operation)
    let descriptor = open("/proc/self/fd/\(fileDescriptor)", cgcd_o_path() | O_CLOEXEC)
    guard descriptor >= 0 else {
      throw GCDError.fromErrno(operation, detail: "cannot reopen the descriptor through /proc/self/fd")
    }
    try self.init(
      pathDescriptor: descriptor, handle: fileDescriptor, events: events, queue: queue, operation: operation)
  }

  /// Takes over `pathDescriptor` (closed here on failure).
  private init(
    pathDescriptor: Int32, handle: Int32, events: FileSystemEvents, queue: Queue, operation: String
  ) throws(GCDError) {
    let watch: InotifyWatch
    do {
      watch = try Inotify.shared(operation: operation).register(
        pathDescriptor: pathDescriptor, events: events.rawValue, operation: operation)
    } catch {
      close(pathDescriptor)
      throw error
    }
    let created: OpaquePointer
    do {
      created = try SourceCore.create(type: cgcd_source_type_data_or(), handle: 0, mask: 0, queue: queue)
    } catch {
      watch.center.unregister(watch)
      throw error
    }
    self.watchedEvents = events
    self.watch = watch
    watchedDescriptor = handle
    super.init(
      created: created, queue: queue, ownedCleanup: { watch.center.unregister(watch) },
      onActivate: { watch.activate() })
    watch.setTarget(raw)
  }

  private static func check(_ events: FileSystemEvents, operation: String) throws(GCDError) {
    guard !events.isEmpty else {
      throw GCDError(operation: operation, errno: EINVAL, detail: "no events to watch")
    }
    guard events.isSubset(of: .all) else {
      throw GCDError(
        operation: operation, errno: EINVAL,
        detail: "unknown event bits 0x\(String(events.subtracting(.all).rawValue, radix: 16))")
    }
  }

  /// The file's current path: after a rename, the new one. Nil once the
  /// file is deleted or the source cancelled.
  public var path: String? { watch.path }

  /// The `FileSystemEvents` flags that fired, as a raw value.
  public var data: UInt { dispatch_source_get_data(raw) }
  /// The events that fired since the handler last ran (merged).
  public var firedEvents: FileSystemEvents { FileSystemEvents(rawValue: data) }
  /// The events the source watches, as a raw value.
  public var mask: UInt { watchedEvents.rawValue }
  /// The descriptor given to `init(fileDescriptor:events:queue:)`, or the
  /// source's own `O_PATH` descriptor for `init(path:events:queue:)`
  /// (closed once the file is deleted or the source cancelled).
  public var handle: UInt { UInt(truncatingIfNeeded: Int(watchedDescriptor)) }
}
