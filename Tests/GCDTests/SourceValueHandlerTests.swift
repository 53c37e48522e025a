import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// `setEventHandler { value in }`: each source type's handler gets the
/// value its `events` yields, read in the handler, so it never captures
/// its own source; the no-argument `setEventHandler { }` still works.
@Suite("Source value handlers")
struct SourceValueHandlerTests {
  @Test("data sources: the merged sum, bits, latest value; the zero-argument spelling still runs")
  func dataSources() async throws {
    let add = DataAddSource(queue: Queue(label: "value.add"))
    let sums = Mutex<[UInt]>([])
    add.setEventHandler { value in sums.withLock { $0.append(value) } }
    add.resume()
    add.merge(7)
    #expect(await eventually { sums.withLock { $0.reduce(0, +) } == 7 })

    let or = DataOrSource(queue: Queue(label: "value.or"))
    let bits = Mutex<UInt>(0)
    or.setEventHandler { bits.withLock { [value = $0] in $0 |= value } }
    or.resume()
    or.merge(0b100)
    #expect(await eventually { bits.withLock { $0 } == 0b100 })

    let replace = DataReplaceSource(queue: Queue(label: "value.replace"))
    let latest = Mutex<UInt>(0)
    replace.setEventHandler { (value: UInt) in latest.withLock { $0 = value } }
    replace.resume()
    replace.merge(42)
    #expect(await eventually { latest.withLock { $0 } == 42 })

    // The zero-argument closure still picks the plain handler.
    let plain = DataAddSource(queue: Queue(label: "value.plain"))
    let runs = Counter()
    plain.setEventHandler { runs.increment() }
    plain.resume()
    plain.merge(1)
    #expect(await eventually { runs.current >= 1 })
    for source in [add, or, replace, plain] as [Source] { source.cancel() }
  }

  @Test("a timer's handler gets the fire count")
  func timer() async throws {
    let timer = TimerSource(queue: Queue(label: "value.timer"))
    let fires = Counter()
    timer.setEventHandler { count in for _ in 0..<count { fires.increment() } }
    timer.schedule(start: .now, interval: .milliseconds(1))
    timer.resume()
    #expect(await eventually { fires.current >= 5 })
    timer.cancel()
  }

  @Test("a signal source's handler gets the delivery count (its own source not captured)")
  func signal() async {
    expectChildPassed(
      await #expect(processExitsWith: .success, observing: [\.standardErrorContent]) {
        blocking { signalCount() }
      })
  }

  @Test("read and write sources' handlers get the bytes available and the buffer space")
  func readWrite() async throws {
    var ends: [Int32] = [-1, -1]
    #expect(pipe(&ends) == 0)
    defer {
      close(ends[0])
      close(ends[1])
    }
    let space = Mutex<UInt>(0)
    let writer = try WriteSource(fileDescriptor: ends[1], queue: Queue(label: "value.write"))
    writer.setEventHandler { value in space.withLock { $0 = max($0, value) } }
    writer.resume()
    #expect(await eventually { space.withLock { $0 } > 0 })
    writer.cancel()
    _ = write(ends[1], "hello", 5)
    let available = Mutex<UInt>(0)
    let reader = try ReadSource(fileDescriptor: ends[0], queue: Queue(label: "value.read"))
    reader.setEventHandler { value in available.withLock { $0 = value } }
    reader.resume()
    #expect(await eventually { available.withLock { $0 } == 5 })
    reader.cancel()
  }

  @Test("a ProcSource's handler gets ProcEvents, a FileSystemSource's FileSystemEvents")
  func procAndFileSystem() async throws {
    let pid = try spawnProcess("/bin/sh", ["-c", "exit 0"])
    let proc = try ProcSource(pid: pid, queue: Queue(label: "value.proc"))
    let exited = Mutex<ProcEvents>([])
    proc.setEventHandler { events in exited.withLock { $0.formUnion(events) } }
    proc.resume()
    #expect(await eventually { exited.withLock { $0 } == .exit })
    proc.cancel()
    #expect(reapProcess(pid) == 0)

    let path = "/tmp/gcd-value-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    let descriptor = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0o600)
    #expect(descriptor >= 0)
    defer {
      close(descriptor)
      unlink(path)
    }
    let file = try FileSystemSource(path: path, events: [.write, .extend], queue: Queue(label: "value.fs"))
    let fired = Mutex<FileSystemEvents>([])
    let registered = Event()
    file.setRegistrationHandler { registered.signal() }
    file.setEventHandler { events in fired.withLock { $0.formUnion(events) } }
    file.resume()
    #expect(await eventually { registered.isSignaled })
    _ = write(descriptor, "data", 4)
    #expect(await eventually { fired.withLock { $0.contains(.write) } })
    file.cancel()
  }

  @Test("the pressure sources' handlers take their events' element types")
  func pressureTypes() {
    // These compile only with the typed overloads (firing needs a cgroup
    // under pressure: PressureSourceTests, MemoryPressureSourceTests).
    let pressure: (PressureSource, @escaping @Sendable (UInt) -> Void) -> Void = { $0.setEventHandler($1) }
    let memory: (MemoryPressureSource, @escaping @Sendable (MemoryPressureEvents) -> Void) -> Void = {
      $0.setEventHandler($1)
    }
    #expect(type(of: pressure) == type(of: { (_: PressureSource, _: @escaping @Sendable (UInt) -> Void) in }))
    #expect(
      SourceEvents<MemoryPressureEvents>.Element.self == MemoryPressureEvents.self
        && type(of: memory)
          == type(of: { (_: MemoryPressureSource, _: @escaping @Sendable (MemoryPressureEvents) -> Void) in })
    )
  }
}

/// In an exit test's child (a signal of its own): the handler sees the
/// count, and the source is released once dropped (no handler holds it).
@available(*, noasync, message: "blocks the thread")
private func signalCount() {
  signal(SIGUSR1, SIG_IGN)
  weak var released: SignalSource?
  let seen = Event()
  let cancelled = Event()
  do {
    guard let source = try? SignalSource(signal: SIGUSR1, queue: Queue(label: "value.signal")) else {
      failChild("SignalSource failed")
    }
    released = source
    let registered = Event()
    source.setRegistrationHandler { registered.signal() }
    source.setEventHandler { count in
      childCheck(count >= 1, "a delivery count of \(count)")
      seen.signal()
    }
    source.setCancelHandler { cancelled.signal() }
    source.resume()
    requireInChild(registered, "the signal source never registered")
    kill(getpid(), SIGUSR1)
    requireInChild(seen, "the handler never saw the signal")
  }
  // The handler does not hold the source: dropping it cancels and frees it.
  requireInChild(cancelled, "the dropped source was not cancelled")
  childCheck(released == nil, "the source outlived its last reference")
  exit(0)
}
