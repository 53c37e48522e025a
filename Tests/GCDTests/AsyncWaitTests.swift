import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

private struct Failure: Error, Equatable { let code: Int }

/// Blocking checks, from synchronous code (the blocking forms are `noasync`).
private func groupIsEmpty(_ group: Group) -> Bool { group.wait(timeout: .zero) }
private func takeUnit(_ semaphore: GCD.Semaphore) -> Bool { semaphore.wait(timeout: .zero) }

@Suite("Await forms: Queue.run, Group.wait, Semaphore.wait")
struct AsyncWaitTests {
  @Test("await run returns the closure's result from the queue, and rethrows its typed error")
  func runReturnsAndThrows() async {
    let queue = Queue(label: "await.run")
    let (value, onQueue) = await queue.run { (42, queue.isCurrent) }
    #expect(value == 42)
    #expect(onQueue)
    do {
      _ = try await queue.run { () throws(Failure) -> Int in throw Failure(code: 7) }
      Issue.record("run did not rethrow")
    } catch {
      #expect(error == Failure(code: 7))  // typed: `error` is a Failure
    }
  }

  @Test("10,000 await run calls complete without a blocked thread", .timeLimit(.minutes(3)))
  func tenThousandRunsBlockNoThread() async {
    let queue = Queue(label: "await.many", target: .global())
    queue.suspend()
    let finished = Counter()
    await withTaskGroup(of: Void.self) { group in
      for index in 0..<10_000 {
        group.addTask {
          let echoed = await queue.run { index }
          if echoed == index { finished.increment() }
        }
      }
      // Every task is now suspended in run (the queue is suspended). Were a
      // thread blocked per call, the cooperative pool (one thread per core)
      // would be exhausted and this probe would never run.
      let probe = await Task.detached { 1 + 1 }.value
      #expect(probe == 2)
      #expect(finished.current == 0)
      queue.resume()
    }
    #expect(finished.current == 10_000)
  }

  @Test("await group.wait returns once the group's work is done")
  func groupWaitReturns() async throws {
    let group = Group()
    try await group.wait()  // empty: at once
    group.enter()
    let released = Event()
    let returned = Event()
    let waiter = Task {
      try await group.wait()
      returned.signal()
    }
    #expect(await !eventually(timeout: briefTimeout) { returned.isSignaled })
    group.async(on: .global()) { released.signal() }
    group.leave()
    try await waiter.value
    #expect(released.isSignaled)
    #expect(returned.isSignaled)
  }

  @Test("a cancelled group.wait throws CancellationError promptly; the group is untouched")
  func groupWaitCancelled() async {
    let group = Group()
    group.enter()
    let waiter = Task { try await group.wait() }
    waiter.cancel()
    let outcome = await waiter.result
    #expect(throws: CancellationError.self) { try outcome.get() }
    #expect(!groupIsEmpty(group))
    group.leave()
    #expect(groupIsEmpty(group))
  }

  @Test("await semaphore.wait takes a free unit at once, or waits for a signal")
  func semaphoreWaitTakesAndWaits() async throws {
    let semaphore = try GCD.Semaphore(value: 1)
    try await semaphore.wait()
    let acquired = Event()
    let waiter = Task {
      try await semaphore.wait()
      acquired.signal()
    }
    #expect(await !eventually(timeout: briefTimeout) { acquired.isSignaled })
    #expect(semaphore.signal())  // wakes the task
    try await waiter.value
    #expect(acquired.isSignaled)
    #expect(!takeUnit(semaphore))
  }

  @Test(
    "a cancelled semaphore waiter returns promptly with CancellationError and takes no unit", .timeLimit(.minutes(3)))
  func semaphoreWaitCancelled() async throws {
    let semaphore = try GCD.Semaphore(value: 0)
    let waiter = Task { try await semaphore.wait() }
    let other = Task { try await semaphore.wait() }
    waiter.cancel()
    let outcome = await waiter.result
    #expect(throws: CancellationError.self) { try outcome.get() }
    semaphore.signal()  // goes to the remaining waiter, not to the cancelled one
    try await other.value
    semaphore.signal()
    #expect(takeUnit(semaphore))  // the count is intact
    #expect(!takeUnit(semaphore))
  }

  @Test("many async waiters and a semaphore of 2: at most 2 inside, every unit handed over once")
  func semaphoreStress() async throws {
    let semaphore = try GCD.Semaphore(value: 2)
    let meter = OverlapMeter()
    let passed = Counter()
    try await withThrowingTaskGroup(of: Void.self) { group in
      for _ in 0..<2_000 {
        group.addTask {
          try await semaphore.wait()
          meter.enter()
          await Task.yield()
          meter.exit()
          passed.increment()
          semaphore.signal()
        }
      }
      try await group.waitForAll()
    }
    #expect(passed.current == 2_000)
    #expect(meter.maximum <= 2)
    #expect(takeUnit(semaphore) && takeUnit(semaphore) && !takeUnit(semaphore))
  }
}
