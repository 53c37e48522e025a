import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

@Suite("Semaphore")
struct SemaphoreTests {
  @Test("a negative starting value throws GCDError with EINVAL and a readable description")
  func negativeValueThrows() {
    #expect(throws: GCDError.self) { try Semaphore(value: -1) }
    do {
      _ = try Semaphore(value: -3)
      Issue.record("Semaphore(value: -3) did not throw")
    } catch {
      // `error` is statically a GCDError: the initializer throws typed.
      #expect(error.errno == EINVAL)
      #expect(error.operation == "Semaphore(value: -3)")
      #expect(error.detail != nil)
      #expect(
        error.description
          == "Semaphore(value: -3): Invalid argument (errno \(EINVAL), EINVAL): the starting value must be zero or more"
      )
    }
  }

  @Test("zero and positive starting values are accepted", arguments: [0, 1, 2, 64])
  func startingValues(value: Int) throws {
    let semaphore = try Semaphore(value: value)
    for _ in 0..<value {
      #expect(semaphore.wait(timeout: .zero))
    }
    #expect(!semaphore.wait(timeout: .zero))
  }

  @Test("a Semaphore(1) guards a counter over 10,000 concurrent increments")
  func mutualExclusion() throws {
    let semaphore = try Semaphore(value: 1)
    let counter = UnsafeBox(0)
    let meter = OverlapMeter()
    Queue.global().apply(10_000) { _ in
      semaphore.wait()
      meter.enter()
      counter.value += 1
      meter.exit()
      semaphore.signal()
    }
    #expect(counter.value == 10_000)
    #expect(meter.maximum == 1)
  }

  @Test("a Semaphore(n) lets at most n holders in at once")
  func countingLimit() throws {
    let semaphore = try Semaphore(value: 3)
    let meter = OverlapMeter()
    Queue(label: "s.limit", kind: .concurrent).apply(2_000) { _ in
      semaphore.wait()
      meter.enter()
      meter.exit()
      semaphore.signal()
    }
    #expect(meter.maximum <= 3)
    #expect(meter.maximum >= 1)
  }

  @Test("wait(timeout:) is false when no unit is available, true once one is")
  func waitTimeout() throws {
    let semaphore = try Semaphore(value: 0)
    #expect(!semaphore.wait(timeout: .zero))
    #expect(!semaphore.wait(timeout: .milliseconds(20)))
    #expect(!semaphore.wait(timeout: .seconds(-1)))
    semaphore.signal()
    #expect(semaphore.wait(timeout: .zero))
    #expect(!semaphore.wait(timeout: .zero))
  }

  @Test("wait(timeout:) returns true when another thread signals while it waits")
  func waitTimeoutWoken() throws {
    let semaphore = try Semaphore(value: 0)
    Queue.global().after(.milliseconds(20)) { semaphore.signal() }
    #expect(semaphore.wait(timeout: generousTimeout))
  }

  @Test("wait(deadline:) with monotonic, wall-clock, past and forever deadlines")
  func waitDeadline() throws {
    let semaphore = try Semaphore(value: 0)
    #expect(!semaphore.wait(deadline: .now))
    #expect(!semaphore.wait(deadline: .now + .milliseconds(20)))
    #expect(!semaphore.wait(deadline: .wallClock() + .milliseconds(20)))
    #expect(!semaphore.wait(deadline: .now - .seconds(1)))
    semaphore.signal()
    #expect(semaphore.wait(deadline: .forever))
    Queue.global().after(.milliseconds(10)) { semaphore.signal() }
    #expect(semaphore.wait(deadline: .forever))
  }

  @Test("wait(timeout:) with a huge timeout clamps instead of trapping")
  func waitHugeTimeout() throws {
    let semaphore = try Semaphore(value: 1)
    #expect(semaphore.wait(timeout: .seconds(Int64.max)))
  }

  @Test("signal() returns false when nobody waits")
  func signalWithoutWaiter() throws {
    let semaphore = try Semaphore(value: 0)
    #expect(!semaphore.signal())
    #expect(!semaphore.signal())
    #expect(semaphore.wait(timeout: .zero))
    #expect(semaphore.wait(timeout: .zero))
  }

  // A waiter counts as waiting once its wait() has taken the count below
  // zero, which happens before it blocks in the kernel. The waiter's only
  // blocking call after it has published its thread id is that wait(), so
  // once the kernel reports the thread sleeping, signal() must wake it.
  @Test("signal() returns true when it wakes a waiting thread")
  func signalWakesWaiter() throws {
    let semaphore = try Semaphore(value: 0)
    let waiter = Atomic<Int32>(0)
    let returned = Event()
    Queue(label: "s.waiter").async {
      waiter.store(currentThreadID(), ordering: .releasing)
      semaphore.wait()
      returned.signal()
    }
    var thread: Int32 = 0
    let clock = ContinuousClock()
    let deadline = clock.now + generousTimeout
    while thread == 0 && clock.now < deadline {
      thread = waiter.load(ordering: .acquiring)
      if thread == 0 { sched_yield() }
    }
    try #require(thread != 0)
    try #require(waitUntilBlocked(thread: thread))
    #expect(semaphore.signal())
    #expect(returned.wait())
    #expect(!semaphore.signal())
  }

  @Test("a blocked wait() returns once signalled from another thread")
  func blockedWaitReturns() throws {
    let semaphore = try Semaphore(value: 0)
    let returned = Event()
    Queue(label: "s.blocked").async {
      semaphore.wait()
      returned.signal()
    }
    #expect(!returned.wait(timeout: briefTimeout))
    semaphore.signal()
    #expect(returned.wait())
  }

  @Test("dropping a semaphore below its starting value does not crash")
  func dropBelowStart() async {
    await #expect(processExitsWith: .success) {
      dropSemaphoresBelowTheirStartingValue()
    }
  }

  @Test("dropping a semaphore below its starting value in-process is safe too")
  func dropBelowStartInProcess() throws {
    for value in [1, 2, 10] {
      let semaphore = try Semaphore(value: value)
      #expect(semaphore.wait(timeout: .zero))
    }
  }

  @Test("dropping a semaphore above its starting value is safe")
  func dropAboveStart() throws {
    let semaphore = try Semaphore(value: 1)
    semaphore.signal()
    semaphore.signal()
  }
}

private func dropSemaphoresBelowTheirStartingValue() {
  for value in [1, 2, 5, 100] {
    let semaphore = try! Semaphore(value: value)
    for _ in 0..<value { _ = semaphore.wait(timeout: .zero) }
  }
  // A semaphore with a timed-out waiter, dropped at zero.
  let semaphore = try! Semaphore(value: 3)
  for _ in 0..<3 { semaphore.wait() }
  _ = semaphore.wait(timeout: .milliseconds(1))
}
