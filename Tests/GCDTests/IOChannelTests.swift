import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// MARK: - Helpers

/// What `/proc/self/fd/N` says `descriptor` is ("pipe:[123]", "socket:[456]"):
/// unique per kernel object, so a test can check that no descriptor of this
/// process still refers to it, whatever numbers other tests reuse meanwhile.
private func kernelObject(_ descriptor: Int32) -> String {
  openDescriptorTargets()[descriptor] ?? "?"
}

/// Whether `descriptor` is still open as `object` (both ends of a pipe are
/// the same object, so for one end the number matters too).
private func isOpen(_ descriptor: Int32, as object: String) -> Bool {
  openDescriptorTargets()[descriptor] == object
}

/// Whether any open descriptor still refers to `object`.
private func isHeld(_ object: String) -> Bool { openDescriptorTargets().values.contains(object) }

/// The tests of this file that make pseudo-terminals run one at a time: the kernel gives a freed
/// terminal's number to the next one, so `pseudoTerminalRoundTrip`'s check that no descriptor of
/// this process holds its terminal's name saw `hungUpTerminalEndsWrites`' new terminal (one full
/// run, under load). (A child process's terminals do not count: the check reads this process's
/// descriptors.)
private let pseudoTerminals = try! Semaphore(value: 1)

/// `count` random bytes from /dev/urandom.
private func randomBuffer(_ count: Int) -> DispatchBuffer {
  let memory = malloc(count)!
  let fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC)
  var filled = 0
  while filled < count {
    let got = read(fd, memory + filled, count - filled)
    precondition(got > 0, "urandom: errno \(errno)")
    filled += got
  }
  close(fd)
  return DispatchBuffer(bytesNoCopy: UnsafeRawBufferPointer(start: memory, count: count), deallocator: .free)
}

/// An FNV-1a checksum over 8-byte words (and the tail bytes), region by region.
private func checksum(_ buffer: DispatchBuffer) -> UInt64 {
  var hash: UInt64 = 0xcbf2_9ce4_8422_2325
  var carry: [UInt8] = []
  func mix(_ word: UInt64) { hash = (hash ^ word) &* 0x100_0000_01b3 }
  buffer.enumerateRegions { bytes, _ in
    var index = 0
    while !carry.isEmpty && index < bytes.count {
      carry.append(bytes[index])
      index += 1
      if carry.count == 8 {
        mix(carry.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) })
        carry.removeAll()
      }
    }
    while index + 8 <= bytes.count {
      mix(bytes.loadUnaligned(fromByteOffset: index, as: UInt64.self))
      index += 8
    }
    carry.append(contentsOf: bytes[index...])
    return true
  }
  for byte in carry { mix(UInt64(byte)) }
  return hash
}

/// What a read or write handler saw: each call's bytes, and the final errno.
private final class Operation: Sendable {
  let deliveries = Mutex<[(done: Bool, count: Int)]>([])
  let bytes = Mutex(DispatchBuffer())
  let error = Mutex<Int32?>(nil)
  let finished = Event()
  let delivered = Event()

  var handler: IOChannel.Handler {
    { done, data, error in
      self.deliveries.withLock { $0.append((done, data?.count ?? 0)) }
      if let data, !data.isEmpty {
        self.bytes.withLock { $0.append(data) }
        self.delivered.signal()
      }
      if done {
        self.error.withLock { $0 = error }
        self.finished.signal()
      }
    }
  }
  var finalError: Int32? { error.withLock { $0 } }
  var received: [UInt8] { Array(bytes.withLock { $0 }) }
}

/// A cleanup handler's record: how often it ran, with which descriptor, on which queue.
private final class Cleanup: Sendable {
  let calls = Counter()
  let descriptor = Mutex<Int32?>(nil)
  let ran = Event()
  let closes: Bool
  init(closes: Bool = true) { self.closes = closes }

  var handler: @Sendable (Int32) -> Void {
    { fd in
      self.descriptor.withLock { $0 = fd }
      if self.closes { close(fd) }
      self.calls.increment()
      self.ran.signal()
    }
  }
}

private func write(_ descriptor: Int32, _ bytes: [UInt8]) {
  precondition(bytes.withUnsafeBytes { Glibc.write(descriptor, $0.baseAddress, $0.count) } == bytes.count)
}

// MARK: - Tests

@Suite("IOChannel", .timeLimit(.minutes(2)))
struct IOChannelTests {
  let queue = Queue(label: "io-tests")

