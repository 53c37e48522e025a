import CGCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The C library calls the package makes: the one Swift file that names a
// libc function (C.swift is its twin for libdispatch). As in swift-system,
// each is a `system_` function that only makes the call; `checkedCall`
// retries EINTR and turns a failure into a `GCDError`, the one way this
// package builds an error from `errno`.

/// The calling thread's `errno`.
var system_errno: Int32 { errno }

/// Runs `body` until it does not fail with `EINTR`; a result of -1 then
/// throws `GCDError(operation:errno:detail:)` with `errno` and the
/// `detail` for it.
func checkedCall<Result: FixedWidthInteger>(
  _ operation: @autoclosure () -> String, detail: (Int32) -> String? = { _ in nil }, _ body: () -> Result
) throws(GCDError) -> Result {
  while true {
    let result = body()
    if result != -1 { return result }
    let error = errno
    if error == EINTR { continue }
    throw GCDError(operation: operation(), errno: error, detail: detail(error))
  }
}

/// The system's text for an errno value.
func system_strerror(_ error: Int32) -> String { String(cString: strerror(error)) }

// MARK: - Descriptors

/// `open(path, flags | O_CLOEXEC)`; -1 and errno on failure.
func system_open(_ path: String, _ flags: Int32) -> Int32 { open(path, flags | O_CLOEXEC) }

/// `open(path, flags | O_CLOEXEC, mode)`; -1 and errno on failure.
func system_open(_ path: String, _ flags: Int32, _ mode: UInt32) -> Int32 { open(path, flags | O_CLOEXEC, mode) }

/// `open(path, O_PATH | O_CLOEXEC)`: a descriptor that holds the file (for
/// `fstat`, `/proc/self/fd`, inotify) without opening its contents. CGCD
/// supplies `O_PATH`, which the C library defines only under _GNU_SOURCE.
func system_openPath(_ path: String) -> Int32 { open(path, cgcd_o_path() | O_CLOEXEC) }

/// `close(2)`, result unchecked: on Linux the descriptor is released even
/// when close reports an error, so there is nothing to retry or undo.
func system_close(_ descriptor: Int32) { _ = close(descriptor) }

/// `exit(3)`: ends the process (atexit handlers and stdio flushes run).
func system_exit(_ status: Int32) -> Never { exit(status) }

/// Writes `text` to standard error (`write(2)` on descriptor 2, once).
func system_writeStandardError(_ text: String) {
  var text = text
  text.withUTF8 { _ = write(2, $0.baseAddress, $0.count) }
}

/// `read(2)`; -1 and errno on failure.
func system_read(_ descriptor: Int32, _ buffer: UnsafeMutableRawPointer, _ count: Int) -> Int {
  read(descriptor, buffer, count)
}

/// `write(2)`; -1 and errno on failure.
func system_write(_ descriptor: Int32, _ buffer: UnsafeRawPointer, _ count: Int) -> Int {
  write(descriptor, buffer, count)
}

/// `malloc(3)`: memory a `DispatchBuffer` made with the `.free` deallocator can take over.
func system_allocate(_ count: Int) -> UnsafeMutableRawPointer? { malloc(count) }

/// `realloc(3)` to a smaller size (the same block when the C library keeps it).
func system_shrink(_ memory: UnsafeMutableRawPointer, to count: Int) -> UnsafeMutableRawPointer {
  realloc(memory, count) ?? memory
}

/// `free(3)`.
func system_deallocate(_ memory: UnsafeMutableRawPointer) { free(memory) }

/// What `fstat` says of a descriptor: its kind, size and link count.
struct FileStatus {
  var isDirectory: Bool
  /// A FIFO or a socket: a stream no offset applies to.
  var isStream: Bool
  /// A pipe or a FIFO.
  var isFIFO: Bool
  /// A character device: a terminal, a pseudo-terminal, `/dev/null`, `/dev/zero`.
  var isCharacterDevice: Bool
  /// A regular file (libdispatch reads and writes it blocking, on its disk queues).
  var isRegular: Bool
  var size: Int
  var links: UInt
  /// The file's device and inode: the same for every descriptor of one pipe or socket.
  var device: UInt64
  var inode: UInt64
}

/// Whether `descriptor` is open (`fcntl(F_GETFD)`; errno set when it is not: `EBADF`).
func system_isOpen(_ descriptor: Int32) -> Bool { fcntl(descriptor, F_GETFD) != -1 }

