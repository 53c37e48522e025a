import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Starts `path` with `arguments`; standard input from `stdin` and standard
/// output to `stdout` if given, otherwise /dev/null, like standard error.
func spawnProcess(
  _ path: String, _ arguments: [String] = [], stdin: Int32? = nil, stdout: Int32? = nil,
  environment: [String] = []
) throws -> pid_t {
  var actions = posix_spawn_file_actions_t()
  posix_spawn_file_actions_init(&actions)
  defer { posix_spawn_file_actions_destroy(&actions) }
  // The child starts with no blocked signals and default dispositions,
  // whatever the test runner's threads block or ignore.
  var attributes = posix_spawnattr_t()
  posix_spawnattr_init(&attributes)
  defer { posix_spawnattr_destroy(&attributes) }
  var signals = sigset_t()
  sigemptyset(&signals)
  posix_spawnattr_setsigmask(&attributes, &signals)
  sigaddset(&signals, SIGTERM)
  sigaddset(&signals, SIGINT)
  sigaddset(&signals, SIGHUP)
  sigaddset(&signals, SIGPIPE)
  posix_spawnattr_setsigdefault(&attributes, &signals)
  posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
  if let stdin {
    posix_spawn_file_actions_adddup2(&actions, stdin, STDIN_FILENO)
  } else {
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0)
  }
  if let stdout {
    posix_spawn_file_actions_adddup2(&actions, stdout, STDOUT_FILENO)
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0)
  }
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0)
  let argv = ([path] + arguments).map { strdup($0) } + [nil]
  defer { argv.forEach { free($0) } }
  // The test process's environment, then `environment`'s additions ("NAME=value").
  var inherited: [UnsafeMutablePointer<CChar>?] = []
  var entry = environ
  while let variable = entry.pointee {
    inherited.append(variable)
    entry += 1
  }
  let added = environment.map { strdup($0) }
  defer { added.forEach { free($0) } }
  var envp = inherited + added + [nil]
  var pid: pid_t = 0
  let status = posix_spawn(&pid, path, &actions, &attributes, argv, &envp)
  guard status == 0 else { throw GCDError(operation: "posix_spawn(\(path))", errno: status) }
  return pid
}

/// Reaps `pid`; returns its raw wait status (-1 if it was not ours to reap).
@discardableResult
func reapProcess(_ pid: pid_t) -> Int32 {
  var status: Int32 = 0
  while waitpid(pid, &status, 0) < 0 {
    if errno != EINTR { return -1 }
  }
  return status
}

/// Waits until `pid` (a child) has exited, without reaping it: it stays a
/// zombie, observable by a `ProcSource`, until `reapProcess`.
func waitForExitWithoutReaping(_ pid: pid_t) -> Bool {
  var info = siginfo_t()
  while waitid(P_PID, id_t(pid), &info, WEXITED | WNOWAIT) != 0 {
    if errno != EINTR { return false }
  }
  return true
}

/// Reads `descriptor` to its end (blocking I/O).
func readToEnd(_ descriptor: Int32) -> String {
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 256)
  while true {
    let count = read(descriptor, &chunk, chunk.count)
    if count < 0 && errno == EINTR { continue }
    if count <= 0 { break }
    bytes += chunk[0..<count]
  }
  return String(decoding: bytes, as: UTF8.self)
}

/// In an exit test's child: keeps the children it starts from inheriting
/// the exit test's pipes (the parent would wait for them to close).
func markEveryDescriptorCloseOnExec() {
  for descriptor in openDescriptorTargets().keys where descriptor > 2 {
    _ = fcntl(descriptor, F_SETFD, fcntl(descriptor, F_GETFD) | FD_CLOEXEC)
  }
}

/// In an exit test's child: kills `pid` when the child exits, on every path
/// (`endChild` and `childCheck` end it with `exit`, which skips `defer`). A
/// process left running would hold the exit test's pipes, if it inherited
/// them, and keep the parent waiting.
func killAtExit(_ pid: pid_t) {
  processesToKill.withLock { $0.append(pid) }
  _ = registerKillAtExit
}

private let processesToKill = Mutex<[pid_t]>([])
private let registerKillAtExit: Void = {
  atexit {
    for pid in processesToKill.withLock({ $0 }) { kill(pid, SIGKILL) }
  }
}()
