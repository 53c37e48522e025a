import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Swift concurrency (docs/concurrency.md): actors on a queue, `await
// queue.run`, source events as an AsyncSequence. The GCD column is this
// package; the Dispatch column is what a Linux user writes instead (named in
// each title); C has no async form.

func concurrencyBenchmarks(heapInUse: (@convention(c) () -> Int)?) -> [Benchmark] {
  let noAsyncInC = Runner.unavailable("n/a (no async in C)")
  return [
    Benchmark(
      name: "actor_same_queue",
      title: "actor call from a task preferring the actor's SerialQueue (Dispatch column: a default actor)",
      count: 200_000,
      runners: [.c: noAsyncInC, .gcd: .run(gcdActorSameQueue), .dispatch: .run(defaultActorCall)]),
    Benchmark(
      name: "actor_hop",
      title:
        "actor call from an actor on another executor (a hop there and back): SerialQueue vs DispatchQueue executors",
      count: 20_000,
      runners: [.c: noAsyncInC, .gcd: .run(gcdActorHop), .dispatch: .run(dispatchExecutorActorHop)]),
    Benchmark(
      name: "actor_8_callers",
      title: "8 concurrent callers of one actor (time per call): SerialQueue vs DispatchQueue executor",
      count: 40_000,
      runners: [.c: noAsyncInC, .gcd: .run(gcdActorEightCallers), .dispatch: .run(dispatchExecutorEightCallers)]),
    Benchmark(
      name: "await_run_serial",
      title: "await q.run {} on a private serial queue vs withCheckedContinuation + DispatchQueue.async",
      count: 20_000,
      runners: [
        .c: noAsyncInC, .gcd: .run { gcdAwaitRun(Queue(label: "bench.run"), $0) },
        .dispatch: .run { continuationAsync(DispatchQueue(label: "bench.run"), $0) },
      ]),
    Benchmark(
      name: "await_run_target",
      title: "await q.run {} on a serial queue targeting a global queue vs the same with DispatchQueue",
      count: 50_000,
      runners: [
        .c: noAsyncInC, .gcd: .run { gcdAwaitRun(Queue(label: "bench.run.t", target: .global()), $0) },
        .dispatch: .run { continuationAsync(DispatchQueue(label: "bench.run.t", target: .global()), $0) },
      ]),
    Benchmark(
      name: "await_run_global",
      title: "await Queue.global().run {} vs withCheckedContinuation + DispatchQueue.global().async",
      count: 50_000,
      runners: [
        .c: noAsyncInC, .gcd: .run { gcdAwaitRun(Queue.global(), $0) },
        .dispatch: .run { continuationAsync(DispatchQueue.global(), $0) },
      ]),
    Benchmark(
      name: "source_events",
      title:
        "DATA_ADD merges every 20 µs into a consumer taking 200 µs per element: source.makeEvents() vs AsyncStream fed from a DispatchSource (ns/merge)",
      count: 5_000, repeats: 3,
      shownExtras: [
        ("peak_kib", "peak heap KiB", 1), ("backlog", "most elements held", 1), ("elements", "elements", 1),
      ],
      runners: [
        .c: noAsyncInC, .gcd: .run { gcdSourceEvents($0, heapInUse: heapInUse) },
        .dispatch: .run { streamSourceEvents($0, heapInUse: heapInUse) },
      ]),
  ]
}

/// Runs `body` as a task and blocks the calling (main) thread until it ends.
private func blockOn(_ body: @escaping @Sendable () async -> Void) {
  let done = DispatchSemaphore(value: 0)
  Task {
    await body()
    done.signal()
  }
  done.wait()
}

/// Times `body` (run as a task) over `count` operations.
func timed(_ count: Int, _ body: @escaping @Sendable () async -> Void) -> Sample {
  let start = Mutex<Int64>(0)
  let end = Mutex<Int64>(0)
  blockOn {
    start.withLock { $0 = monotonicNanos() }
    await body()
    end.withLock { $0 = monotonicNanos() }
  }
  return Sample(start: start.withLock { $0 }, end: end.withLock { $0 }, count: count)
}

// MARK: - Actors

private actor QueueActor {
  let queue: SerialQueue
  var calls = 0
  init(queue: SerialQueue) { self.queue = queue }
  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
  func call() {
    check(queue.isCurrent, "QueueActor ran off its queue")
    calls &+= 1
  }
}

/// QueueActor without the per-call check (the same-queue row compares it with a default actor, which has none).
private actor PlainQueueActor {
  let queue: SerialQueue
  var calls = 0
  init(queue: SerialQueue) { self.queue = queue }
  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
  func call() { calls &+= 1 }
  func ranOnQueue() -> Bool { queue.isCurrent }
}

private actor DefaultActor {
  var calls = 0
  func call() { calls &+= 1 }
}

/// Marks each DispatchQueueExecutor's queue with its label, for the check in the actor.
private let executorQueueKey = DispatchSpecificKey<String>()

