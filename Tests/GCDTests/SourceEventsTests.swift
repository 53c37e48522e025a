import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// Signals these tests own (no other suite sends them): their default action is to ignore.
private let eventsSignal = SIGWINCH
private let scopedSignal = SIGURG

@Suite("SourceEvents")
struct SourceEventsTests {
  @Test("a DATA_ADD source with a slow consumer: the exact sum, merged in the suspended source")
  func dataAddSlowConsumerExactSum() async throws {
    let source = DataAddSource(queue: Queue(label: "events.add"))
    source.setRegistrationHandler { source.merge(1) }
    var events = source.makeEvents().makeAsyncIterator()
    var total = try await events.next() ?? 0
    #expect(total == 1)
    // The consumer is busy (it does not ask for the next element): the next
    // event is taken from the source and the source is suspended ...
    source.merge(1)
    #expect(await eventually { source.isSuspended })
    // ... so everything merged meanwhile stays in the source, merged.
    let merges = 50_000
    await Task.detached {
      for _ in 2..<merges { source.merge(1) }
    }.value
    var elements = 1
    while total < UInt(merges), let value = try await events.next() {
      total += value
      elements += 1
    }
    #expect(total == UInt(merges))
    #expect(elements == 3, "expected 1, the element held back, and one merged sum; got \(elements) elements")
    #expect(!source.isSuspended)
    withExtendedLifetime(events) {}
  }

