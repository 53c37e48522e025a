import GCD
import Synchronization
import Testing

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

/// An actor whose executor is a `SerialQueue`: each call records whether it
/// ran on the queue (`isCurrent`, `Queue.precondition`) and bumps a counter
/// with a read-yield-write that would lose updates without isolation.
private actor QueueActor {
  let queue: SerialQueue
  var count = 0
  var offQueueCalls = 0

  init(queue: SerialQueue) { self.queue = queue }

  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }

  func bump() {
    if !queue.isCurrent { offQueueCalls += 1 }
    Queue.precondition(.onQueue(queue))
    let seen = count
    count = seen + 1
  }

  func snapshot() -> (count: Int, offQueue: Int) { (count, offQueueCalls) }
}

/// `assumeIsolated` from synchronous code (it is not available from async code).
private func assumeIsolatedFromHere(_ actor: QueueActor) {
  _ = actor.assumeIsolated { $0.count }
}

/// Waits, without blocking a thread, until `condition` holds or `timeout`
/// passes (checking every millisecond); true if it held. Async tests use it
/// instead of `Event.wait`, which would block a cooperative thread.
func eventually(timeout: Duration = generousTimeout, _ condition: () -> Bool) async -> Bool {
  let deadline = ContinuousClock.now + timeout
  while !condition() {
    if ContinuousClock.now >= deadline { return false }
    try? await Task.sleep(for: .milliseconds(1))
  }
  return true
}

@Suite("SerialQueue")
struct SerialQueueTests {
  @Test("an actor on a SerialQueue runs every method on that queue, serially, under 8 concurrent callers")
  func actorOnQueueUnderEightCallers() async {
    let queue = SerialQueue(label: "serial.actor")
    let actor = QueueActor(queue: queue)
    await withTaskGroup(of: Void.self) { group in
      for _ in 0..<8 {
        group.addTask {
          for _ in 0..<250 { await actor.bump() }
        }
      }
    }
    let (count, offQueue) = await actor.snapshot()
    #expect(count == 8 * 250)
    #expect(offQueue == 0)
  }

  @Test("assumeIsolated holds in plain queue work (closures and sync), through checkIsolated")
  func assumeIsolatedFromQueueWork() async {
    let queue = SerialQueue(label: "serial.assume")
    let actor = QueueActor(queue: queue)
    await actor.bump()
    let done = Event()
    let seen = Mutex(0)
    queue.async {
      let count = actor.assumeIsolated { $0.count }
      seen.withLock { $0 = count }
      done.signal()
    }
    #expect(await eventually { done.isSignaled })
    #expect(seen.withLock { $0 } == 1)
    #expect(queue.isIsolatingCurrentContext() == false)
    let inside = blocking { queue.sync { queue.isIsolatingCurrentContext() } }
    #expect(inside == true)
  }

  @Test("assumeIsolated off the queue stops the process")
  func assumeIsolatedOffQueueTraps() async {
    await #expect(processExitsWith: .failure) {
      assumeIsolatedFromHere(QueueActor(queue: SerialQueue(label: "serial.off")))
    }
  }

  @Test("checkIsolated off the queue stops with a message naming the queue")
  func checkIsolatedMessage() async {
    let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
      SerialQueue(label: "serial.check").checkIsolated()
    }
    #expect(standardError(of: result).contains("SerialQueue 'serial.check'"))
  }

  @Test("a task preferring the actor's queue calls it on that queue; its own code runs there too")
  func preferenceCallsInline() async {
    let queue = SerialQueue(label: "serial.preferred")
    let actor = QueueActor(queue: queue)
    let onQueue = await withTaskExecutorPreference(queue) {
      await actor.bump()
      return queue.isCurrent
    }
    #expect(onQueue)
    #expect(await actor.snapshot().offQueue == 0)
  }

  @Test(
    "withTaskExecutorPreference runs child tasks on the queue, for any kind of Queue",
    arguments: ["serial", "concurrent", "global", "serialQueue"])
  func childTasksRunOnPreferredQueue(kind: String) async {
    let queue: Queue =
      switch kind {
      case "serial": Queue(label: "pref.serial")
      case "concurrent": Queue(label: "pref.concurrent", kind: .concurrent)
      case "global": Queue.global(.low)
      default: SerialQueue(label: "pref.serialQueue")
      }
    let onQueue = await withTaskExecutorPreference(queue) {
      await withTaskGroup(of: Bool.self) { group in
        for _ in 0..<16 {
          group.addTask {
            await Task.yield()
            return queue.isCurrent
          }
        }
        var all = true
        for await child in group { all = all && child }
        return all
      }
    }
    #expect(onQueue)
  }

  @Test("a SerialQueue is a Queue (targets, groups, sources) and a SerialExecutor; a Queue is not one")
  func isAQueueAndOnlySerialQueuesAreSerialExecutors() async throws {
    let serial = SerialQueue(label: "serial.queue", qos: .utility)
    #expect(serial.kind == .serial)
    #expect(serial.label == "serial.queue")
    #expect(serial.qos.rawClass == Queue.QoS.utility.rawClass)
    #expect((serial as Any) is any SerialExecutor)
    #expect((serial as Any) is any TaskExecutor)
    let concurrent = Queue(label: "serial.concurrent", kind: .concurrent)
    #expect(!((concurrent as Any) is any SerialExecutor))
    #expect((concurrent as Any) is any TaskExecutor)
    #expect(!((Queue.global() as Any) is any SerialExecutor))

    let target = SerialQueue(label: "serial.target")
    let child = Queue(label: "serial.child", target: target)
    let retargeted = SerialQueue(label: "serial.retargeted", target: target)
    let group = Group()
    let onTarget = Counter()
    for queue in [child, retargeted] as [Queue] {
      group.async(on: queue) { if target.isCurrent { onTarget.increment() } }
    }
    let source = DataAddSource(queue: serial)
    let fired = Event()
    source.setEventHandler { if serial.isCurrent { fired.signal() } }
    source.resume()
    source.merge(1)
    try await group.wait()
    #expect(onTarget.current == 2)
    #expect(await eventually { fired.isSignaled })
    source.cancel()
  }

  @Test("actor methods on a SerialQueue that targets another queue run through it")
  func actorThroughTarget() async {
    let target = Queue(label: "serial.outer")
    let queue = SerialQueue(label: "serial.inner", target: target)
    let actor = QueueActor(queue: queue)
    await actor.bump()
    let throughTarget = await withTaskExecutorPreference(queue) { target.isCurrent }
    #expect(throughTarget)
    #expect(await actor.snapshot() == (1, 0))
  }
}
