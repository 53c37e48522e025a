import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The descriptor fence (DescriptorFence; docs/sources-linux.md, "Descriptor sources: the fence"):
// one epoll instance for the process, a registration per descriptor with the union of its sources'
// interests, keyed by generation. Each test runs in a child process: the fence is the process's.
extension NestedEpollTests {
  @Test(
    "a descriptor closed under its live source, its number reused: a source on the new file fires, and the old source's cancel leaves it watched"
  )
  func reusedNumber() async {
    await expectChildSaysOK(.reusedNumber)
  }

  @Test("a closed descriptor still registered for a live source (closed under it) throws EBADF for a new source")
  func closedUnderLiveSourceThrows() async {
    await expectChildSaysOK(.closedUnderLiveSource)
  }

  @Test("the fence's reader is one thread for the process, named GCD.descriptors, with every signal blocked")
  func readerThread() async {
    await expectChildSaysOK(.readerThread)
  }

  @Test(
    "a write source that is not started adds nothing to its socket's registration (no call, no write interest); started, it fires"
  )
  func unstartedWriteSource() async {
    await expectChildSaysOK(.unstartedWriteSource)
  }

  @Test("a connection's read and write sources share one registration: each fires for its own direction, alone")
  func readAndWriteOnOneSocket() async {
    await expectChildSaysOK(.readAndWriteOnOneSocket)
  }
}

/// The children below, each run in a process of its own by `expectChildSaysOK`.
private enum FenceCheck: String, Codable, Sendable {
  case reusedNumber, closedUnderLiveSource, readerThread, unstartedWriteSource, readAndWriteOnOneSocket
  case manySourcesOnOneFile

  func run() -> Never {
    switch self {
    case .reusedNumber: checkReusedNumber()
    case .closedUnderLiveSource: checkClosedUnderLiveSource()
    case .readerThread: checkReaderThread()
    case .unstartedWriteSource: checkUnstartedWriteSource()
    case .readAndWriteOnOneSocket: checkReadAndWriteOnOneSocket()
    case .manySourcesOnOneFile: checkManySourcesOnOneFile()
    }
  }
}

/// Runs `check` in a child process and expects it to end with "exit-test child: ok" (else shows
/// what it wrote instead).
private func expectChildSaysOK(_ check: FenceCheck, sourceLocation: SourceLocation = #_sourceLocation) async {
  let result = await #expect(
    processExitsWith: .success, observing: [\.standardErrorContent], sourceLocation: sourceLocation
  ) { [check] in
    check.run()
  }
  expectChildSaidOK(result, sourceLocation: sourceLocation)
}

/// A read source on a pipe whose read end is closed while the source lives (a misuse the kernel
/// answers by dropping the registration), then a new pipe that gets the same number and a source on
/// it: the new source fires; cancelling the old one does not take the new registration away.
private func checkReusedNumber() -> Never {
  warmUpDispatch()
  let queue = Queue(label: "fence.reused")
  let (readEnd, writeEnd) = makePipe()
  let old = childTry { try ReadSource(fileDescriptor: readEnd, queue: queue) }
  old.setEventHandler {}
  old.resume()
  close(readEnd)
  close(writeEnd)
  let (again, otherWrite) = makePipe()
  childCheck(again == readEnd, "the new pipe's read end is \(again), not the reused \(readEnd)")
  let fired = Event()
  let new = childTry { try ReadSource(fileDescriptor: again, queue: queue) }
  new.setEventHandler {
    var byte: UInt8 = 0
    if read(again, &byte, 1) == 1 { fired.signal() }
  }
  new.resume()
  let oldCancelled = Event()
  old.setCancelHandler { oldCancelled.signal() }
  old.cancel()
  childCheck(oldCancelled.wait(), "the old source's cancel handler did not run")
  var byte: UInt8 = 7
  _ = write(otherWrite, &byte, 1)
  childCheck(fired.wait(), "the source on the reused number never fired")
  let newCancelled = Event()
  new.setCancelHandler { newCancelled.signal() }
  new.cancel()
  childCheck(newCancelled.wait(), "the new source's cancel handler did not run")
  close(again)
  close(otherWrite)
  endChild("ok: the reused number's source fired; the stale one went without touching it")
}

/// A source keeps its descriptor's entry in the fence after the descriptor is closed under it
/// (against the rule): a new source on the closed number must still throw `EBADF` from `init`, as
/// on any closed descriptor (found while chasing `ReadSourceTests.closedDescriptorThrows`, which
/// failed in 3 of 40 runs of the I/O suites under the scribbling allocator; that one was a number
/// reused by a parallel test).
private func checkClosedUnderLiveSource() -> Never {
  let (readEnd, writeEnd) = makePipe()
  let queue = Queue(label: "fence.closed.under")
  let live = childTry { try ReadSource(fileDescriptor: readEnd, queue: queue) }
  live.setEventHandler {}
  live.resume()
  close(readEnd)
  do {
    _ = try ReadSource(fileDescriptor: readEnd, queue: queue)
    endChild("failed: a read source on the closed descriptor \(readEnd) was made")
  } catch {
    childCheck(error.errno == EBADF, "the error was \(error), not EBADF")
  }
  let cancelled = Event()
  live.setCancelHandler { cancelled.signal() }
  live.cancel()
  childCheck(cancelled.wait(), "the live source's cancel handler did not run")
  close(writeEnd)
  endChild("ok: EBADF for a closed descriptor that a live source still had registered")
}

