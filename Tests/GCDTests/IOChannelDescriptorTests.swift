import CGCD
import Synchronization
import Testing

@testable import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// The fourth review's I/O defects (issue 52), each a test that failed on the tree it was found on:
// cancellation that belongs to its task, the end of file ending one read, packet pipes, barriers
// after close, one record per open descriptor shared by every channel and one-shot call over it.

/// A pipe (close-on-exec), optionally in packet mode (`O_DIRECT`).
private func makePipe(packets: Bool = false) -> (read: Int32, write: Int32) {
  var fds: [Int32] = [-1, -1]
  precondition(cgcd_pipe2(&fds, O_CLOEXEC | (packets ? cgcd_o_direct() : 0)) == 0, "pipe2: errno \(errno)")
  return (fds[0], fds[1])
}

/// One `write(2)` of `bytes`, expected whole.
private func writeAll(_ descriptor: Int32, _ bytes: [UInt8], sourceLocation: SourceLocation = #_sourceLocation) {
  let written = bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) }
  #expect(written == bytes.count, "write: errno \(errno)", sourceLocation: sourceLocation)
}

/// Reads `count` bytes from `descriptor` (fewer at its end, or when nothing comes for the generous
/// timeout), on a thread of its own: the wait never holds a thread of the cooperative pool, which
/// the other tests need.
private func readOnThread(_ descriptor: Int32, count: Int) async -> [UInt8] {
  await onThreadOfItsOwn {
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 65_536)
    let deadline = ContinuousClock.now + generousTimeout
    while bytes.count < count && ContinuousClock.now < deadline {
      var ready = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
      guard poll(&ready, 1, 100) > 0 else { continue }
      let got = chunk.withUnsafeMutableBytes {
        Glibc.read(descriptor, $0.baseAddress, min($0.count, count - bytes.count))
      }
      if got < 0 && (errno == EINTR || errno == EAGAIN) { continue }
      if got <= 0 { break }
      bytes += chunk[..<got]
    }
    return bytes
  }
}

/// The bytes queued in a pipe (`FIONREAD`).
private func bytesQueued(_ descriptor: Int32) -> Int {
  var count: Int32 = 0
  return ioctl(descriptor, UInt(FIONREAD), &count) == 0 ? Int(count) : -1
}

/// One read or write handler's calls: the bytes, and the final errno once `done`.
private final class Outcome: Sendable {
  let bytes = Mutex<[UInt8]>([])
  let error = Mutex<Int32?>(nil)
  let finished = Event()
  var handler: IOChannel.Handler {
    { done, data, error in
      if let data { self.bytes.withLock { $0 += Array(data) } }
      if done {
        self.error.withLock { $0 = error }
        self.finished.signal()
      }
    }
  }
  var finalError: Int32? { error.withLock { $0 } }
  var received: [UInt8] { bytes.withLock { $0 } }
}