  @Test("the sequence's hold is its own: a resume() during it stops at that call, naming the hold")
  func resumeDuringHoldStops() async {
    // The user never suspended the source: a resume() has nothing of the user's to balance. Were
    // the hold a suspend() of the user's count, the resume would undo it (the source would run
    // again with an element still held, and the consumer's next() would stop the process later).
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      let source = DataAddSource(queue: Queue(label: "events.hold.resume"))
      source.setRegistrationHandler { source.merge(1) }
      var events = source.makeEvents().makeAsyncIterator()
      _ = try await events.next()
      source.merge(1)
      guard await eventually({ source.isSuspended }) else { exit(0) }
      source.resume()
      let accepted = Array("exit-test child: the resume was accepted\n".utf8)
      _ = accepted.withUnsafeBytes { write(STDERR_FILENO, $0.baseAddress, $0.count) }
      _ = try await events.next()
      exit(0)
    }
    let text = standardError(of: result)
    #expect(text.contains("DataAddSource.resume() without a matching suspend()"), "\(text)")
    #expect(text.contains("its event sequence holds it"), "\(text)")
    #expect(!text.contains("the resume was accepted"), "\(text)")
  }

  @Test("a suspend() and resume() of the user's during the hold balance each other; the hold stays until next()")
  func userSuspensionDuringHold() async throws {
    let source = DataAddSource(queue: Queue(label: "events.hold.suspend"))
    source.setRegistrationHandler { source.merge(1) }
    var events = source.makeEvents().makeAsyncIterator()
    #expect(try await events.next() == 1)
    source.merge(2)
    #expect(await eventually { source.isSuspended })
    source.suspend()
    source.resume()
    #expect(source.isSuspended, "the user's resume() ended the sequence's hold")
    #expect(try await events.next() == 2)
    #expect(await eventually { !source.isSuspended })
    source.merge(3)
    #expect(try await events.next() == 3)
    withExtendedLifetime(events) {}
  }

  @Test("breaking out of the loop cancels the source once; its cancel handler runs once")
  func breakCancelsOnce() async throws {
    let source = DataOrSource(queue: Queue(label: "events.break"))
    let cancels = Counter()
    let cancelled = Event()
    source.setCancelHandler {
      cancels.increment()
      cancelled.signal()
    }
    source.setRegistrationHandler { source.merge(0b101) }
    for try await bits in source.makeEvents() {
      #expect(bits == 0b101)
      break
    }
    #expect(await eventually { cancelled.isSignaled })
    #expect(source.isCancelled)
    #expect(await !eventually(timeout: briefTimeout) { cancels.current > 1 })
    #expect(cancels.current == 1)
  }

  @Test("cancelling the task ends the loop and cancels the source once")
  func taskCancellationEndsLoop() async throws {
    // A serial queue of its own, not the global one: libdispatch gives a serial queue a thread even
    // when the global queue's are all busy, and on 2 cores the testing library's blocking reads of
    // exit tests' pipes can hold both (once in 10 clean-clone `make test` runs the registration
    // handler had not run on the global queue after 10 s).
    let source = DataReplaceSource(queue: Queue(label: "events.task.cancel"))
    let cancels = Counter()
    source.setCancelHandler { cancels.increment() }
    let started = Event()
    source.setRegistrationHandler { started.signal() }
    // The consumer on a queue of its own too (a task executor preference), not the cooperative
    // pool: on 2 cores the suite's tests that block their threads (exit tests reading their
    // children's pipes, waits on events) can hold both of the pool's threads for longer than the
    // wait below, and a task waiting for a thread never starts the sequence.
    let consumer = Task(executorPreference: Queue(label: "events.task.cancel.consumer")) {
      var seen = 0
      for try await _ in source.makeEvents() { seen += 1 }
      return seen
    }
    #expect(await eventually { started.isSignaled })
    consumer.cancel()
    #expect(try await consumer.value == 0)
    #expect(await eventually { cancels.current == 1 })
    #expect(source.isCancelled)
  }

  @Test("cancelling the source elsewhere finishes the sequence after the element already taken")
  func sourceCancelFinishes() async throws {
    let source = DataAddSource(queue: Queue(label: "events.finish"))
    source.setRegistrationHandler {
      source.merge(3)
    }
    var values: [UInt] = []
    for try await value in source.makeEvents() {
      values.append(value)
      source.cancel()
    }
    #expect(values == [3])
  }

  @Test(
    "a source started before iteration, or iterated while another iteration runs, throws EBUSY; a cancelled one finishes"
  )
  func startedSourceThrows() async throws {
    let started = DataAddSource(queue: .global())
    started.resume()
    let error = await #expect(throws: GCDError.self) {
      for try await _ in started.makeEvents() {}
    }
    #expect(error?.errno == EBUSY)
    #expect(error?.description.contains("DataAddSource.makeEvents()") == true)

    let twice = DataAddSource(queue: .global())
    twice.setRegistrationHandler { twice.merge(1) }
    var first = twice.makeEvents().makeAsyncIterator()
    #expect(try await first.next() == 1)
    let second = await #expect(throws: GCDError.self) {
      for try await _ in twice.makeEvents() {}
    }
    #expect(second?.errno == EBUSY)
    #expect(!twice.isCancelled)  // the failed second iteration leaves the first one's source alone
    withExtendedLifetime(first) {}
    // Once the source is cancelled, a new iteration just finishes.
    twice.cancel()
    for try await _ in twice.makeEvents() { Issue.record("an element after cancel") }

    let cancelled = DataAddSource(queue: .global())
    cancelled.cancel()
    var count = 0
    for try await _ in cancelled.makeEvents() { count += 1 }
    #expect(count == 0)
  }

  @Test("a signal sent right after registration is seen (sent with kill(getpid()))")
  func signalAfterRegistrationIsSeen() async throws {
    let source = try SignalSource(signal: eventsSignal, queue: Queue(label: "events.signal"))
    let registered = Event()
    source.setRegistrationHandler { registered.signal() }
    let sender = Task.detached {
      #expect(await eventually { registered.isSignaled })
      kill(getpid(), eventsSignal)
    }
    for try await deliveries in source.makeEvents() {
      #expect(deliveries >= 1)
      break
    }
    await sender.value
  }

  @Test("withSignals: registered before the body runs; deliveries as signal numbers; sources gone after")
  func scopedSignals() async throws {
    let seen = try await SignalSource.withSignals([scopedSignal, SIGWINCH]) { signals in
      kill(getpid(), scopedSignal)
      for await signal in signals where signal == scopedSignal {
        return signal
      }
      return 0
    }
    #expect(seen == scopedSignal)
    await #expect(throws: GCDError.self) {
      try await SignalSource.withSignals([SIGKILL]) { _ in }
    }
  }

  @Test("a timer's events are fire counts")
  func timerEvents() async throws {
    let timer = TimerSource(queue: .global())
    timer.schedule(start: .now, interval: .milliseconds(1))
    var fires: UInt = 0
    for try await count in timer.makeEvents() {
      fires += count
      if fires >= 5 { break }
    }
    #expect(fires >= 5)
    #expect(timer.isCancelled)
  }

  @Test("read and write sources: bytes available, buffer space")
  func readWriteEvents() async throws {
    var ends: [Int32] = [-1, -1]
    #expect(pipe(&ends) == 0)
    defer {
      close(ends[0])
      close(ends[1])
    }
    let writer = try WriteSource(fileDescriptor: ends[1], queue: .global())
    for try await space in writer.makeEvents() {
      #expect(space > 0)
      _ = write(ends[1], "hello", 5)
      break
    }
    let reader = try ReadSource(fileDescriptor: ends[0], queue: .global())
    for try await available in reader.makeEvents() {
      #expect(available == 5)
      var buffer = [UInt8](repeating: 0, count: 16)
      #expect(read(ends[0], &buffer, 16) == 5)
      break
    }
  }

  @Test("a ProcSource's events are ProcEvents: .exit once the child exits")
  func procEvents() async throws {
    let pid = try spawnProcess("/bin/sh", ["-c", "exit 3"])
    let source = try ProcSource(pid: pid, queue: .global())
    var fired: [ProcEvents] = []
    for try await events in source.makeEvents() {
      fired.append(events)
      break
    }
    #expect(fired == [.exit])
    #expect(reapProcess(pid) >> 8 == 3)
  }

  @Test("a FileSystemSource's events are FileSystemEvents")
  func fileSystemEvents() async throws {
    let path = "/tmp/gcd-events-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    let descriptor = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
    #expect(descriptor >= 0)
    defer {
      close(descriptor)
      unlink(path)
    }
    let source = try FileSystemSource(path: path, events: [.write, .extend], queue: .global())
    source.setRegistrationHandler { _ = write(descriptor, "data", 4) }
    for try await events in source.makeEvents() {
      #expect(events.contains(.write))
      break
    }
  }
}
