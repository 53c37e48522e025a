import CGCD
import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("ReadSource")
struct ReadSourceTests {
  /// Starts a read source that reads `fd` (non-blocking) until end of file, then cancels itself and
  /// closes `fd` in its cancel handler. Returns the bytes read, the handler calls, and whether the
  /// cancel handler ran in time.
  @available(*, noasync, message: "blocks the thread")
  func readToEnd(_ fd: Int32, queue: Queue, whileReading: () -> Void = {}) -> (bytes: [UInt8], calls: Int, done: Bool) {
    let received = Mutex<[UInt8]>([])
    let calls = Counter()
    let cancelled = Event()
    let source = try! ReadSource(fileDescriptor: fd, queue: queue)
    source.setEventHandler { [unowned source] in
      calls.increment()
      let estimated = source.bytesAvailable + 1
      var buffer = [UInt8](repeating: 0, count: estimated)
      // Read until the descriptor has nothing more (EAGAIN) or is at its end (0): on Linux, once a
      // pipe's writer has closed, libdispatch delivers one last event, not one per remaining chunk.
      while true {
        let count = read(fd, &buffer, estimated)
        if count > 0 {
          received.withLock { $0.append(contentsOf: buffer.prefix(count)) }
        } else {
          if count == 0 || (errno != EAGAIN && errno != EINTR) { source.cancel() }
          break
        }
      }
    }
    source.setCancelHandler {
      // The descriptor closed here, exactly once: close succeeds. (Checking it afterwards
      // with fcntl would race with other tests reusing the number.)
      if close(fd) == 0 { cancelled.signal() }
    }
    source.resume()
    whileReading()
    let done = cancelled.wait()
    return (received.withLock { $0 }, calls.current, done)
  }

  @Test("a read source reads a whole regular file, and reports 0 bytes available at its end")
  func readsAWholeFile() {
    let expected = patternBytes(300_000)
    let path = temporaryFile(containing: expected)
    defer { unlink(path) }
    let fd = open(path, O_RDONLY | O_NONBLOCK)
    #expect(fd >= 0)
    let (bytes, calls, done) = readToEnd(fd, queue: .global())
    #expect(done)
    #expect(bytes.count == expected.count)
    #expect(firstDifference(bytes, expected) == nil)
    #expect(calls >= 1)
  }

  @Test(
    "a read source on /dev/zero, a device epoll cannot watch, fires at once and again after each handler (always ready, as poll says) until cancelled"
  )
  func readsADevice() {
    let fd = open("/dev/zero", O_RDONLY | O_CLOEXEC)
    let events = Counter()
    let zeros = Atomic<Bool>(true)
    let cancelled = Event()
    let source = try! ReadSource(fileDescriptor: fd, queue: Queue(label: "read.device"))
    source.setEventHandler { [unowned source] in
      var buffer = [UInt8](repeating: 1, count: 4096)
      if read(fd, &buffer, buffer.count) != buffer.count || buffer.contains(where: { $0 != 0 }) {
        zeros.store(false, ordering: .relaxed)
      }
      if events.increment() == 5 { source.cancel() }
    }
    source.setCancelHandler { if close(fd) == 0 { cancelled.signal() } }
    source.resume()
    // Before the device was watched as always ready, libdispatch refused its registration and
    // the handler never ran.
    #expect(cancelled.wait())
    #expect(events.current == 5)
    let allZero = zeros.load(ordering: .relaxed)
    #expect(allZero)
  }

  @Test("a read source reads everything written to a pipe until the writer closes it")
  func readsAPipe() {
    let expected = patternBytes(1_000_000)
    let (readEnd, writeEnd) = makePipe()
    let (bytes, _, done) = readToEnd(readEnd, queue: Queue(label: "read.pipe")) {
      // Blocking writes in chunks: the pipe holds 64 KB, so the reader must keep up.
      Queue.global().async {
        var offset = 0
        while offset < expected.count {
          let count = expected[offset..<min(offset + 10_000, expected.count)].withUnsafeBytes {
            write(writeEnd, $0.baseAddress, $0.count)
          }
          if count < 0 && errno == EINTR { continue }
          if count <= 0 { break }
          offset += count
        }
        close(writeEnd)
      }
    }
    #expect(done)
    #expect(bytes.count == expected.count)
    #expect(firstDifference(bytes, expected) == nil)
  }

