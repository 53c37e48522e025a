import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Load and faults: a million tasks, a signal storm, pipes whose other end
/// dies with its process. The other cases of the list live with their type:
/// a process source on a process killed with SIGKILL
/// (ProcSourceTests.childExitFiresOnceWithExitData), a file-system source
/// whose file is deleted (FileSystemSourceTests.deleteIsReportedOnceAndThePathGoes,
/// and thousandSourcesInEveryStateLeakNoDescriptorAndNoWatch for its
/// descriptor), exact sums of merges from 4 threads (DataSourceTests, 4 ×
/// 100,000 merges for each data source type).
@Suite("Stress and faults")
struct StressTests {
  @Test("1,000,000 tasks from 4 threads across 8 serial queues: each runs once, in order per sender; exact checksum")
  func millionTasks() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runMillionTasks()
    }
    let text = standardError(of: result)
    #expect(text.contains("exit-test child: ok"), "\(text)")
  }

  @Test("a signal storm from 4 threads: the handler runs, never counts more than was sent, and the process lives")
  func signalStorm() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      runSignalStorm()
    }
    expectChildSaidOK(result)
  }

  @Test("a read source on a pipe whose writer process is killed: the data, then end of file; it cancels, closes once")
  func readSourceWriterDies() throws {
    let (readEnd, writeEnd) = try closeOnExecPipe()
    _ = fcntl(readEnd, F_SETFL, O_NONBLOCK)
    // The writer is the only holder of the write end: our copy is closed
    // once it has started (both ends are close-on-exec for every other child).
    let writer = try spawnProcess("/bin/sh", ["-c", "printf hello; exec sleep 600"], stdout: writeEnd)
    close(writeEnd)
    let received = Mutex<[UInt8]>([])
    let gotData = Event()
    let endOfFile = Counter()
    let closed = Event()
    let source = try ReadSource(fileDescriptor: readEnd, queue: Queue(label: "stress.writer.dies"))
    source.setEventHandler { [unowned source] in
      var buffer = [UInt8](repeating: 0, count: 256)
      while true {
        let count = read(readEnd, &buffer, buffer.count)
        if count > 0 {
          received.withLock { $0 += buffer.prefix(count) }
          gotData.signal()
        } else {
          if count == 0 {
            endOfFile.increment()
            source.cancel()
          }
          break
        }
      }
    }
    source.setCancelHandler {
      if close(readEnd) == 0 { closed.signal() }
    }
    source.resume()
    #expect(gotData.wait())
    kill(writer, SIGKILL)
    #expect(reapProcess(writer) & 0x7f == SIGKILL)
    #expect(closed.wait(), "end of file did not reach the handler, or the cancel handler did not close the pipe")
    #expect(String(decoding: received.withLock { $0 }, as: UTF8.self) == "hello")
    #expect(endOfFile.current == 1)
  }

  // The handler writes once and suspends the source (back-pressure: a
  // writable pipe would fire again at once), the reader process is killed,
  // the source is resumed. The pipe is not full: on Linux libdispatch never
  // reports a write source whose pipe is full when its reader goes away
  // (it ignores the EPOLLERR that is then the only event) — see
  // docs/reliability.md.
  @Test("a write source on a pipe whose reader process is killed: the next write fails with EPIPE (SIGPIPE ignored)")
  func writeSourceReaderDies() throws {
    signal(SIGPIPE, SIG_IGN)
    let (readEnd, writeEnd) = try closeOnExecPipe()
    _ = fcntl(writeEnd, F_SETFL, O_NONBLOCK)
    let reader = try spawnProcess("/bin/sleep", ["600"], stdin: readEnd)
    close(readEnd)
    let wrote = Event()
    let results = Recorder<Int32>()
    let closed = Event()
    let source = try WriteSource(fileDescriptor: writeEnd, queue: Queue(label: "stress.reader.dies"))
    source.setEventHandler { [unowned source] in
      let result = write(writeEnd, "x", 1)
      results.append(result == 1 ? 0 : errno)
      if result == 1 {
        source.suspend()
        wrote.signal()
      } else {
        source.cancel()
      }
    }
    source.setCancelHandler {
      if close(writeEnd) == 0 { closed.signal() }
    }
    source.resume()
    #expect(wrote.wait(), "no first write while the reader lives")
    kill(reader, SIGKILL)
    #expect(reapProcess(reader) & 0x7f == SIGKILL)
    // A process another test is starting may hold a copy of the read end
    // until its exec closes it (close-on-exec): wait until the pipe has no
    // reader left, which poll reports as POLLERR on the write end.
    #expect(pollUntil { pollEvents(writeEnd) & Int16(POLLERR) != 0 }, "the pipe kept a reader")
    source.resume()
    #expect(closed.wait(), "no event after the reader died, or the cancel handler did not close the pipe")
    #expect(results.values == [0, EPIPE])
  }

  // What the user must do: libdispatch and this package leave SIGPIPE alone,
  // so with its default disposition a write to a pipe without readers kills
  // the process before `write` can return EPIPE.
  @Test("the same write with SIGPIPE at its default disposition kills the process: ignore SIGPIPE (documented)")
  func writeSourceWithoutIgnoringSIGPIPE() async {
    await #expect(processExitsWith: .signal(SIGPIPE)) {
      writeToPipeWithoutReader()
    }
  }
}

// MARK: - Exit-test bodies