/// The threads named `GCD.descriptors` in this process, with their blocked-signal masks
/// (`SigBlk` in /proc/self/task/<tid>/status, hexadecimal).
private func readerThreads() -> [(tid: String, blocked: String)] {
  guard let directory = opendir("/proc/self/task") else { return [] }
  defer { closedir(directory) }
  var found: [(String, String)] = []
  while let entry = readdir(directory) {
    let tid = withUnsafeBytes(of: entry.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
    guard tid.first?.isNumber == true else { continue }
    let name = String(decoding: contentsOfFile("/proc/self/task/\(tid)/comm"), as: UTF8.self)
    guard name.split(separator: "\n").first == "GCD.descriptors" else { continue }
    let status = String(decoding: contentsOfFile("/proc/self/task/\(tid)/status"), as: UTF8.self)
    let blocked = status.split(separator: "\n").first { $0.hasPrefix("SigBlk:") }.map {
      String($0.dropFirst("SigBlk:".count).filter { !$0.isWhitespace })
    }
    found.append((tid, blocked ?? ""))
  }
  return found
}

/// Two descriptor sources, on a pipe and on a socket: the fence's reader thread exists once, with
/// every signal blocked (it never takes a signal another thread waits for).
private func checkReaderThread() -> Never {
  let (readEnd, writeEnd) = makePipe()
  let (mine, peer) = makeSocketPair()
  let queue = Queue(label: "fence.thread")
  let sources: [Source] = childTry {
    [try ReadSource(fileDescriptor: readEnd, queue: queue), try ReadSource(fileDescriptor: mine, queue: queue)]
  }
  let threads = readerThreads()
  childCheck(threads.count == 1, "\(threads.count) threads named GCD.descriptors, not 1")
  // Bit n - 1 is signal n. SIGKILL (9) and SIGSTOP (19) cannot be blocked, and glibc keeps two
  // real-time signals for itself (32, 33), which `sigfillset` leaves out.
  let mask = UInt64(threads[0].blocked, radix: 16) ?? 0
  let expected = ~UInt64(0) & ~([9, 19, 32, 33].reduce(UInt64(0)) { $0 | UInt64(1) << ($1 - 1) })
  childCheck(
    mask & expected == expected,
    "the reader thread blocks \(threads[0].blocked), not every signal (SIGKILL, SIGSTOP aside)")
  let cancelled = Latch(count: sources.count)
  for source in sources {
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
  }
  childCheck(cancelled.wait(), "a cancel handler did not run")
  for descriptor in [readEnd, writeEnd, mine, peer] { close(descriptor) }
  endChild("ok: one reader thread, every signal blocked")
}

/// A connected socket with a started read source and a write source that is not started (a
/// server's connection whose replies have not blocked): the registration asks for reading only,
/// and the write source's handler does not run; once started, the write source fires when the
/// socket has room.
private func checkUnstartedWriteSource() -> Never {
  let (mine, peer) = makeSocketPair()
  // Full, so that no write interest can fire (and leave the registration) before it is looked at.
  _ = fcntl(mine, F_SETFL, fcntl(mine, F_GETFL) | O_NONBLOCK)
  _ = fcntl(peer, F_SETFL, fcntl(peer, F_GETFL) | O_NONBLOCK)
  let chunk = [UInt8](repeating: 7, count: 4096)
  while (chunk.withUnsafeBytes { send(mine, $0.baseAddress, $0.count, 0) }) > 0 {}
  let queue = Queue(label: "fence.unstarted")
  let (reader, writer) = childTry { try makeReadAndWriteSources(on: mine, queue: queue) }
  let writes = Atomic<Int>(0)
  let writable = Event()
  reader.setEventHandler {}
  writer.setEventHandler { [unowned writer] in
    writes.add(1, ordering: .relaxed)
    writer.suspend()
    writable.signal()
  }
  reader.resume()
  let fences = epollInstances(watching: mine)
  childCheck(fences.count == 1, "\(fences.count) epoll instances watch the socket, not 1 (the fence)")
  let fence = fences.first!
  let inbound: UInt32 = 0x001  // EPOLLIN
  let outbound: UInt32 = 0x004  // EPOLLOUT
  let before = epollInterests(of: fence)?[mine] ?? 0
  childCheck(
    before & inbound != 0 && before & outbound == 0,
    "the socket's registration asks for \(String(before, radix: 16)), not reading alone")
  queue.sync {}
  childCheck(writes.load(ordering: .relaxed) == 0, "the write source's handler ran before it was started")
  writer.resume()
  var sink = [UInt8](repeating: 0, count: 65536)
  while recv(peer, &sink, sink.count, 0) > 0 {}
  childCheck(writable.wait(), "the started write source never fired once its socket had room")
  let cancelled = Latch(count: 2)
  for source in [reader, writer] as [Source] {
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
  }
  childCheck(cancelled.wait(), "a cancel handler did not run")
  childCheck(
    pollUntil { !(epollTargets(of: fence) ?? []).contains(mine) },
    "the fence still watches the socket after both cancels")
  close(mine)
  close(peer)
  endChild("ok: the unstarted write source added nothing; started, it fired")
}

/// A connected socket, idle: its write source fires (buffer space), its read source does not until
/// the peer sends; then the read source fires, with the bytes queued as its data.
private func checkReadAndWriteOnOneSocket() -> Never {
  let (mine, peer) = makeSocketPair()
  let queue = Queue(label: "fence.both")
  let reads = Atomic<Int>(0)
  let readData = Atomic<UInt>(0)
  let writable = Event()
  let readable = Event()
  let (reader, writer) = childTry { try makeReadAndWriteSources(on: mine, queue: queue) }
  reader.setEventHandler { [unowned reader] in
    reads.add(1, ordering: .relaxed)
    readData.store(reader.data, ordering: .relaxed)
    var buffer = [UInt8](repeating: 0, count: 64)
    _ = read(mine, &buffer, buffer.count)
    readable.signal()
  }
  writer.setEventHandler { [unowned writer] in
    // Writable once: suspended so that its level does not keep it firing.
    writer.suspend()
    writable.signal()
  }
  reader.resume()
  writer.resume()
  childCheck(writable.wait(), "the write source of an idle socket never fired")
  // The write source's event and its re-arm did not report the read direction: nothing to read.
  queue.sync {}
  childCheck(reads.load(ordering: .relaxed) == 0, "the read source fired with nothing to read")
  let bytes = [UInt8](repeating: 1, count: 40)
  _ = bytes.withUnsafeBytes { send(peer, $0.baseAddress, $0.count, 0) }
  childCheck(readable.wait(), "the read source never fired after the peer sent")
  childCheck(
    readData.load(ordering: .relaxed) == 40, "the read source's data was \(readData.load(ordering: .relaxed)), not 40")
  let cancelled = Latch(count: 2)
  for source in [reader, writer] as [Source] {
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
  }
  writer.resume()
  childCheck(cancelled.wait(), "a cancel handler did not run")
  close(mine)
  close(peer)
  endChild("ok: one socket, a read and a write source, each fired for its own direction")
}

// The kernel allows at most 500 paths through nested epoll instances to one open file
// (`reverse_path_check`): with a nest per source, the 501st source on one file — dups of one
// socket, or the same descriptor — failed its registration in libdispatch (EINVAL, unseen: its
// registration handler still ran) and never fired (100 of these 600 sources, before a limit of 64
// nests per file, past which sources were watched directly and unfenced). In the fence each
// descriptor number is registered once, with all its sources: every one is fenced.
extension NestedEpollTests {
  @Test("600 read sources on one socket (dups and the descriptor itself) all register and all fire")
  func manySourcesOnOneFile() async {
    await expectChildSaysOK(.manySourcesOnOneFile)
  }
}

private func checkManySourcesOnOneFile() -> Never {
  let count = 600
  let (mine, peer) = makeSocketPair()
  let descriptors = (0..<count).map { $0.isMultiple(of: 2) ? mine : dup(mine) }
  let queue = Queue(label: "nest.one.file")
  let registered = Latch(count: count)
  let fired = Latch(count: count)
  let sources = childTry { try descriptors.map { try ReadSource(fileDescriptor: $0, queue: queue) } }
  let firedOnce = Mutex<Set<Int>>([])
  for (index, source) in sources.enumerated() {
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler {
      if firedOnce.withLock({ $0.insert(index).inserted }) { fired.signal() }
    }
    source.resume()
  }
  childCheck(registered.wait(), "\(registered.count) of \(count) sources on one socket never registered")
  var byte: UInt8 = 1
  _ = send(peer, &byte, 1, 0)
  childCheck(fired.wait(), "\(fired.count) of \(count) sources on one readable socket never fired")
  let fenced = Set(descriptors).filter { descriptor in
    !epollInstances(watching: descriptor).isEmpty
  }.count
  childCheck(
    fenced == Set(descriptors).count, "\(fenced) of \(Set(descriptors).count) descriptors are in an epoll instance")
  let cancelled = Latch(count: count)
  for source in sources {
    source.setCancelHandler { cancelled.signal() }
    source.cancel()
  }
  requireInChild(cancelled, "cancel handlers did not run")
  for descriptor in Set(descriptors) { close(descriptor) }
  close(peer)
  endChild("ok: \(count) sources on one socket registered and fired, every descriptor fenced")
}