  @Test("bytesAvailable is what a pipe holds; fileDescriptor and handle are the descriptor")
  func bytesAvailableOnAPipe() {
    let (readEnd, writeEnd) = makePipe()
    defer {
      close(readEnd)
      close(writeEnd)
    }
    _ = write(writeEnd, "0123456789", 10)
    let queue = Queue(label: "read.available")
    let source = try! ReadSource(fileDescriptor: readEnd, queue: queue)
    let available = Recorder<Int>()
    let fired = Event()
    let cancelled = Event()
    source.setEventHandler { [unowned source] in
      available.append(source.bytesAvailable)
      source.cancel()
      fired.signal()
    }
    source.setCancelHandler { cancelled.signal() }
    #expect(source.fileDescriptor == readEnd)
    #expect(source.handle == UInt(readEnd))
    source.resume()
    #expect(fired.wait())
    #expect(cancelled.wait())
    #expect(available.values == [10])
  }

  @Test("read and write sources on the two ends of a socket pair, and on one end, all fire")
  func socketPairReadAndWrite() {
    let (left, right) = makeSocketPair()
    let queue = Queue(label: "read.socketpair")
    let leftRead = try! ReadSource(fileDescriptor: left, queue: queue)
    let leftWrite = try! WriteSource(fileDescriptor: left, queue: queue)
    let rightRead = try! ReadSource(fileDescriptor: right, queue: queue)
    let fired = Recorder<String>()
    let all = Latch(count: 3)
    let cancelled = Latch(count: 3)
    leftWrite.setEventHandler { [unowned leftWrite] in
      // Room to write: send one byte to the right end, once.
      _ = write(left, "L", 1)
      fired.append("left writable")
      leftWrite.cancel()
      all.signal()
    }
    rightRead.setEventHandler { [unowned rightRead] in
      var byte: UInt8 = 0
      guard read(right, &byte, 1) == 1 else { return }
      fired.append("right read \(Character(UnicodeScalar(byte)))")
      _ = write(right, "R", 1)
      rightRead.cancel()
      all.signal()
    }
    leftRead.setEventHandler { [unowned leftRead] in
      var byte: UInt8 = 0
      guard read(left, &byte, 1) == 1 else { return }
      fired.append("left read \(Character(UnicodeScalar(byte)))")
      leftRead.cancel()
      all.signal()
    }
    for source in [leftRead, rightRead] as [Source] + [leftWrite] {
      source.setCancelHandler { cancelled.signal() }
    }
    leftRead.resume()
    leftWrite.resume()
    rightRead.resume()
    #expect(all.wait())
    #expect(cancelled.wait())
    #expect(fired.values == ["left writable", "right read L", "left read R"])
    close(left)
    close(right)
  }

  @Test(
    "a write source's cancel leaves a read source on the same descriptor delivering (libdispatch's goes silent)",
    .timeLimit(.minutes(1)))
  func readerOutlivesCancelledWriter() {
    let (left, right) = makeSocketPair()
    defer { close(right) }
    let queue = Queue(label: "read.outlives-writer")
    let reader = try! ReadSource(fileDescriptor: left, queue: queue)
    let writer = try! WriteSource(fileDescriptor: left, queue: queue)
    let bytes = Recorder<UInt8>()
    let first = Event()
    let second = Event()
    reader.setEventHandler {
      var byte: UInt8 = 0
      while read(left, &byte, 1) == 1 {
        bytes.append(byte)
        (bytes.values.count == 1 ? first : second).signal()
      }
    }
    let writerCancelled = Event()
    writer.setEventHandler {}
    writer.setCancelHandler { writerCancelled.signal() }
    let readerCancelled = Event()
    reader.setCancelHandler {
      close(left)
      readerCancelled.signal()
    }
    writer.resume()
    reader.resume()
    _ = write(right, "a", 1)
    #expect(first.wait())
    writer.cancel()
    #expect(writerCancelled.wait())
    // The same steps through `import Dispatch` (a read and a write source on one number, the write
    // source cancelled): the read source's handler never runs again
    // (docs/reliability.md, `writeCancelKeepsReads`).
    _ = write(right, "b", 1)
    #expect(second.wait())
    #expect(bytes.values == [UInt8(ascii: "a"), UInt8(ascii: "b")])
    reader.cancel()
    #expect(readerCancelled.wait())
  }

