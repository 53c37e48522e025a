import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Probes of the descriptor sources and the descriptor fence (docs/sources-linux.md), run instead
// of the benchmark table when the first argument names one:
//   GCDBenchmarks --read-round-trip [N]      one event through a ReadSource on a pipe: write a
//                                            byte, the handler reads it and signals; median ns of 7
//   GCDBenchmarks --source-cycle read|write [N]  the whole life of N sources, each on a pipe of its own
//                                            (as a server's connections are): create, set a cancel
//                                            handler, resume, cancel, until every cancel handler has
//                                            run; median ns per source of 5
//   GCDBenchmarks --http-server PORT SECONDS a small HTTP/1.1 server on 127.0.0.1:PORT, a
//                                            ReadSource and a WriteSource per connection, for `wrk`
//                                            (answers "ok"; honours Connection: close); prints the
//                                            connections and requests served when it stops
//   GCDBenchmarks --http-server-dispatch PORT SECONDS  the same server on `import Dispatch`'s
//                                            DispatchSourceRead and DispatchSourceWrite
//   ... PORT SECONDS short-reads             either server, its handler ending a connection's
//                                            reads at a read shorter than its buffer (as SwiftNIO's
//                                            does) instead of reading until EAGAIN: the level
//                                            semantics report what is left

/// Runs the probe the arguments name, and exits; returns when they name none.
func runChurnProbeIfAsked() {
  let arguments = Array(CommandLine.arguments.dropFirst())
  guard let first = arguments.first else { return }
  switch first {
  case "--read-round-trip":
    readRoundTrip(count: arguments.count > 1 ? Int(arguments[1]) ?? 20_000 : 20_000)
    exit(0)
  case "--source-cycle":
    guard arguments.count > 1, ["read", "write"].contains(arguments[1]) else {
      note("usage: GCDBenchmarks --source-cycle read|write [N]")
      exit(2)
    }
    sourceCycle(write: arguments[1] == "write", count: arguments.count > 2 ? Int(arguments[2]) ?? 2_000 : 2_000)
    exit(0)
  case "--http-server", "--http-server-dispatch":
    guard arguments.count > 2, let port = UInt16(arguments[1]), let seconds = Int(arguments[2]),
      arguments.count == 3 || (arguments.count == 4 && arguments[3] == "short-reads")
    else {
      note("usage: GCDBenchmarks --http-server[-dispatch] PORT SECONDS [short-reads]")
      exit(2)
    }
    shortReads = arguments.count == 4
    httpServer(port: port, seconds: seconds, backend: first == "--http-server" ? .gcd : .dispatch)
    exit(0)
  default: return
  }
}

private func readRoundTrip(count: Int) {
  var ends: [Int32] = [-1, -1]
  precondition(pipe(&ends) == 0)
  _ = fcntl(ends[0], F_SETFL, O_NONBLOCK)
  let readEnd = ends[0]
  let handled = try! Semaphore(value: 0)
  let source = try! ReadSource(fileDescriptor: readEnd, queue: Queue(label: "probe.round.trip"))
  source.setEventHandler {
    var byte: UInt8 = 0
    while read(readEnd, &byte, 1) == 1 { handled.signal() }
  }
  source.resume()
  var samples: [Double] = []
  for _ in 0..<7 {
    let start = monotonicNanos()
    for _ in 0..<count {
      var byte: UInt8 = 1
      _ = write(ends[1], &byte, 1)
      handled.wait()
    }
    samples.append(Double(monotonicNanos() - start) / Double(count))
  }
  source.cancel()
  samples.sort()
  print("read_round_trip_ns median=\(Int(samples[3])) min=\(Int(samples[0])) max=\(Int(samples[6])) count=\(count)")
}

private func sourceCycle(write: Bool, count: Int) {
  let pipes = (0..<count).map { _ -> (Int32, Int32) in
    var ends: [Int32] = [-1, -1]
    precondition(pipe(&ends) == 0, "pipe: errno \(errno)")
    return (ends[0], ends[1])
  }
  let queue = Queue(label: "probe.source.cycle")
  var samples: [Double] = []
  for _ in 0..<5 {
    let done = try! Semaphore(value: 0)
    let start = monotonicNanos()
    for (readEnd, writeEnd) in pipes {
      let source: Source =
        write
        ? try! WriteSource(fileDescriptor: writeEnd, queue: queue)
        : try! ReadSource(fileDescriptor: readEnd, queue: queue)
      source.setCancelHandler { done.signal() }
      source.resume()
      source.cancel()
    }
    for _ in 0..<count { done.wait() }
    samples.append(Double(monotonicNanos() - start) / Double(count))
  }
  samples.sort()
  print(
    "source_cycle_\(write ? "write" : "read")_ns median=\(Int(samples[2])) min=\(Int(samples[0])) max=\(Int(samples[4])) count=\(count)"
  )
}