/// `fstat(2)`; nil (errno set) when it fails.
func system_fstat(_ descriptor: Int32) -> FileStatus? {
  var status = stat()
  guard fstat(descriptor, &status) == 0 else { return nil }
  return FileStatus(
    isDirectory: status.st_mode & S_IFMT == S_IFDIR,
    isStream: status.st_mode & S_IFMT == S_IFIFO || status.st_mode & S_IFMT == S_IFSOCK,
    isFIFO: status.st_mode & S_IFMT == S_IFIFO,
    isCharacterDevice: status.st_mode & S_IFMT == S_IFCHR,
    isRegular: status.st_mode & S_IFMT == S_IFREG,
    size: Int(status.st_size), links: UInt(status.st_nlink), device: UInt64(status.st_dev),
    inode: UInt64(status.st_ino))
}

/// `fcntl(F_DUPFD_CLOEXEC)`: a close-on-exec duplicate; -1 and errno on failure.
func system_duplicate(_ descriptor: Int32) -> Int32 { fcntl(descriptor, F_DUPFD_CLOEXEC, 0) }

/// `fcntl(F_GETFL)`: the file status flags; -1 and errno on failure.
func system_statusFlags(_ descriptor: Int32) -> Int32 { fcntl(descriptor, F_GETFL) }

/// `fcntl(F_SETFL)`: sets the file status flags (`O_NONBLOCK`, `O_APPEND`, …).
func system_setStatusFlags(_ descriptor: Int32, _ flags: Int32) { _ = fcntl(descriptor, F_SETFL, flags) }

/// `O_NONBLOCK`.
let system_nonBlocking = O_NONBLOCK

/// `O_ACCMODE`, `O_RDONLY` and `O_WRONLY`: the access mode within the status flags.
let system_accessMode = O_ACCMODE
let system_readOnly = O_RDONLY
let system_writeOnly = O_WRONLY

/// Whether `descriptor` was opened for reading only (`O_RDONLY`): nothing will be written to it.
func system_isReadOnly(_ descriptor: Int32) -> Bool { system_statusFlags(descriptor) & O_ACCMODE == O_RDONLY }

/// Whether `descriptor` was opened for writing only (`O_WRONLY`): nothing will be read from it.
func system_isWriteOnly(_ descriptor: Int32) -> Bool { system_statusFlags(descriptor) & O_ACCMODE == O_WRONLY }

/// Whether `descriptor` was opened for reading and writing (`O_RDWR`).
func system_isReadWrite(_ descriptor: Int32) -> Bool { system_statusFlags(descriptor) & O_ACCMODE == O_RDWR }

/// `readlink(2)`: the target of a symbolic link or a `/proc/self/fd` entry.
func system_readlink(_ path: String) -> String? {
  var buffer = [UInt8](repeating: 0, count: Int(PATH_MAX) + 1)
  let count = buffer.withUnsafeMutableBufferPointer { buffer in
    buffer.withMemoryRebound(to: CChar.self) { readlink(path, $0.baseAddress!, Int(PATH_MAX)) }
  }
  guard count >= 0 else { return nil }
  return String(decoding: buffer[0..<count], as: UTF8.self)
}

/// The first line of a small file such as a `/proc/sys` value ("?" when it cannot be read).
func system_firstLine(of path: String) -> String {
  let descriptor = system_open(path, O_RDONLY)
  guard descriptor >= 0 else { return "?" }
  defer { system_close(descriptor) }
  var bytes = [UInt8](repeating: 0, count: 64)
  let count = bytes.withUnsafeMutableBytes { read(descriptor, $0.baseAddress!, $0.count) }
  guard count > 0 else { return "?" }
  return String(decoding: bytes[0..<count].prefix { $0 != 10 }, as: UTF8.self)
}

/// `poll` on one descriptor for input, without a timeout; false when poll
/// failed with anything but `EINTR`.
func system_waitReadable(_ descriptor: Int32) -> Bool {
  var wait = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
  while poll(&wait, 1, -1) < 0 {
    if errno != EINTR { return false }
  }
  return true
}