  @Test(
    "a read source started after a write source on its descriptor filled the socket reads the bytes queued (libdispatch's stays silent)",
    .timeLimit(.minutes(1)))
  func readerAfterFullWriter() {
    let (left, right) = makeSocketPair()
    defer { close(right) }
    _ = fcntl(left, F_SETFL, fcntl(left, F_GETFL) | O_NONBLOCK)
    let queue = Queue(label: "read.after-full-writer")
    let writer = try! WriteSource(fileDescriptor: left, queue: queue)
    let filled = Event()
    writer.setEventHandler {
      var chunk = [UInt8](repeating: 7, count: 4096)
      while chunk.withUnsafeMutableBytes({ write(left, $0.baseAddress, $0.count) }) > 0 {}
      filled.signal()
    }
    let reader = try! ReadSource(fileDescriptor: left, queue: queue)
    let got = Recorder<Int>()
    let first = Event()
    reader.setEventHandler {
      var bytes = [UInt8](repeating: 0, count: 200)
      let count = bytes.withUnsafeMutableBytes { read(left, $0.baseAddress, $0.count) }
      if count > 0 {
        got.append(count)
        first.signal()
      }
    }
    let cancelled = Event()
    reader.setCancelHandler {
      close(left)
      cancelled.signal()
    }
    _ = write(right, [UInt8](repeating: 1, count: 82), 82)
    writer.resume()
    #expect(filled.wait())
    queue.sync {}
    // The same steps through `import Dispatch`: the read source's handler never runs
    // (docs/reliability.md, `readerAfterFullWriter`; `make reader-probe` shows it in C).
    reader.resume()
    #expect(first.wait())
    #expect(got.values == [82])
    writer.cancel()
    reader.cancel()
    #expect(cancelled.wait())
  }

