import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `pipe2` and `accept4`, which make a descriptor close-on-exec in the same call (no window in
/// which another thread's fork inherits it); GNU extensions the Glibc module leaves out, so found
/// by name.
private let glibcPipe2 = unsafeBitCast(
  dlsym(nil, "pipe2"), to: (@convention(c) (UnsafeMutablePointer<Int32>, Int32) -> Int32).self)
private let glibcAccept4 = unsafeBitCast(
  dlsym(nil, "accept4"),
  to: (@convention(c) (Int32, UnsafeMutablePointer<sockaddr>?, UnsafeMutablePointer<socklen_t>?, Int32) -> Int32).self)

/// A pipe: `(read, write)` descriptors; close-on-exec when asked (a test that waits for the end of
/// file must not have a child that another test spawns meanwhile inherit the write end).
func makePipe(nonBlockingRead: Bool = true, closeOnExec: Bool = false) -> (read: Int32, write: Int32) {
  var ends: [Int32] = [-1, -1]
  precondition(glibcPipe2(&ends, closeOnExec ? Int32(O_CLOEXEC) : 0) == 0, "pipe failed: errno \(errno)")
  if nonBlockingRead { _ = fcntl(ends[0], F_SETFL, O_NONBLOCK) }
  return (ends[0], ends[1])
}

/// A connected pair of non-blocking Unix stream sockets (close-on-exec when asked, as `makePipe`).
func makeSocketPair(closeOnExec: Bool = false) -> (Int32, Int32) {
  var ends: [Int32] = [-1, -1]
  let type = Int32(SOCK_STREAM.rawValue) | (closeOnExec ? Int32(SOCK_CLOEXEC.rawValue) : 0)
  precondition(socketpair(AF_UNIX, type, 0, &ends) == 0, "socketpair failed: errno \(errno)")
  _ = fcntl(ends[0], F_SETFL, O_NONBLOCK)
  _ = fcntl(ends[1], F_SETFL, O_NONBLOCK)
  return (ends[0], ends[1])
}

/// A connected TCP pair on 127.0.0.1 (blocking, close-on-exec).
func tcpPair() -> (client: Int32, server: Int32) {
  let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  precondition(listener >= 0, "socket: errno \(errno)")
  defer { close(listener) }
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_addr.s_addr = inet_addr("127.0.0.1")
  var length = socklen_t(MemoryLayout<sockaddr_in>.size)
  withUnsafeMutablePointer(to: &address) { pointer in
    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
      precondition(bind(listener, generic, length) == 0, "bind: errno \(errno)")
      precondition(listen(listener, 4) == 0, "listen: errno \(errno)")
      precondition(getsockname(listener, generic, &length) == 0, "getsockname: errno \(errno)")
    }
  }
  let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  let connected = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, length) }
  }
  precondition(connected == 0, "connect: errno \(errno)")
  let server = glibcAccept4(listener, nil, nil, Int32(SOCK_CLOEXEC.rawValue))
  precondition(server >= 0, "accept: errno \(errno)")
  return (client, server)
}

/// `count` bytes of a pattern that does not repeat every 256 bytes.
func patternBytes(_ count: Int) -> [UInt8] {
  (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ $0 >> 8) }
}

/// Writes `bytes` to a new temporary file and returns its path.
func temporaryFile(containing bytes: [UInt8]) -> String {
  var template = Array("/tmp/GCDTests-XXXXXX".utf8CString)
  let fd = mkstemp(&template)
  precondition(fd >= 0, "mkstemp failed: errno \(errno)")
  var offset = 0
  while offset < bytes.count {
    let written = bytes[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    precondition(written > 0, "write failed: errno \(errno)")
    offset += written
  }
  close(fd)
  return template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
}

/// Reads a whole file (blocking I/O).
func contentsOfFile(_ path: String) -> [UInt8] {
  let fd = open(path, O_RDONLY)
  guard fd >= 0 else { return [] }
  defer { close(fd) }
  var result: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 65536)
  while true {
    let count = read(fd, &chunk, chunk.count)
    if count <= 0 { break }
    result.append(contentsOf: chunk.prefix(count))
  }
  return result
}

/// Waits until `condition` holds, checking it every millisecond, for at most `timeout`. For conditions
/// no event announces (a weak reference that becomes nil); the answer never depends on the timing.
@available(*, noasync, message: "blocks the thread")
func waitUntil(timeout: Duration = generousTimeout, _ condition: () -> Bool) -> Bool {
  let deadline = ContinuousClock.now + timeout
  while !condition() {
    if ContinuousClock.now >= deadline { return condition() }
    usleep(1000)
  }
  return true
}

/// Lets at least `duration` pass: a wait on an event nobody signals. Only ever a lower bound of the
/// time elapsed, never an expectation that something has happened meanwhile.
@available(*, noasync, message: "blocks the thread")
func letTimePass(_ duration: Duration) {
  Event().wait(timeout: duration)
}

