import Synchronization

// The few system calls the sequences make themselves, as the peer of a descriptor or to look at
// one: no library code is involved, so both runs of a sequence see the kernel the same way.
#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `pipe2(2)`: not in Swift's Glibc module.
@_silgen_name("pipe2")
private func systemPipe2(_ fds: UnsafeMutablePointer<Int32>, _ flags: Int32) -> Int32

/// A counter for the names of the FIFOs the sequences make.
private let fifoCounter = Mutex(0)

enum Posix {
  /// `O_DIRECT` (packet mode for a pipe): not in Swift's Glibc module either.
  #if arch(x86_64) || arch(i386)
    static let packetMode: Int32 = 0o40000
  #else
    static let packetMode: Int32 = 0o200000
  #endif

  /// A packet-mode pipe (`pipe2(O_DIRECT | O_CLOEXEC)`), blocking: (read end, write end). Each
  /// write of up to 4,096 bytes is one packet (a longer one several); a read takes one packet.
  static func packetPipePair() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(systemPipe2(&fds, packetMode | O_CLOEXEC) == 0, "pipe2(O_DIRECT): errno \(errno)")
    return (fds[0], fds[1])
  }

  /// A new FIFO's path (under /tmp, unique to this process), made with `mkfifo`.
  static func makeFIFO() -> String {
    let number = fifoCounter.withLock {
      $0 += 1
      return $0
    }
    let path = "/tmp/gcd-differential-\(getpid())-\(number).fifo"
    unlink(path)
    precondition(mkfifo(path, 0o600) == 0, "mkfifo: errno \(errno)")
    return path
  }

  /// Opens a FIFO's read end (non-blocking, so the open does not wait for a writer) or a writer
  /// (non-blocking: a reader is open), close-on-exec.
  static func openFIFO(_ path: String, reading: Bool) -> Int32 {
    let fd = open(path, (reading ? O_RDONLY : O_WRONLY) | O_NONBLOCK | O_CLOEXEC)
    precondition(fd >= 0, "open(FIFO): errno \(errno)")
    return fd
  }

  /// A connected AF_UNIX stream pair, close-on-exec, blocking.
  static func socketPair() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    let made = socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds)
    precondition(made == 0, "socketpair: errno \(errno)")
    return (fds[0], fds[1])
  }

  /// A pipe, close-on-exec, blocking: (read end, write end).
  static func pipePair() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0, "pipe: errno \(errno)")
    for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
    return (fds[0], fds[1])
  }

  /// A pseudo-terminal, close-on-exec, blocking: (master, slave), the slave in raw mode
  /// (`cfmakeraw`: no echo, no line editing, no signals, bytes passed unchanged both ways).
  static func ptyPair() -> (Int32, Int32) {
    // grantpt, unlockpt and ptsname are not in Swift's Glibc module: their Linux ioctls instead
    // (TIOCSPTLCK, `_IOW('T', 0x31, int)`; TIOCGPTPEER, `_IO('T', 0x41)`, Linux 4.13).
    let master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC)
    precondition(master >= 0, "open(/dev/ptmx): errno \(errno)")
    var unlock: Int32 = 0
    precondition(ioctl(master, UInt(0x4004_5431), &unlock) == 0, "ioctl(TIOCSPTLCK): errno \(errno)")
    let slave = ioctl(master, UInt(0x5441), O_RDWR | O_NOCTTY | O_CLOEXEC)
    precondition(slave >= 0, "ioctl(TIOCGPTPEER): errno \(errno)")
    var mode = termios()
    precondition(tcgetattr(slave, &mode) == 0, "tcgetattr: errno \(errno)")
    cfmakeraw(&mode)
    precondition(tcsetattr(slave, TCSANOW, &mode) == 0, "tcsetattr: errno \(errno)")
    return (master, slave)
  }

  /// Takes the signals of `signals` pending for the process or this thread (`sigtimedwait`, with
  /// them blocked in this thread meanwhile) and returns them. With `quiet`, it goes on until no
  /// signal has come for that long: one still on its way (a handler that is about to send it to the
  /// process again) is taken too.
  static func drainPendingSignals(_ signals: [Int32], quiet: Duration = .zero) -> [Int32] {
    var set = sigset_t()
    sigemptyset(&set)
    for signal in signals { sigaddset(&set, signal) }
    var old = sigset_t()
    pthread_sigmask(SIG_BLOCK, &set, &old)
    defer { pthread_sigmask(SIG_SETMASK, &old, nil) }
    var taken: [Int32] = []
    let (seconds, attoseconds) = quiet.components
    var wait = timespec(tv_sec: Int(seconds), tv_nsec: Int(attoseconds / 1_000_000_000))
    while true {
      let signal = sigtimedwait(&set, nil, &wait)
      if signal <= 0 { break }
      taken.append(signal)
    }
    return taken
  }

  static func statusFlags(_ fd: Int32) -> Int32 { fcntl(fd, F_GETFL) }

  static func setNonBlocking(_ fd: Int32) { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }

  static func isNonBlocking(_ fd: Int32) -> Bool { fcntl(fd, F_GETFL) & O_NONBLOCK != 0 }

  /// The kernel object behind `fd` (device and inode), or nil when the number is not open: a socket's
  /// or a pipe's inode is unique while it lives, so a number reused by another file reads different.
  static func identity(_ fd: Int32) -> [UInt64]? {
    var status = stat()
    guard fstat(fd, &status) == 0 else { return nil }
    return [UInt64(status.st_dev), UInt64(status.st_ino)]
  }

  /// Bytes queued to read on `fd` (FIONREAD), 0 on an error.
  static func bytesQueued(_ fd: Int32) -> Int {
    var count: Int32 = 0
    return ioctl(fd, UInt(FIONREAD), &count) == 0 ? Int(count) : 0
  }

  /// Whether `fd` is writable now (poll, no wait).
  static func isWritable(_ fd: Int32) -> Bool {
    var entry = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
    return poll(&entry, 1, 0) == 1 && entry.revents & Int16(POLLOUT) != 0
  }

  /// Whether `fd` has something to read or an end to report now (poll, up to `milliseconds`).
  static func isReadable(_ fd: Int32, milliseconds: Int32 = 0) -> Bool {
    var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    return poll(&entry, 1, milliseconds) == 1
  }

  /// Writes `count` bytes of the pattern that continues `offset` (byte i is i % 251), as much as
  /// the descriptor takes without blocking when it is non-blocking; returns what was written or
  /// -errno.
  static func writePattern(_ fd: Int32, offset: Int, count: Int) -> Int {
    let bytes = (0..<count).map { UInt8((offset + $0) % 251) }
    var done = 0
    while done < count {
      let wrote = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + done, count - done) }
      if wrote < 0 {
        if errno == EINTR { continue }
        return done > 0 ? done : -Int(errno)
      }
      done += wrote
    }
    return done
  }

  /// Reads what `fd` has now (it must be non-blocking): (bytes, end of file seen, errno or 0).
  static func drain(_ fd: Int32) -> (bytes: [UInt8], end: Bool, error: Int32) {
    var result: [UInt8] = []
    var buffer = [UInt8](repeating: 0, count: 65536)
    while true {
      let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress!, $0.count) }
      if got > 0 {
        result += buffer[0..<got]
        continue
      }
      if got == 0 { return (result, true, 0) }
      if errno == EINTR { continue }
      return (result, false, errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno)
    }
  }

  /// A descriptor number that is not open now (searched upwards from 900; the suites of this
  /// process do not hold that many).
  static func closedNumber() -> Int32 {
    var candidate: Int32 = 900
    while fcntl(candidate, F_GETFD) >= 0 { candidate += 1 }
    return candidate
  }

  /// Writes `text` to standard error (no Foundation here, and `stderr` is a C global).
  static func printError(_ text: String) {
    var bytes = Array(text.utf8)
    var done = 0
    while done < bytes.count {
      let wrote = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress! + done, $0.count - done) }
      if wrote <= 0 { return }
      done += wrote
    }
  }

  /// SIGPIPE caught by a handler that does nothing, so that a write whose reader is gone fails
  /// with EPIPE in the `import Dispatch` runs too. A handler, not SIG_IGN: exec resets a handler,
  /// so the other suites' child processes still start with the default disposition.
  static let brokenPipeCaught: Void = {
    var action = sigaction()
    sigemptyset(&action.sa_mask)
    action.sa_flags = SA_RESTART
    action.__sigaction_handler.sa_handler = { _ in }
    var previous = sigaction()
    _ = sigaction(SIGPIPE, nil, &previous)
    if previous.__sigaction_handler.sa_handler == nil {  // SIG_DFL
      _ = sigaction(SIGPIPE, &action, nil)
    }
  }()
}