  @Test("an invalid descriptor throws GCDError with EBADF", arguments: [Int32(-1), 9999])
  func invalidDescriptorThrows(fd: Int32) {
    #expect {
      _ = try ReadSource(fileDescriptor: fd, queue: .global())
    } throws: { error in
      (error as? GCDError)?.errno == EBADF
    }
  }

  @Test("a closed descriptor throws GCDError with EBADF, naming the call")
  func closedDescriptorThrows() throws {
    // The highest number the process may open, made and closed: the suite's other tests, running
    // at once in this process, take the lowest free numbers, so none gets this one meanwhile (a
    // low number, closed here, was taken by another test's pipe in 7 of 80 runs of the I/O suites
    // under the scribbling allocator, and the source on it was rightly made).
    var limit = rlimit()
    getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    let (pipeRead, writeEnd) = makePipe()
    let high = fcntl(pipeRead, F_DUPFD, Int32(clamping: limit.rlim_cur - 1))
    let readEnd = high >= 0 ? high : pipeRead
    if high >= 0 { close(pipeRead) }
    close(readEnd)
    close(writeEnd)
    let error = #expect(throws: GCDError.self) {
      _ = try ReadSource(fileDescriptor: readEnd, queue: .global())
    }
    #expect(error?.errno == EBADF)
    #expect(error?.description.contains("ReadSource(fileDescriptor: \(readEnd))") == true)
  }

  @Test("the event handler runs on the source's queue")
  func handlerRunsOnTheQueue() {
    let (readEnd, writeEnd) = makePipe()
    defer { close(writeEnd) }
    let queue = Queue(label: "read.queue")
    let source = try! ReadSource(fileDescriptor: readEnd, queue: queue)
    let onQueue = Recorder<Bool>()
    let cancelled = Event()
    source.setEventHandler { [unowned source] in
      onQueue.append(queue.isCurrent)
      source.cancel()
    }
    source.setCancelHandler {
      close(readEnd)
      cancelled.signal()
    }
    source.resume()
    _ = write(writeEnd, "x", 1)
    #expect(cancelled.wait())
    #expect(onQueue.values == [true])
  }

  // Defect 1 of the oracle issue: the fence merges into the C source and disarms the watch; with no
  // handler set, libdispatch drops the event and no block of the package's ran to re-arm it, so the
  // source went silent for good. `import Dispatch`'s read source fires once the handler is set.

  @Test(
    "a read source resumed before its event handler is set fires once the handler is set (as libdispatch's)",
    .timeLimit(.minutes(1)))
  func handlerSetAfterResume() {
    let (left, right) = makeSocketPair()
    defer { close(right) }
    let source = try! ReadSource(fileDescriptor: left, queue: Queue(label: "read.late-handler"))
    let fired = firesOnceHandlerIsSet(source, watch: source.watch!, after: { _ = write(right, "x", 1) }) {
      var byte: UInt8 = 0
      return read(left, &byte, 1) == 1 && byte == UInt8(ascii: "x")
    }
    #expect(fired)
  }

  @Test(
    "a read source on a regular file resumed before its handler is set fires once it is set", .timeLimit(.minutes(1)))
  func fileHandlerSetAfterResume() {
    let path = temporaryFile(containing: patternBytes(10))
    defer { unlink(path) }
    let fd = open(path, O_RDONLY | O_NONBLOCK)
    #expect(fd >= 0)
    let queue = Queue(label: "read.late-handler.file")
    let source = try! ReadSource(fileDescriptor: fd, queue: queue)
    let cancelled = Event()
    source.setCancelHandler {
      close(fd)
      cancelled.signal()
    }
    source.resume()
    // The start merged its event, and the queue ran the source without a handler.
    queue.sync {}
    queue.sync {}
    let fired = Event()
    source.setEventHandler { [unowned source] _ in
      fired.signal()
      source.cancel()
    }
    #expect(fired.wait())
    #expect(cancelled.wait())
  }

  @Test(
    "a handler set while the source's first event is delivered runs: 200 rounds of the race between the two",
    .timeLimit(.minutes(2)))
  func handlerSetRacesTheFirstEvent() {
    for round in 0..<200 {
      let (left, right) = makeSocketPair()
      let source = try! ReadSource(fileDescriptor: left, queue: Queue(label: "read.race"))
      let cancelled = Event()
      source.setCancelHandler {
        close(left)
        cancelled.signal()
      }
      _ = write(right, "x", 1)
      // The event (merged by the fence's reader as soon as the source starts) and the handler's
      // setting race: whichever comes second runs the handler, or re-arms the watch for it.
      source.resume()
      let fired = Event()
      source.setEventHandler { [unowned source] _ in
        var byte: UInt8 = 0
        if read(left, &byte, 1) == 1 { fired.signal() }
        source.cancel()
      }
      #expect(fired.wait(), "round \(round)")
      #expect(cancelled.wait())
      close(right)
    }
  }

  /// The descriptors a level-semantics test reads: a pipe, a TCP connection on 127.0.0.1, a Unix
  /// stream socket pair; `(read, write)`, the read end non-blocking.
  enum Fixture: String, CaseIterable, CustomTestStringConvertible {
    case pipe, tcp, unixSocket

    var testDescription: String { rawValue }

    func make() -> (read: Int32, write: Int32) {
      switch self {
      case .pipe:
        return makePipe(closeOnExec: true)
      case .tcp:
        let (client, server) = tcpPair()
        _ = fcntl(server, F_SETFL, O_NONBLOCK)
        return (server, client)
      case .unixSocket:
        return makeSocketPair(closeOnExec: true)
      }
    }
  }

  /// One read of up to `count` bytes in a handler: through the source (`read(into:)`) or with
  /// `read(2)` of its own; the count, 0 at the end of file, nil for nothing now.
  static func readOnce(_ source: ReadSource, _ count: Int, throughSource: Bool, into received: Recorder<UInt8>) -> Int?
  {
    var buffer = [UInt8](repeating: 0, count: count)
    let got: Int? = buffer.withUnsafeMutableBytes { bytes in
      if throughSource { return try? source.read(into: bytes) }
      let got = read(source.fileDescriptor, bytes.baseAddress, bytes.count)
      return got < 0 ? nil : got
    }
    if let got, got > 0 { for byte in buffer.prefix(got) { received.append(byte) } }
    return got
  }

  @Test(
    "a handler that takes one byte per event is called again for what it left: every byte, then the end of file",
    arguments: Fixture.allCases, [true, false])
  func oneBytePerEvent(fixture: Fixture, throughSource: Bool) {
    let (readEnd, writeEnd) = fixture.make()
    let expected = patternBytes(40)
    #expect(expected.withUnsafeBytes { write(writeEnd, $0.baseAddress, $0.count) } == expected.count)
    close(writeEnd)
    let source = try! ReadSource(fileDescriptor: readEnd, queue: Queue(label: "read.level"))
    let received = Recorder<UInt8>()
    let calls = Counter()
    let ended = Event()
    source.setEventHandler { [unowned source] in
      calls.increment()
      if ReadSourceTests.readOnce(source, 1, throughSource: throughSource, into: received) == 0 { source.cancel() }
    }
    source.setCancelHandler {
      close(readEnd)
      ended.signal()
    }
    source.resume()
    #expect(ended.wait())
    #expect(received.values == expected)
    // One call per byte and one for the end of file: none lost, none for nothing.
    #expect(calls.current == expected.count + 1)
  }

  /// In a process of its own (the fence's count of `epoll_ctl` modifications is the process's):
  /// 50 rounds of one byte written once the source waits again, and each handler's one read of
  /// up to 64 bytes; the modifications the 50 re-arms made.
  static func rearmCalls(_ fixture: Fixture, throughSource: Bool, untilNothing: Bool = false) -> Int {
    let fence = try! DescriptorFence.shared("rearmCalls")
    let (readEnd, writeEnd) = fixture.make()
    let source = try! ReadSource(fileDescriptor: readEnd, queue: Queue(label: "read.rearm"))
    let received = Recorder<UInt8>()
    let handled = Counter()
    source.setEventHandler { [unowned source] in
      while ReadSourceTests.readOnce(source, 64, throughSource: throughSource, into: received) != nil && untilNothing {}
      handled.increment()
    }
    // The end waits for the source to leave the fence (its cancel handler runs after that) before
    // it closes the writer: the hang-up of a descriptor still registered may cost a modification
    // that the next case's window counts (one CI run under TSan: 2 in a case that makes 1).
    let cancelled = Event()
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    let before = fence.modifications.load(ordering: .relaxed)
    for round in 1...50 {
      _ = write(writeEnd, "x", 1)
      if !pollUntil({ handled.current == round && fence.isArmed(source.watch!) }) {
        failChild("\(fixture) round \(round): the handler did not run, or its source did not wait again")
      }
    }
    let calls = fence.modifications.load(ordering: .relaxed) - before
    if received.count != 50 { failChild("\(fixture): \(received.count) bytes of 50") }
    source.cancel()
    if !cancelled.wait() { failChild("\(fixture): the source's cancel handler did not run") }
    close(writeEnd)
    return calls
  }

  @Test(
    "waiting again after a handler that emptied a pipe or a TCP socket through read(into:) costs no epoll_ctl but the first time (which makes the registration persistent); after one that read on its own, or short on a Unix socket, one each time"
  )
  func emptiedDescriptorWaitsWithNoCall() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      ReadSourceTests.checkRearmCalls()
    }
    #expect(result?.exitStatus == .exitCode(0), "\(standardError(of: result))")
  }

  /// The exit test's body: each case's modifications in 50 re-arms.
  static func checkRearmCalls() {
    for fixture in [Fixture.pipe, .tcp] {
      let calls = ReadSourceTests.rearmCalls(fixture, throughSource: true)
      if calls != 1 { failChild("\(fixture) through read(into:): \(calls) modifications in 50 re-arms, not 1") }
    }
    let untilNothing = ReadSourceTests.rearmCalls(.unixSocket, throughSource: true, untilNothing: true)
    if untilNothing != 1 { failChild("Unix socket read until nil: \(untilNothing) modifications, not 1") }
    for (fixture, throughSource) in [(Fixture.pipe, false), (.tcp, false), (.unixSocket, true)] {
      let calls = ReadSourceTests.rearmCalls(fixture, throughSource: throughSource)
      if calls != 50 { failChild("\(fixture), through the source \(throughSource): \(calls) modifications, not 50") }
    }
    exit(0)
  }

  @Test(
    "a handler that reads one packet of a packet-mode pipe with read(into:) is called again for the next, as libdispatch's is",
    .timeLimit(.minutes(1)), arguments: [[100, 100, 100], [4_096, 10], [1, 2, 3, 4]])
  func packetPipeFiresForEveryPacket(writes: [Int]) async {
    var ends: [Int32] = [-1, -1]
    precondition(cgcd_pipe2(&ends, O_CLOEXEC | O_NONBLOCK | cgcd_o_direct()) == 0, "pipe2: errno \(errno)")
    let (readEnd, writeEnd) = (ends[0], ends[1])
    defer { close(writeEnd) }
    let source = try! ReadSource(fileDescriptor: readEnd, queue: Queue(label: "read.packets"))
    let packets = Recorder<Int>()
    source.setEventHandler { [unowned source] in
      // One read per event: a packet (a read of a packet pipe takes one write of up to 4,096 bytes).
      var buffer = [UInt8](repeating: 0, count: 8_192)
      if let got = try? buffer.withUnsafeMutableBytes({ try source.read(into: $0) }), got > 0 { packets.append(got) }
    }
    let cancelled = Event()
    source.setCancelHandler {
      close(readEnd)
      cancelled.signal()
    }
    for round in 0..<2 {
      // The first round's packets are queued before the source starts, the second's while it waits.
      for count in writes {
        let written = [UInt8](repeating: 7, count: count).withUnsafeBytes { write(writeEnd, $0.baseAddress, $0.count) }
        #expect(written == count, "write: errno \(errno)")
      }
      if round == 0 { source.resume() }
      #expect(
        await eventually { packets.count == writes.count * (round + 1) },
        "\(packets.values) for \(writes); queued \(system_queuedBytes(readEnd, output: false) ?? -1); \(DescriptorFence.instance.describe(source.watch!))"
      )
    }
    #expect(packets.values == writes + writes)
    source.cancel()
    #expect(await eventually { cancelled.isSignaled })
  }

  @Test("read(into:) reads, says nil for nothing now and 0 at the end of file, and throws EBADF naming the call")
  func readIntoResults() throws {
    let (readEnd, writeEnd) = makePipe()
    let source = try ReadSource(fileDescriptor: readEnd, queue: Queue(label: "read.into"))
    var buffer = [UInt8](repeating: 0, count: 8)
    #expect(try buffer.withUnsafeMutableBytes { try source.read(into: $0) } == nil)
    _ = write(writeEnd, "abc", 3)
    #expect(try buffer.withUnsafeMutableBytes { try source.read(into: $0) } == 3)
    #expect(buffer.prefix(3) == [97, 98, 99])
    close(writeEnd)
    #expect(try buffer.withUnsafeMutableBytes { try source.read(into: $0) } == 0)
    let cancelled = Event()
    source.setCancelHandler {
      close(readEnd)
      cancelled.signal()
    }
    source.cancel()
    #expect(cancelled.wait())
    let error = #expect(throws: GCDError.self) { try buffer.withUnsafeMutableBytes { try source.read(into: $0) } }
    #expect(error?.errno == EBADF)
    #expect(error?.operation.hasSuffix("read(into:): read") == true)
  }
  /// How the source ends while its handler is blocked on another thread.
  enum Ending: String, CaseIterable, Sendable { case cancel, drop }

  @Test(
    "cancelled or dropped while its handler runs, a read source still leaves the fence, then runs its cancel handler once",
    .timeLimit(.minutes(1)), arguments: Ending.allCases)
  func endsWhileHandlerRuns(_ ending: Ending) {
    // The cancel block that takes the watch out of the fence is installed by the cancel itself
    // (`Source.cleansUp`): with the handler running, libdispatch cannot change the handler at once
    // and queues the change on the source, which it drains before the cancel callout.
    let (left, right) = makeSocketPair()
    defer {
      close(left)
      close(right)
    }
    let queue = Queue(label: "read.ends-while-handling")
    var source: ReadSource? = try! ReadSource(fileDescriptor: left, queue: queue)
    let watch = source!.watch!
    let inHandler = Event()
    let release = Event()
    let cancelled = Counter()
    let cancelledOnce = Event()
    let calls = Counter()
    source!.setEventHandler {
      calls.increment()
      inHandler.signal()
      release.wait()
    }
    source!.setCancelHandler {
      cancelled.increment()
      cancelledOnce.signal()
    }
    source!.resume()
    _ = write(right, "x", 1)
    #expect(inHandler.wait())
    switch ending {
    case .cancel: source!.cancel()
    case .drop: source = nil
    }
    release.signal()
    #expect(cancelledOnce.wait())
    queue.sync {}
    #expect(cancelled.current == 1)
    #expect(calls.current == 1)
    #expect(!watch.inTable, "the watch is still in the fence")
    _ = source
  }

}
