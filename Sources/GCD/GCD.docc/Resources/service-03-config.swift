// A Linux service with GCD, step 3: the service reads its configuration file, and reads it again
// whenever the file is written.
import GCD
import Glibc

let work = Queue(label: "com.example.service")
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

signal(SIGTERM, SIG_IGN)
let terminate = try SignalSource(signal: SIGTERM, queue: work)
terminate.setEventHandler {
  print("service: SIGTERM, shutting down")
  heartbeat.cancel()
  config.cancel()
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