  @Test(
    "64 MiB of random bytes cross a pipe between two channels (one per end) intact, and both descriptors are released")
  func pipeRoundTrip() async throws {
    let payload = randomBuffer(runningUnderSanitizer ? 8 << 20 : 64 << 20)
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let objects = (kernelObject(readEnd), kernelObject(writeEnd))
    let cleanups = (Cleanup(), Cleanup())
    var received = DispatchBuffer()
    do {
      let writer = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue, cleanup: cleanups.0.handler)
      let reader = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanups.1.handler)
      async let sent: Void = {
        try await writer.write(payload)
        writer.close()
      }()
      for try await chunk in reader.chunks() { received.append(chunk) }
      try await sent
    }
    #expect(received.count == payload.count)
    #expect(checksum(received) == checksum(payload))
    #expect(received == payload)
    #expect(await eventually { cleanups.0.calls.current == 1 && cleanups.1.calls.current == 1 })
    #expect(!isHeld(objects.0) && !isHeld(objects.1))
  }

  @Test(
    "64 MiB round trips through loopback TCP, three times: each side reads and writes through one channel at once, and both descriptors are released"
  )
  func tcpRoundTrip() async throws {
    // One C channel doing this stalled in about a third of the rounds (libdispatch's
    // epoll code; C shows it too). The package's socket channels write through a
    // second C channel, so every round must finish; a stalled one is stopped by the
    // deadline and fails instead of hanging the suite.
    let payload = randomBuffer(runningUnderSanitizer ? 8 << 20 : 64 << 20)
    let expected = checksum(payload)
    for round in 1...3 {
      let (client, server) = tcpPair()
      let objects = (kernelObject(client), kernelObject(server))
      let cleanups = (Cleanup(), Cleanup())
      var echoed = DispatchBuffer()
      let stalled = Event()
      do {
        let clientChannel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: cleanups.0.handler)
        let serverChannel = IOChannel(fileDescriptor: server, type: .stream, queue: queue, cleanup: cleanups.1.handler)
        let deadline = Task {
          try await Task.sleep(for: .seconds(30))
          stalled.signal()
          clientChannel.close(stop: true)
          serverChannel.close(stop: true)
        }
        defer { deadline.cancel() }
        async let served: Void = {
          while true {
            let chunk = try await serverChannel.read(upTo: 256 * 1024)
            if chunk.isEmpty { break }
            try await serverChannel.write(chunk)
          }
          shutdown(server, Int32(SHUT_WR))
        }()
        async let sent: Void = {
          try await clientChannel.write(payload)
          shutdown(client, Int32(SHUT_WR))
        }()
        do {
          while true {
            let chunk = try await clientChannel.read(upTo: 256 * 1024)
            if chunk.isEmpty { break }
            echoed.append(chunk)
          }
          try await sent
          try await served
        } catch  where stalled.isSignaled {
          Issue.record("round \(round) stalled: no progress for 30 s, so the channels were stopped (\(error))")
        }
      }
      #expect(!stalled.isSignaled, "round \(round) stalled")
      #expect(echoed.count == payload.count, "round \(round)")
      #expect(checksum(echoed) == expected, "round \(round)")
      #expect(await eventually { cleanups.0.calls.current == 1 && cleanups.1.calls.current == 1 }, "round \(round)")
      #expect(!isHeld(objects.0) && !isHeld(objects.1), "round \(round): the descriptor or its duplicate is still open")
    }
  }

  @Test(
    "a socket channel ends as one: a stop or a drop ends a waiting read; the cleanup runs once, no descriptor but the caller's is open, the caller's flags are restored"
  )
  func socketChannelEnds() {
    for ending in 0..<3 {
      let (client, server) = tcpPair()
      defer { close(server) }
      let object = kernelObject(client)
      let flagsBefore = fcntl(client, F_GETFL)
      let flagsAtCleanup = Mutex<Int32>(-1)
      let openAtCleanup = Mutex(0)
      let cleanup = Cleanup()
      let wrote = Operation()
      let waiting = Operation()
      do {
        let channel = IOChannel(fileDescriptor: client, type: .stream, queue: queue) { fd in
          flagsAtCleanup.withLock { $0 = fcntl(fd, F_GETFL) }
          openAtCleanup.withLock { $0 = openDescriptorTargets().values.filter { $0 == object }.count }
          cleanup.handler(fd)
        }
        #expect(fcntl(client, F_GETFL) & O_NONBLOCK != 0)
        // While the channel lives, the socket is open once: the caller's descriptor (the channel
        // reads and writes it on the package's own sources: no duplicate, no descriptor of its own).
        #expect(allOpenDescriptorTargets().values.filter { $0 == object }.count == 1)
        channel.write(data: [1, 2, 3], queue: queue, handler: wrote.handler)
        #expect(wrote.finished.wait())
        // A stop or a drop also ends a read that waits for bytes the peer never sends.
        if ending > 0 { channel.read(length: 10, queue: queue, handler: waiting.handler) }
        switch ending {
        case 0: channel.close()
        case 1: channel.close(stop: true)
        default: break  // dropped
        }
      }
      if ending > 0 {
        #expect(waiting.finished.wait(), "ending \(ending)")
        #expect(waiting.finalError == ECANCELED, "ending \(ending)")
      }
      #expect(cleanup.ran.wait(), "ending \(ending)")
      #expect(!pollBriefly { cleanup.calls.current > 1 }, "ending \(ending)")
      #expect(wrote.finalError == 0)
      #expect(flagsAtCleanup.withLock { $0 } == flagsBefore, "ending \(ending)")
      #expect(openAtCleanup.withLock { $0 } == 1, "ending \(ending): another descriptor of the socket at the cleanup")
      #expect(!isHeld(object), "ending \(ending)")
      var bytes = [UInt8](repeating: 0, count: 3)
      #expect(recv(server, &bytes, 3, Int32(MSG_WAITALL)) == 3)
      #expect(bytes == [1, 2, 3])
    }
  }

  @Test(
    "on a socket channel a barrier waits for the write and the read before it, and runs before the write after it"
  )
  func socketBarrier() {
    let (client, server) = tcpPair()
    defer { close(server) }
    let channel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: Cleanup().handler)
    let earlier = Operation()
    let read = Operation()
    let later = Operation()
    let barrierRan = Event()
    // What the barrier saw: its descriptor, and whether the later write's byte had reached the peer.
    let seen = Mutex<(descriptor: Int32, laterArrived: Bool)?>(nil)
    channel.write(data: [1, 2], queue: queue, handler: earlier.handler)
    channel.read(length: 2, queue: queue, handler: read.handler)
    channel.barrier {
      var byte: UInt8 = 0
      let arrived = recv(server, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)) == 1
      seen.withLock { $0 = (channel.fileDescriptor, arrived) }
      barrierRan.signal()
    }
    channel.write(data: [3], queue: queue, handler: later.handler)
    var first = [UInt8](repeating: 0, count: 2)
    #expect(recv(server, &first, 2, Int32(MSG_WAITALL)) == 2)
    // The read before the barrier still waits for the peer's bytes: the barrier must wait too.
    #expect(!pollBriefly { barrierRan.isSignaled })
    write(server, [8, 9])
    #expect(barrierRan.wait())
    #expect(later.finished.wait())
    var rest: UInt8 = 0
    #expect(recv(server, &rest, 1, Int32(MSG_WAITALL)) == 1)
    #expect(first == [1, 2] && rest == 3)
    #expect(read.finished.wait())
    #expect(read.received == [8, 9])
    #expect(seen.withLock { $0?.descriptor } == client)
    #expect(seen.withLock { $0?.laterArrived } == false, "the write after the barrier ran before it")
  }

  @Test(
    "a stream channel made from a socket channel reads and writes the socket; the descriptor is let go once both are done"
  )
  func socketChannelFromChannel() async throws {
    let (client, server) = tcpPair()
    defer { close(server) }
    let object = kernelObject(client)
    let firstCleanup = Cleanup()
    let secondCleanup = Cleanup(closes: false)
    do {
      let first = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: firstCleanup.handler)
      let second = IOChannel(channel: first, type: .stream, queue: queue, cleanup: secondCleanup.handler)
      try await second.write([4, 5, 6])
      var bytes = [UInt8](repeating: 0, count: 3)
      #expect(recv(server, &bytes, 3, Int32(MSG_WAITALL)) == 3)
      #expect(bytes == [4, 5, 6])
      write(server, [7])
      #expect(Array(try await second.read(upTo: 10)) == [7])
      first.close()
      #expect(
        !blocking { pollBriefly { firstCleanup.ran.isSignaled } },
        "the first cleanup ran while the second channel was open")
    }
    #expect(await eventually { firstCleanup.ran.isSignaled && secondCleanup.ran.isSignaled })
    #expect(firstCleanup.calls.current == 1 && secondCleanup.calls.current == 1)
    #expect(!isHeld(object))
  }

  @Test(
    "dropping a channel while a read waits on a pipe whose writer stays open ends the read with ECANCELED and releases the descriptor"
  )
  func droppedMidRead() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let object = kernelObject(readEnd)
    let cleanup = Cleanup()
    let read = Operation()
    do {
      let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
      channel.read(length: 1024, queue: queue, handler: read.handler)
    }
    #expect(read.finished.wait())
    #expect(read.finalError == ECANCELED)
    #expect(cleanup.ran.wait())
    #expect(!isOpen(readEnd, as: object))
    #expect(!pollBriefly { cleanup.calls.current > 1 })
  }

  @Test(
    "close(stop: true) wakes a read waiting on a pipe that never gets data; a plain close() lets it wait (C semantics)")
  func closeStopWakesRead() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    let read = Operation()
    channel.read(length: 1024, queue: queue, handler: read.handler)
    channel.close()
    #expect(!read.finished.wait(timeout: briefTimeout))
    #expect(!cleanup.ran.isSignaled)
    channel.close(stop: true)
    #expect(read.finished.wait())
    #expect(read.finalError == ECANCELED)
    #expect(cleanup.ran.wait())
    #expect(channel.fileDescriptor == -1)
    let late = Operation()
    channel.read(length: 1, queue: queue, handler: late.handler)
    #expect(late.finished.wait())
    #expect(late.finalError == ECANCELED)
  }

  @Test(
    "a cancelled read(upTo:) throws ECANCELED (the task was cancelled) promptly, stops the reads, and later reads throw ECANCELED"
  )
  func cancelledReader() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    let started = Event()
    let task = Task {
      started.signal()
      return try await channel.read(upTo: 100)
    }
    #expect(await eventually { started.isSignaled })
    task.cancel()
    await #expect(
      throws: GCDError(operation: "IOChannel.read(upTo: 100)", errno: ECANCELED, detail: "the task was cancelled")
    ) {
      try await task.value
    }
    #expect(await eventually { cleanup.ran.isSignaled })
    await #expect(throws: GCDError(operation: "IOChannel.read(upTo: 5)", errno: ECANCELED)) {
      try await channel.read(upTo: 5)
    }
    let already = Task {
      withUnsafeCurrentTask { $0?.cancel() }
      return try await IOChannel(fileDescriptor: -1, type: .stream, queue: queue) { _ in }.read(upTo: 1)
    }
    await #expect(throws: (any Error).self) { try await already.value }
  }

  @Test(
    "read(upTo:) returns what arrived (at most the limit), keeps the rest for the next call, and an empty buffer at end of file"
  )
  func readUpTo() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    write(writeEnd, Array(0..<10))
    let first = try await channel.read(upTo: 4)
    #expect(Array(first) == [0, 1, 2, 3])
    var rest: [UInt8] = []
    while rest.count < 6 { rest += Array(try await channel.read(upTo: 100)) }
    #expect(rest == Array(4..<10))
    close(writeEnd)
    #expect(try await channel.read(upTo: 100).isEmpty)
    #expect(try await channel.read(upTo: 100).isEmpty)
    #expect(try await channel.read(upTo: 0).isEmpty)
  }

  @Test(
    "read(upTo:) of bytes already in a pipe keeps the channel's order and marks: after a barrier, held back by a low-water mark, cut by a high-water mark"
  )
  func readUpToKeepsOrderAndMarks() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    write(writeEnd, [1, 2, 3])
    // A barrier submitted first runs first: the read that could take the bytes at once waits.
    let taken = Mutex<UInt8?>(nil)
    channel.barrier {
      var byte: UInt8 = 0
      let got = Glibc.read(readEnd, &byte, 1)
      taken.withLock { $0 = got == 1 ? byte : nil }
    }
    #expect(Array(try await channel.read(upTo: 10)) == [2, 3])
    #expect(taken.withLock { $0 } == 1)
    // A low-water mark of 4 holds two bytes back until two more come.
    channel.setLimit(lowWater: 4)
    write(writeEnd, [4, 5])
    let returned = Event()
    let reading = Task {
      defer { returned.signal() }
      return Array(try await channel.read(upTo: 10))
    }
    #expect(await Queue(label: "io.wait").run { !returned.wait(timeout: briefTimeout) })
    write(writeEnd, [6, 7])
    #expect(try await reading.value == [4, 5, 6, 7])
    // A high-water mark of 2 cuts what a read returns; the rest comes next.
    channel.setLimit(lowWater: 1, highWater: 2)
    write(writeEnd, [8, 9, 10])
    #expect(Array(try await channel.read(upTo: 10)) == [8, 9])
    #expect(Array(try await channel.read(upTo: 10)) == [10])
    channel.close()
    #expect(await Queue(label: "io.wait").run { cleanup.ran.wait() })
    #expect(cleanup.calls.current == 1)
  }

  @Test(
    "read(upTo:) of a socket another thread writes in chunks of random sizes: every byte in order at random limits (reads on the caller's thread and waits mixed); a close(stop:) halfway ends them with ECANCELED"
  )
  func readUpToInOrderUnderLoad() async throws {
    let seed = SeededRandom.runSeed
    for round in 0..<3 {
      let (mine, peer) = makeSocketPair(closeOnExec: true)
      let cleanup = Cleanup()
      let channel = IOChannel(fileDescriptor: mine, type: .stream, queue: queue, cleanup: cleanup.handler)
      let total = 300_000
      let written = Event()
      Queue(label: "io-tests.writer").async {
        defer { written.signal() }
        var random = SeededRandom(seed: seed &+ UInt64(round))
        var sent = 0
        while sent < total {
          let count = min(total - sent, Int(random.next() % 1500) + 1)
          let chunk = (sent..<sent + count).map { UInt8(truncatingIfNeeded: $0 &* 7) }
          var offset = 0
          while offset < count {
            let wrote = chunk.withUnsafeBytes { Glibc.write(peer, $0.baseAddress! + offset, count - offset) }
            if wrote > 0 {
              offset += wrote
            } else if wrote < 0 && errno == EAGAIN {
              var ready = pollfd(fd: peer, events: Int16(POLLOUT), revents: 0)
              _ = poll(&ready, 1, 1000)
            } else {
              return  // the reader is gone (the stopped round)
            }
          }
          sent += count
        }
      }
      var random = SeededRandom(seed: seed &+ 100 &+ UInt64(round))
      var received = 0
      let stopAt = round == 2 ? total / 2 : total
      while received < stopAt {
        let chunk = try await channel.read(upTo: Int(random.next() % 700) + 1)
        try #require(!chunk.isEmpty, "seed \(seed), round \(round): end of file after \(received) bytes")
        if let wrong = chunk.enumerated().first(where: { $1 != UInt8(truncatingIfNeeded: (received + $0) &* 7) }) {
          Issue.record("seed \(seed), round \(round): byte \(received + wrong.offset) is \(wrong.element)")
          return
        }
        received += chunk.count
      }
      if round == 2 {
        channel.close(stop: true)
        await #expect(throws: GCDError.self) {
          while true { _ = try await channel.read(upTo: 100) }
        }
      }
      channel.close()
      #expect(await Queue(label: "io.wait").run { cleanup.ran.wait() })
      // The channel closed its end: a writer still writing gets EPIPE.
      #expect(await Queue(label: "io.wait").run { written.wait() })
      close(peer)
    }
  }

  @Test("end of file on a socket: the peer's close gives done with no error, and read(upTo:) an empty buffer")
  func socketEndOfFile() async throws {
    let (client, server) = tcpPair()
    let channel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: Cleanup().handler)
    write(server, [1, 2, 3])
    close(server)
    var received: [UInt8] = []
    while true {
      let chunk = try await channel.read(upTo: 1000)
      if chunk.isEmpty { break }
      received += chunk
    }
    #expect(received == [1, 2, 3])
    let (other, peer) = tcpPair()
    let read = Operation()
    let second = IOChannel(fileDescriptor: other, type: .stream, queue: queue, cleanup: Cleanup().handler)
    second.read(length: 1000, queue: queue, handler: read.handler)
    close(peer)
    #expect(await eventually { read.finished.isSignaled })
    #expect(read.finalError == 0)
  }

  @Test(
    "a write to a pseudo-terminal's master whose slave closed ends with EIO once the terminal is full, and so does the next (libdispatch's waits for good)"
  )
  func hungUpTerminalEndsWrites() {
    pseudoTerminals.wait()
    defer { _ = pseudoTerminals.signal() }
    // The master's writes fill the terminal's buffers (about 14 KB), then find no room, and the
    // hang-up wakes the write registration again at once: the engine spun a core on it (622,190
    // failed writes in 76 s in the differential's pty sequence 0x23528482b85840f8). The slave
    // closes before the writes (the first finds the terminal hung up), then while they wait.
    // A dropped channel's writes go on, and end the same way.
    for (closesFirst, drops) in [(true, false), (false, false), (false, true)] {
      let (master, slave, _) = makePseudoTerminal()
      if closesFirst { close(slave) }
      let cleanup = Cleanup()
      var channel: IOChannel? = IOChannel(
        fileDescriptor: master, type: .stream, queue: queue, cleanup: cleanup.handler)
      let errors = Mutex<[Int32]>([])
      for size in [1 << 20, 10] {
        channel!.write(data: [UInt8](repeating: 65, count: size), queue: queue) { done, _, error in
          if done { errors.withLock { $0.append(error) } }
        }
      }
      if drops { channel = nil }
      if !closesFirst {
        // The first write has filled what the terminal takes.
        var queued: Int32 = 0
        #expect(pollUntil { ioctl(slave, UInt(FIONREAD), &queued) == 0 && queued >= 4095 })
        close(slave)
      }
      #expect(pollUntil { errors.withLock { $0.count } == 2 }, "the writes never ended (closesFirst \(closesFirst))")
      #expect(errors.withLock { $0 } == [EIO, EIO])
      channel?.close(stop: true)
      #expect(cleanup.ran.wait())
    }
    let (master, slave, _) = makePseudoTerminal()
    close(slave)
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: master, type: .stream, queue: queue, cleanup: cleanup.handler)
    // Its reads end with EIO too, as the kernel's read says.
    let read = Mutex<Int32?>(nil)
    channel.read(length: 10, queue: queue) { done, _, error in
      if done { read.withLock { $0 = error } }
    }
    #expect(pollUntil { read.withLock { $0 } != nil })
    #expect(read.withLock { $0 } == EIO)
    channel.close(stop: true)
    #expect(cleanup.ran.wait())
  }

  @Test(
    "a stream channel's read of bytes already queued takes them at once, without registering the descriptor; one that finds none waits for it"
  )
  func readsQueuedBytesFirst() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    write(writeEnd, [1, 2, 3])
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    let first = Mutex<(bytes: [UInt8], error: Int32)?>(nil)
    channel.read(length: 3, queue: queue) { done, data, error in
      if done { first.withLock { $0 = (data.map { Array($0) } ?? [], error) } }
    }
    #expect(pollUntil { first.withLock { $0 } != nil })
    #expect(first.withLock { $0?.bytes } == [1, 2, 3])
    // The engine asked the pipe first: no read source, so the fence never watched the pipe.
    #expect(epollInstances(watching: readEnd).isEmpty)
    let second = Mutex<[UInt8]?>(nil)
    channel.read(length: 1, queue: queue) { done, data, _ in
      if done { second.withLock { $0 = data.map { Array($0) } ?? [] } }
    }
    // Nothing queued: the read waits for the pipe, which the fence now watches.
    #expect(pollUntil { !epollInstances(watching: readEnd).isEmpty })
    #expect(second.withLock { $0 } == nil)
    write(writeEnd, [4])
    #expect(pollUntil { second.withLock { $0 } != nil })
    #expect(second.withLock { $0 } == [4])
    channel.close()
    #expect(cleanup.ran.wait())
  }

  @Test(
    "readAvailable takes what a pipe holds now and does not wait: bytes while another copy of the write end stays open, EAGAIN for nothing, then the end of file"
  )
  func readAvailableTakesWhatIsThere() async throws {
    // Close-on-exec: a child another test spawns meanwhile must not hold the write end.
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false, closeOnExec: true)
    // A grandchild's copy of the write end: the end of file will not come while it is open.
    let heldCopy = fcntl(writeEnd, F_DUPFD_CLOEXEC, 0)
    write(writeEnd, [1, 2, 3, 4, 5])
    close(writeEnd)
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    let first = try await channel.readAvailable(upTo: .max)
    #expect(Array(first.bytes) == [1, 2, 3, 4, 5])
    #expect(!first.ended)
    let nothing = try await channel.readAvailable(upTo: .max)
    #expect(nothing.bytes.isEmpty)
    #expect(!nothing.ended)
    // The callback form: once, done, with EAGAIN and no bytes.
    let calls = Recorder<(done: Bool, count: Int, error: Int32)>()
    let ended = Event()
    channel.readAvailable(upTo: 10, queue: queue) { done, data, error in
      calls.append((done, data?.count ?? 0, error))
      if done { ended.signal() }
    }
    #expect(await Queue(label: "io.wait").run { ended.wait() })
    #expect(calls.values.map(\.done) == [true])
    #expect(calls.values.first?.count == 0)
    #expect(calls.values.first?.error == EAGAIN)
    // Up to a length, and then what is left; the end of file once the copy is closed.
    write(heldCopy, [6, 7, 8])
    let two = try await channel.readAvailable(upTo: 2)
    #expect(Array(two.bytes) == [6, 7])
    #expect(!two.ended)
    close(heldCopy)
    let last = try await channel.readAvailable(upTo: .max)
    #expect(Array(last.bytes) == [8])
    #expect(last.ended)
    await #expect(throws: GCDError.self) { _ = try await channel.readAvailable(upTo: -1) }
    channel.close()
    #expect(await Queue(label: "io.wait").run { cleanup.ran.wait() })
  }

  @Test(
    "setLimit applies to the operations called after it: a running read keeps its low-water mark (as libdispatch's)")
  func limitsApplyToLaterOperations() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    channel.setLimit(lowWater: 1024)
    let first = Mutex<[(done: Bool, count: Int)]>([])
    channel.read(length: 4096, queue: queue) { done, data, _ in
      first.withLock { $0.append((done, data?.count ?? 0)) }
    }
    write(writeEnd, [UInt8](repeating: 5, count: 58))
    // The engine has taken the 58 bytes (below the read's mark of 1,024): nothing is delivered.
    var queued: Int32 = 0
    #expect(pollUntil { ioctl(readEnd, UInt(FIONREAD), &queued) == 0 && queued == 0 })
    channel.setLimit(lowWater: 1)
    // More bytes reach the running read: with its own mark (1,024) it still delivers nothing.
    write(writeEnd, [UInt8](repeating: 6, count: 10))
    #expect(pollUntil { ioctl(readEnd, UInt(FIONREAD), &queued) == 0 && queued == 0 })
    #expect(!pollBriefly { !first.withLock { $0 }.isEmpty }, "the running read delivered below its mark")
    // The writer's end completes the read with what it gathered.
    close(writeEnd)
    #expect(pollUntil { first.withLock { $0 }.last?.done == true })
    #expect(first.withLock { $0.map(\.count) }.reduce(0, +) == 68)
    channel.close()
    #expect(cleanup.ran.wait())
  }

  @Test("a peer that resets the connection ends the read with ECONNRESET")
  func peerReset() async throws {
    let (client, server) = tcpPair()
    let channel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: Cleanup().handler)
    let waiting = Task {
      var received: [UInt8] = []
      do {
        while true {
          let chunk = try await channel.read(upTo: 1000)
          if chunk.isEmpty { return (received, Int32(0)) }
          received += chunk
        }
      } catch let error as GCDError {
        return (received, error.errno)
      }
    }
    write(server, [7, 7])
    var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
    _ = setsockopt(server, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
    close(server)
    let (received, error) = try await waiting.value
    #expect(error == ECONNRESET)
    #expect(received.count <= 2)
  }

  @Test(
    "a write to a pipe whose reader is gone fails with EPIPE and the process lives on (SIGPIPE default -> do-nothing handler)"
  )
  func brokenPipe() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      writeToBrokenPipe()
    }
    #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
  }

  @Test("an ignored SIGPIPE stays ignored (the package changes only the default disposition)")
  func ignoredBrokenPipeLeftAlone() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      writeToBrokenPipeWithSIGPIPEIgnored()
    }
    #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
  }

  @Test("init(path:) throws at once: a missing file (ENOENT), a directory (EISDIR), a FIFO for random access (ESPIPE)")
  func pathErrors() throws {
    do {
      _ = try IOChannel(path: "/tmp/GCDTests-does-not-exist", flags: O_RDONLY, type: .stream, queue: queue)
      Issue.record("no error for a missing path")
    } catch {
      #expect(error.errno == ENOENT)
      #expect(error.operation.contains("/tmp/GCDTests-does-not-exist"))
    }
    #expect(throws: GCDError.self) { try IOChannel(path: "/tmp", flags: O_RDONLY, type: .stream, queue: queue) }
    do {
      _ = try IOChannel(path: "/tmp", flags: O_RDONLY, type: .randomAccess, queue: queue)
    } catch { #expect(error.errno == EISDIR) }
    let fifo = "/tmp/GCDTests-fifo-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    #expect(mkfifo(fifo, 0o600) == 0)
    defer { unlink(fifo) }
    do {
      _ = try IOChannel(path: fifo, flags: O_RDONLY | O_NONBLOCK, type: .randomAccess, queue: queue)
      Issue.record("no error for a FIFO opened for random access")
    } catch { #expect(error.errno == ESPIPE) }
    let stream = try IOChannel(path: fifo, flags: O_RDONLY | O_NONBLOCK, type: .stream, queue: queue)
    stream.close(stop: true)
  }

  @Test(
    "a relative path is opened against the current directory; the channel reads the file and closes its own descriptor")
  func relativePath() async throws {
    let contents = patternBytes(300_000)
    let file = temporaryFile(containing: contents)
    defer { unlink(file) }
    var directory = [CChar](repeating: 0, count: 4096)
    let cwd = String(cString: getcwd(&directory, directory.count)!)
    let relative = String(repeating: "../", count: cwd.split(separator: "/").count) + file.dropFirst()
    #expect(!relative.hasPrefix("/"))
    let cleanup = Cleanup(closes: false)
    do {
      let channel = try IOChannel(
        path: relative, flags: O_RDONLY, type: .randomAccess, queue: queue, cleanup: cleanup.handler)
      let read = Operation()
      channel.read(offset: 0, length: .max, queue: queue, handler: read.handler)
      #expect(await eventually { read.finished.isSignaled })
      #expect(read.finalError == 0)
      #expect(read.received == contents)
      let descriptor = channel.fileDescriptor
      #expect(descriptor >= 0)
      #expect(openDescriptorTargets()[descriptor] == file)
    }
    #expect(await eventually { cleanup.ran.isSignaled })
    #expect(!isHeld(file))
    #expect(cleanup.calls.current == 1)
  }

  @Test("errors a descriptor can only report later reach the read and the cleanup: EBADF, ESPIPE")
  func descriptorErrors() {
    let cleanup = Cleanup(closes: false)
    let bad = IOChannel(fileDescriptor: 1_000_000, type: .stream, queue: queue, cleanup: cleanup.handler)
    let read = Operation()
    bad.read(length: 10, queue: queue, handler: read.handler)
    #expect(read.finished.wait())
    #expect(read.finalError == EBADF)
    #expect(cleanup.ran.wait())
    #expect(cleanup.descriptor.withLock { $0 } == 1_000_000)

    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let pipeCleanup = Cleanup()
    let random = IOChannel(fileDescriptor: readEnd, type: .randomAccess, queue: queue, cleanup: pipeCleanup.handler)
    let seek = Operation()
    random.read(offset: 0, length: 10, queue: queue, handler: seek.handler)
    #expect(seek.finished.wait())
    #expect(seek.finalError == ESPIPE)
    #expect(pipeCleanup.ran.wait())
    #expect(random.unsafeObject == nil)
    #expect(random.fileDescriptor == -1)
    let stream = IOChannel(fileDescriptor: dup(writeEnd), type: .stream, queue: queue, cleanup: Cleanup().handler)
    let negative = Operation()
    stream.read(length: -1, queue: queue, handler: negative.handler)
    #expect(negative.finished.wait())
    #expect(negative.finalError == EINVAL)
  }

  @Test(
    "after a channel's error cleanup closes the descriptor, a new descriptor with the same number works (no stale libdispatch record)"
  )
  func numberReuseAfterError() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      reuseNumberAfterErrorCleanup()
    }
    #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
  }

  @Test("stream channels deliver small amounts at once (low water 1); libdispatch's 1 MiB low water holds them back")
  func lowWater() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    let prompt = Operation()
    channel.read(length: 1 << 20, queue: queue, handler: prompt.handler)
    write(writeEnd, [1, 2, 3])
    #expect(prompt.delivered.wait())
    #expect(prompt.received == [1, 2, 3])
    #expect(!prompt.finished.isSignaled)
    channel.close(stop: true)
    close(writeEnd)

    let (readEnd2, writeEnd2) = makePipe(nonBlockingRead: false)
    let held = IOChannel(fileDescriptor: readEnd2, type: .stream, queue: queue, cleanup: Cleanup().handler)
    held.setLimit(lowWater: 1 << 20)
    let waiting = Operation()
    held.read(length: 1 << 20, queue: queue, handler: waiting.handler)
    write(writeEnd2, [1, 2, 3])
    #expect(!waiting.delivered.wait(timeout: briefTimeout))
    close(writeEnd2)
    #expect(waiting.finished.wait())
    #expect(waiting.received == [1, 2, 3])
    #expect(waiting.finalError == 0)
  }

  @Test(
    "writes keep libdispatch's low-water mark: a 512 KiB write through a pipe or a socket reports once, when done; at 1 byte a pipe write reports its progress"
  )
  func writeProgress() {
    func partialReports(_ channel: IOChannel, into peer: Int32) -> Int {
      let write = Operation()
      channel.write(data: patternBytes(512 * 1024), queue: queue, handler: write.handler)
      // The peer drains 16 KiB at a time; a pipe holds 64 KiB, so the write ends in many parts.
      var drained = 0
      var bytes = [UInt8](repeating: 0, count: 16 * 1024)
      while drained < 512 * 1024 {
        let got = bytes.withUnsafeMutableBytes { Glibc.read(peer, $0.baseAddress, $0.count) }
        if got <= 0 { break }
        drained += got
      }
      #expect(write.finished.wait())
      #expect(write.finalError == 0 && drained == 512 * 1024)
      return write.deliveries.withLock { $0.filter { !$0.done }.count }
    }
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(readEnd) }
    let pipeChannel = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    #expect(partialReports(pipeChannel, into: readEnd) == 0)
    let (client, server) = tcpPair()
    defer { close(server) }
    let socketChannel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: Cleanup().handler)
    #expect(partialReports(socketChannel, into: server) == 0)
    // A pipe holds 64 KiB: at a low-water mark of 1 byte each partial write is reported.
    pipeChannel.setLimit(lowWater: 1)
    #expect(partialReports(pipeChannel, into: readEnd) > 0)
  }

  @Test("the high-water mark caps each delivery")
  func highWater() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    channel.setLimit(lowWater: 1, highWater: 4096)
    let read = Operation()
    channel.read(length: 60_000, queue: queue, handler: read.handler)
    write(writeEnd, patternBytes(60_000))
    #expect(read.finished.wait())
    close(writeEnd)
    #expect(read.received == patternBytes(60_000))
    let sizes = read.deliveries.withLock { $0.map(\.count) }
    #expect(sizes.allSatisfy { $0 <= 4096 })
    #expect(sizes.count >= 60_000 / 4096)
  }

  @Test("a strict interval delivers below the low-water mark; a non-strict one does not")
  func intervals() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let strict = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    strict.setLimit(lowWater: 1 << 20)
    strict.setInterval(.milliseconds(20), strict: true)
    let read = Operation()
    strict.read(length: 1 << 20, queue: queue, handler: read.handler)
    write(writeEnd, [9, 9])
    #expect(read.delivered.wait())
    #expect(read.received == [9, 9])
    #expect(!read.finished.isSignaled)
    strict.close(stop: true)
    close(writeEnd)

    let (readEnd2, writeEnd2) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd2) }
    let loose = IOChannel(fileDescriptor: readEnd2, type: .stream, queue: queue, cleanup: Cleanup().handler)
    loose.setLimit(lowWater: 1 << 20)
    loose.setInterval(.milliseconds(20))
    let held = Operation()
    loose.read(length: 1 << 20, queue: queue, handler: held.handler)
    write(writeEnd2, [9, 9])
    #expect(!held.delivered.wait(timeout: briefTimeout))
  }

  @Test("a barrier runs after the operations before it and before those after it, with the descriptor usable")
  func barriers() throws {
    let file = temporaryFile(containing: [])
    defer { unlink(file) }
    let channel = try IOChannel(path: file, flags: O_RDWR, type: .randomAccess, queue: queue)
    let first = Operation()
    let second = Operation()
    let seen = Mutex<[UInt8]>([])
    let barrierRan = Event()
    channel.write(offset: 0, data: [1, 2, 3], queue: queue, handler: first.handler)
    channel.barrier {
      let descriptor = channel.fileDescriptor
      var bytes = [UInt8](repeating: 0, count: 8)
      let count = pread(descriptor, &bytes, 8, 0)
      seen.withLock { $0 = Array(bytes.prefix(max(count, 0))) }
      barrierRan.signal()
    }
    channel.write(offset: 3, data: [4, 5], queue: queue, handler: second.handler)
    #expect(barrierRan.wait())
    #expect(second.finished.wait())
    #expect(first.finished.isSignaled)
    #expect(seen.withLock { $0 } == [1, 2, 3])
    #expect(contentsOfFile(file) == [1, 2, 3, 4, 5])
  }

  @Test("the cleanup runs exactly once however the channel ends: close(), close(stop:), dropped, dropped after close")
  func cleanupOnce() {
    for ending in 0..<4 {
      let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
      let cleanup = Cleanup()
      do {
        let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
        switch ending {
        case 0: channel.close()
        case 1: channel.close(stop: true)
        case 3:
          channel.close()
          channel.close(stop: true)
        default: break
        }
      }
      #expect(cleanup.ran.wait(), "ending \(ending)")
      #expect(!pollBriefly { cleanup.calls.current > 1 }, "ending \(ending)")
      close(writeEnd)
    }
  }

  @Test(
    "a pseudo-terminal's two ends carry 256 KiB each way at once, intact, through one stream channel each: no C channel, no duplicate descriptor; the cleanups run once, the flags come back"
  )
  func pseudoTerminalRoundTrip() async throws {
    try await pseudoTerminals.wait()
    defer { _ = pseudoTerminals.signal() }
    let terminal = makePseudoTerminal()
    let flags = (fcntl(terminal.master, F_GETFL), fcntl(terminal.slave, F_GETFL))
    let payloads = (randomBuffer(256 << 10), randomBuffer(256 << 10))
    let cleanups = (Cleanup(), Cleanup())
    let masterFlagsAtCleanup = Mutex<Int32>(-1)
    let slaveFlagsAtCleanup = Mutex<Int32>(-1)
    var received = (DispatchBuffer(), DispatchBuffer())
    do {
      let master = IOChannel(fileDescriptor: terminal.master, type: .stream, queue: queue) { fd in
        masterFlagsAtCleanup.withLock { $0 = fcntl(fd, F_GETFL) }
        cleanups.0.handler(fd)
      }
      let slave = IOChannel(fileDescriptor: terminal.slave, type: .stream, queue: queue) { fd in
        slaveFlagsAtCleanup.withLock { $0 = fcntl(fd, F_GETFL) }
        cleanups.1.handler(fd)
      }
      // On dispatch_io a terminal's channel wrote through a second C channel over a duplicate.
      #expect(master.unsafeObject == nil && slave.unsafeObject == nil)
      #expect(openDescriptorTargets().values.filter { $0 == terminal.name }.count == 1)
      async let toSlave: Void = master.write(payloads.0)
      async let toMaster: Void = slave.write(payloads.1)
      async let atSlave: DispatchBuffer = {
        var bytes = DispatchBuffer()
        while bytes.count < payloads.0.count { bytes.append(try await slave.read(upTo: 64 << 10)) }
        return bytes
      }()
      while received.1.count < payloads.1.count { received.1.append(try await master.read(upTo: 64 << 10)) }
      received.0 = try await atSlave
      try await toSlave
      try await toMaster
      master.close()
      slave.close()
    }
    #expect(received.0 == payloads.0)
    #expect(received.1 == payloads.1)
    #expect(await eventually { cleanups.0.calls.current == 1 && cleanups.1.calls.current == 1 })
    #expect(masterFlagsAtCleanup.withLock { $0 } == flags.0 && slaveFlagsAtCleanup.withLock { $0 } == flags.1)
    // No `isHeld(terminal.name)` check after the cleanups: the differential suite's pty profile
    // runs in this process too, and the kernel gives it the freed terminal number at once (a full
    // run failed so). The count above shows the channels held no descriptor of their own.
  }

  @Test(
    "character devices epoll cannot watch are streams too: /dev/zero gives 1 MiB of zeros, /dev/null ends a read at end of file at once and takes a 1 MiB write whole"
  )
  func deviceStreams() async throws {
    let zero = IOChannel(
      fileDescriptor: open("/dev/zero", O_RDONLY | O_CLOEXEC), type: .stream, queue: queue, cleanup: Cleanup().handler)
    var zeros = DispatchBuffer()
    while zeros.count < 1 << 20 { zeros.append(try await zero.read(upTo: (1 << 20) - zeros.count)) }
    #expect(zeros.count == 1 << 20 && zeros.allSatisfy { $0 == 0 })
    #expect(zero.unsafeObject == nil)
    let null = IOChannel(
      fileDescriptor: open("/dev/null", O_RDWR | O_CLOEXEC), type: .stream, queue: queue, cleanup: Cleanup().handler)
    #expect(try await null.read(upTo: 4096).isEmpty)
    try await null.write(randomBuffer(1 << 20))
  }

  @Test(
    "handlers run on the queue passed to each call, the cleanup on the creation queue; O_NONBLOCK is set, then restored before the cleanup"
  )
  func queuesAndFlags() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let key = Queue.SpecificKey<String>()
    let creation = Queue(label: "creation")
    creation.setSpecific(key, "creation")
    let handlers = Queue(label: "handlers")
    handlers.setSpecific(key, "handlers")
    let cleanupQueue = Mutex<String?>(nil)
    let flagsAtCleanup = Mutex<Int32>(-1)
    let cleaned = Event()
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: creation) { fd in
      cleanupQueue.withLock { $0 = Queue.currentSpecific(key) }
      flagsAtCleanup.withLock { $0 = fcntl(fd, F_GETFL) }
      close(fd)
      cleaned.signal()
    }
    let handlerQueue = Mutex<String?>(nil)
    let delivered = Event()
    channel.read(length: 10, queue: handlers) { _, _, _ in
      handlerQueue.withLock { $0 = Queue.currentSpecific(key) }
      delivered.signal()
    }
    write(writeEnd, [1])
    #expect(delivered.wait())
    #expect(handlerQueue.withLock { $0 } == "handlers")
    #expect(fcntl(readEnd, F_GETFL) & O_NONBLOCK != 0)
    channel.close(stop: true)
    #expect(cleaned.wait())
    #expect(cleanupQueue.withLock { $0 } == "creation")
    #expect(flagsAtCleanup.withLock { $0 } & O_NONBLOCK == 0)
  }

  @Test("one-shot IOChannel.read(fileDescriptor:) and write(fileDescriptor:) move the bytes once")
  func oneShot() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer {
      close(readEnd)
      close(writeEnd)
    }
    let wrote = Event()
    let writeError = Mutex<Int32>(-1)
    IOChannel.write(fileDescriptor: writeEnd, data: DispatchBuffer([5, 6, 7]), queue: queue) { remaining, error in
      writeError.withLock { $0 = error }
      #expect(remaining.isEmpty)
      wrote.signal()
    }
    #expect(wrote.wait())
    #expect(writeError.withLock { $0 } == 0)
    let read = Event()
    let bytes = Mutex<[UInt8]>([])
    IOChannel.read(fileDescriptor: readEnd, length: 3, queue: queue) { data, error in
      bytes.withLock { $0 = Array(data) }
      #expect(error == 0)
      read.signal()
    }
    #expect(read.wait())
    #expect(bytes.withLock { $0 } == [5, 6, 7])
  }

  @Test("a channel made from another shares its descriptor, which is let go once both are done")
  func channelFromChannel() async throws {
    let contents = patternBytes(10_000)
    let file = temporaryFile(containing: contents)
    defer { unlink(file) }
    let firstCleanup = Cleanup(closes: false)
    let secondCleanup = Cleanup(closes: false)
    do {
      let random = try IOChannel(
        path: file, flags: O_RDONLY, type: .randomAccess, queue: queue, cleanup: firstCleanup.handler)
      let stream = IOChannel(channel: random, type: .stream, queue: queue, cleanup: secondCleanup.handler)
      var received: [UInt8] = []
      for try await chunk in stream.chunks(maximumLength: 4096) { received += chunk }
      #expect(received == contents)
    }
    #expect(await eventually { firstCleanup.ran.isSignaled && secondCleanup.ran.isSignaled })
    #expect(!isHeld(file))
  }

  @Test(
    "after chunks() reaches end of file the channel stays open: an answer can still be written on the half-closed socket"
  )
  func chunksEndKeepsChannel() async throws {
    let (client, server) = tcpPair()
    defer { close(client) }
    let channel = IOChannel(fileDescriptor: server, type: .stream, queue: queue, cleanup: Cleanup().handler)
    write(client, [1, 2, 3])
    shutdown(client, Int32(SHUT_WR))
    var total = 0
    for try await chunk in channel.chunks() { total += chunk.count }
    #expect(total == 3)
    try await channel.write([9, 8])
    var answer = [UInt8](repeating: 0, count: 2)
    #expect(recv(client, &answer, 2, Int32(MSG_WAITALL)) == 2)
    #expect(answer == [9, 8])
  }

  @Test("breaking out of chunks() stops the channel although the writer stays open; each chunk respects the maximum")
  func chunksBreak() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(writeEnd) }
    let object = kernelObject(readEnd)
    let cleanup = Cleanup()
    write(writeEnd, patternBytes(5000))
    do {
      let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
      var total = 0
      for try await chunk in channel.chunks(maximumLength: 1000) {
        #expect(chunk.count <= 1000)
        total += chunk.count
        if total >= 2000 { break }
      }
    }
    #expect(await eventually { cleanup.ran.isSignaled })
    #expect(!isOpen(readEnd, as: object))
  }
}

