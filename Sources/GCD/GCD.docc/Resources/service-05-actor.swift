// A Linux service with GCD, step 5: the service's counters live in an actor that runs on the
// service's own queue, so the handlers (already on that queue) use it without a hop or an await.
import GCD
import Glibc
import Synchronization

let work = SerialQueue(label: "com.example.service")

/// The service's counters: an actor whose executor is `work`. Code already running on `work` (every
/// handler below) enters it synchronously with `assumeIsolated`; other code awaits it as usual.
actor Stats {
  nonisolated let queue: SerialQueue
  var ticks = 0
  var restarts = 0

  init(queue: SerialQueue) { self.queue = queue }

  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }

  func tick() { ticks += 1 }
  func workerExited() { restarts += 1 }
  var summary: String { "\(ticks) ticks, \(restarts) worker exits" }
}

let stats = Stats(queue: work)
let running = Group()
let configPath = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "/tmp/service.conf"

/// The file's contents, or nil when it cannot be read.
func readConfig(_ path: String) -> String? {
  let fd = open(path, O_RDONLY | O_CLOEXEC)
  guard fd >= 0 else { return nil }
  defer { close(fd) }
  var bytes: [UInt8] = []
  var buffer = [UInt8](repeating: 0, count: 4096)
  while case let count = read(fd, &buffer, buffer.count), count > 0 { bytes += buffer[..<count] }
  while bytes.last == UInt8(ascii: "\n") { bytes.removeLast() }
  return String(decoding: bytes, as: UTF8.self)
}

print("service: config \(readConfig(configPath) ?? "(none)")")

let heartbeat = TimerSource(queue: work)
heartbeat.schedule(start: .now, interval: .seconds(1), leeway: .milliseconds(100))
heartbeat.setEventHandler {
  stats.assumeIsolated { $0.tick() }  // the handler runs on `work`, the actor's executor
  print("service: tick")
}
running.enter()
heartbeat.setCancelHandler {
  print("service: timer stopped")
  running.leave()
}
heartbeat.resume()

// On Linux a file-system source is an inotify watch; creating it throws if the file is missing.
let config = try FileSystemSource(path: configPath, events: [.write, .rename, .delete], queue: work)
config.setEventHandler { [weak config] in
  guard let events = config?.firedEvents else { return }
  if events.contains(.write) {
    print("service: config reloaded: \(readConfig(configPath) ?? "(unreadable)")")
  } else {
    print("service: config file moved or deleted; keeping the last settings")
  }
}
running.enter()
config.setCancelHandler { running.leave() }
config.resume()

/// Starts `/bin/sleep 3` (the worker) and returns its pid, or nil.
///
/// The child gets an empty signal mask and SIGTERM's default action: a child inherits the mask,
/// and libdispatch blocks every signal a source watches, so without this the worker would ignore
/// the SIGTERM that stops it.
func startWorker() -> pid_t? {
  var attributes = posix_spawnattr_t()
  posix_spawnattr_init(&attributes)
  defer { posix_spawnattr_destroy(&attributes) }
  var none = sigset_t()
  sigemptyset(&none)
  var terminate = sigset_t()
  sigemptyset(&terminate)
  sigaddset(&terminate, SIGTERM)
  posix_spawnattr_setsigmask(&attributes, &none)
  posix_spawnattr_setsigdefault(&attributes, &terminate)
  posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))

  var pid: pid_t = 0
  let arguments: [UnsafeMutablePointer<CChar>?] = [strdup("/bin/sleep"), strdup("3"), nil]
  defer { arguments.forEach { free($0) } }
  return posix_spawn(&pid, "/bin/sleep", nil, &attributes, arguments, environ) == 0 ? pid : nil
}

/// Watches the worker; when it exits, reaps it and starts the next one a second later.
final class Supervisor: Sendable {
  let queue: Queue
  let stopping = Atomic<Bool>(false)
  /// The source that watches the current worker (touched only on `queue`).
  let watch = Mutex<ProcSource?>(nil)

  init(queue: Queue) { self.queue = queue }

  func start() {
    guard !stopping.load(ordering: .relaxed), let pid = startWorker() else { return }
    print("supervisor: worker \(pid) started")
    // A pidfd: the source fires once, when this very process exits (its pid cannot be reused).
    guard let source = try? ProcSource(pid: pid, events: .exit, queue: queue) else { return }
    source.setEventHandler { [weak self] in
      var status: Int32 = 0
      waitpid(pid, &status, 0)
      print("supervisor: worker \(pid) exited")
      stats.assumeIsolated { $0.workerExited() }
      guard let self else { return }
      self.queue.after(.seconds(1)) { [weak self] in self?.start() }
    }
    source.resume()
    watch.withLock { $0 = source }  // dropping the previous source cancels it
  }

  func stop() {
    stopping.store(true, ordering: .relaxed)
    watch.withLock { source in
      if let pid = source.map({ pid_t($0.handle) }) { kill(pid, SIGTERM) }
      source = nil
    }
  }
}

let supervisor = Supervisor(queue: work)
work.async { supervisor.start() }

signal(SIGTERM, SIG_IGN)
let terminate = try SignalSource(signal: SIGTERM, queue: work)
terminate.setEventHandler {
  print("service: SIGTERM, shutting down after \(stats.assumeIsolated { $0.summary })")
  heartbeat.cancel()
  config.cancel()
  supervisor.stop()
  terminate.cancel()
}
running.enter()
terminate.setCancelHandler { running.leave() }
terminate.resume()

running.notify(on: .main) {
  print("service: stopped")
  exit(0)
}
dispatchMain()