/// What the HTTP probe needs of a source, so that one server runs on the package's sources and on
/// `import Dispatch`'s (`ProbeBackend`), and `strace` counts the same program's calls on each.
protocol ProbeSource: AnyObject, Sendable {
  func resume()
  func suspend()
  func cancel()
  func onEvent(_ handler: @escaping @Sendable () -> Void)
  func onCancel(_ handler: @escaping @Sendable () -> Void)
  /// One read of `descriptor` into `buffer`, as a user of the source's API reads: `recv` on
  /// `import Dispatch`; on the package, `ReadSource.read(into:)`, which tells the source when the
  /// socket is empty. The count, 0 at the end of file, -1 with `errno` set.
  func receive(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Int
}

extension ProbeSource {
  func receive(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Int {
    recv(descriptor, buffer.baseAddress, buffer.count, 0)
  }
}

extension Source: ProbeSource {
  func onEvent(_ handler: @escaping @Sendable () -> Void) { setEventHandler(handler) }
  func onCancel(_ handler: @escaping @Sendable () -> Void) { setCancelHandler(handler) }
  func receive(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Int {
    guard let reader = self as? ReadSource else { return recv(descriptor, buffer.baseAddress, buffer.count, 0) }
    do throws(GCDError) {
      guard let count = try reader.read(into: buffer) else {
        errno = EAGAIN
        return -1
      }
      return count
    } catch {
      errno = error.errno
      return -1
    }
  }
}

/// A `DispatchSourceRead` or `DispatchSourceWrite` as a `ProbeSource`, with what a user of
/// `import Dispatch` must add for the probe's `stop`: a cancelled source that was never resumed, or
/// is suspended, runs no cancel handler until it is resumed, so `cancel()` resumes it as often as
/// needed (the package's `cancel()` does that itself). The counts are touched only on the
/// connection's queue (the listener's source is resumed once, before any event).
final class DispatchProbeSource: ProbeSource, @unchecked Sendable {
  let source: any DispatchSourceProtocol
  private var started = false
  private var suspensions = 0
  init(_ source: any DispatchSourceProtocol) { self.source = source }
  func resume() {
    if started { suspensions -= 1 } else { started = true }
    source.resume()
  }
  func suspend() {
    suspensions += 1
    source.suspend()
  }
  func cancel() {
    source.cancel()
    if !started {
      started = true
      source.resume()
    }
    while suspensions > 0 {
      suspensions -= 1
      source.resume()
    }
  }
  func onEvent(_ handler: @escaping @Sendable () -> Void) { source.setEventHandler(handler: handler) }
  func onCancel(_ handler: @escaping @Sendable () -> Void) { source.setCancelHandler(handler: handler) }
}

/// How the HTTP probe makes its sources: on the package's `ReadSource` and `WriteSource` and
/// `Queue`s, or on `import Dispatch`'s, each with 4 serial queues for the connections and one for
/// the listener.
struct ProbeBackend: Sendable {
  /// The serial queues the connections are spread over.
  static let connectionQueues = 4

  let name: String
  /// A read (false) or write (true) source on the descriptor, on connection queue `queue` (or the
  /// accepting queue for -1).
  let make: @Sendable (_ write: Bool, _ descriptor: Int32, _ queue: Int) throws -> any ProbeSource

  static var gcd: ProbeBackend {
    let queues = (0..<connectionQueues).map { Queue(label: "probe.http.\($0)") }
    let accepting = Queue(label: "probe.http.accept")
    return ProbeBackend(name: "GCD") { write, descriptor, index in
      let queue = index < 0 ? accepting : queues[index]
      return write
        ? try WriteSource(fileDescriptor: descriptor, queue: queue)
        : try ReadSource(fileDescriptor: descriptor, queue: queue)
    }
  }

  static var dispatch: ProbeBackend {
    let queues = (0..<connectionQueues).map { DispatchQueue(label: "probe.http.\($0)") }
    let accepting = DispatchQueue(label: "probe.http.accept")
    return ProbeBackend(name: "Dispatch") { write, descriptor, index in
      let queue = index < 0 ? accepting : queues[index]
      return DispatchProbeSource(
        write
          ? DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: queue)
          : DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue))
    }
  }
}

/// One connection: its descriptor, its sources and what is left to send; touched only on its queue.
private final class Connection: @unchecked Sendable {
  let descriptor: Int32
  let reader: any ProbeSource
  let writer: any ProbeSource
  var input: [UInt8] = []
  var output: [UInt8] = []
  var writing = false
  var closeAfterOutput = false
  var closing = false
  let cancelled = Atomic<Int>(0)