// MARK: - Errors, drops and durations (issue 17)

/// Reads up to `count` bytes from `fd` on the calling thread, stopping early at end of file; nil
/// when no byte and no end of file came for the generous timeout. (On the calling thread: a read
/// blocked on a thread of the global queues would take one of libdispatch's few workers, which
/// the channel's own I/O needs to produce the bytes.)
/// The bytes waiting to be read from `descriptor` (`FIONREAD`), -1 when it cannot say.
private func bytesQueued(_ descriptor: Int32) -> Int32 {
  var queued: Int32 = 0
  return ioctl(descriptor, UInt(FIONREAD), &queued) == 0 ? queued : -1
}

private func readToEnd(_ fd: Int32, count: Int) -> [UInt8]? {
  var received: [UInt8] = []
  received.reserveCapacity(count)
  var chunk = [UInt8](repeating: 0, count: 64 * 1024)
  let timeout = Int32(generousTimeout.components.seconds * 1000)
  while received.count < count {
    var ready = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
    let polled = poll(&ready, 1, timeout)
    if polled < 0 && errno == EINTR { continue }
    if polled <= 0 { return nil }
    let got = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
    if got < 0 && (errno == EINTR || errno == EAGAIN) { continue }
    if got <= 0 { break }
    received += chunk[0..<got]
  }
  return received
}

