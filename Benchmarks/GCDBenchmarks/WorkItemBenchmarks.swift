import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Work items: GCD's WorkItem against the overlay's DispatchWorkItem and
// against C's dispatch blocks (dispatch_block_create, dispatch_block_notify,
// dispatch_block_cancel). Each closure captures one value, as the C blocks
// do. `after` is measured too, since Queue.after now returns a WorkItem.

func workItemBenchmarks(_ c: CLibrary?) -> [Benchmark] {
  [
    Benchmark(
      name: "workitem_notify",
      title: "work item: create + async + notify on a serial queue + drain",
      count: 300_000,
      runners: [
        .c: c.runner("workitem_notify"), .gcd: .run(gcdWorkItemNotify), .dispatch: .run(dispatchWorkItemNotify),
      ]
    ),
    Benchmark(
      name: "workitem_graph",
      title:
        "work items in one pending graph, then run, per item (the scale row work_item_graph at N = the count): a root, "
        + "a chain after it, a fan-out after it, a fan-in",
      count: 20_000,
      runners: [
        .c: c.runner("scale_work_item_graph"),
        .gcd: .run { count in
          let queue = Queue(label: "bench.graph")
          return Sample(value: timedGraph(count) { gcdPendingGraph($0, queue) })
        },
        .dispatch: .run { count in
          let queue = DispatchQueue(label: "bench.graph")
          return Sample(value: timedGraph(count) { dispatchPendingGraph($0, queue) })
        },
      ]),
    Benchmark(
      name: "workitem_async",
      title: "work item: create + async on a serial queue + drain (no notify)",
      count: 300_000,
      runners: [.c: c.runner("workitem_async"), .gcd: .run(gcdWorkItemAsync), .dispatch: .run(dispatchWorkItemAsync)]),
    Benchmark(
      name: "after", title: "after(now) of a closure onto a serial queue + drain (result ignored)",
      count: 300_000,
      runners: [.c: c.runner("after"), .gcd: .run(gcdAfter), .dispatch: .run(dispatchAfter)]),
    Benchmark(
      name: "after_cancel", title: "after(1 s) of a work item + cancel (the timers are drained untimed)",
      count: 100_000, repeats: 3,
      runners: [.c: c.runner("after_cancel"), .gcd: .run(gcdAfterCancel), .dispatch: .run(dispatchAfterCancel)]),
  ]
}

// MARK: - create + async + notify

@inline(never)
func gcdWorkItemNotify(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.workitem")
  let counter = Counter()
  let notified = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    let item = WorkItem { counter.value &+= 1 }
    queue.async(item)
    item.notify(on: queue) { notified.value &+= 1 }
  }
  // The last notify is queued while the last item runs: behind the first sync.
  queue.sync {}
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count && notified.value == count, "GCD workitem_notify count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchWorkItemNotify(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.workitem")
  let counter = Counter()
  let notified = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    let item = DispatchWorkItem { counter.value &+= 1 }
    queue.async(execute: item)
    item.notify(queue: queue) { notified.value &+= 1 }
  }
  queue.sync {}
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count && notified.value == count, "Dispatch workitem_notify count")
  return Sample(start: start, end: end, count: count)
}

// MARK: - create + async

@inline(never)
func gcdWorkItemAsync(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.workitem")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async(WorkItem { counter.value &+= 1 })
  }
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count, "GCD workitem_async count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchWorkItemAsync(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.workitem")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async(execute: DispatchWorkItem { counter.value &+= 1 })
  }
  queue.sync {}
  let end = monotonicNanos()
  check(counter.value == count, "Dispatch workitem_async count")
  return Sample(start: start, end: end, count: count)
}

// MARK: - after

@inline(never)
func gcdAfter(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.after")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.after(deadline: .now) { counter.value &+= 1 }
  }
  let drained = waitUntilCount(counter, count) { queue.sync {} }
  let end = monotonicNanos()
  check(drained, "GCD after count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchAfter(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.after")
  let counter = Counter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.asyncAfter(deadline: .now()) { counter.value &+= 1 }
  }
  let drained = waitUntilCount(counter, count) { queue.sync {} }
  let end = monotonicNanos()
  check(drained, "Dispatch after count")
  return Sample(start: start, end: end, count: count)
}

/// Drains `queue` (with `drain`) until `counter` reaches `count`: a timer
/// hands its work to the queue only when it fires, so one drain may come
/// too early.
func waitUntilCount(_ counter: Counter, _ count: Int, drain: () -> Void) -> Bool {
  for _ in 0..<100_000 {
    drain()
    if counter.value == count { return true }
    usleep(100)
  }
  return false
}

// MARK: - after + cancel

/// How far ahead the cancelled timers are set: 1 s, or 10 ms for the tiny
/// counts of `--quick` (bench_c.c uses the same rule).
func cancelDelayMilliseconds(_ count: Int) -> Int { count <= 10 ? 10 : 1000 }

/// Lets the cancelled timers of a run fire (and free their blocks) before
/// the next run, outside the timed region.
func drainCancelledTimers(_ count: Int, _ drain: () -> Void) {
  usleep(UInt32(cancelDelayMilliseconds(count) * 1000 + 100_000))
  drain()
}

@inline(never)
func gcdAfterCancel(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.after_cancel")
  let counter = Counter()
  let delay = cancelDelayMilliseconds(count)
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.after(.milliseconds(delay)) { counter.value &+= 1 }.cancel()
  }
  let end = monotonicNanos()
  drainCancelledTimers(count) { queue.sync {} }
  check(counter.value == 0, "GCD after_cancel: a cancelled item ran")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchAfterCancel(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.after_cancel")
  let counter = Counter()
  let delay = cancelDelayMilliseconds(count)
  let start = monotonicNanos()
  for _ in 0..<count {
    let item = DispatchWorkItem { counter.value &+= 1 }
    queue.asyncAfter(deadline: .now() + .milliseconds(delay), execute: item)
    item.cancel()
  }
  let end = monotonicNanos()
  drainCancelledTimers(count) { queue.sync {} }
  check(counter.value == 0, "Dispatch after_cancel: a cancelled item ran")
  return Sample(start: start, end: end, count: count)
}