/// Whether `descriptor` reports a hang-up and no room to write, now (`poll`, no wait): a
/// pseudo-terminal's master whose slave closed, once its buffers are full. Such a descriptor stays
/// so, and its write registration fires for the hang-up for as long as it is armed.
func system_hungUpWithoutRoom(_ descriptor: Int32) -> Bool {
  var state = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
  guard poll(&state, 1, 0) == 1 else { return false }
  return state.revents & Int16(POLLHUP) != 0 && state.revents & Int16(POLLOUT) == 0
}

// MARK: - Signals

/// Makes a write to a pipe or socket whose reader is gone fail with `EPIPE`
/// instead of killing the process, once per process: when `SIGPIPE` still
/// has its default disposition, installs a handler that does nothing
/// (`SA_RESTART`). A handler, unlike `SIG_IGN`, is reset to the default by
/// `exec`, so child processes start with the usual disposition; an ignored
/// or handled `SIGPIPE` (the program's own choice) is left alone.
func system_catchBrokenPipe() { _ = brokenPipeCaught }

private let brokenPipeCaught: Bool = {
  var current = sigaction()
  guard sigaction(SIGPIPE, nil, &current) == 0 else { return false }
  guard current.sa_flags & SA_SIGINFO == 0, current.__sigaction_handler.sa_handler == nil else { return false }
  var action = sigaction()
  action.__sigaction_handler.sa_handler = { _ in }
  action.sa_flags = SA_RESTART
  sigemptyset(&action.sa_mask)
  return sigaction(SIGPIPE, &action, nil) == 0
}()

// MARK: - Processes

/// `pidfd_open(pid, 0)` (through CGCD: a raw `syscall`, which Swift cannot
/// call): a close-on-exec descriptor that becomes readable when `pid` exits.
func system_pidfd_open(_ pid: Int32) -> Int32 { cgcd_pidfd_open(pid, 0) }

/// The process a pidfd refers to, from its `/proc/self/fdinfo` entry (`Pid:`; -1 once the process
/// has been reaped); nil when `descriptor` is open but not a pidfd, or not open (errno `EBADF`).
func system_pidfdProcess(_ descriptor: Int32) -> Int32? {
  guard system_isOpen(descriptor), case .success(let info) = system_readSmallFile("/proc/self/fdinfo/\(descriptor)")
  else { return nil }
  for line in info.split(separator: "\n") where line.hasPrefix("Pid:") {
    return Int32(line.dropFirst(4).filter { $0 != "\t" && $0 != " " })
  }
  return nil
}

// MARK: - inotify

/// `inotify_init1(IN_NONBLOCK | IN_CLOEXEC)`.
func system_inotify_init1() -> Int32 { inotify_init1(Int32(IN_NONBLOCK) | Int32(IN_CLOEXEC)) }

/// `inotify_add_watch(2)`.
func system_inotify_add_watch(_ instance: Int32, _ path: String, _ mask: UInt32) -> Int32 {
  inotify_add_watch(instance, path, mask)
}

/// `inotify_rm_watch(2)`.
func system_inotify_rm_watch(_ instance: Int32, _ watch: Int32) { _ = inotify_rm_watch(instance, watch) }

// MARK: - Pressure stall information (PSI)

/// `open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC)`: a pressure file opened to
/// hold a trigger; -1 and errno on failure.
func system_openPressureTrigger(_ path: String) -> Int32 { open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC) }

/// `write(2)` of `text` and a trailing NUL in one call (a PSI trigger is
/// parsed from one write); -1 and errno on failure.
func system_writeWithNul(_ descriptor: Int32, _ text: String) -> Int {
  var bytes = Array(text.utf8CString)
  return bytes.withUnsafeMutableBytes { write(descriptor, $0.baseAddress, $0.count) }
}

/// The contents of a small file read to its end (`/proc/self/cgroup`,
/// `/proc/self/mountinfo`, a pressure file), or the errno of the failure.
func system_readSmallFile(_ path: String) -> Result<String, GCDError> {
  let descriptor = open(path, O_RDONLY | O_CLOEXEC)
  guard descriptor >= 0 else { return .failure(GCDError(operation: "open(\"\(path)\")", errno: errno)) }
  defer { close(descriptor) }
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 4096)
  while true {
    let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
    if count < 0 && errno == EINTR { continue }
    if count < 0 { return .failure(GCDError(operation: "read(\"\(path)\")", errno: errno)) }
    if count == 0 { break }
    bytes += chunk[0..<count]
  }
  return .success(String(decoding: bytes, as: UTF8.self))
}