/// Reads `fd` to end of file and expects exactly `payload`, and `wrote` to have ended without an
/// error.
private func expectDelivered(
  _ payload: [UInt8], from fd: Int32, by wrote: Operation, sourceLocation: SourceLocation = #_sourceLocation
) {
  let received = readToEnd(fd, count: payload.count + 1) ?? []
  #expect(wrote.finished.wait(), sourceLocation: sourceLocation)
  #expect(wrote.finalError == 0, sourceLocation: sourceLocation)
  let (receivedCount, intact) = (received.count, received == payload)
  #expect(receivedCount == payload.count, sourceLocation: sourceLocation)
  #expect(intact, sourceLocation: sourceLocation)
}

extension IOChannelTests {
  @Test(
    "one-shot write(fileDescriptor: -1) reports EBADF with the whole unwritten buffer, and read(fileDescriptor: -1) EBADF, every time and once",
    arguments: [false, true])
  func oneShotBadDescriptor(concurrent: Bool) {
    let handlerQueue = concurrent ? Queue.global() : queue
    let rounds = runningUnderSanitizer ? 50 : 300
    let writes = Mutex<[(remaining: Int, error: Int32)]>([])
    let reads = Mutex<[(count: Int, error: Int32)]>([])
    let finished = Latch(count: 2 * rounds)
    for _ in 0..<rounds {
      IOChannel.write(fileDescriptor: -1, data: DispatchBuffer([1, 2, 3, 4, 5]), queue: handlerQueue) {
        remaining, error in
        writes.withLock { $0.append((remaining.count, error)) }
        finished.signal()
      }
      IOChannel.read(fileDescriptor: -1, length: 10, queue: handlerQueue) { data, error in
        reads.withLock { $0.append((data.count, error)) }
        finished.signal()
      }
    }
    #expect(finished.wait())
    #expect(!pollBriefly { writes.withLock { $0.count } > rounds || reads.withLock { $0.count } > rounds })
    let wrote = writes.withLock { $0 }
    let read = reads.withLock { $0 }
    let (writeCount, readCount) = (wrote.count, read.count)
    #expect(writeCount == rounds && readCount == rounds)
    let writesWithoutEBADF = wrote.filter { $0.error != EBADF || $0.remaining != 5 }.count
    let readsWithoutEBADF = read.filter { $0.error != EBADF || $0.count != 0 }.count
    let seen =
      "writes (unwritten, errno): \(Set(wrote.map { "\($0.remaining), \($0.error)" }).sorted()); reads: \(Set(read.map(\.error)).sorted())"
    #expect(writesWithoutEBADF == 0, "\(seen)")
    #expect(readsWithoutEBADF == 0, "\(seen)")
  }

