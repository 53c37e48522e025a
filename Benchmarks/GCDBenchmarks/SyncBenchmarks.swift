import Dispatch
import GCD

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Semaphores, groups and apply.

func synchronizationBenchmarks(_ c: CLibrary?) -> [Benchmark] {
  [
    Benchmark(
      name: "semaphore", title: "semaphore signal + wait, uncontended",
      count: 5_000_000,
      runners: [.c: c.runner("semaphore"), .gcd: .run(gcdSemaphore), .dispatch: .run(dispatchSemaphore)]),
    Benchmark(
      name: "group_enter_leave", title: "group enter + leave",
      count: 3_000_000,
      runners: [
        .c: c.runner("group_enter_leave"), .gcd: .run(gcdGroupEnterLeave),
        .dispatch: .run(dispatchGroupEnterLeave),
      ]),
    Benchmark(
      name: "group_async", title: "group async onto the global queue, then wait",
      count: 300_000,
      runners: [.c: c.runner("group_async"), .gcd: .run(gcdGroupAsync), .dispatch: .run(dispatchGroupAsync)]),
  ]
}

/// `apply` with a trivial body and with ~100 µs iterations; the rounds of
/// the heavy kernel are calibrated once, in Swift, and used by every variant.
func applyBenchmarks(_ c: CLibrary?, quick: Bool) -> [Benchmark] {
  let heavyRounds = quick ? 100 : calibrateKernel(targetNanoseconds: 100_000)
  let extras: [(key: String, label: String, scale: Double)] = [
    (key: "speedup", label: "speed-up over a plain loop", scale: 1),
    (key: "loop", label: "plain loop ns/iteration", scale: 1),
  ]
  return [
    Benchmark(
      name: "apply_trivial", title: "apply, trivial iterations (global queue)", unit: "ns/iter",
      count: 1_000_000, shownExtras: extras,
      runners: [
        .c: c.runner("apply", extraKeys: ["speedup", "loop"], input: [0]),
        .gcd: .run { gcdApply($0, rounds: 0) }, .dispatch: .run { dispatchApply($0, rounds: 0) },
      ]),
    Benchmark(
      name: "apply_heavy", title: "apply, ~100 µs iterations (global queue)", unit: "ns/iter",
      count: 100, quickCount: 2, shownExtras: extras,
      runners: [
        .c: c.runner("apply", extraKeys: ["speedup", "loop"], input: [Double(heavyRounds)]),
        .gcd: .run { gcdApply($0, rounds: heavyRounds) }, .dispatch: .run { dispatchApply($0, rounds: heavyRounds) },
      ]),
  ]
}

// MARK: - Semaphore

@inline(never)
func gcdSemaphore(_ count: Int) -> Sample {
  let semaphore = try! Semaphore(value: 0)
  let start = monotonicNanos()
  for _ in 0..<count {
    semaphore.signal()
    semaphore.wait()
  }
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func dispatchSemaphore(_ count: Int) -> Sample {
  let semaphore = DispatchSemaphore(value: 0)
  let start = monotonicNanos()
  for _ in 0..<count {
    semaphore.signal()
    semaphore.wait()
  }
  return Sample(start: start, end: monotonicNanos(), count: count)
}

// MARK: - Group

@inline(never)
func gcdGroupEnterLeave(_ count: Int) -> Sample {
  let group = Group()
  let start = monotonicNanos()
  for _ in 0..<count {
    group.enter()
    group.leave()
  }
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func dispatchGroupEnterLeave(_ count: Int) -> Sample {
  let group = DispatchGroup()
  let start = monotonicNanos()
  for _ in 0..<count {
    group.enter()
    group.leave()
  }
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func gcdGroupAsync(_ count: Int) -> Sample {
  let group = Group()
  let queue = Queue.global()
  let counter = AtomicCounter()
  let start = monotonicNanos()
  for _ in 0..<count {
    group.async(on: queue) { counter.value.add(1, ordering: .relaxed) }
  }
  group.wait()
  let end = monotonicNanos()
  check(counter.value.load(ordering: .relaxed) == count, "GCD group_async count")
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchGroupAsync(_ count: Int) -> Sample {
  let group = DispatchGroup()
  let queue = DispatchQueue.global()
  let counter = AtomicCounter()
  let start = monotonicNanos()
  for _ in 0..<count {
    queue.async(group: group) { counter.value.add(1, ordering: .relaxed) }
  }
  group.wait()
  let end = monotonicNanos()
  check(counter.value.load(ordering: .relaxed) == count, "Dispatch group_async count")
  return Sample(start: start, end: end, count: count)
}

// MARK: - apply

/// The work of one iteration: `rounds` steps of a 64-bit LCG, as in bench_c.c.
@inline(never)
func kernel(_ seed: UInt64, _ rounds: Int) -> UInt64 {
  var x = seed | 1
  var round = 0
  while round < rounds {
    x = x &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
    round += 1
  }
  return x
}

/// The kernel rounds that take about `targetNanoseconds` on this machine.
func calibrateKernel(targetNanoseconds: Int64) -> Int {
  // A count the optimizer cannot see through (a constant one lets it fold the call).
  let probe = 1_000_000 + Int(getpid() & 1)
  var best = Int64.max
  for _ in 0..<5 {
    let start = monotonicNanos()
    let result = kernel(UInt64(truncatingIfNeeded: start), probe)
    best = min(best, monotonicNanos() - start)
    check(result != 0, "kernel result")
  }
  let perRound = Double(max(best, 1)) / Double(probe)
  let rounds = Int(Double(targetNanoseconds) / perRound)
  return min(max(rounds, 1), 10_000_000)
}

/// Results written by the iterations, one slot each.
struct Slots: @unchecked Sendable {
  let base: UnsafeMutablePointer<UInt64>

  init(_ count: Int) {
    base = .allocate(capacity: max(count, 1))
    base.initialize(repeating: 0, count: max(count, 1))
  }

  func free() { base.deallocate() }
}

/// A plain loop of the kernel, timed: the baseline of the speed-up.
@inline(never)
func serialLoop(_ count: Int, rounds: Int, into slots: Slots) -> Int64 {
  let start = monotonicNanos()
  for index in 0..<count { slots.base[index] = kernel(UInt64(index), rounds) }
  return monotonicNanos() - start
}

func applySample(serial: Int64, parallel: Int64, count: Int) -> Sample {
  Sample(
    value: Double(parallel) / Double(max(count, 1)),
    extras: [
      "speedup": Double(serial) / Double(max(parallel, 1)), "loop": Double(serial) / Double(max(count, 1)),
    ])
}

@inline(never)
func gcdApply(_ count: Int, rounds: Int) -> Sample {
  let slots = Slots(count)
  defer { slots.free() }
  let serial = serialLoop(count, rounds: rounds, into: slots)
  let start = monotonicNanos()
  Queue.global().apply(count) { index in slots.base[index] = kernel(UInt64(index), rounds) }
  return applySample(serial: serial, parallel: monotonicNanos() - start, count: count)
}

@inline(never)
func dispatchApply(_ count: Int, rounds: Int) -> Sample {
  let slots = Slots(count)
  defer { slots.free() }
  let serial = serialLoop(count, rounds: rounds, into: slots)
  let start = monotonicNanos()
  DispatchQueue.concurrentPerform(iterations: count) { index in slots.base[index] = kernel(UInt64(index), rounds) }
  return applySample(serial: serial, parallel: monotonicNanos() - start, count: count)
}