/// `access(path, F_OK) == 0`.
func system_exists(_ path: String) -> Bool { access(path, F_OK) == 0 }

/// `epoll_create1(EPOLL_CLOEXEC)`: an epoll descriptor of the package's own.
func system_epoll_create() -> Int32 { epoll_create1(Int32(EPOLL_CLOEXEC)) }

/// `epoll_ctl(EPOLL_CTL_ADD)` of `descriptor` for `events`, level-triggered; -1 and errno on
/// failure.
func system_epoll_add(_ epoll: Int32, _ descriptor: Int32, events: UInt32) -> Int32 {
  var event = epoll_event()
  event.events = events
  event.data.fd = descriptor
  return epoll_ctl(epoll, Int32(EPOLL_CTL_ADD), descriptor, &event)
}

/// `system_epoll_add` for `EPOLLPRI` only (what a PSI trigger reports; it is
/// always readable, so `EPOLLIN` would mean nothing).
func system_epoll_addPriority(_ epoll: Int32, _ descriptor: Int32) -> Int32 {
  system_epoll_add(epoll, descriptor, events: EPOLLPRI.rawValue)
}

/// `epoll_ctl(EPOLL_CTL_DEL)`; -1 and errno on failure (`EBADF` when `descriptor` is closed,
/// `ENOENT` when the open file it now names is not the one registered).
@discardableResult
func system_epoll_remove(_ epoll: Int32, _ descriptor: Int32) -> Int32 {
  var event = epoll_event()
  return epoll_ctl(epoll, Int32(EPOLL_CTL_DEL), descriptor, &event)
}

/// `epoll_ctl(EPOLL_CTL_ADD)` (or `EPOLL_CTL_MOD` when `modify`) of `descriptor` for `events`, with
/// `key` as the event's data; -1 and errno on failure (`EBADF`: not open; `EPERM`: epoll cannot
/// watch this kind of file; `ENOENT` for a modification: the open file `descriptor` names now is
/// not the one registered).
func system_epoll_control(_ epoll: Int32, modify: Bool, _ descriptor: Int32, events: UInt32, key: UInt64) -> Int32 {
  var event = epoll_event()
  event.events = events
  event.data.u64 = key
  return epoll_ctl(epoll, Int32(modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD), descriptor, &event)
}

/// `epoll_wait`'s records, for one reader at a time (allocated once, never freed: the descriptor
/// fence's, which lives as long as the process).
struct EpollRecords: @unchecked Sendable {
  let records: UnsafeMutablePointer<epoll_event>
  let capacity: Int

  init(capacity: Int) {
    records = .allocate(capacity: capacity)
    records.initialize(repeating: epoll_event(), count: capacity)
    self.capacity = capacity
  }

  /// `epoll_wait(epoll, records, capacity, timeout)` (milliseconds, -1 for none), again on
  /// `EINTR`: how many records are filled (0 when nothing is ready).
  func wait(_ epoll: Int32, timeout: Int32 = 0) -> Int {
    while true {
      let count = epoll_wait(epoll, records, Int32(capacity), timeout)
      if count < 0 && errno == EINTR { continue }
      return max(0, Int(count))
    }
  }

  /// The key (the event's data) of record `index`.
  func key(_ index: Int) -> UInt64 { records[index].data.u64 }
  /// The events of record `index`.
  func events(_ index: Int) -> UInt32 { records[index].events }
}

/// Starts a detached thread named `name` that runs `body`, with every signal blocked (so that it
/// never takes a signal another thread waits for, as libdispatch's own threads do not); 0, or
/// `pthread_create`'s error (`EAGAIN`).
func system_startThread(named name: String, _ body: @escaping @Sendable () -> Void) -> Int32 {
  final class Start {
    let body: @Sendable () -> Void
    init(body: @escaping @Sendable () -> Void) { self.body = body }
  }
  let start = Unmanaged.passRetained(Start(body: body)).toOpaque()
  var all = sigset_t()
  var previous = sigset_t()
  sigfillset(&all)
  pthread_sigmask(SIG_SETMASK, &all, &previous)
  defer { pthread_sigmask(SIG_SETMASK, &previous, nil) }
  var attributes = pthread_attr_t()
  pthread_attr_init(&attributes)
  defer { pthread_attr_destroy(&attributes) }
  pthread_attr_setdetachstate(&attributes, Int32(PTHREAD_CREATE_DETACHED))
  var thread = pthread_t()
  let error = pthread_create(
    &thread, &attributes,
    { context in
      Unmanaged<Start>.fromOpaque(context!).takeRetainedValue().body()
      return nil
    }, start)
  if error != 0 {
    Unmanaged<Start>.fromOpaque(start).release()
    return error
  }
  // Named here, not by the thread itself: the name is there once the caller returns.
  _ = cgcd_pthread_setname_np(thread, name)
  return 0
}