  @Test(
    "a channel on a pipe's write end dropped right after a 2 MiB write delivers all of it; the write's handler runs with done and no error before the one cleanup"
  )
  func droppedChannelKeepsWrites() {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(readEnd) }
    let payload = randomBuffer(2 << 20)
    let object = kernelObject(writeEnd)
    let wrote = Operation()
    let order = Mutex<[String]>([])
    let cleanup = Cleanup()
    do {
      let channel = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue) { fd in
        order.withLock { $0.append("cleanup") }
        cleanup.handler(fd)
      }
      channel.write(data: payload, queue: queue) { done, remaining, error in
        if done { order.withLock { $0.append("write done") } }
        wrote.handler(done, remaining, error)
      }
    }
    expectDelivered(Array(payload), from: readEnd, by: wrote)
    #expect(cleanup.ran.wait())
    #expect(!pollBriefly { cleanup.calls.current > 1 })
    #expect(order.withLock { $0 } == ["write done", "cleanup"])
    #expect(!isOpen(writeEnd, as: object))
  }

  @Test(
    "dropping a socket channel with a read waiting and a 4 MiB write in flight: the read ends with ECANCELED, the write reaches the peer whole, the cleanup runs once after both"
  )
  func droppedSocketChannelKeepsWrites() {
    let (client, server) = tcpPair()
    defer { close(server) }
    let object = kernelObject(client)
    let payload = randomBuffer(4 << 20)
    let wrote = Operation()
    let waiting = Operation()
    let cleanup = Cleanup()
    do {
      let channel = IOChannel(fileDescriptor: client, type: .stream, queue: queue, cleanup: cleanup.handler)
      channel.read(length: 10, queue: queue, handler: waiting.handler)
      channel.write(data: payload, queue: queue, handler: wrote.handler)
    }
    #expect(waiting.finished.wait())
    #expect(waiting.finalError == ECANCELED)
    expectDelivered(Array(payload), from: server, by: wrote)
    #expect(cleanup.ran.wait())
    #expect(!pollBriefly { cleanup.calls.current > 1 })
    #expect(!isHeld(object))
  }

  @Test(
    "a FIFO opened for reading and writing, dropped: a read waiting for bytes ends with ECANCELED; a pending 200 kB write reaches the other end whole; the cleanup runs once"
  )
  func droppedReadWriteFIFO() {
    let fifo = "/tmp/GCDTests-fifo-\(getpid())-drop"
    unlink(fifo)
    #expect(mkfifo(fifo, 0o600) == 0)
    defer { unlink(fifo) }
    for pending in ["read", "write"] {
      let descriptor = open(fifo, O_RDWR | O_CLOEXEC)
      // Another reader, for the write's bytes (the channel's own reads would take them otherwise).
      let other = open(fifo, O_RDONLY | O_CLOEXEC)
      #expect(descriptor >= 0 && other >= 0)
      defer { close(other) }
      let object = kernelObject(descriptor)
      let payload = patternBytes(200_000)
      let cleanup = Cleanup()
      let operation = Operation()
      do {
        let channel = IOChannel(fileDescriptor: descriptor, type: .stream, queue: queue, cleanup: cleanup.handler)
        if pending == "read" {
          channel.read(length: 10, queue: queue, handler: operation.handler)
        } else {
          channel.write(data: payload, queue: queue, handler: operation.handler)
        }
      }
      if pending == "read" {
        #expect(operation.finished.wait())
        #expect(operation.finalError == ECANCELED)
      } else {
        // End of file comes when the cleanup closes the channel's descriptor, the last writer.
        expectDelivered(payload, from: other, by: operation)
      }
      #expect(cleanup.ran.wait(), "\(pending)")
      #expect(!pollBriefly { cleanup.calls.current > 1 }, "\(pending)")
      #expect(!isOpen(descriptor, as: object), "\(pending)")
    }
  }

  @Test(
    "a regular file opened for reading and writing, dropped right after a write: the bytes are in the file, the handler ran, the cleanup once"
  )
  func droppedReadWriteFile() throws {
    let file = temporaryFile(containing: [])
    defer { unlink(file) }
    let payload = patternBytes(3 << 20)
    let wrote = Operation()
    let cleanup = Cleanup(closes: false)
    do {
      let channel = try IOChannel(
        path: file, flags: O_RDWR, type: .randomAccess, queue: queue, cleanup: cleanup.handler)
      channel.write(offset: 0, data: payload, queue: queue, handler: wrote.handler)
    }
    #expect(wrote.finished.wait())
    #expect(wrote.finalError == 0)
    #expect(cleanup.ran.wait())
    #expect(!pollBriefly { cleanup.calls.current > 1 })
    let contents = contentsOfFile(file)
    let (fileSize, intact) = (contents.count, contents == payload)
    #expect(fileSize == payload.count)
    #expect(intact)
    #expect(!isHeld(file))
  }

  @Test(
    "setInterval with a huge duration saturates (\"practically never\") instead of trapping; the channel still works")
  func hugeInterval() async {
    let result = await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
      setHugeIntervals()
    }
    #expect(standardError(of: result).contains("exit-test child: ok"), "\(standardError(of: result))")
  }
}