/// In an exit test's child: `requireInChild` — unless `condition` holds, the message reaches the
/// parent as an issue (or on standard error from a queue's thread) and the child ends with status 1.
func childRequire(
  _ condition: Bool, _ message: @autoclosure () -> String, sourceLocation: SourceLocation = #_sourceLocation
) {
  requireInChild(condition, message(), sourceLocation: sourceLocation)
}

/// The first index where `a` and `b` differ (or the shorter length), nil when they are equal: for
/// comparing large buffers without printing them whole on failure.
func firstDifference(_ a: [UInt8], _ b: [UInt8]) -> Int? {
  if let index = zip(a.indices, zip(a, b)).first(where: { $0.1.0 != $0.1.1 })?.0 { return index }
  return a.count == b.count ? nil : min(a.count, b.count)
}

/// A fresh directory under /tmp, removed with everything in it on deinit.
final class TemporaryDirectory {
  let path: String

  init() {
    var template = Array("/tmp/GCDTests-fs-XXXXXX".utf8CString)
    precondition(mkdtemp(&template) != nil, "mkdtemp failed: errno \(errno)")
    path = template.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
  }

  deinit { TemporaryDirectory.remove(path) }

  /// Creates `name` in the directory and returns its path.
  func file(_ name: String, contents: String = "") -> String {
    TemporaryDirectory.create(path + "/" + name, contents: contents)
  }

  @discardableResult
  static func create(_ path: String, contents: String) -> String {
    let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
    precondition(descriptor >= 0, "open(\(path)) failed: errno \(errno)")
    let bytes = Array(contents.utf8)
    precondition(bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) } == bytes.count)
    close(descriptor)
    return path
  }

  static func remove(_ path: String) {
    if let directory = opendir(path) {
      while let entry = readdir(directory) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) {
          String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self)
        }
        if name == "." || name == ".." { continue }
        remove(path + "/" + name)
      }
      closedir(directory)
      rmdir(path)
    } else {
      unlink(path)
    }
  }
}

/// A read and a write source on one descriptor (a connection's two), in that order, on `queue`.
func makeReadAndWriteSources(on descriptor: Int32, queue: Queue) throws -> (reader: ReadSource, writer: WriteSource) {
  (try ReadSource(fileDescriptor: descriptor, queue: queue), try WriteSource(fileDescriptor: descriptor, queue: queue))
}

/// A pseudo-terminal in raw mode, so that bytes cross it unchanged both ways: its master and its
/// slave end, both blocking and close-on-exec, and the slave's name ("/dev/pts/3"), which is also
/// what `/proc/self/fd` says of it.
func makePseudoTerminal() -> (master: Int32, slave: Int32, name: String) {
  // unlockpt and ptsname_r are X/Open and GNU names the Glibc module does not export.
  typealias Unlock = @convention(c) (Int32) -> Int32
  typealias Name = @convention(c) (Int32, UnsafeMutablePointer<CChar>, Int) -> Int32
  guard let unlockSymbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "unlockpt"),
    let nameSymbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "ptsname_r")
  else { preconditionFailure("libc has no unlockpt or ptsname_r") }
  let master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC)
  precondition(master >= 0, "open /dev/ptmx: errno \(errno)")
  precondition(unsafeBitCast(unlockSymbol, to: Unlock.self)(master) == 0, "unlockpt: errno \(errno)")
  var name = [CChar](repeating: 0, count: 128)
  precondition(unsafeBitCast(nameSymbol, to: Name.self)(master, &name, name.count) == 0, "ptsname_r: errno \(errno)")
  let path = String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
  let slave = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC)
  precondition(slave >= 0, "open \(path): errno \(errno)")
  var settings = termios()
  precondition(tcgetattr(slave, &settings) == 0, "tcgetattr: errno \(errno)")
  cfmakeraw(&settings)
  precondition(tcsetattr(slave, TCSANOW, &settings) == 0, "tcsetattr: errno \(errno)")
  return (master, slave, path)
}

/// Resumes `source` (a read or write source in the descriptor fence) with no event handler, makes
/// its descriptor ready (`after`), waits until the fence merged the event into it (its watch
/// disarmed) and its queue ran it without a handler, then sets a handler that runs `handled` and
/// cancels the source, whose cancel handler closes the descriptor. True when the handler ran, saw
/// `handled` succeed, and the cancel handler ran.
@available(*, noasync, message: "blocks the thread")
func firesOnceHandlerIsSet(
  _ source: Source, watch: DescriptorWatch, after makeReady: () -> Void, _ handled: @escaping @Sendable () -> Bool
) -> Bool {
  let cancelled = Event()
  source.setCancelHandler {
    close(watch.descriptor)
    cancelled.signal()
  }
  source.resume()
  makeReady()
  guard waitUntil({ !DescriptorFence.instance.isArmed(watch) }) else {
    Issue.record("the fence never merged an event into the source")
    return false
  }
  source.queue.sync {}
  let fired = Event()
  source.setEventHandler { [unowned source] in
    if handled() { fired.signal() }
    source.cancel()
  }
  guard fired.wait() else {
    Issue.record("the handler set after the source's first event never ran")
    return false
  }
  return cancelled.wait()
}