extension IOChannelTests {
  @Test(
    "a cancelled task's read(upTo:) beside another task's waiting read leaves that read alone: it gets the next byte",
    .timeLimit(.minutes(1)))
  func cancelledReadLeavesWaitingRead() async throws {
    let fds = makePipe()
    defer { close(fds.write) }
    let channel = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "t")) { close($0) }
    let waiting = Task { try await Array(channel.read(upTo: 16)) }
    #expect(await eventually { channel.reader.state.withLock { $0.isWaiting } })
    let cancelled = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      return try await channel.read(upTo: 16)
    }
    await #expect(throws: GCDError.self) { try await cancelled.value }
    writeAll(fds.write, [7])
    #expect(try await waiting.value == [7])
    // The channel reads on.
    writeAll(fds.write, [8])
    #expect(try await Array(channel.read(upTo: 16)) == [8])
  }

  @Test(
    "end of file ends one read, not the channel: a FIFO that gets a new writer is read again, by handler and awaited",
    .timeLimit(.minutes(1)))
  func endOfFileEndsOneRead() async throws {
    let directory = TemporaryDirectory()
    let path = directory.path + "/fifo"
    #expect(mkfifo(path, 0o600) == 0)
    let reading = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
    try #require(reading >= 0)
    let channel = IOChannel(fileDescriptor: reading, type: .stream, queue: Queue(label: "t")) { close($0) }
    for round in 0..<3 {
      let writer = open(path, O_WRONLY | O_CLOEXEC)
      try #require(writer >= 0)
      writeAll(writer, [UInt8(round)])
      close(writer)
      if round == 1 {
        // Awaited: the byte, then the end of file.
        #expect(try await Array(channel.read(upTo: 8)) == [UInt8(round)])
        #expect(try await channel.read(upTo: 8).isEmpty)
      } else {
        let read = Outcome()
        channel.read(length: 100, queue: Queue(label: "h"), handler: read.handler)
        #expect(await eventually { read.finished.isSignaled })
        #expect(read.received == [UInt8(round)], "round \(round)")
        #expect(read.finalError == 0)
      }
    }
    withExtendedLifetime(directory) {}
  }

  @Test(
    "a write(_:) whose task is cancelled after the write ended returns normally and leaves the writes going",
    .timeLimit(.minutes(1)))
  func cancelAfterWriteEndedStopsNothing() async throws {
    let fds = makePipe()
    defer { close(fds.read) }
    let channel = IOChannel(fileDescriptor: fds.write, type: .stream, queue: Queue(label: "t")) { close($0) }
    let executor = Queue(label: "writer's executor")
    let size = 1 << 20
    let writer = Task(executorPreference: executor) { try await channel.write([UInt8](repeating: 1, count: size)) }
    // The pipe holds 64 KiB: the write fills it and waits for room. Then hold the task's executor,
    // so that the task cannot return before it is cancelled, and let the write end.
    #expect(await eventually { bytesQueued(fds.read) >= 65_536 })
    executor.suspend()
    let drained = Task { await readOnThread(fds.read, count: size) }
    #expect(await drained.value.count == size)
    writer.cancel()
    executor.resume()
    try await writer.value
    // The channel's writes go on.
    try await channel.write([2, 3])
    #expect(await readOnThread(fds.read, count: 2) == [2, 3])
  }

  @Test(
    "an awaited write(_:) that waited for room leaves nothing behind: the engine is freed once the channel ends",
    .timeLimit(.minutes(1)))
  func awaitedWriteLeavesNoCycle() async throws {
    let fds = makePipe()
    defer { close(fds.read) }
    let cleaned = Event()
    var channel: IOChannel? = IOChannel(fileDescriptor: fds.write, type: .stream, queue: Queue(label: "t")) { fd in
      close(fd)
      cleaned.signal()
    }
    weak let engine = channel!.engine
    let size = 1 << 20
    // More than the pipe holds: the rest is handed to the engine, and the call waits for it.
    let writer = Task { [channel] in try await channel!.write([UInt8](repeating: 3, count: size)) }
    #expect(await readOnThread(fds.read, count: size).count == size)
    try await writer.value
    channel = nil
    #expect(await eventually { cleaned.isSignaled })
    #expect(await eventually { engine == nil }, "the engine outlived its channel: a cycle through the write's handler")
  }

  @Test(
    "IOChannel.read(fileDescriptor:length:) delivers what is there (3 bytes of up to 100), as dispatch_read does",
    .timeLimit(.minutes(1)))
  func oneShotReadDeliversWhatIsThere() async throws {
    let fds = makePipe()
    defer { close(fds.write) }
    writeAll(fds.write, [1, 2, 3])
    let got = Mutex<([UInt8], Int32)?>(nil)
    let done = Event()
    IOChannel.read(fileDescriptor: fds.read, length: 100, queue: Queue(label: "t")) { data, error in
      got.withLock { $0 = (Array(data), error) }
      done.signal()
    }
    #expect(await eventually { done.isSignaled })
    let outcome = try #require(got.withLock { $0 })
    #expect(outcome.0 == [1, 2, 3])
    #expect(outcome.1 == 0)
    close(fds.read)
  }

  @Test(
    "a barrier submitted after close() waits for the write submitted before it",
    .timeLimit(.minutes(1)))
  func barrierAfterCloseWaits() async throws {
    let fds = makePipe()
    defer { close(fds.read) }
    let cleaned = Event()
    let channel = IOChannel(fileDescriptor: fds.write, type: .stream, queue: Queue(label: "t")) { fd in
      close(fd)
      cleaned.signal()
    }
    let size = 1 << 20
    let write = Outcome()
    channel.write(data: [UInt8](repeating: 5, count: size), queue: Queue(label: "h"), handler: write.handler)
    channel.close()
    let barrier = Event()
    channel.barrier { barrier.signal() }
    // A quarter read: the engine wrote more after the barrier was submitted (its queue is serial),
    // and the write has not ended (the pipe holds 64 KiB): the barrier must not have run.
    let quarter = await readOnThread(fds.read, count: size / 4)
    #expect(quarter.count == size / 4)
    #expect(!barrier.isSignaled, "the barrier ran before the write submitted ahead of it ended")
    let rest = await readOnThread(fds.read, count: size - size / 4)
    #expect(rest.count == size - size / 4)
    #expect(await eventually { barrier.isSignaled })
    #expect(await eventually { write.finished.isSignaled })
    #expect(write.finalError == 0)
    #expect(await eventually { cleaned.isSignaled })
  }

  @Test(
    "a read submitted after close() behind a waiting barrier ends with ECANCELED after the barrier, as libdispatch's",
    .timeLimit(.minutes(1)))
  func refusedReadWaitsForBarrier() async throws {
    let fds = makePipe()
    defer { close(fds.write) }
    let channel = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "t")) { close($0) }
    let order = Mutex<[String]>([])
    let events = Queue(label: "h")
    channel.read(length: 1, queue: events) { done, _, error in
      if done { order.withLock { $0.append("read \(error)") } }
    }
    channel.barrier { order.withLock { $0.append("barrier") } }
    channel.close()
    channel.read(length: 1, queue: events) { done, _, error in
      if done { order.withLock { $0.append("late read \(error)") } }
    }
    // The first read waits for a byte; the barrier waits for it, and the late read for the barrier.
    // (The engine's queue has taken every submission before the byte comes.)
    await channel.engine!.queue.run {}
    writeAll(fds.write, [1])
    #expect(await eventually { order.withLock { $0.count } == 3 })
    // (The first read's handler runs on `events`, not ordered with the barrier's body.)
    let seen = order.withLock { $0 }
    #expect(Set(seen) == ["read 0", "barrier", "late read \(ECANCELED)"])
    #expect(seen.firstIndex(of: "barrier")! < seen.firstIndex(of: "late read \(ECANCELED)")!)
  }

  @Test(
    "a channel over a number whose descriptor was closed under another channel, and reused, reads the new descriptor",
    .timeLimit(.minutes(1)))
  func reusedNumberReadsNewDescriptor() async throws {
    let old = makePipe()
    defer { close(old.read) }
    // A channel over the old pipe's write end (write-only), left open.
    let first = IOChannel(fileDescriptor: old.write, type: .stream, queue: Queue(label: "t")) { _ in }
    let fresh = makePipe()
    defer { close(fresh.write) }
    // The number is closed under `first` and reused, at once (no other test can take it between).
    #expect(dup2(fresh.read, old.write) == old.write)
    #expect(fcntl(old.write, F_SETFD, FD_CLOEXEC) == 0)
    close(fresh.read)
    let number = old.write
    let second = IOChannel(fileDescriptor: number, type: .stream, queue: Queue(label: "t")) { _ in }
    writeAll(fresh.write, Array("new".utf8))
    let read = Outcome()
    second.read(length: 3, queue: Queue(label: "h"), handler: read.handler)
    #expect(await eventually { read.finished.isSignaled })
    #expect(read.finalError == 0)
    #expect(read.received == Array("new".utf8))
    second.close()
    first.close()
    withExtendedLifetime((first, second)) {}
    close(number)
  }

  @Test(
    "a write(_:) by a task already cancelled throws ECANCELED and stops nothing: a pipe, a socket",
    .timeLimit(.minutes(1)), arguments: [false, true])
  func alreadyCancelledWriteStopsNothing(socket: Bool) async throws {
    var pair: [Int32] = [-1, -1]
    if socket {
      #expect(socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &pair) == 0)
    } else {
      let fds = makePipe()
      pair = [fds.write, fds.read]
    }
    defer { close(pair[1]) }
    let channel = IOChannel(fileDescriptor: pair[0], type: .stream, queue: Queue(label: "t")) { close($0) }
    let cancelled = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      try await channel.write([1, 2, 3])
    }
    await #expect(throws: GCDError.self) { try await cancelled.value }
    // A task that was never cancelled writes.
    try await channel.write([9, 9])
    #expect(await readOnThread(pair[1], count: 2) == [9, 9])
  }

  @Test(
    "two channels reading one pipe: a read submitted while another channel's read runs waits for it, as io.c's",
    .timeLimit(.minutes(1)))
  func readsOverOneDescriptorStayInOrder() async throws {
    for round in 0..<5 {
      let fds = makePipe()
      let first = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "a")) { _ in }
      let second = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "b")) { _ in }
      let a = Outcome()
      let b = Outcome()
      first.read(length: 10, queue: Queue(label: "ha"), handler: a.handler)
      writeAll(fds.write, Array("hello".utf8))
      #expect(await eventually { a.received.count == 5 })
      second.read(length: 5, queue: Queue(label: "hb"), handler: b.handler)
      // The second engine has taken its read before the rest comes.
      await second.engine!.queue.run {}
      writeAll(fds.write, Array("world".utf8))
      #expect(await eventually { a.finished.isSignaled })
      #expect(a.received == Array("helloworld".utf8), "round \(round): second got \(b.received)")
      // Then the second read reads.
      writeAll(fds.write, Array("again".utf8))
      #expect(await eventually { b.finished.isSignaled })
      #expect(b.received == Array("again".utf8))
      first.close(stop: true)
      second.close(stop: true)
      withExtendedLifetime((first, second)) {}
      close(fds.write)
    }
  }

  @Test(
    "readAvailable beside another channel's waiting read ends at once with EAGAIN: the bytes are the other read's",
    .timeLimit(.minutes(1)))
  func readAvailableBesideAnotherChannelsRead() async throws {
    let fds = makePipe()
    defer { close(fds.write) }
    let first = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "a")) { _ in }
    let second = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "b")) { _ in }
    let waiting = Outcome()
    first.read(length: 100, queue: Queue(label: "ha"), handler: waiting.handler)
    // The first engine has taken its read (and the descriptor's read turn) before the second asks.
    await first.engine!.queue.run {}
    let now = Outcome()
    second.readAvailable(upTo: 10, queue: Queue(label: "hb"), handler: now.handler)
    #expect(await eventually { now.finished.isSignaled })
    #expect(now.finalError == EAGAIN)
    let awaited = try await second.readAvailable(upTo: 10)
    #expect(awaited.bytes.isEmpty && !awaited.ended)
    // The waiting read still gets what comes.
    writeAll(fds.write, [4])
    #expect(await eventually { waiting.received == [4] })
    first.close(stop: true)
    second.close(stop: true)
    withExtendedLifetime((first, second)) {}
    close(fds.read)
  }

  @Test(
    "a packet-mode pipe delivers every packet to a channel's reads, by handler and awaited",
    .timeLimit(.minutes(1)), arguments: [[6_000], [100, 100, 100], [4_096, 10]])
  func packetPipeDeliversEveryPacket(writes: [Int]) async throws {
    let total = writes.reduce(0, +)
    let bytes = (0..<total).map { UInt8(truncatingIfNeeded: $0) }
    /// The writes, each one `write(2)`: a packet each, and one of more than 4,096 bytes two.
    func writePackets(_ descriptor: Int32) {
      var start = 0
      for count in writes {
        writeAll(descriptor, Array(bytes[start..<start + count]))
        start += count
      }
    }
    let fds = makePipe(packets: true)
    defer { close(fds.write) }
    let channel = IOChannel(fileDescriptor: fds.read, type: .stream, queue: Queue(label: "t")) { close($0) }
    writePackets(fds.write)
    let read = Outcome()
    channel.read(length: total, queue: Queue(label: "h"), handler: read.handler)
    #expect(await eventually { read.finished.isSignaled })
    #expect(read.received == bytes, "\(read.received.count) of \(total) bytes")
    // Awaited, after the packets were written while no read was pending.
    writePackets(fds.write)
    var awaited: [UInt8] = []
    while awaited.count < total { awaited += try await channel.read(upTo: total) }
    #expect(awaited == bytes)
    channel.close(stop: true)
  }

  @Test(
    "one-shot writes and two channels over one pipe keep each write whole",
    .timeLimit(.minutes(1)))
  func writesOverOneDescriptorStayWhole() async throws {
    let fds = makePipe()
    defer { close(fds.read) }
    let first = IOChannel(fileDescriptor: fds.write, type: .stream, queue: Queue(label: "a")) { _ in }
    let second = IOChannel(fileDescriptor: fds.write, type: .stream, queue: Queue(label: "b")) { _ in }
    // Writes of 100 KiB each, larger than the pipe: each waits for room in parts.
    let size = 100 * 1024
    let writers: [UInt8] = Array(1...6)
    let done = Counter()
    for tag in writers {
      let data = DispatchBuffer([UInt8](repeating: tag, count: size))
      switch tag % 3 {
      case 0: first.write(data: data, queue: Queue(label: "h")) { finished, _, _ in if finished { done.increment() } }
      case 1: second.write(data: data, queue: Queue(label: "h")) { finished, _, _ in if finished { done.increment() } }
      default:
        IOChannel.write(fileDescriptor: fds.write, data: data, queue: Queue(label: "h")) { _, _ in done.increment() }
      }
    }
    let total = size * writers.count
    let received = await readOnThread(fds.read, count: total)
    #expect(received.count == total)
    // Each write's bytes are one run.
    var runs: [UInt8] = []
    for byte in received where runs.last != byte { runs.append(byte) }
    #expect(runs.count == writers.count, "\(runs.count) runs: the writes interleaved")
    #expect(Set(runs) == Set(writers))
    // The one-shot writes' handlers wait for every channel over the descriptor to end.
    #expect(await eventually { done.current == 4 })
    first.close()
    second.close()
    #expect(await eventually { done.current == writers.count })
    withExtendedLifetime((first, second)) {}
    close(fds.write)
  }
}