/// Exit-test child: `setInterval` with durations far past `Int64` nanoseconds, both ways, strict or
/// not, then a read that still delivers its byte.
private func setHugeIntervals() -> Never {
  var ends: [Int32] = [-1, -1]
  childCheck(pipe(&ends) == 0, "pipe")
  let channel = IOChannel(fileDescriptor: ends[0], type: .stream, queue: .global()) { close($0) }
  for interval in [Duration.seconds(Int64.max / 4), .seconds(Int64.max), .seconds(-Int64.max / 4), .seconds(Int64.min)]
  {
    channel.setInterval(interval)
    channel.setInterval(interval, strict: true)
  }
  channel.setInterval(.seconds(Int64.max / 4))
  let read = Event()
  let bytes = Mutex<[UInt8]>([])
  channel.read(length: 1, queue: .global()) { done, data, _ in
    if let data { bytes.withLock { $0 += data } }
    if done { read.signal() }
  }
  write(ends[1], [42])
  childCheck(read.wait(), "the read never ended")
  childCheck(bytes.withLock { $0 } == [42], "read \(bytes.withLock { $0 })")
  endChild("ok")
}

/// Exit-test child: a channel write to a pipe with no reader gets EPIPE, and
/// SIGPIPE went from its default disposition to a do-nothing handler.
private func writeToBrokenPipe() -> Never {
  var before = sigaction()
  sigaction(SIGPIPE, nil, &before)
  childCheck(before.__sigaction_handler.sa_handler == nil, "SIGPIPE did not start at its default")
  var ends: [Int32] = [-1, -1]
  childCheck(pipe(&ends) == 0, "pipe")
  close(ends[0])
  let finished = Event()
  let error = Mutex<Int32>(-1)
  let channel = IOChannel(fileDescriptor: ends[1], type: .stream, queue: .global()) { close($0) }
  channel.write(data: [1, 2, 3], queue: .global()) { done, _, code in
    if done {
      error.withLock { $0 = code }
      finished.signal()
    }
  }
  childCheck(finished.wait(), "the write never finished")
  childCheck(error.withLock { $0 } == EPIPE, "error \(error.withLock { $0 }), not EPIPE")
  var after = sigaction()
  sigaction(SIGPIPE, nil, &after)
  let handler = after.__sigaction_handler.sa_handler.map { unsafeBitCast($0, to: Int.self) } ?? 0
  childCheck(handler > 1, "SIGPIPE is not a handler now (\(handler))")
  childCheck(after.sa_flags & Int32(SA_RESTART) != 0, "the handler lacks SA_RESTART")
  endChild("ok")
}

/// Exit-test child: with SIGPIPE ignored beforehand, a one-shot write gets
/// EPIPE and SIGPIPE stays ignored.
private func writeToBrokenPipeWithSIGPIPEIgnored() -> Never {
  signal(SIGPIPE, SIG_IGN)
  var ends: [Int32] = [-1, -1]
  childCheck(pipe(&ends) == 0, "pipe")
  close(ends[0])
  let finished = Event()
  IOChannel.write(fileDescriptor: ends[1], data: DispatchBuffer([1]), queue: .global()) { _, error in
    childCheck(error == EPIPE, "error \(error)")
    finished.signal()
  }
  childCheck(finished.wait(), "the write never finished")
  var after = sigaction()
  sigaction(SIGPIPE, nil, &after)
  let handler = after.__sigaction_handler.sa_handler.map { unsafeBitCast($0, to: Int.self) } ?? 0
  childCheck(handler == 1, "SIGPIPE is no longer SIG_IGN (\(handler))")
  endChild("ok")
}

/// Exit-test child: a random-access channel on a pipe fails with ESPIPE and
/// its cleanup closes the pipe; a file opened next gets the same number and
/// a random-access channel on it reads the file.
private func reuseNumberAfterErrorCleanup() -> Never {
  let file = temporaryFile(containing: [1, 2, 3])
  defer { unlink(file) }
  var ends: [Int32] = [-1, -1]
  childCheck(pipe(&ends) == 0, "pipe")
  let cleaned = Event()
  let failed = Event()
  let pipeChannel = IOChannel(fileDescriptor: ends[0], type: .randomAccess, queue: .global()) {
    close($0)
    cleaned.signal()
  }
  pipeChannel.read(length: 10, queue: .global()) { done, _, error in
    childCheck(!done || error == ESPIPE, "pipe read: error \(error)")
    if done { failed.signal() }
  }
  childCheck(failed.wait() && cleaned.wait(), "the pipe channel did not end")
  let opened = open(file, O_RDONLY | O_CLOEXEC)
  let descriptor = dup2(opened, ends[0])
  childCheck(opened >= 0 && descriptor == ends[0], "could not put the file at \(ends[0])")
  if opened != descriptor { close(opened) }
  let read = Event()
  let outcome = Mutex<([UInt8], Int32)>(([], -1))
  let fileChannel = IOChannel(fileDescriptor: descriptor, type: .randomAccess, queue: .global()) { close($0) }
  fileChannel.read(offset: 0, length: 10, queue: .global()) { done, data, error in
    outcome.withLock {
      if let data { $0.0 += data }
      if done { $0.1 = error }
    }
    if done { read.signal() }
  }
  childCheck(read.wait(), "the file read did not end")
  let (bytes, error) = outcome.withLock { $0 }
  childCheck(error == 0 && bytes == [1, 2, 3], "file read: error \(error), bytes \(bytes)")
  endChild("ok")
}

// MARK: - The I/O examples

@Suite("IOChannel examples", .timeLimit(.minutes(2)))
struct IOChannelExampleTests {
  @Test("ExampleCat copies a 3 MB binary file to its standard output byte for byte and reports the count")
  func cat() async throws {
    let contents = patternBytes(3_000_000)
    let file = temporaryFile(containing: contents)
    defer { unlink(file) }
    let run = try await ExampleProcess.run("ExampleCat", [file])
    #expect(run.status == 0, "\(run.errorText)")
    #expect(run.output == contents)
    #expect(run.errorText.contains("copied 3000000 bytes"), "\(run.errorText)")
  }