/// The epoll flags the descriptor fence uses.
let system_epollIn = EPOLLIN.rawValue
let system_epollOut = EPOLLOUT.rawValue
let system_epollReadHangUp = EPOLLRDHUP.rawValue
let system_epollOneShot = EPOLLONESHOT.rawValue
let system_epollEdge = EPOLLET.rawValue

/// What a read from a descriptor that returns fewer bytes than it asked for says of what is left.
enum ShortRead: UInt64 {
  /// It emptied the descriptor: a TCP socket, where the kernel copies what is queued, up to the
  /// count, and returns short only when nothing is left.
  case empties = 1
  /// Nothing: a datagram socket (a read takes one message), a Unix-domain stream socket (a read
  /// stops where the credentials or passed descriptors of the queued messages change), a terminal
  /// (a canonical-mode read takes a line).
  case saysNothing = 2
  /// Ask the queue (`FIONREAD`): a pipe or FIFO, which a short read empties unless the pipe is in
  /// packet mode (`O_DIRECT` on its write end, which the read end cannot see), where a read takes
  /// one packet (one write of at most 4,096 bytes) and more may be queued behind it.
  case asksQueue = 3
}

/// What a short read from `descriptor` says (`ShortRead`): `getsockopt(SO_PROTOCOL)`, then `fstat`.
func system_shortRead(_ descriptor: Int32) -> ShortRead {
  var protocolNumber: Int32 = 0
  var length = socklen_t(MemoryLayout<Int32>.size)
  if getsockopt(descriptor, SOL_SOCKET, SO_PROTOCOL, &protocolNumber, &length) == 0 {
    return protocolNumber == Int32(IPPROTO_TCP) ? .empties : .saysNothing
  }
  guard errno == ENOTSOCK, let status = system_fstat(descriptor), status.isFIFO else { return .saysNothing }
  return .asksQueue
}

/// `epoll_wait(epoll, …, 0)` until nothing is ready: the union of the events
/// reported (0 when none was, or when the outer poll already consumed it).
func system_epoll_drain(_ epoll: Int32) -> UInt32 {
  var reported: UInt32 = 0
  var events = [epoll_event](repeating: epoll_event(), count: 4)
  while true {
    let count = events.withUnsafeMutableBufferPointer { epoll_wait(epoll, $0.baseAddress, Int32($0.count), 0) }
    if count < 0 && errno == EINTR { continue }
    guard count > 0 else { return reported }
    for index in 0..<Int(count) { reported |= events[index].events }
    if count < events.count { return reported }
  }
}

/// `EPOLLPRI`, `EPOLLERR`, `EPOLLHUP`.
let system_epollPriority = EPOLLPRI.rawValue
let system_epollError = EPOLLERR.rawValue | EPOLLHUP.rawValue

// MARK: - Constants

/// The errno values the package names, with Swift names (swift-system's).
enum Errno {
  /// `EPERM`
  static let notPermitted = EPERM
  /// `ENOENT`
  static let noSuchFileOrDirectory = ENOENT
  /// `ESRCH`
  static let noSuchProcess = ESRCH
  /// `EINTR`
  static let interrupted = EINTR
  /// The descriptor has nothing to give, or no room, now (non-blocking).
  static let wouldBlock = EAGAIN
  /// `EBADF`
  static let badFileDescriptor = EBADF
  /// `EIO`
  static let inputOutput = EIO
  /// `ENOMEM`
  static let noMemory = ENOMEM
  /// `EACCES`
  static let permissionDenied = EACCES
  /// `EISDIR`
  static let isDirectory = EISDIR
  /// `EINVAL`
  static let invalidArgument = EINVAL
  /// `ENFILE`
  static let tooManyOpenFilesInSystem = ENFILE
  /// `EMFILE`
  static let tooManyOpenFiles = EMFILE
  /// `ENOSPC`
  static let noSpace = ENOSPC
  /// `ENOSYS`
  static let noFunction = ENOSYS
  /// `ENOTSUP`
  static let notSupported = ENOTSUP
  /// `ECANCELED`
  static let canceled = ECANCELED
  /// `EBUSY`
  static let busy = EBUSY
  /// `ESPIPE`
  static let illegalSeek = ESPIPE

