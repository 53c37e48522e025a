// A line-oriented TCP echo server on 127.0.0.1 whose connections are
// IOChannels, with graceful shutdown.
//
// The server listens on an ephemeral port of 127.0.0.1 (loopback only) and
// accepts with a ReadSource on the listening socket. Each connection is a
// stream channel served by a task: it reads what arrives, and writes back
// every complete line ("\n"-terminated) as soon as it has it. When the peer
// closes its side, the task writes back what is left and closes the channel.
//
// Graceful shutdown — on SIGINT/SIGTERM, or here once the built-in clients
// are done — stops accepting (the accept source is cancelled and closes the
// listening socket), lets every open connection finish, and exits when the
// last channel's cleanup has run. The program is bounded: it runs `clients`
// clients (plain blocking sockets on their own threads) that each send
// `lines` lines, check every echo, and hang up; then it shuts down by itself.
//
// Usage: ExampleEchoServer [clients, default 4] [lines per client, default 200]

import GCD
import Glibc
import Synchronization

/// Writes a line to standard output or error at once (one unbuffered `write`, safe from any thread).
func say(_ text: String, to descriptor: Int32 = STDOUT_FILENO) {
  var bytes = Array("\(text)\n".utf8)
  _ = bytes.withUnsafeMutableBytes { write(descriptor, $0.baseAddress, $0.count) }
}

let arguments = CommandLine.arguments
let clientCount = arguments.count > 1 ? Int(arguments[1]) ?? 4 : 4
let linesPerClient = arguments.count > 2 ? Int(arguments[2]) ?? 200 : 200

// MARK: - The server

/// Counts what the server did and tells `main` when the last connection is gone.
final class ServerState: Sendable {
  struct Counts {
    var open = 0
    var served = 0
    var lines = 0
    var shuttingDown = false
    var drained: CheckedContinuation<Void, Never>?
  }
  let counts = Mutex(Counts())

  func opened() { counts.withLock { $0.open += 1 } }

  func echoed(lines: Int) { counts.withLock { $0.lines += lines } }

  /// A connection's cleanup ran: its descriptor is closed.
  func closed() {
    let waiter = counts.withLock { counts -> CheckedContinuation<Void, Never>? in
      counts.open -= 1
      counts.served += 1
      guard counts.shuttingDown && counts.open == 0 else { return nil }
      defer { counts.drained = nil }
      return counts.drained
    }
    waiter?.resume()
  }

  /// Waits until shutdown has begun and no connection is open.
  func drain() async {
    await withCheckedContinuation { continuation in
      let done = counts.withLock { counts -> Bool in
        counts.shuttingDown = true
        if counts.open > 0 { counts.drained = continuation }
        return counts.open == 0
      }
      if done { continuation.resume() }
    }
  }
}

let newline = UInt8(ascii: "\n")

/// Serves one connection: echoes each complete line as soon as it has arrived.
func serve(_ channel: IOChannel, _ state: ServerState) async {
  var partial = DispatchBuffer()
  do {
    while true {
      let chunk = try await channel.read(upTo: 16 * 1024)
      if chunk.isEmpty { break }  // the peer closed its side
      partial.append(chunk)
      guard let last = partial.lastIndex(of: newline) else { continue }
      let lines = partial.extracting(0..<last + 1)
      partial = partial.extracting(last + 1..<partial.count)
      try await channel.write(lines)
      state.echoed(lines: lines.reduce(0) { $1 == newline ? $0 + 1 : $0 })
    }
    if !partial.isEmpty { try await channel.write(partial) }
  } catch {
    say("ExampleEchoServer: connection: \(error)", to: STDERR_FILENO)
  }
  channel.close()
}

/// Binds a listening TCP socket to 127.0.0.1 on an ephemeral port; returns it and the port.
func listenOnLoopback() -> (socket: Int32, port: UInt16) {
  let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  precondition(listener >= 0, "socket: errno \(errno)")
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_addr.s_addr = inet_addr("127.0.0.1")
  var length = socklen_t(MemoryLayout<sockaddr_in>.size)
  withUnsafeMutablePointer(to: &address) { pointer in
    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { generic in
      precondition(bind(listener, generic, length) == 0, "bind: errno \(errno)")
      precondition(getsockname(listener, generic, &length) == 0, "getsockname: errno \(errno)")
    }
  }
  precondition(listen(listener, 64) == 0, "listen: errno \(errno)")
  _ = fcntl(listener, F_SETFL, O_NONBLOCK)
  return (listener, UInt16(bigEndian: address.sin_port))
}

let state = ServerState()
let queue = Queue(label: "echo-server")
let (listener, port) = listenOnLoopback()
let acceptor = try ReadSource(fileDescriptor: listener, queue: queue)
acceptor.setEventHandler {
  while true {
    let connection = accept(listener, nil, nil)
    if connection < 0 { break }  // EAGAIN: no more pending connections
    _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
    state.opened()
    let channel = IOChannel(fileDescriptor: connection, type: .stream, queue: queue) { descriptor in
      close(descriptor)
      state.closed()
    }
    Task { await serve(channel, state) }
  }
}
acceptor.setCancelHandler { close(listener) }
acceptor.resume()
/// Announces the address (a function, so that no temporary of the top-level code's async frame outlives the
/// program: LeakSanitizer reports those).
func announceListening() { say("ExampleEchoServer: listening on 127.0.0.1:\(port)") }
announceListening()