/// The usual Linux workaround: a serial executor that wraps each job in a
/// closure submitted to a DispatchQueue (a block per job).
private final class DispatchQueueExecutor: SerialExecutor {
  let queue: DispatchQueue
  init(label: String) {
    queue = DispatchQueue(label: label)
    queue.setSpecific(key: executorQueueKey, value: label)
  }

  func enqueue(_ job: consuming ExecutorJob) {
    let job = UnownedJob(job)
    queue.async { job.runSynchronously(on: self.asUnownedSerialExecutor()) }
  }
}

private actor DispatchExecutorActor {
  let executor: DispatchQueueExecutor
  var calls = 0
  init(executor: DispatchQueueExecutor) { self.executor = executor }
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  func call() {
    // (dispatchPrecondition is compiled out of release builds; the queue's specific value is not.)
    check(
      DispatchQueue.getSpecific(key: executorQueueKey) == executor.queue.label,
      "DispatchExecutorActor ran off its queue")
    calls &+= 1
  }
}

@inline(never)
private func gcdActorSameQueue(_ count: Int) -> Sample {
  let actor = PlainQueueActor(queue: SerialQueue(label: "bench.actor.same"))
  let sample = timed(count) {
    await withTaskExecutorPreference(actor.queue) {
      for _ in 0..<count { await actor.call() }
    }
  }
  blockOn {
    check(await actor.calls == count, "actor_same_queue GCD calls")
    check(await actor.ranOnQueue(), "actor_same_queue GCD off its queue")
  }
  return sample
}

@inline(never)
private func defaultActorCall(_ count: Int) -> Sample {
  let actor = DefaultActor()
  let sample = timed(count) {
    for _ in 0..<count { await actor.call() }
  }
  blockOn { check(await actor.calls == count, "actor_same_queue default actor calls") }
  return sample
}

/// An actor on a SerialQueue that calls `target` (on another queue) `count` times.
private actor QueueCaller {
  let queue = SerialQueue(label: "bench.actor.caller")
  nonisolated var unownedExecutor: UnownedSerialExecutor { queue.asUnownedSerialExecutor() }
  func call(_ target: QueueActor, _ count: Int) async {
    for _ in 0..<count { await target.call() }
  }
}

/// An actor on a DispatchQueue executor that calls `target` `count` times.
private actor DispatchCaller {
  let executor = DispatchQueueExecutor(label: "bench.actor.caller")
  nonisolated var unownedExecutor: UnownedSerialExecutor { executor.asUnownedSerialExecutor() }
  func call(_ target: DispatchExecutorActor, _ count: Int) async {
    for _ in 0..<count { await target.call() }
  }
}

@inline(never)
private func gcdActorHop(_ count: Int) -> Sample {
  let actor = QueueActor(queue: SerialQueue(label: "bench.actor.hop"))
  let caller = QueueCaller()
  let sample = timed(count) { await caller.call(actor, count) }
  blockOn { check(await actor.calls == count, "actor_hop GCD calls") }
  return sample
}

@inline(never)
private func dispatchExecutorActorHop(_ count: Int) -> Sample {
  let actor = DispatchExecutorActor(executor: DispatchQueueExecutor(label: "bench.actor.hop"))
  let caller = DispatchCaller()
  let sample = timed(count) { await caller.call(actor, count) }
  blockOn { check(await actor.calls == count, "actor_hop Dispatch calls") }
  return sample
}

private func eightCallers(_ count: Int, _ call: @escaping @Sendable () async -> Void) async {
  await withTaskGroup(of: Void.self) { group in
    for _ in 0..<8 {
      group.addTask {
        for _ in 0..<count / 8 { await call() }
      }
    }
  }
}

@inline(never)
private func gcdActorEightCallers(_ count: Int) -> Sample {
  let actor = QueueActor(queue: SerialQueue(label: "bench.actor.8"))
  let sample = timed(count) { await eightCallers(count) { await actor.call() } }
  blockOn { check(await actor.calls == count / 8 * 8, "actor_8_callers GCD calls") }
  return sample
}

@inline(never)
private func dispatchExecutorEightCallers(_ count: Int) -> Sample {
  let actor = DispatchExecutorActor(executor: DispatchQueueExecutor(label: "bench.actor.8"))
  let sample = timed(count) { await eightCallers(count) { await actor.call() } }
  blockOn { check(await actor.calls == count / 8 * 8, "actor_8_callers Dispatch calls") }
  return sample
}

// MARK: - await run

@inline(never)
private func gcdAwaitRun(_ queue: Queue, _ count: Int) -> Sample {
  let counter = AtomicCounter()
  let sample = timed(count) {
    for _ in 0..<count { _ = await queue.run { counter.value.add(1, ordering: .relaxed) } }
  }
  check(counter.value.load(ordering: .relaxed) == count, "await_run GCD count")
  return sample
}