/// 4 threads each send 250,000 tasks, round robin, to 8 serial queues. Every
/// task checks that it comes after the previous task of its sender on its
/// queue (FIFO) and adds its value to its queue's sum.
private func runMillionTasks() -> Never {
  let senders = 4
  let queueCount = 8
  let perSender = runningUnderSanitizer ? 25_000 : 250_000
  let queues = (0..<queueCount).map { Queue(label: "stress.million.\($0)") }
  // Touched only on their own serial queue.
  let sums = (0..<queueCount).map { _ in UnsafeBox<UInt64>(0) }
  let counts = (0..<queueCount).map { _ in UnsafeBox<Int>(0) }
  let lastSeen = (0..<queueCount).map { _ in UnsafeBox([Int](repeating: -1, count: senders)) }
  let outOfOrder = Atomic<Int>(0)
  let sent = Group()
  for sender in 0..<senders {
    sent.async(on: .global()) {
      for index in 0..<perSender {
        let target = index % queueCount
        let value = UInt64(sender) << 32 | UInt64(index)
        queues[target].async {
          if lastSeen[target].value[sender] >= index { outOfOrder.add(1, ordering: .relaxed) }
          lastSeen[target].value[sender] = index
          sums[target].value &+= value
          counts[target].value += 1
        }
      }
    }
  }
  childCheck(sent.wait(timeout: .seconds(120)), "the senders did not finish")
  for queue in queues { queue.sync {} }
  let total = senders * perSender
  let expected = (0..<senders).reduce(UInt64(0)) { sum, sender in
    sum &+ UInt64(perSender) * (UInt64(sender) << 32) &+ UInt64(perSender * (perSender - 1) / 2)
  }
  let ran = queues.indices.reduce(0) { sum, index in sum + queues[index].sync { counts[index].value } }
  let checksum = queues.indices.reduce(UInt64(0)) { sum, index in sum &+ queues[index].sync { sums[index].value } }
  childCheck(ran == total, "\(ran) of \(total) tasks ran")
  childCheck(checksum == expected, "checksum \(checksum), expected \(expected)")
  childCheck(outOfOrder.load(ordering: .relaxed) == 0, "\(outOfOrder.load(ordering: .relaxed)) tasks out of order")
  endChild("ok: \(total) tasks")
}

/// 4 threads send SIGUSR1 to the process 2,500 times each while a source
/// counts the deliveries; afterwards the source still sees new signals.
private func runSignalStorm() -> Never {
  let threads = 4
  let perThread = 2_500
  signal(SIGUSR1, SIG_IGN)
  let queue = Queue(label: "stress.signals")
  let source: SignalSource
  do {
    source = try SignalSource(signal: SIGUSR1, queue: queue)
  } catch {
    endChild("failed: \(error)")
  }
  let counted = Atomic<UInt>(0)
  let calls = Atomic<Int>(0)
  let registered = Event()
  source.setRegistrationHandler { registered.signal() }
  source.setEventHandler { [unowned source] in
    counted.add(source.count, ordering: .relaxed)
    calls.add(1, ordering: .relaxed)
  }
  source.resume()
  childCheck(registered.wait(), "the source was not registered")
  let storm = Group()
  for _ in 0..<threads {
    storm.async(on: .global()) {
      for _ in 0..<perThread { kill(getpid(), SIGUSR1) }
    }
  }
  childCheck(storm.wait(timeout: .seconds(120)), "the senders did not finish")
  childCheck(pollUntil { calls.load(ordering: .relaxed) > 0 }, "the handler never ran")
  // New signals still arrive after the storm.
  let before = queue.sync { calls.load(ordering: .relaxed) }
  var later = 0
  childCheck(
    pollUntil {
      kill(getpid(), SIGUSR1)
      later += 1
      return calls.load(ordering: .relaxed) > before
    }, "no event for a signal sent after the storm")
  let sent = UInt(threads * perThread + later)
  let total = queue.sync { counted.load(ordering: .relaxed) }
  childCheck(total >= 1 && total <= sent, "counted \(total) deliveries of \(sent) signals sent")
  source.cancel()
  endChild("ok: \(total) deliveries counted in \(calls.load(ordering: .relaxed)) events")
}

/// A write source on a pipe whose read end is closed, with SIGPIPE at its
/// default disposition: the handler's write kills the process.
private func writeToPipeWithoutReader() {
  signal(SIGPIPE, SIG_DFL)
  let (readEnd, writeEnd) = makePipe()
  close(readEnd)
  let survived = Event()
  let source = try! WriteSource(fileDescriptor: writeEnd, queue: Queue(label: "stress.sigpipe"))
  source.setEventHandler {
    _ = write(writeEnd, "x", 1)
    survived.signal()
  }
  source.resume()
  exitIfSurvived(waitingFor: survived)
}

// MARK: - Helpers

/// The events `poll` reports for `descriptor` right now.
private func pollEvents(_ descriptor: Int32) -> Int16 {
  var entry = pollfd(fd: descriptor, events: Int16(POLLOUT), revents: 0)
  return poll(&entry, 1, 0) == 1 ? entry.revents : 0
}

/// A pipe whose two ends are close-on-exec: a child started by another test
/// meanwhile cannot inherit them (and hold back end of file or EPIPE); a
/// child given an end as its standard input or output gets a copy without
/// the flag.
private func closeOnExecPipe() throws -> (read: Int32, write: Int32) {
  // pipe2 is declared only under _GNU_SOURCE, which the Glibc module does not set.
  typealias Pipe2 = @convention(c) (UnsafeMutablePointer<Int32>, Int32) -> Int32
  guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "pipe2") else {
    throw GCDError(operation: "dlsym(pipe2)", errno: ENOSYS)
  }
  var ends: [Int32] = [-1, -1]
  guard unsafeBitCast(symbol, to: Pipe2.self)(&ends, O_CLOEXEC) == 0 else {
    throw GCDError(operation: "pipe2", errno: errno)
  }
  return (ends[0], ends[1])
}