  /// The C names of the values above, for messages ("ESRCH").
  static let names: [Int32: String] = [
    EPERM: "EPERM", ENOENT: "ENOENT", ESRCH: "ESRCH", EINTR: "EINTR", EBADF: "EBADF", EAGAIN: "EAGAIN",
    ENOMEM: "ENOMEM", EACCES: "EACCES", EISDIR: "EISDIR", EINVAL: "EINVAL", ENFILE: "ENFILE", EMFILE: "EMFILE",
    ENOSPC: "ENOSPC", EPIPE: "EPIPE", ERANGE: "ERANGE", ENOSYS: "ENOSYS", ENOTSUP: "ENOTSUP", ENOTDIR: "ENOTDIR",
    ECANCELED: "ECANCELED", EBUSY: "EBUSY", ESPIPE: "ESPIPE", ECONNRESET: "ECONNRESET",
  ]
}

/// The first real-time signal (`SIGRTMIN`), read at run time as the C
/// library's macro does: the numbers from 32 up to it are the library's own
/// (glibc: SIGCANCEL 32, SIGSETXID 33).
func system_sigrtmin() -> Int32 { __libc_current_sigrtmin() }

/// The signals a `SignalSource` cannot observe, by number, with their C
/// names and why (the C library's own, from 32 to `SIGRTMIN`, beside these).
let unobservableSignals: [(number: Int32, name: String, reason: String)] = [
  (SIGKILL, "SIGKILL", "cannot be caught or observed"),
  (SIGSTOP, "SIGSTOP", "cannot be caught or observed"),
  (SIGSEGV, "SIGSEGV", "means the process is broken; it cannot be observed from a queue"),
  (SIGBUS, "SIGBUS", "means the process is broken; it cannot be observed from a queue"),
  (SIGILL, "SIGILL", "means the process is broken; it cannot be observed from a queue"),
  (SIGFPE, "SIGFPE", "means the process is broken; it cannot be observed from a queue"),
  // libdispatch blocks every signal on its threads but these and the four above (its
  // `_dispatch_sigmask`), and its handler re-raises a signal at its manager thread to reach the
  // signalfd: one of these is delivered to the handler again, forever. Measured: the event is
  // lost and the manager thread spins at 100% CPU.
  (SIGTRAP, "SIGTRAP", unmaskedReason),
  (SIGSYS, "SIGSYS", unmaskedReason),
  (SIGPIPE, "SIGPIPE", unmaskedReason),
  (SIGPROF, "SIGPROF", unmaskedReason),
]

/// Why the signals libdispatch leaves unblocked on its threads cannot be observed.
private let unmaskedReason =
  "is one libdispatch never blocks on its threads: its handler would re-raise it on the manager thread forever (never reaching the signalfd); ignore it with signal(_, SIG_IGN) instead"

// MARK: - Memory

/// `malloc(size)`; stops the process when memory is exhausted.
@inlinable
func system_malloc(_ size: Int) -> UnsafeMutableRawPointer {
  guard let memory = malloc(size) else { fatalError("GCD: out of memory (malloc of \(size) bytes)") }
  return memory
}

/// `free(memory)`.
@inlinable
func system_free(_ memory: UnsafeMutableRawPointer) { free(memory) }

/// `memcmp(first, second, count) == 0`.
@inlinable
func system_memequal(_ first: UnsafeRawPointer, _ second: UnsafeRawPointer, _ count: Int) -> Bool {
  memcmp(first, second, count) == 0
}

// MARK: - What a descriptor source reports

/// The bytes `descriptor` has queued to read (`SIOCINQ`, as `FIONREAD`), or still to send
/// (`SIOCOUTQ`) when `output`: what libdispatch reports as a read or write source's data; nil and
/// errno when the request fails (`ENOTTY` or `EINVAL`: the descriptor does not support it).
func system_queuedBytes(_ descriptor: Int32, output: Bool) -> Int? {
  var bytes: Int32 = 0
  guard cgcd_queued_bytes(descriptor, output ? 1 : 0, &bytes) == 0 else { return nil }
  return Int(bytes)
}
