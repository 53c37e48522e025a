import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("WriteSource")
struct WriteSourceTests {
  @Test("a write source writes 1 MB into a pipe as the reader drains it, until EAGAIN each time")
  func writesAPipe() {
    let expected = patternBytes(1_000_000)
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    _ = fcntl(writeEnd, F_SETFL, O_NONBLOCK)
    let written = Atomic<Int>(0)
    let calls = Counter()
    let cancelled = Event()
    let source = try! WriteSource(fileDescriptor: writeEnd, queue: Queue(label: "write.pipe"))
    source.setEventHandler { [unowned source] in
      calls.increment()
      var offset = written.load(ordering: .relaxed)
      while offset < expected.count {
        let count = expected[offset...].withUnsafeBytes { write(writeEnd, $0.baseAddress, $0.count) }
        if count < 0 { break }  // EAGAIN: the pipe is full; wait for the next event
        offset += count
      }
      written.store(offset, ordering: .relaxed)
      if offset == expected.count { source.cancel() }
    }
    source.setCancelHandler {
      close(writeEnd)
      cancelled.signal()
    }
    source.resume()
    let received = contentsOfDescriptor(readEnd)
    close(readEnd)
    #expect(cancelled.wait())
    #expect(received.count == expected.count)
    #expect(firstDifference(received, expected) == nil)
    #expect(calls.current >= 2, "a 64 KB pipe cannot take 1 MB in one handler call")
  }

