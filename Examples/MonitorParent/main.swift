// Reproduces `MonitorParentProcess()` ("Monitoring a Process"): a PROC source on `getppid()` with
// `DISPATCH_PROC_EXIT` on the default global queue; its handler sets an exit flag (`MySetAppExitFlag`),
// then cancels and releases the source, which owns itself.
//
// On Linux: libdispatch has no process source; `ProcSource` opens the parent with pidfd_open(2) and
// watches that descriptor with a read source, delivering `.exit` once. To show a parent exiting, the
// example runs as three processes: this one starts an intermediate "parent", which starts the watching
// child and exits as soon as the child watches it; the child reports through a pipe what it saw.
//
// Usage: ExampleMonitorParent   (the arguments `intermediate` and `watcher` are for its own children)

import GCD
import Glibc
import Synchronization

/// The descriptor on which the intermediate and the watcher report to the top-level process.
let reportDescriptor: Int32 = 3
/// The descriptor on which the watcher tells the intermediate that it watches it.
let readyDescriptor: Int32 = 4

/// Writes one line to `descriptor` (one `write`: lines from two processes never interleave).
func send(_ line: String, to descriptor: Int32 = reportDescriptor) {
  let bytes = Array((line + "\n").utf8)
  _ = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
}

/// Starts this executable again with `argument`, mapping `descriptors` (child fd: our fd) into it.
func spawnSelf(_ argument: String, descriptors: [(Int32, Int32)]) -> pid_t {
  var actions = posix_spawn_file_actions_t()
  posix_spawn_file_actions_init(&actions)
  defer { posix_spawn_file_actions_destroy(&actions) }
  for (target, source) in descriptors {
    posix_spawn_file_actions_adddup2(&actions, source, target)
  }
  let path = "/proc/self/exe"
  let argv = [strdup(path), strdup(argument), nil]
  defer { argv.forEach { free($0) } }
  var pid: pid_t = 0
  let status = posix_spawn(&pid, path, &actions, nil, argv, environ)
  guard status == 0 else {
    print("posix_spawn failed: \(String(cString: strerror(status)))")
    exit(1)
  }
  return pid
}

/// A pipe whose ends are close-on-exec (a child gets an end only through a dup2 in `spawnSelf`).
func makePipe() -> (read: Int32, write: Int32) {
  var ends: [Int32] = [-1, -1]
  guard pipe(&ends) == 0 else {
    print("pipe failed")
    exit(1)
  }
  for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
  return (ends[0], ends[1])
}

/// Reads lines from `descriptor` until end of file or `timeout`.
func readLines(_ descriptor: Int32, timeout: Duration) -> [String] {
  let deadline = ContinuousClock.now + timeout
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 1024)
  while ContinuousClock.now < deadline {
    var poller = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
    if poll(&poller, 1, 100) <= 0 { continue }
    let count = read(descriptor, &chunk, chunk.count)
    if count < 0 && errno == EINTR { continue }
    if count <= 0 { break }
    bytes += chunk[0..<count]
  }
  return String(decoding: bytes, as: UTF8.self).split(separator: "\n").map(String.init)
}

// MARK: - The watcher: the listing

let exitFlag = Atomic<Bool>(false)
let exitFlagSet = try! Semaphore(value: 0)

/// Holds the source weakly, to show that it released itself.
final class WeakSource: @unchecked Sendable {
  private let lock = Mutex<Void>(())
  private weak var _source: ProcSource?
  var source: ProcSource? {
    get { lock.withLock { _ in _source } }
    set { lock.withLock { _ in _source = newValue } }
  }
}
let observed = WeakSource()

/// `MySetAppExitFlag`: tells the program it should exit.
func mySetAppExitFlag() {
  exitFlag.store(true, ordering: .releasing)
  exitFlagSet.signal()
}

/// `MonitorParentProcess()`: a process source on the parent that owns itself.
func monitorParentProcess() {
  let parentPID = getppid()

  let queue = Queue.global(.default)
  let source: ProcSource
  do {
    source = try ProcSource(pid: parentPID, events: .exit, queue: queue)
  } catch {
    send("watcher \(getpid()): \(error)")
    exit(1)
  }
  // The handler's capture is the source's only reference (the source owns itself): `cancel()` ends
  // it, and libdispatch then lets go of the handler and with it the source (dispatch_release).
  source.setEventHandler {
    send(
      "watcher \(getpid()): event \(ProcEvents(rawValue: source.data)) from parent \(source.pid)")
    mySetAppExitFlag()
    source.cancel()
  }
  source.resume()
  observed.source = source
}

func runWatcher() -> Never {
  let parent = getppid()
  monitorParentProcess()
  send("watcher \(getpid()): watching parent \(parent) with ProcSource(pid: getppid(), events: .exit)")
  send("ready", to: readyDescriptor)
  close(readyDescriptor)

  guard exitFlagSet.wait(timeout: .seconds(10)) else {
    send("watcher \(getpid()): parent \(parent) did not exit in time")
    exit(1)
  }
  send("watcher \(getpid()): exit flag set: \(exitFlag.load(ordering: .acquiring)); now parent is \(getppid())")
  // The source cancelled itself; once its cancel completes, it is gone.
  let deadline = ContinuousClock.now + .seconds(5)
  while observed.source != nil && ContinuousClock.now < deadline { usleep(1000) }
  send("watcher \(getpid()): source released itself: \(observed.source == nil)")
  close(reportDescriptor)
  exit(0)
}

// MARK: - The intermediate parent

func runIntermediate() -> Never {
  let ready = makePipe()
  let watcher = spawnSelf(
    "watcher", descriptors: [(reportDescriptor, reportDescriptor), (readyDescriptor, ready.write)])
  close(ready.write)
  send("intermediate \(getpid()): started watcher \(watcher)")
  // Exit only once the watcher watches this process.
  guard readLines(ready.read, timeout: .seconds(10)).contains("ready") else {
    send("intermediate \(getpid()): the watcher did not start")
    exit(1)
  }
  send("intermediate \(getpid()): exiting now")
  exit(0)
}

// MARK: - The top level

func runTopLevel() -> Never {
  print("top level \(getpid()): starting an intermediate parent that starts a watcher, then exits")
  let report = makePipe()
  let intermediate = spawnSelf("intermediate", descriptors: [(reportDescriptor, report.write)])
  close(report.write)

  let lines = readLines(report.read, timeout: .seconds(10))
  for line in lines { print(line) }

  var status: Int32 = 0
  _ = waitpid(intermediate, &status, 0)
  // The watcher was re-parented (to init or the nearest subreaper), which reaps it; it has closed
  // the pipe, so it is exiting.

  let sawExit = lines.contains { $0.contains("event [.exit] from parent \(intermediate)") }
  let released = lines.contains { $0.hasSuffix("source released itself: true") }
  print("watcher saw its parent exit: \(sawExit)")
  print("self-owned source released after cancel: \(released)")
  exit(sawExit && released ? 0 : 1)
}

switch CommandLine.arguments.dropFirst().first {
case "watcher": runWatcher()
case "intermediate": runIntermediate()
default: runTopLevel()
}