@inline(never)
private func continuationAsync(_ queue: DispatchQueue, _ count: Int) -> Sample {
  let counter = AtomicCounter()
  let sample = timed(count) {
    for _ in 0..<count {
      await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
        queue.async {
          counter.value.add(1, ordering: .relaxed)
          continuation.resume()
        }
      }
    }
  }
  check(counter.value.load(ordering: .relaxed) == count, "await_run Dispatch count")
  return sample
}

// MARK: - Source events

/// Busy-waits `nanoseconds` (a paced producer, a slow consumer).
@inline(never)
private func spin(_ nanoseconds: Int64) {
  let end = monotonicNanos() + nanoseconds
  while monotonicNanos() < end {}
}

/// The producer merges one unit every 20 µs: slower than a source's handler
/// (so a DispatchSource hands each merge to its handler), faster than the
/// consumer, which works 200 µs per element.
private let producerPace: Int64 = 20_000
private let consumerWork: Int64 = 200_000

/// Runs the producer (count merges of 1, as fast as it can, on its own
/// thread) against `consume`, which returns the number of elements once it
/// has seen the whole sum; records the peak heap the consumer saw.
private func eventsSample(
  _ count: Int, heapInUse: (@convention(c) () -> Int)?, produce: @escaping @Sendable () -> Void,
  consume: @escaping @Sendable (_ peak: @escaping @Sendable () -> Void) async -> Int
) -> Sample {
  let baseline = heapInUse?() ?? 0
  let peak = Atomic<Int>(0)
  let elements = Atomic<Int>(0)
  let sample = timed(count) {
    let producer = Task.detached { produce() }
    let seen = await consume {
      let now = (heapInUse?() ?? 0) - baseline
      if now > peak.load(ordering: .relaxed) { peak.store(now, ordering: .relaxed) }
    }
    elements.store(seen, ordering: .relaxed)
    await producer.value
  }
  var result = sample
  result.extras = [
    "peak_kib": Double(peak.load(ordering: .relaxed)) / 1024, "elements": Double(elements.load(ordering: .relaxed)),
  ]
  return result
}

@inline(never)
private func gcdSourceEvents(_ count: Int, heapInUse: (@convention(c) () -> Int)?) -> Sample {
  let source = DataAddSource(queue: Queue(label: "bench.events"))
  let registered = DispatchSemaphore(value: 0)
  source.setRegistrationHandler { registered.signal() }
  // The sequence holds an element only while it keeps the source suspended.
  let backlog = Atomic<Int>(0)
  var result = eventsSample(
    count, heapInUse: heapInUse,
    produce: {
      registered.wait()
      for _ in 0..<count {
        source.merge(1)
        spin(producerPace)
      }
    },
    consume: { peak in
      var total: UInt = 0
      var elements = 0
      do {
        for try await value in source.makeEvents() {
          total += value
          elements += 1
          spin(consumerWork)
          if source.isSuspended { backlog.store(1, ordering: .relaxed) }
          if elements % 64 == 0 { peak() }
          if total == UInt(count) { break }
        }
      } catch {
        check(false, "source.makeEvents() threw \(error)")
      }
      check(total == UInt(count), "source_events GCD sum")
      peak()
      return elements
    })
  result.extras["backlog"] = Double(backlog.load(ordering: .relaxed))
  return result
}

@inline(never)
private func streamSourceEvents(_ count: Int, heapInUse: (@convention(c) () -> Int)?) -> Sample {
  let source = SendableDataAddSource(
    source: DispatchSource.makeUserDataAddSource(queue: DispatchQueue(label: "bench.events")))
  let (stream, continuation) = AsyncStream.makeStream(of: UInt.self)  // the default: an unbounded buffer
  let yielded = Atomic<Int>(0)
  let backlog = Atomic<Int>(0)
  source.source.setEventHandler {
    yielded.add(1, ordering: .relaxed)
    continuation.yield(source.source.data)
  }
  source.source.activate()
  var result = eventsSample(
    count, heapInUse: heapInUse,
    produce: {
      for _ in 0..<count {
        source.source.add(data: 1)
        spin(producerPace)
      }
    },
    consume: { peak in
      var total: UInt = 0
      var elements = 0
      for await value in stream {
        total += value
        elements += 1
        spin(consumerWork)
        let waiting = yielded.load(ordering: .relaxed) - elements
        if waiting > backlog.load(ordering: .relaxed) { backlog.store(waiting, ordering: .relaxed) }
        if elements % 64 == 0 { peak() }
        if total == UInt(count) { break }
      }
      check(total == UInt(count), "source_events Dispatch sum")
      peak()
      source.source.cancel()
      continuation.finish()
      return elements
    })
  result.extras["backlog"] = Double(backlog.load(ordering: .relaxed))
  return result
}

/// A Dispatch data source shared with the producer thread.
// @unchecked: DispatchSource is thread-safe; the overlay does not say so.
private struct SendableDataAddSource: @unchecked Sendable {
  let source: any DispatchSourceUserDataAdd
}