  /// Reads until end of file (blocking).
  func contentsOfDescriptor(_ fd: Int32) -> [UInt8] {
    var result: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65536)
    while true {
      let count = read(fd, &chunk, chunk.count)
      if count < 0 && errno == EINTR { continue }
      if count <= 0 { break }
      result.append(contentsOf: chunk.prefix(count))
    }
    return result
  }

  @Test("a write source on a regular file fires at once; the file holds what the handler wrote")
  func writesAFile() {
    let path = temporaryFile(containing: [])
    defer { unlink(path) }
    let fd = open(path, O_WRONLY | O_TRUNC)
    let expected = patternBytes(100_000)
    let cancelled = Event()
    let writable = Recorder<Int>()
    let source = try! WriteSource(fileDescriptor: fd, queue: .global())
    source.setEventHandler { [unowned source] in
      writable.append(Int(source.data))
      var offset = 0
      while offset < expected.count {
        let count = expected[offset...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if count <= 0 { break }
        offset += count
      }
      source.cancel()
    }
    source.setCancelHandler {
      // Closed here, exactly once: close succeeds (checking afterwards would race with other
      // tests reusing the descriptor number).
      if close(fd) == 0 { cancelled.signal() }
    }
    #expect(source.fileDescriptor == fd)
    source.resume()
    #expect(cancelled.wait())
    #expect(writable.values.count == 1)
    #expect(writable.values.allSatisfy { $0 > 0 })
    #expect(firstDifference(contentsOfFile(path), expected) == nil)
  }

  @Test(
    "a write source on /dev/null, a device epoll cannot watch, fires at once and again after each handler until cancelled; a suspension holds it back"
  )
  func writesADevice() throws {
    let fd = open("/dev/null", O_WRONLY | O_CLOEXEC)
    let events = Counter()
    let cancelled = Event()
    let suspended = Event()
    let source = try! WriteSource(fileDescriptor: fd, queue: Queue(label: "write.device"))
    source.setEventHandler { [unowned source] in
      let bytes = [UInt8](repeating: 7, count: 4096)
      precondition(write(fd, bytes, bytes.count) == bytes.count)
      switch events.increment() {
      case 2:
        source.suspend()
        suspended.signal()
      case 5: source.cancel()
      default: break
      }
    }
    source.setCancelHandler { if close(fd) == 0 { cancelled.signal() } }
    source.resume()
    // Before the device was watched as always ready, libdispatch refused its registration and
    // the handler never ran.
    try #require(suspended.wait())
    #expect(!pollBriefly { events.current > 2 })
    source.resume()
    #expect(cancelled.wait())
    #expect(events.current == 5)
  }

  @Test("on a pipe whose reader has closed, write fails with EPIPE (SIGPIPE ignored) and the process lives on")
  func brokenPipeGivesEPIPE() {
    signal(SIGPIPE, SIG_IGN)
    let (readEnd, writeEnd) = makePipe()
    close(readEnd)
    let errors = Recorder<Int32>()
    let cancelled = Event()
    let source = try! WriteSource(fileDescriptor: writeEnd, queue: Queue(label: "write.epipe"))
    source.setEventHandler { [unowned source] in
      let result = write(writeEnd, "x", 1)
      errors.append(result < 0 ? errno : 0)
      source.cancel()
    }
    source.setCancelHandler {
      close(writeEnd)
      cancelled.signal()
    }
    source.resume()
    #expect(cancelled.wait())
    #expect(errors.values == [EPIPE])
  }

  @Test("an invalid descriptor throws GCDError with EBADF", arguments: [Int32(-1), 9999])
  func invalidDescriptorThrows(fd: Int32) {
    let error = #expect(throws: GCDError.self) {
      _ = try WriteSource(fileDescriptor: fd, queue: .global())
    }
    #expect(error?.errno == EBADF)
    #expect(error?.description.contains("WriteSource(fileDescriptor: \(fd))") == true)
  }

  @Test("the event handler runs on the source's queue; setTarget moves later events")
  func handlerRunsOnTheQueue() {
    let (readEnd, writeEnd) = makePipe()
    _ = fcntl(writeEnd, F_SETFL, O_NONBLOCK)
    defer { close(readEnd) }
    let first = Queue(label: "write.first")
    let second = Queue(label: "write.second")
    let source = try! WriteSource(fileDescriptor: writeEnd, queue: first)
    let ranOn = Recorder<String>()
    let fired = Event()
    let cancelled = Event()
    // The pipe stays writable, so the source fires again and again: until an event runs on `second`.
    source.setEventHandler { [unowned source] in
      ranOn.append("first \(first.isCurrent), second \(second.isCurrent)")
      fired.signal()
      if second.isCurrent { source.cancel() }
    }
    source.setCancelHandler {
      close(writeEnd)
      cancelled.signal()
    }
    source.resume()
    #expect(fired.wait())
    source.setTarget(second)
    #expect(cancelled.wait())
    // ThreadSanitizer's libdispatch interceptor remembers the queue a source
    // targeted when a handler was set (`first`, for the cancel handler) and
    // reads it after the handler returns, without retaining it: keep `first`
    // until the cancel handler has finished on `second` (docs/reliability.md).
    withExtendedLifetime(first) { second.sync {} }
    let values = ranOn.values
    #expect(values.first == "first true, second false")
    #expect(values.last == "first false, second true")
    // Once an event has run on the new queue, none runs on the old one.
    let moved = values.firstIndex(of: "first false, second true") ?? values.count
    #expect(values[..<moved].allSatisfy { $0 == "first true, second false" })
    #expect(values[moved...].allSatisfy { $0 == "first false, second true" })
  }

  @Test("on Linux, data of a write source on an idle socket is the bytes still queued: 0 (documented)")
  func dataOnAnIdleSocket() {
    let (left, right) = makeSocketPair()
    defer {
      close(left)
      close(right)
    }
    let queue = Queue(label: "write.room")
    let source = try! WriteSource(fileDescriptor: left, queue: queue)
    let writable = Recorder<Int>()
    let cancelled = Event()
    source.setEventHandler { [unowned source] in
      writable.append(Int(source.data))
      source.cancel()
    }
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    #expect(cancelled.wait())
    // libdispatch on Linux reports SIOCOUTQ here: the bytes still queued for sending (0 on an idle
    // socket), not the room left; WriteSource documents it.
    #expect(writable.values == [0], "data: \(writable.values)")
  }

  @Test(
    "a write source resumed before its event handler is set fires once the handler is set (as libdispatch's)",
    .timeLimit(.minutes(1)))
  func handlerSetAfterResume() {
    let (left, right) = makeSocketPair()
    defer { close(right) }
    let source = try! WriteSource(fileDescriptor: left, queue: Queue(label: "write.late-handler"))
    // A socket has room at once.
    #expect(firesOnceHandlerIsSet(source, watch: source.watch!, after: {}) { write(left, "x", 1) == 1 })
  }
}