// MARK: - Shutdown on a signal

/// Resumes the waiting `main` once `count` arrivals have happened (later arrivals change nothing).
final class Countdown: Sendable {
  private let state: Mutex<(remaining: Int, waiter: CheckedContinuation<Void, Never>?)>
  init(_ count: Int) { state = Mutex((count, nil)) }
  func arrive() {
    let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
      state.remaining = max(state.remaining - 1, 0)
      return state.remaining == 0 ? state.waiter.take() : nil
    }
    waiter?.resume()
  }
  func wait() async {
    await withCheckedContinuation { continuation in
      let open = state.withLock { state -> Bool in
        if state.remaining > 0 { state.waiter = continuation }
        return state.remaining == 0
      }
      if open { continuation.resume() }
    }
  }
}

// The signals are ignored by default handling and watched by sources; the
// server announces that it serves only once both sources are registered, so
// a signal sent after the announcement is never lost.
let shutdownRequest = Countdown(1)
signal(SIGINT, SIG_IGN)
signal(SIGTERM, SIG_IGN)
let shutdownSignals = [SIGINT, SIGTERM].compactMap { try? SignalSource(signal: $0, queue: queue) }
let signalsWatched = Countdown(shutdownSignals.count)
for source in shutdownSignals {
  source.setEventHandler { shutdownRequest.arrive() }
  source.setRegistrationHandler { signalsWatched.arrive() }
  source.resume()
}
await signalsWatched.wait()

// MARK: - The built-in clients (plain blocking sockets, one thread each)

/// Connects, sends `lines` lines in bursts, reads the echoes, checks them; returns the lines echoed intact.
func runClient(_ number: Int) -> Int {
  let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  defer { close(descriptor) }
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_addr.s_addr = inet_addr("127.0.0.1")
  address.sin_port = port.bigEndian
  let connected = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
      connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
    }
  }
  guard connected == 0 else { return 0 }
  let expected = (0..<linesPerClient).map { "client \(number) line \($0)\n" }.joined()
  let bytes = Array(expected.utf8)
  // Send in bursts of 10 lines, each as one write, and read the echo of each burst.
  var received: [UInt8] = []
  var buffer = [UInt8](repeating: 0, count: 4096)
  var sent = 0
  for burst in stride(from: 0, to: linesPerClient, by: 10) {
    let text = Array((burst..<min(burst + 10, linesPerClient)).map { "client \(number) line \($0)\n" }.joined().utf8)
    guard text.withUnsafeBytes({ send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == text.count
    else { return 0 }
    sent += text.count
    while received.count < sent {
      let count = recv(descriptor, &buffer, buffer.count, 0)
      if count <= 0 { return 0 }
      received += buffer[0..<count]
    }
  }
  shutdown(descriptor, Int32(SHUT_WR))
  while recv(descriptor, &buffer, buffer.count, 0) > 0 {}  // the server closes after the last echo
  return received == bytes ? linesPerClient : 0
}

let clientsDone = Atomic<Int>(0)
let intactLines = Atomic<Int>(0)

/// The work of one client thread.
final class ClientContext {
  let number: Int
  init(number: Int) { self.number = number }
}

func clientThread(_ context: UnsafeMutableRawPointer?) -> UnsafeMutableRawPointer? {
  let client = Unmanaged<ClientContext>.fromOpaque(context!).takeRetainedValue()
  intactLines.add(runClient(client.number), ordering: .relaxed)
  if clientsDone.add(1, ordering: .acquiringAndReleasing).newValue == clientCount { shutdownRequest.arrive() }
  return nil
}

var threads: [pthread_t] = []
for number in 0..<clientCount {
  var thread = pthread_t()
  let context = Unmanaged.passRetained(ClientContext(number: number)).toOpaque()
  precondition(pthread_create(&thread, nil, clientThread, context) == 0, "pthread_create")
  threads.append(thread)
}
if clientCount == 0 { say("ExampleEchoServer: no clients; serving until SIGINT or SIGTERM") }

// MARK: - main: serve until the clients are done or a signal asks to stop, then shut down gracefully

await shutdownRequest.wait()
for thread in threads { pthread_join(thread, nil) }
acceptor.cancel()  // stop accepting; the cancel handler closes the listening socket
await state.drain()  // every connection finishes and its channel's cleanup closes it
let (served, lines) = state.counts.withLock { ($0.served, $0.lines) }
say("ExampleEchoServer: served \(served) connections, echoed \(lines) lines")
say(
  "ExampleEchoServer: \(intactLines.load(ordering: .relaxed)) of \(clientCount * linesPerClient) lines came back intact"
)
say("ExampleEchoServer: shut down")