  init(descriptor: Int32, queue: Int, backend: ProbeBackend) throws {
    self.descriptor = descriptor
    reader = try backend.make(false, descriptor, queue)
    writer = try backend.make(true, descriptor, queue)
  }
}

private let response = Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok".utf8)
private let closingResponse = Array(
  "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\nok".utf8)
private let served = Atomic<Int>(0)
private let requests = Atomic<Int>(0)

private func httpServer(port: UInt16, seconds: Int, backend: ProbeBackend) {
  signal(SIGPIPE, SIG_IGN)
  let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
  var yes: Int32 = 1
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
  var address = sockaddr_in()
  address.sin_family = sa_family_t(AF_INET)
  address.sin_addr.s_addr = inet_addr("127.0.0.1")
  address.sin_port = port.bigEndian
  let bound = withUnsafePointer(to: &address) {
    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
      bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
    }
  }
  precondition(bound == 0 && listen(listener, 1024) == 0, "bind/listen: errno \(errno)")
  _ = fcntl(listener, F_SETFL, O_NONBLOCK)
  let acceptor = try! backend.make(false, listener, -1)
  let next = Atomic<Int>(0)
  acceptor.onEvent {
    while true {
      let descriptor = accept(listener, nil, nil)
      if descriptor < 0 { break }
      _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
      _ = fcntl(descriptor, F_SETFL, O_NONBLOCK)
      serve(
        descriptor, queue: next.add(1, ordering: .relaxed).newValue % ProbeBackend.connectionQueues, backend: backend)
    }
  }
  acceptor.onCancel { close(listener) }
  acceptor.resume()
  print("http-server (\(backend.name)): listening on 127.0.0.1:\(port) for \(seconds) s")
  sleep(UInt32(seconds))
  acceptor.cancel()
  print(
    "http-server: served \(served.load(ordering: .relaxed)) connections, \(requests.load(ordering: .relaxed)) requests")
}

private func serve(_ descriptor: Int32, queue: Int, backend: ProbeBackend) {
  let connection: Connection
  do {
    connection = try Connection(descriptor: descriptor, queue: queue, backend: backend)
  } catch {
    note("http-server: \(error)")
    close(descriptor)
    return
  }
  let finish: @Sendable () -> Void = {
    if connection.cancelled.add(1, ordering: .acquiringAndReleasing).newValue == 2 {
      close(connection.descriptor)
      served.add(1, ordering: .relaxed)
    }
  }
  connection.reader.onCancel(finish)
  connection.writer.onCancel(finish)
  connection.reader.onEvent { readAvailable(connection) }
  connection.writer.onEvent { flush(connection) }
  connection.reader.resume()
}

/// Stops both sources once (on the connection's queue).
private func stop(_ connection: Connection) {
  guard !connection.closing else { return }
  connection.closing = true
  connection.reader.cancel()
  connection.writer.cancel()  // also balances a suspension, or starts a writer never started
}

/// Set once, before the server starts (`short-reads`): a handler stops reading at a short read.
nonisolated(unsafe) private var shortReads = false

private func readAvailable(_ connection: Connection) {
  var buffer = [UInt8](repeating: 0, count: 4096)
  while true {
    let count = buffer.withUnsafeMutableBytes { connection.reader.receive(connection.descriptor, into: $0) }
    if count > 0 {
      connection.input += buffer[0..<count]
      if shortReads && count < buffer.count { break }
      continue
    }
    if count == 0 || errno != EAGAIN {
      stop(connection)
      return
    }
    break
  }
  // Each request ends with an empty line; answer each one.
  let end: [UInt8] = [13, 10, 13, 10]
  var answered = false
  while let range = connection.input.firstRange(of: end) {
    let head = connection.input[..<range.lowerBound]
    let closeRequested = head.firstRange(of: Array("Connection: close".utf8)) != nil
    connection.input.removeSubrange(..<range.upperBound)
    connection.output += closeRequested ? closingResponse : response
    requests.add(1, ordering: .relaxed)
    answered = true
    if closeRequested {
      connection.closeAfterOutput = true
      break
    }
  }
  if answered { flush(connection) }
}

private func flush(_ connection: Connection) {
  while !connection.output.isEmpty {
    let sent = connection.output.withUnsafeBytes {
      send(connection.descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
    }
    if sent > 0 {
      connection.output.removeFirst(sent)
      continue
    }
    if errno == EAGAIN {
      // Wait for room: the write source fires when the socket can take more.
      if !connection.writing {
        connection.writing = true
        connection.writer.resume()
      }
      return
    }
    stop(connection)
    return
  }
  if connection.writing && !connection.closing {
    connection.writing = false
    connection.writer.suspend()
  }
  if connection.closeAfterOutput { stop(connection) }
}