  @Test("ExampleCat without an argument copies its own 1,000-line input; a missing file is a clear error")
  func catDefaultAndMissing() async throws {
    let run = try await ExampleProcess.run("ExampleCat", [])
    #expect(run.status == 0, "\(run.errorText)")
    let text = String(decoding: run.output, as: UTF8.self)
    #expect(text.split(separator: "\n").count == 1000)
    #expect(text.hasPrefix("line 1 of the default input\n"))
    let missing = try await ExampleProcess.run("ExampleCat", ["/tmp/GCDTests-no-such-file"])
    #expect(missing.status == 1)
    #expect(missing.errorText.contains("ENOENT"), "\(missing.errorText)")
  }

  @Test("ExampleEchoServer echoes every line of 8 real loopback clients intact and shuts down by itself")
  func echoServer() async throws {
    let run = try await ExampleProcess.run("ExampleEchoServer", ["8", "300"])
    let text = String(decoding: run.output, as: UTF8.self)
    #expect(run.status == 0, "\(text)\(run.errorText)")
    #expect(text.contains("listening on 127.0.0.1:"))
    #expect(text.contains("served 8 connections, echoed 2400 lines"), "\(text)")
    #expect(text.contains("2400 of 2400 lines came back intact"), "\(text)")
    #expect(text.hasSuffix("shut down\n"), "\(text)")
  }

  @Test(
    "ExampleEchoServer under churning clients: 8 at once, each connecting 10 times in turn (connect, echo, close), every line intact"
  )
  func echoServerChurn() async throws {
    let run = try await ExampleProcess.run("ExampleEchoServer", ["8", "20", "10"])
    let text = String(decoding: run.output, as: UTF8.self)
    #expect(run.status == 0, "\(text)\(run.errorText)")
    #expect(text.contains("served 80 connections, echoed 1600 lines"), "\(text)")
    #expect(text.contains("1600 of 1600 lines came back intact"), "\(text)")
    #expect(text.hasSuffix("shut down\n"), "\(text)")
  }

  @Test("ExampleEchoServer with no clients serves until SIGTERM, then shuts down gracefully")
  func echoServerSignal() async throws {
    let run = try await ExampleProcess.run("ExampleEchoServer", ["0"], signalWhen: "serving until SIGINT or SIGTERM")
    let text = String(decoding: run.output, as: UTF8.self)
    #expect(run.status == 0, "\(text)\(run.errorText)")
    #expect(text.contains("served 0 connections"), "\(text)")
    #expect(text.hasSuffix("shut down\n"), "\(text)")
  }
}

/// Runs an example executable (built next to the test bundle) with its
/// standard output and error captured apart, killing it after a generous timeout.
private struct ExampleProcess {
  var status: Int32
  var output: [UInt8]
  var errorText: String

  /// Runs `name`; with `signalWhen`, sends SIGTERM once its standard output contains that text.
  static func run(_ name: String, _ arguments: [String], signalWhen: String? = nil) async throws -> ExampleProcess {
    let executable = try #require(examplePath(name), "\(name) is not built next to the test bundle")
    let outputFile = temporaryFile(containing: [])
    let errorFile = temporaryFile(containing: [])
    defer {
      unlink(outputFile)
      unlink(errorFile)
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, outputFile, O_WRONLY | O_TRUNC, 0)
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, errorFile, O_WRONLY | O_TRUNC, 0)
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0)
    // The child starts with no signal blocked and SIGTERM at its default,
    // whatever the test runner's thread has.
    var attributes = posix_spawnattr_t()
    posix_spawnattr_init(&attributes)
    defer { posix_spawnattr_destroy(&attributes) }
    var noSignals = sigset_t()
    sigemptyset(&noSignals)
    var defaults = sigset_t()
    sigemptyset(&defaults)
    sigaddset(&defaults, SIGTERM)
    posix_spawnattr_setsigmask(&attributes, &noSignals)
    posix_spawnattr_setsigdefault(&attributes, &defaults)
    posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { argv.forEach { free($0) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, &attributes, argv, environ)
    try #require(spawned == 0, "posix_spawn(\(executable)): errno \(spawned)")
    let deadline = ContinuousClock.now + .seconds(60)
    var rawStatus: Int32 = 0
    var signalled = false
    while waitpid(pid, &rawStatus, WNOHANG) != pid {
      if let signalWhen, !signalled,
        String(decoding: contentsOfFile(outputFile), as: UTF8.self).contains(signalWhen)
      {
        kill(pid, SIGTERM)
        signalled = true
      }
      if ContinuousClock.now >= deadline {
        kill(pid, SIGKILL)
        _ = waitpid(pid, &rawStatus, 0)
        Issue.record("\(name) did not exit within 60 s and was killed")
        break
      }
      try await Task.sleep(for: .milliseconds(5))
    }
    let signal = rawStatus & 0x7f
    return ExampleProcess(
      status: signal == 0 ? (rawStatus >> 8) & 0xff : -signal, output: contentsOfFile(outputFile),
      errorText: String(decoding: contentsOfFile(errorFile), as: UTF8.self))
  }
}

// MARK: - One direction cancelled (issue 19)

extension IOChannelTests {
  @Test(
    "a socket channel: cancelling the task in read(upTo:) stops the reads only; a concurrent 1 MiB write(_:) completes and the peer receives every byte",
    .timeLimit(.minutes(2))
  )
  func cancelledReadLeavesWritesAlone() async throws {
    let (local, peer) = makeSocketPair()
    defer { close(peer) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: local, type: .stream, queue: queue, cleanup: cleanup.handler)
    let payload = patternBytes(1 << 20)
    // The peer reads nothing yet: the write stays in flight, far beyond the socket's buffer.
    let writer = Task { try await channel.write(payload) }
    let started = Event()
    let reader = Task {
      started.signal()
      return try await channel.read(upTo: 100)
    }
    #expect(await eventually { started.isSignaled })
    reader.cancel()
    let readError = await #expect(throws: (any Error).self) { try await reader.value }
    #expect((readError as? GCDError)?.errno == ECANCELED, "\(String(describing: readError))")
    let received = readToEnd(peer, count: payload.count)
    let writeOutcome = await writer.result
    #expect(throws: Never.self) { try writeOutcome.get() }
    let (receivedCount, intact) = (received?.count, received == payload)
    #expect(receivedCount == payload.count)
    #expect(intact)
    await #expect(throws: GCDError.self) { try await channel.read(upTo: 1) }
    withExtendedLifetime(channel) {}
  }
}

extension IOChannelTests {
  @Test(
    "write(_:) on a socket with no write pending writes on the caller's thread; the rest that finds no room goes before a write submitted meanwhile, and a cancelled wait for it ends with ECANCELED",
    .timeLimit(.minutes(2))
  )
  func writeHandsItsRestOverFirst() async throws {
    let (local, peer) = makeSocketPair()
    defer { close(peer) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: local, type: .stream, queue: queue, cleanup: cleanup.handler)
    let payload = patternBytes(1 << 20)
    let tail: [UInt8] = [0xEE, 0xDD, 0xCC]
    // The peer reads nothing yet: the write fills the socket on this task's thread, then waits.
    let writer = Task { try await channel.write(payload) }
    #expect(await eventually { bytesQueued(peer) > 0 })
    // Submitted after the first bytes went: it must come after every byte of the payload.
    let tailDone = Operation()
    channel.write(data: DispatchBuffer(tail), queue: queue, handler: tailDone.handler)
    let received = readToEnd(peer, count: payload.count + tail.count)
    try await writer.value
    #expect(await Queue(label: "io.wait").run { tailDone.finished.wait() })
    #expect(tailDone.finalError == 0)
    let intact = received == payload + tail
    #expect(intact)
    // A wait for a rest, cancelled: the writes stop with ECANCELED (the task's cancellation).
    let stopped = Task { try await channel.write(payload) }
    #expect(await eventually { bytesQueued(peer) > 0 })
    stopped.cancel()
    let error = await #expect(throws: GCDError.self) { try await stopped.value }
    #expect(error?.errno == ECANCELED)
    #expect(error?.detail == "the task was cancelled")
    channel.close()
    #expect(await Queue(label: "io.wait").run { cleanup.ran.wait() })
  }
}

extension IOChannelTests {
  @Test(
    "a write(_:) awaited right after a callback write comes after it, while the engine finishes a barrier's run as the callback write is submitted (200 rounds): a write on the caller's thread never goes ahead of one submitted before it"
  )
  func writeAfterSubmittedWriteKeepsOrder() async throws {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    defer { close(readEnd) }
    let cleanup = Cleanup()
    let channel = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue, cleanup: cleanup.handler)
    let rounds = 200
    let submitted = Counter()
    for index in 0..<rounds {
      // The barrier's body holds the engine inside a run until the callback write is on its way.
      let (inBarrier, released) = (Event(), Event())
      channel.barrier {
        inBarrier.signal()
        _ = released.wait()
      }
      #expect(await Queue(label: "io.wait").run { inBarrier.wait() })
      channel.write(data: DispatchBuffer([UInt8(truncatingIfNeeded: 2 * index)]), queue: queue) { done, _, error in
        if done && error == 0 { submitted.increment() }
      }
      released.signal()
      try await channel.write([UInt8(truncatingIfNeeded: 2 * index + 1)])
    }
    channel.close()
    #expect(await Queue(label: "io.wait").run { cleanup.ran.wait() })
    #expect(submitted.current == rounds)
    let received = readToEnd(readEnd, count: 2 * rounds) ?? []
    let firstWrong = received.indices.first { received[$0] != UInt8(truncatingIfNeeded: $0) }
    #expect(received.count == 2 * rounds)
    #expect(firstWrong == nil, "byte \(firstWrong ?? -1) out of order")
  }
}

// MARK: - Stream channels where libdispatch is the oracle (issue 38)

/// What the calls of one read handler did: whether two ran at once, whether one ran after `done`,
/// the bytes in the order the calls saw them.
private final class CallRecord: Sendable {
  struct State {
    var running = 0
    var overlapped = false
    var doneSeen = false
    var afterDone = false
    var calls = 0
    var bytes: [UInt8] = []
  }
  let state = Mutex(State())
  let finished = Event()

  var handler: IOChannel.Handler {
    { done, data, _ in
      self.state.withLock { state in
        state.running += 1
        if state.running > 1 { state.overlapped = true }
        if state.doneSeen { state.afterDone = true }
        if let data { state.bytes += Array(data) }
      }
      usleep(50)  // widens the window in which a second call could run beside this one
      self.state.withLock { state in
        if done { state.doneSeen = true }
        state.running -= 1
        state.calls += 1
      }
      if done { self.finished.signal() }
    }
  }
}

