import Dispatch
import GCD
import Synchronization

#if canImport(Glibc)
  import Glibc
#elseif canImport(Musl)
  import Musl
#endif

// Dispatch sources: merge throughput, the life cycle of each source type,
// timer lateness and merge → handler latency.

/// What the source benchmarks need from the process: a pipe, a file to
/// watch, and a harmless signal.
final class SourceFixtures: @unchecked Sendable {
  let readEnd: Int32
  let writeEnd: Int32
  let watchedPath: String
  let signal = SIGUSR2

  init() {
    var ends: [Int32] = [0, 0]
    check(pipe(&ends) == 0, "pipe")
    readEnd = ends[0]
    writeEnd = ends[1]
    var template = Array("/tmp/gcd-bench-XXXXXX".utf8CString)
    let descriptor = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
    check(descriptor >= 0, "mkstemp")
    close(descriptor)
    watchedPath = String(decoding: template.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    // Harmless until libdispatch installs its own handler for the signal sources.
    _ = Glibc.signal(SIGUSR2, SIG_IGN)
  }

  deinit {
    close(readEnd)
    close(writeEnd)
    unlink(watchedPath)
  }
}

func sourceBenchmarks(_ c: CLibrary?, fixtures: SourceFixtures) -> [Benchmark] {
  let onlyGCD = Runner.unavailable("n/a (no such source on Linux)")
  let latencyExtras: [(key: String, label: String, scale: Double)] = [
    (key: "mean", label: "mean µs", scale: 0.001), (key: "p99", label: "p99 µs", scale: 0.001),
  ]
  // `closing`: the GCD source holds a descriptor of its own until its cancel handler has run (a
  // process source's pidfd, a file-system source's O_PATH descriptor), so its loop is paced. A read
  // or write source holds none (the descriptor fence, docs/sources-linux.md).
  func cycle<S: Source>(
    _ kind: String, closing: Bool = false, _ gcd: @escaping (Queue) throws -> S, _ dispatch: Runner
  ) -> Benchmark {
    Benchmark(
      name: "source_\(kind)", title: "\(kind) source: create + resume + cancel + release",
      count: 20_000,
      runners: [
        .c: c.runner("source_\(kind)"), .gcd: .run { gcdSourceCycle($0, closingDescriptors: closing, gcd) },
        .dispatch: dispatch,
      ])
  }
  return [
    Benchmark(
      name: "merge", title: "merge(1) into a DATA_ADD source until handled",
      count: 3_000_000,
      runners: [.c: c.runner("merge"), .gcd: .run(gcdMerge), .dispatch: .run(dispatchMerge)]),
    cycle(
      "timer", { TimerSource(queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeTimerSource(queue: $0) } }),
    Benchmark(
      name: "source_timer_handlers",
      title: "timer source with an event and a cancel handler: create + set both + resume + cancel + release",
      count: 20_000,
      runners: [
        .c: c.runner("source_timer_handlers"), .gcd: .run(gcdTimerHandlersCycle),
        .dispatch: .run(dispatchTimerHandlersCycle),
      ]),
    Benchmark(
      name: "connection_cycle",
      title:
        "a connection's read source: socketpair + read source + the peer writes 1 byte + the handler reads it"
        + " and cancels + the cancel handler closes",
      count: 5_000,
      runners: [
        .c: c.runner("connection_cycle"), .gcd: .run(gcdConnectionCycle), .dispatch: .run(dispatchConnectionCycle),
      ]),
    Benchmark(
      name: "source_events_cycle",
      title:
        "a DATA_ADD source's event sequence: create + makeEvents() + merge(1) + one element + break (cancel) "
        + "(Dispatch: the source bridged to an AsyncStream, as a user writes it)",
      count: 20_000,
      runners: [
        .c: .unavailable("n/a (C has no async sequence)"), .gcd: .run(gcdEventsCycle),
        .dispatch: .run(dispatchEventsCycle),
      ]),
    cycle(
      "read", { try ReadSource(fileDescriptor: fixtures.readEnd, queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeReadSource(fileDescriptor: fixtures.readEnd, queue: $0) } }),
    cycle(
      "write", { try WriteSource(fileDescriptor: fixtures.writeEnd, queue: $0) },
      .run {
        dispatchSourceCycle($0) { DispatchSource.makeWriteSource(fileDescriptor: fixtures.writeEnd, queue: $0) }
      }),
    cycle(
      "signal", { try SignalSource(signal: fixtures.signal, queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeSignalSource(signal: fixtures.signal, queue: $0) } }),
    cycle(
      "data_add", { DataAddSource(queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeUserDataAddSource(queue: $0) } }),
    cycle(
      "data_or", { DataOrSource(queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeUserDataOrSource(queue: $0) } }),
    cycle(
      "data_replace", { DataReplaceSource(queue: $0) },
      .run { dispatchSourceCycle($0) { DispatchSource.makeUserDataReplaceSource(queue: $0) } }),
    Benchmark(
      name: "source_proc", title: "proc source (pidfd): create + resume + cancel + release, descriptors closed",
      count: 5_000,
      runners: [
        .c: onlyGCD,
        .gcd: .run { gcdSourceCycle($0, closingDescriptors: true) { try ProcSource(pid: getpid(), queue: $0) } },
        .dispatch: onlyGCD,
      ]),
    Benchmark(
      name: "source_filesystem",
      title: "file-system source (inotify): create + resume + cancel + release, descriptors closed",
      count: 3_000,
      runners: [
        .c: onlyGCD,
        .gcd: .run {
          gcdSourceCycle($0, closingDescriptors: true) {
            try FileSystemSource(path: fixtures.watchedPath, events: .write, queue: $0)
          }
        },
        .dispatch: onlyGCD,
      ]),
    Benchmark(
      name: "timer_lateness", title: "10 ms repeating timer, lateness per fire (median)", unit: "ns late",
      count: 30, quickCount: 2, repeats: 3, shownExtras: latencyExtras,
      runners: [
        .c: c.runner("timer_lateness", extraKeys: ["mean", "p99", "max"]), .gcd: .run(gcdTimerLateness),
        .dispatch: .run(dispatchTimerLateness),
      ]),
    Benchmark(
      name: "event_latency", title: "merge → handler latency, one event at a time (median)", unit: "ns",
      count: 2_000, quickCount: 3, repeats: 5, shownExtras: latencyExtras,
      runners: [
        .c: c.runner("event_latency", extraKeys: ["mean", "p99", "max"]), .gcd: .run(gcdEventLatency),
        .dispatch: .run(dispatchEventLatency),
      ]),
  ]
}

// MARK: - merge

@inline(never)
func gcdMerge(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.merge")
  let source = DataAddSource(queue: queue)
  let done = try! Semaphore(value: 0)
  let sum = Counter()
  source.setEventHandler {
    sum.value += Int(source.data)
    if sum.value == count { done.signal() }
  }
  source.resume()
  let start = monotonicNanos()
  for _ in 0..<count {
    source.merge(1)
  }
  if count > 0 { done.wait() }
  let end = monotonicNanos()
  source.cancel()
  queue.sync {}
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchMerge(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.merge")
  let source = DispatchSource.makeUserDataAddSource(queue: queue)
  let done = DispatchSemaphore(value: 0)
  let sum = Counter()
  source.setEventHandler {
    sum.value += Int(source.data)
    if sum.value == count { done.signal() }
  }
  source.resume()
  let start = monotonicNanos()
  for _ in 0..<count {
    source.add(data: 1)
  }
  if count > 0 { done.wait() }
  let end = monotonicNanos()
  source.cancel()
  queue.sync {}
  return Sample(start: start, end: end, count: count)
}

// MARK: - Life cycle

/// With `closingDescriptors` (proc and file-system sources,
/// which own a descriptor that their cancel path closes on libdispatch's threads),
/// every 100 sources and at the end the loop waits until the process has
/// about as many open descriptors as before (a few may stay: the inotify
/// instance, libdispatch's own): a tight loop would otherwise run ahead of
/// the closes and reach the descriptor limit.
@inline(never)
func gcdSourceCycle<S: Source>(_ count: Int, closingDescriptors: Bool = false, _ make: (Queue) throws -> S)
  -> Sample
{
  let queue = Queue(label: "bench.source")
  let descriptors = closingDescriptors ? openDescriptorCount() : 0
  let start = monotonicNanos()
  for index in 0..<count {
    let source = try! make(queue)
    escape(source)
    source.resume()
    source.cancel()
    if closingDescriptors && (index % 100 == 99 || index == count - 1) {
      waitForDescriptors(atMost: descriptors + 8)
    }
  }
  escape(nil)
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

/// The number of open descriptors of this process.
func openDescriptorCount() -> Int {
  guard let directory = opendir("/proc/self/fd") else { return 0 }
  defer { closedir(directory) }
  var count = 0
  while readdir(directory) != nil { count += 1 }
  return count
}

/// Waits (at most 10 s) until at most `limit` descriptors are open.
func waitForDescriptors(atMost limit: Int) {
  var polls = 0
  while openDescriptorCount() > limit && polls < 200_000 {
    usleep(50)
    polls += 1
  }
}

@inline(never)
func dispatchSourceCycle(_ count: Int, _ make: (DispatchQueue) -> any DispatchSourceProtocol) -> Sample {
  let queue = DispatchQueue(label: "bench.source")
  let start = monotonicNanos()
  for _ in 0..<count {
    let source = make(queue)
    source.resume()
    source.cancel()
  }
  escape(nil)
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

/// What the handlers of `source_timer_handlers` count: the one object each handler captures.
final class HandlerCounts: Sendable {
  let fired = Atomic(0)
  let cancelled = Atomic(0)
}

@inline(never)
func gcdTimerHandlersCycle(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.source")
  let counts = HandlerCounts()
  let start = monotonicNanos()
  for _ in 0..<count {
    let source = TimerSource(queue: queue)
    source.setEventHandler { counts.fired.add(1, ordering: .relaxed) }
    source.setCancelHandler { counts.cancelled.add(1, ordering: .relaxed) }
    source.resume()
    source.cancel()
  }
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func dispatchTimerHandlersCycle(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.source")
  let counts = HandlerCounts()
  let start = monotonicNanos()
  for _ in 0..<count {
    let source = DispatchSource.makeTimerSource(queue: queue)
    source.setEventHandler { counts.fired.add(1, ordering: .relaxed) }
    source.setCancelHandler { counts.cancelled.add(1, ordering: .relaxed) }
    source.resume()
    source.cancel()
  }
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

/// A sum the sequences' loops add to (so the element is used).
final class EventsSum: Sendable {
  let total = Atomic<UInt>(0)
}

@inline(never)
func gcdEventsCycle(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.source.events")
  let sum = EventsSum()
  let start = monotonicNanos()
  scaleBlockOn {
    for _ in 0..<count {
      let source = DataAddSource(queue: queue)
      var events = source.makeEvents().makeAsyncIterator()
      source.merge(1)
      // The sequence is made by this call, so its first next() cannot throw EBUSY.
      if let value = try? await events.next() { sum.total.add(value, ordering: .relaxed) }
    }
  }
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

@inline(never)
func dispatchEventsCycle(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.source.events")
  let sum = EventsSum()
  let start = monotonicNanos()
  scaleBlockOn {
    for _ in 0..<count {
      let source = DispatchSource.makeUserDataAddSource(queue: queue)
      let events = dispatchEventStream(source)
      source.add(data: 1)
      for await value in events {
        sum.total.add(value, ordering: .relaxed)
        break
      }
    }
  }
  queue.sync {}
  return Sample(start: start, end: monotonicNanos(), count: count)
}

// MARK: - Timer lateness

/// What a timer handler records; touched only on the timer's serial queue
/// until the semaphore hands it back.
final class TimerRecord: @unchecked Sendable {
  var fired: [Int64]
  var ordinal: [UInt]
  var total: UInt = 0
  let wanted: Int

  init(wanted: Int) {
    self.wanted = wanted
    fired = []
    ordinal = []
    fired.reserveCapacity(wanted)
    ordinal.reserveCapacity(wanted)
  }

  /// Records one handler run standing for `fires` merged fires; true when done.
  func record(fires: UInt) -> Bool {
    guard fired.count < wanted else { return false }
    fired.append(monotonicNanos())
    total += fires
    ordinal.append(total)
    return fired.count == wanted
  }

  /// The lateness of each run against `start + k * interval`.
  func lateness(start: Int64, interval: Int64) -> Sample {
    Statistics.latencySample(zip(fired, ordinal).map { $0 - (start + Int64($1) * interval) })
  }
}

let timerInterval: Int64 = 10_000_000

@inline(never)
func gcdTimerLateness(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.timer")
  let timer = TimerSource(queue: queue)
  let record = TimerRecord(wanted: count)
  let done = try! Semaphore(value: 0)
  timer.setEventHandler {
    if record.record(fires: timer.data) { done.signal() }
  }
  let start = monotonicNanos()
  timer.schedule(start: .now + .nanoseconds(timerInterval), interval: .nanoseconds(timerInterval), leeway: .zero)
  timer.resume()
  if count > 0 { done.wait() }
  timer.cancel()
  queue.sync {}
  return record.lateness(start: start, interval: timerInterval)
}

@inline(never)
func dispatchTimerLateness(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.timer")
  let timer = DispatchSource.makeTimerSource(queue: queue)
  let record = TimerRecord(wanted: count)
  let done = DispatchSemaphore(value: 0)
  timer.setEventHandler {
    if record.record(fires: timer.data) { done.signal() }
  }
  let start = monotonicNanos()
  timer.schedule(
    deadline: .now() + .nanoseconds(Int(timerInterval)), repeating: .nanoseconds(Int(timerInterval)),
    leeway: .nanoseconds(0))
  timer.resume()
  if count > 0 { done.wait() }
  timer.cancel()
  queue.sync {}
  return record.lateness(start: start, interval: timerInterval)
}

// MARK: - Event latency

/// Merge times and latencies of one event at a time: the merging thread
/// writes `mergedAt` before it merges, the handler reads it after.
final class LatencyRecord: @unchecked Sendable {
  var mergedAt: Int64 = 0
  var latencies: [Int64] = []

  init(capacity: Int) { latencies.reserveCapacity(capacity) }

  func handled() { latencies.append(monotonicNanos() - mergedAt) }
}

@inline(never)
func gcdEventLatency(_ count: Int) -> Sample {
  let queue = Queue(label: "bench.latency")
  let source = DataAddSource(queue: queue)
  let record = LatencyRecord(capacity: count)
  let handled = try! Semaphore(value: 0)
  source.setEventHandler {
    record.handled()
    handled.signal()
  }
  source.resume()
  for _ in 0..<count {
    record.mergedAt = monotonicNanos()
    source.merge(1)
    handled.wait()
  }
  source.cancel()
  queue.sync {}
  return Statistics.latencySample(record.latencies)
}

@inline(never)
func dispatchEventLatency(_ count: Int) -> Sample {
  let queue = DispatchQueue(label: "bench.latency")
  let source = DispatchSource.makeUserDataAddSource(queue: queue)
  let record = LatencyRecord(capacity: count)
  let handled = DispatchSemaphore(value: 0)
  source.setEventHandler {
    record.handled()
    handled.signal()
  }
  source.resume()
  for _ in 0..<count {
    record.mergedAt = monotonicNanos()
    source.add(data: 1)
    handled.wait()
  }
  source.cancel()
  queue.sync {}
  return Statistics.latencySample(record.latencies)
}

// MARK: - A connection's cycle

/// A connected pair of non-blocking, close-on-exec Unix stream sockets.
private func connectedPair() -> (Int32, Int32) {
  var fds: [Int32] = [-1, -1]
  check(
    socketpair(
      AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0, &fds)
      == 0, "socketpair")
  return (fds[0], fds[1])
}

@inline(never)
func gcdConnectionCycle(_ count: Int) -> Sample { gcdConnectionCycles(count, queue: Queue(label: "bench.connection")) }

/// `count` connection cycles on `queue` (`connection_cycle`; the scale row `connection_churn` runs
/// them beside idle sources on the same queue).
func gcdConnectionCycles(_ count: Int, queue: Queue) -> Sample {
  let done = DispatchSemaphore(value: 0)
  let start = monotonicNanos()
  for _ in 0..<count {
    let (descriptor, peer) = connectedPair()
    let source = try! ReadSource(fileDescriptor: descriptor, queue: queue)
    source.setEventHandler {
      var byte: UInt8 = 0
      _ = read(descriptor, &byte, 1)
      source.cancel()
    }
    source.setCancelHandler {
      close(descriptor)
      done.signal()
    }
    source.resume()
    var byte: UInt8 = 120
    check(write(peer, &byte, 1) == 1, "write")
    done.wait()
    close(peer)
  }
  let end = monotonicNanos()
  return Sample(start: start, end: end, count: count)
}

@inline(never)
func dispatchConnectionCycle(_ count: Int) -> Sample {
  dispatchConnectionCycles(count, queue: DispatchQueue(label: "bench.connection"))
}

func dispatchConnectionCycles(_ count: Int, queue: DispatchQueue) -> Sample {
  let done = DispatchSemaphore(value: 0)
  let start = monotonicNanos()
  for _ in 0..<count {
    let (descriptor, peer) = connectedPair()
    let source = DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: queue)
    source.setEventHandler {
      var byte: UInt8 = 0
      _ = read(descriptor, &byte, 1)
      source.cancel()
    }
    source.setCancelHandler {
      close(descriptor)
      done.signal()
    }
    source.resume()
    var byte: UInt8 = 120
    check(write(peer, &byte, 1) == 1, "write")
    done.wait()
    close(peer)
  }
  let end = monotonicNanos()
  return Sample(start: start, end: end, count: count)
}
