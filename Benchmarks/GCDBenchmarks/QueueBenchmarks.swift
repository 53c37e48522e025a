import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Queue operations. Every variant of an operation does the same work as
// its C twin in bench_c.c: closures capture one value (as the C blocks do,
// which makes dispatch_async heap-copy them), function forms pass a context
// pointer, sync closures capture a local variable (a stack block in C).

/// A counter touched only from a serial queue (or before/after it drains).
final class Counter: @unchecked Sendable {
  var value = 0
}

/// A counter touched from many threads.
final class AtomicCounter: Sendable {
  let value = Atomic<Int>(0)
}

/// A heap `Int` passed as a `_f` context pointer.
struct Cell: @unchecked Sendable {
  let pointer: UnsafeMutablePointer<Int>

  init() {
    pointer = .allocate(capacity: 1)
    pointer.initialize(to: 0)
  }

  var raw: UnsafeMutableRawPointer { UnsafeMutableRawPointer(pointer) }
  var value: Int { pointer.pointee }
  func free() { pointer.deallocate() }
}

func queueBenchmarks(_ c: CLibrary?) -> [Benchmark] {
  [
    Benchmark(
      name: "async", title: "async onto a serial queue (closure / capturing block) + drain",
      count: 500_000,
      runners: [.c: c.runner("async"), .gcd: .run(gcdAsync), .dispatch: .run(dispatchAsync)]),
    Benchmark(
      name: "async_f", title: "async(context:function:) / dispatch_async_f + drain",
      count: 500_000,
      runners: [
        .c: c.runner("async_f"), .gcd: .run(gcdAsyncF),
        .dispatch: .unavailable("n/a (no _f form)"),
      ]),
    Benchmark(
      name: "sync", title: "sync onto a serial queue (closure / stack block)",
      count: 2_000_000,
      runners: [.c: c.runner("sync"), .gcd: .run(gcdSync), .dispatch: .run(dispatchSync)]),
    Benchmark(
      name: "sync_f", title: "sync(context:function:) / dispatch_sync_f",
      count: 2_000_000,
      runners: [
        .c: c.runner("sync_f"), .gcd: .run(gcdSyncF), .dispatch: .unavailable("n/a (no _f form)"),
      ]),
    Benchmark(
      name: "queue_create", title: "create + release a serial queue",
      count: 200_000,
      runners: [
        .c: c.runner("queue_create"), .gcd: .run(gcdQueueCreate), .dispatch: .run(dispatchQueueCreate),
      ]),
  ]
}

// MARK: - async

@inline(never)
func gcdAsync(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.async")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async { counter.value &+= 1 }
  }
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count, "GCD async count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchAsync(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.async")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async { counter.value &+= 1 }
  }
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count, "Dispatch async count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func gcdAsyncF(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.async_f")
  let cell = Cell()
  defer { cell.free() }
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async(context: cell.raw) { $0.unsafelyUnwrapped.assumingMemoryBound(to: Int.self).pointee &+= 1 }
  }
  queue.sync {}
  let end = monotonicNanos()
  check(cell.value == count, "GCD async_f count")
  return Sample(start: start, end: end, count: count)
}

// MARK: - sync

@inline(never)
func gcdSync(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.sync")
  var total = 0
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.sync { total &+= 1 }
  }
  let end = monotonicNanos()
  check(total == count, "GCD sync count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchSync(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.sync")
  var total = 0
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.sync { total &+= 1 }
  }
  let end = monotonicNanos()
  check(total == count, "Dispatch sync count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func gcdSyncF(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.sync_f")
  let cell = Cell()
  defer { cell.free() }
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.sync(context: cell.raw) { $0.unsafelyUnwrapped.assumingMemoryBound(to: Int.self).pointee &+= 1 }
  }
  let end = monotonicNanos()
  check(cell.value == count, "GCD sync_f count")
  return Sample(start: start, end: end, count: count)
}

// MARK: - create + release

/// Stores `object` in a global (replacing, and so releasing, the previous
/// one), so the wrapper escapes and is allocated on the heap as it is in
/// real code, where a queue or a source is kept; without it the optimizer
/// promotes an unused wrapper to the stack and measures less than a
/// program pays. `escape(nil)` after the loop releases the last one.
/// `consuming`: the new object's reference moves into the global, as when a
/// program stores a new queue in a property (no extra retain and release).
@inline(never)
func escape(_ object: consuming AnyObject?) {
  escaped = object
}

nonisolated(unsafe) var escaped: AnyObject?

@inline(never)
func gcdQueueCreate(_ count: Int) -> Sample {
  let start = monotonicNanos()
  for _ in 0..<count {
    escape(Queue(label: "bench.queue"))
  }
  escape(nil)
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func dispatchQueueCreate(_ count: Int) -> Sample {
  let start = monotonicNanos()
  for _ in 0..<count {
    escape(DispatchQueue(label: "bench.queue"))
  }
  escape(nil)
  return Sample(start: start, end: monotonicNanos(), count: count)
}