/// Whether `descriptor` is in non-blocking mode now.
private func isNonBlocking(_ descriptor: Int32) -> Bool { fcntl(descriptor, F_GETFL) & O_NONBLOCK != 0 }

/// A connected pair of blocking Unix stream sockets (close-on-exec).
private func blockingSocketPair() -> (Int32, Int32) {
  var ends: [Int32] = [-1, -1]
  precondition(
    socketpair(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &ends) == 0,
    "socketpair failed: errno \(errno)")
  return (ends[0], ends[1])
}

extension IOChannelTests {
  @Test(
    "two stream channels over one socket: the first to end leaves it non-blocking for the second, whose stopped large write ends with ECANCELED; the flags come back when the last ends",
    .timeLimit(.minutes(1)))
  func twoChannelsOneDescriptor() async {
    let (mine, peer) = blockingSocketPair()
    // Closing the peer ends a write(2) that blocks (EPIPE), should the descriptor be blocking.
    defer {
      close(peer)
      close(mine)
    }
    let original = fcntl(mine, F_GETFL)
    #expect(original & O_NONBLOCK == 0)
    let firstCleanup = Cleanup(closes: false)
    let secondCleanup = Cleanup(closes: false)
    let write = Operation()
    do {
      let first = IOChannel(fileDescriptor: mine, type: .stream, queue: queue, cleanup: firstCleanup.handler)
      let second = IOChannel(fileDescriptor: mine, type: .stream, queue: queue, cleanup: secondCleanup.handler)
      #expect(isNonBlocking(mine))
      first.close()
      #expect(await eventually { first.fileDescriptor == -1 })
      #expect(
        !blocking { pollBriefly { !isNonBlocking(mine) } },
        "the first channel's end restored the blocking flags under the second")
      #expect(!firstCleanup.ran.isSignaled, "the first cleanup ran while another channel used the descriptor")
      // Far more than the socket buffers hold, and nobody reads: the write waits for room.
      second.write(data: randomBuffer(16 << 20), queue: queue, handler: write.handler)
      second.close(stop: true)
      #expect(await eventually { write.finished.isSignaled }, "the stopped write never ended (blocked in write(2)?)")
      #expect(write.finalError == ECANCELED)
    }
    #expect(await eventually { firstCleanup.ran.isSignaled && secondCleanup.ran.isSignaled })
    #expect(fcntl(mine, F_GETFL) == original, "the last channel's end did not restore the original flags")
  }

  @Test(
    "a stream channel made from one that already ended touches no descriptor: its reads and writes end with ECANCELED, its cleanup gets -1",
    .timeLimit(.minutes(1)))
  func channelFromEndedChannel() async {
    let (mine, minePeer) = blockingSocketPair()
    let (other, otherPeer) = blockingSocketPair()
    defer {
      close(mine)
      close(minePeer)
      close(other)
      close(otherPeer)
    }
    let firstCleanup = Cleanup(closes: false)
    let replaced = Event()
    let first = IOChannel(fileDescriptor: mine, type: .stream, queue: queue) { fd in
      // The number now names another connection, as a reused number would.
      precondition(dup2(other, fd) == fd, "dup2: errno \(errno)")
      firstCleanup.handler(fd)
      replaced.signal()
    }
    first.close()
    #expect(await eventually { replaced.isSignaled })
    write(otherPeer, Array("another connection's bytes".utf8))
    let secondCleanup = Cleanup(closes: false)
    let second = IOChannel(channel: first, type: .stream, queue: queue, cleanup: secondCleanup.handler)
    let read = Operation()
    let sent = Operation()
    second.read(length: 100, queue: queue, handler: read.handler)
    second.write(data: [1, 2, 3], queue: queue, handler: sent.handler)
    #expect(await eventually { read.finished.isSignaled && sent.finished.isSignaled })
    #expect(read.received.isEmpty, "the channel read another connection's bytes")
    #expect(read.finalError == ECANCELED)
    #expect(sent.finalError == ECANCELED)
    #expect(second.fileDescriptor == -1)
    var byte: UInt8 = 0
    #expect(recv(otherPeer, &byte, 1, Int32(MSG_DONTWAIT)) == -1, "the channel wrote to another connection")
    second.close()
    #expect(await eventually { secondCleanup.ran.isSignaled })
    #expect(secondCleanup.descriptor.withLock { $0 } == -1)
    #expect(!isNonBlocking(mine), "the other connection's flags were changed")
  }

  @Test(
    "a stream channel made from one closed while its read still waits ends its operations with ECANCELED, as libdispatch's does",
    .timeLimit(.minutes(1)))
  func channelFromClosedChannel() async {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let firstCleanup = Cleanup()
    let secondCleanup = Cleanup(closes: false)
    let first = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: firstCleanup.handler)
    let waiting = Operation()
    first.read(length: 3, queue: queue, handler: waiting.handler)
    first.close()
    let second = IOChannel(channel: first, type: .stream, queue: queue, cleanup: secondCleanup.handler)
    let read = Operation()
    second.read(length: 3, queue: queue, handler: read.handler)
    #expect(await eventually { read.finished.isSignaled && secondCleanup.ran.isSignaled })
    #expect(read.finalError == ECANCELED)
    #expect(secondCleanup.descriptor.withLock { $0 } == -1)
    write(writeEnd, [1, 2, 3])
    close(writeEnd)
    #expect(await eventually { waiting.finished.isSignaled && firstCleanup.ran.isSignaled })
    #expect(waiting.received == [1, 2, 3], "the closed channel's read did not run to its end")
  }

  @Test(
    "a random-access channel made from a socket channel ends its reads with ESPIPE and its cleanup gets -1, leaving the socket to its channel",
    .timeLimit(.minutes(1)))
  func randomAccessFromSocketChannel() async throws {
    let (mine, peer) = blockingSocketPair()
    defer { close(peer) }
    let firstCleanup = Cleanup()
    let secondCleanup = Cleanup()
    let first = IOChannel(fileDescriptor: mine, type: .stream, queue: queue, cleanup: firstCleanup.handler)
    let second = IOChannel(channel: first, type: .randomAccess, queue: queue, cleanup: secondCleanup.handler)
    let read = Operation()
    second.read(length: 10, queue: queue, handler: read.handler)
    #expect(await eventually { read.finished.isSignaled && secondCleanup.ran.isSignaled })
    #expect(read.finalError == ESPIPE)
    #expect(secondCleanup.descriptor.withLock { $0 } == -1, "the cleanup was handed the socket channel's descriptor")
    try await first.write([1, 2, 3])
    var bytes = [UInt8](repeating: 0, count: 3)
    #expect(recv(peer, &bytes, 3, Int32(MSG_WAITALL)) == 3)
    #expect(bytes == [1, 2, 3])
    first.close()
    #expect(await eventually { firstCleanup.ran.isSignaled })
  }

  @Test(
    "a channel made from a closed file channel (a C channel) ends its reads with ECANCELED, and its cleanup gets -1, not the number",
    .timeLimit(.minutes(1)))
  func channelFromClosedFileChannel() async throws {
    let file = temporaryFile(containing: patternBytes(100))
    defer { unlink(file) }
    let firstCleanup = Cleanup(closes: false)
    let first = try IOChannel(path: file, flags: O_RDONLY, type: .stream, queue: queue, cleanup: firstCleanup.handler)
    first.close()
    #expect(await eventually { firstCleanup.ran.isSignaled })
    let secondCleanup = Cleanup(closes: false)
    let second = IOChannel(channel: first, type: .stream, queue: queue, cleanup: secondCleanup.handler)
    let read = Operation()
    second.read(length: 10, queue: queue, handler: read.handler)
    #expect(await eventually { read.finished.isSignaled && secondCleanup.ran.isSignaled })
    #expect(read.finalError == ECANCELED)
    #expect(read.received.isEmpty)
    #expect(secondCleanup.descriptor.withLock { $0 } == -1, "the cleanup was handed a number its channel never had")
  }

  @Test(
    "on a concurrent queue one stream read's handler calls run one at a time, in order, with done last",
    .timeLimit(.minutes(1)))
  func readCallsSerialOnConcurrentQueue() async {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let target = Queue(label: "io-tests.concurrent", kind: .concurrent)
    let channel = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: Cleanup().handler)
    channel.setLimit(highWater: 16)
    let record = CallRecord()
    channel.read(length: Int.max, queue: target, handler: record.handler)
    let sent = patternBytes(32 * 1024)
    Queue.global().async {
      var offset = 0
      while offset < sent.count {
        let count = min(512, sent.count - offset)
        let written = sent[offset..<offset + count].withUnsafeBytes { Glibc.write(writeEnd, $0.baseAddress, $0.count) }
        precondition(written > 0, "write: errno \(errno)")
        offset += written
      }
      close(writeEnd)
    }
    #expect(await eventually { record.finished.isSignaled })
    #expect(await eventually { record.state.withLock { $0.running == 0 } })
    let (overlapped, afterDone, inOrder, calls) = record.state.withLock {
      ($0.overlapped, $0.afterDone, $0.bytes == sent, $0.calls)
    }
    #expect(!overlapped, "two handler calls of one read ran at once")
    #expect(!afterDone, "a handler call ran after done")
    #expect(inOrder, "the bytes arrived out of order")
    #expect(calls > 100)
  }

  @Test(
    "a stream read on a pipe's write end ends at once with EBADF, and a write on its read end too, as dispatch_io does",
    .timeLimit(.minutes(1)))
  func wrongDirectionEndsWithEBADF() async {
    let (readEnd, writeEnd) = makePipe(nonBlockingRead: false)
    let readCleanup = Cleanup()
    let writeCleanup = Cleanup()
    let read = Operation()
    let sent = Operation()
    do {
      let writing = IOChannel(fileDescriptor: writeEnd, type: .stream, queue: queue, cleanup: writeCleanup.handler)
      let reading = IOChannel(fileDescriptor: readEnd, type: .stream, queue: queue, cleanup: readCleanup.handler)
      writing.read(length: 10, queue: queue, handler: read.handler)
      reading.write(data: [1, 2, 3], queue: queue, handler: sent.handler)
      #expect(await eventually { read.finished.isSignaled }, "the read on the write end never ended")
      #expect(read.finalError == EBADF)
      #expect(read.received.isEmpty)
      #expect(await eventually { sent.finished.isSignaled }, "the write on the read end never ended")
      #expect(sent.finalError == EBADF)
      #expect(sent.deliveries.withLock { $0.last?.count } == 3, "the unwritten bytes are not handed back")
    }
    #expect(await eventually { readCleanup.ran.isSignaled && writeCleanup.ran.isSignaled })
  }
}
