// A line-oriented TCP echo server on 127.0.0.1 whose connections are
// IOChannels, with graceful shutdown.
//
// The server listens on an ephemeral port of 127.0.0.1 (loopback only) and
// accepts with a ReadSource on the listening socket. Each connection is a
// stream channel served by a task: it reads what arrives, and writes back
// every complete line ("\n"-terminated) as soon as it has it. When the peer
// closes its side, the task writes back what is left and closes the channel.
// A stream channel over a socket runs on the package's own read and write
// sources: no descriptor but the connection's, none left after its cleanup.
//
// Graceful shutdown — on SIGINT/SIGTERM, or here once the built-in clients
// are done — stops accepting (the accept source is cancelled and closes the
// listening socket), lets every open connection finish, and exits when the
// last channel's cleanup has run. The program is bounded: it runs `clients`
// clients (plain blocking sockets on their own threads), each connecting
// `connections` times in turn: send `lines` lines, check every echo, hang up.
//
// Usage: ExampleEchoServer [clients, default 4] [lines, default 200] [connections, default 1]

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
let linesPerConnection = arguments.count > 2 ? Int(arguments[2]) ?? 200 : 200
let connectionsPerClient = arguments.count > 3 ? Int(arguments[3]) ?? 1 : 1

// MARK: - The server

/// Every open connection: entered when it is accepted, left when its channel's cleanup has closed it.
let connections = Group()
/// Waits until every connection has finished and its channel's cleanup has closed it.
func drain() async throws(CancellationError) { try await connections.wait() }
let served = Atomic<Int>(0)
let echoedLines = Atomic<Int>(0)

let newline = UInt8(ascii: "\n")

/// Serves one connection: echoes each complete line as soon as it has arrived.
func serve(_ channel: IOChannel) async {
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
      echoedLines.add(lines.reduce(0) { $1 == newline ? $0 + 1 : $0 }, ordering: .relaxed)
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

let queue = Queue(label: "echo-server")
let (listener, port) = listenOnLoopback()
let acceptor = try ReadSource(fileDescriptor: listener, queue: queue)
acceptor.setEventHandler {
  while true {
    let connection = accept(listener, nil, nil)
    if connection < 0 { break }  // EAGAIN: no more pending connections
    _ = fcntl(connection, F_SETFD, FD_CLOEXEC)
    connections.enter()
    let channel = IOChannel(fileDescriptor: connection, type: .stream, queue: queue) { descriptor in
      close(descriptor)
      served.add(1, ordering: .relaxed)
      connections.leave()
    }
    Task { await serve(channel) }
  }
}
acceptor.setCancelHandler { close(listener) }
acceptor.resume()
/// Announces the address (a function, so that no temporary of the top-level code's async frame outlives the
/// program: LeakSanitizer reports those).
func announceListening() { say("ExampleEchoServer: listening on 127.0.0.1:\(port)") }
announceListening()

// MARK: - The built-in clients (plain blocking sockets, one thread each)

/// Connects, sends `lines` lines in bursts of 10, reads and checks the echoes, hangs up; returns the
/// lines echoed intact.
func runConnection(_ number: Int) -> Int {
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
  var (sent, received, buffer) = ([UInt8](), [UInt8](), [UInt8](repeating: 0, count: 4096))
  for burst in stride(from: 0, to: linesPerConnection, by: 10) {
    let text = (burst..<min(burst + 10, linesPerConnection)).map { "client \(number) line \($0)\n" }.joined()
    let bytes = Array(text.utf8)
    guard bytes.withUnsafeBytes({ send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == bytes.count
    else { return 0 }
    sent += bytes
    while received.count < sent.count {
      let count = recv(descriptor, &buffer, buffer.count, 0)
      if count <= 0 { return 0 }
      received += buffer[0..<count]
    }
  }
  shutdown(descriptor, Int32(SHUT_WR))
  while recv(descriptor, &buffer, buffer.count, 0) > 0 {}  // the server closes after the last echo
  return received == sent ? linesPerConnection : 0
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
  for _ in 0..<connectionsPerClient { intactLines.add(runConnection(client.number), ordering: .relaxed) }
  if clientsDone.add(1, ordering: .acquiringAndReleasing).newValue == clientCount { kill(getpid(), SIGTERM) }
  return nil
}

// MARK: - main: serve until a signal asks to stop (the last built-in client sends SIGTERM), then shut down

signal(SIGINT, SIG_IGN)  // harmless until the signal sources are registered (libdispatch takes them over)
signal(SIGTERM, SIG_IGN)
var threads: [pthread_t] = []
try await SignalSource.withSignals([SIGINT, SIGTERM], queue: queue) { signals in
  // The sources are registered: from here no signal is lost.
  for number in 0..<clientCount {
    var thread = pthread_t()
    let context = Unmanaged.passRetained(ClientContext(number: number)).toOpaque()
    precondition(pthread_create(&thread, nil, clientThread, context) == 0, "pthread_create")
    threads.append(thread)
  }
  if clientCount == 0 { say("ExampleEchoServer: no clients; serving until SIGINT or SIGTERM") }
  for await _ in signals { break }
}
for thread in threads { pthread_join(thread, nil) }
acceptor.cancel()  // stop accepting; the cancel handler closes the listening socket
try await drain()
say(
  "ExampleEchoServer: served \(served.load(ordering: .relaxed)) connections, echoed \(echoedLines.load(ordering: .relaxed)) lines"
)
say(
  "ExampleEchoServer: \(intactLines.load(ordering: .relaxed)) of \(clientCount * connectionsPerClient * linesPerConnection) lines came back intact"
)
say("ExampleEchoServer: shut down")
